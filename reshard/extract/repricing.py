"""One saturated e-graph read at other mesh sizes: its e-nodes re-priced, its shardings rebuilt.

An e-graph saturated at sizes ``s0`` serves every size ``s`` of the same size class
(``ir.symbolic``): the same e-nodes exist, with each mesh-size split ``Outer(x, s0_a)`` read
as ``Outer(x, s_a)``.  Only the costs and the shardings change:

* ``Repricer``: the cost of each e-node at ``s``.  The cost rules are functions of the local
  bytes of the node's classes, the team size and the node's op, each written once as a
  ``rules.cost_laws.Pricing`` that renders the rule's action; local bytes at ``s`` are
  ``nbytes(v) / prod(s_a)`` over the axes a distribution binds.  Each node's law is identified
  at ``s0`` among the pricings of its constructor (selected by its op's fact: ``viewop``,
  ``memop``, ``mmK``, ``lkgather``, ...): the first whose formula, evaluated at ``s0``, gives
  the e-graph's own cost exactly (else ``ReshardError``).  Then it is evaluated at ``s``, in
  the rules' integer arithmetic.
* ``SizedSnapshot``: the snapshot whose decoded shardings are rebuilt on the mesh at ``s``
  from their placements (``TensorSharding.placements``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..ir.errors import ReshardError
from ..ir.mesh import DeviceMesh
from ..ir.fusion import Fusion
from ..ir.ids import ID, Inner, Merge, Outer
from ..ir.ops import op_kind
from ..ir.sharding import Partial, Replicate, TensorSharding
from ..rules.collectives import BY_CTOR, TEAM_CTORS
from ..rules.cost_laws import PRICINGS, Pricing, Quantities, team_of
from ..rules.cost_profile import CostProfile
from ..rules.schema import OP_CTORS
from ..search.segments import MergedSnapshot
from ..search.snapshot import Snapshot, real_classes
from .dag import ENode

#: a law: the cost in ps at mesh sizes ``s`` (per axis)
Law = Callable[[tuple[int, ...]], int]


class Repricer:
    """The e-nodes ``nodes`` of ``snap`` (saturated for ``fusion`` on ``mesh``; one e-graph or
    segments) priced at other sizes of
    the mesh's axes (module docstring).  ``prices(sizes)``: one cost per node, in ``nodes``' order."""

    def __init__(self, snap: Snapshot | MergedSnapshot, fusion: Fusion, nodes: Sequence[ENode], mesh: DeviceMesh,
                 profile: CostProfile) -> None:
        self.snap, self.fusion, self.mesh, self.prof = snap, fusion, mesh, profile
        self.names = real_classes(snap)  # type: ignore[arg-type]
        self.ids = snap.id_terms()
        self.nbytes = {snap.i64(r.inputs[0]): snap.i64(r.output) for r in snap.rows("nbytes")}
        self._axes: dict[Any, tuple[str, ...]] = {}
        self._sized = SizedSnapshot(snap, mesh)
        self._meshes: dict[tuple[int, ...], DeviceMesh] = {}
        self._local: dict[tuple[Any, tuple[int, ...]], tuple[int, ...]] = {}
        self._facts = {name: {snap.i64(r.inputs[0]): snap.i64(r.output) for r in snap.rows(name)}
                       for p in PRICINGS for name in p.reads}
        self._selected = {p.selector: {snap.i64(r.inputs[0]) for r in snap.rows(p.selector)}
                          for p in PRICINGS if p.selector}
        base = tuple(mesh.shape)
        self.laws = [self._identify(n, base) for n in nodes]

    # ---- what a class holds at given sizes ---------------------------------------------
    def axes(self, cls: Any) -> tuple[str, ...]:
        """Per mesh axis, what T class ``cls``'s distribution places there: "R", "B" (an index:
        the axis splits the value) or "P:<op>"."""
        tid, dist_cls = self.names[cls]
        if dist_cls not in self._axes:
            t = self.fusion.tensors[tid]
            ts = self.snap.sharding(dist_cls, self.mesh, t.shape, self.ids)
            self._axes[dist_cls] = tuple("R" if isinstance(p, Replicate) else f"P:{p.op}" if isinstance(p, Partial)
                                         else "B" for p in ts.axes)
        return self._axes[dist_cls]

    def shards(self, cls: Any, s: tuple[int, ...]) -> int:
        """How many blocks T class ``cls``'s distribution splits its value into at sizes ``s``."""
        return math.prod(n for n, p in zip(s, self.axes(cls)) if p == "B")

    def lb(self, cls: Any, s: tuple[int, ...]) -> int:
        """Local bytes of T class ``cls`` at sizes ``s`` (the rules' ``lb``: nbytes / shards)."""
        return self.nbytes[self.names[cls][0]] // self.shards(cls, s)

    # ---- laws ---------------------------------------------------------------------------
    def _quantities(self, p: Pricing, n: ENode, k: int | None, copies: int, s: tuple[int, ...]) -> Quantities:
        """What node ``n`` (of op ``k``) holds at sizes ``s``, as pricing ``p`` reads it."""
        out, ins = self.lb(n.cls, s), tuple(self.lb(c, s) for c in n.children)
        if n.ctor in TEAM_CTORS:
            t = s[self.snap.i64(n.args[1])]
            return Quantities(out, ins, t, n.ctor, team_of(self.prof, BY_CTOR[n.ctor].name, t, list(s)), copies)
        facts = {name: self._facts[name][k] for name in p.reads}
        if p.rule == "cost-matmul":
            lhs, res = self.axes(n.children[0]), self.axes(n.cls)
            # kf on an axis: its size where the lhs is split and the result Partial(sum)
            facts["kprod"] = math.prod(t for t, a, o in zip(s, lhs, res) if a == "B" and o == "P:sum")
        if p.rule == "cost-attention":
            assert k is not None
            facts.update(self._fused_work(n, k, s))
        return Quantities(out, ins, 0, n.ctor, facts=facts)

    def _fused_work(self, n: ENode, k: int, s: tuple[int, ...]) -> dict[str, int]:
        """The ``fl``, ``pb`` and ``kn`` of fused op ``k``'s strategy that node ``n`` runs, at
        sizes ``s``: ``OpKind.local_work`` on the local shapes its result's and operands' dists
        give there (what ``search.encode.attention_strategies`` wrote at the e-graph's sizes)."""
        op = self.fusion.ops[k]
        fl, pb, kn = op_kind(op.kind).local_work([self.local_shape(c, s) for c in n.children],
                                                 self.local_shape(n.cls, s), self.fusion.tensors[op.output].itemsize)
        return {"fl": fl, "pb": pb, "kn": kn}

    def local_shape(self, cls: Any, s: tuple[int, ...]) -> tuple[int, ...]:
        """The local shape of T class ``cls``'s value at sizes ``s`` (its placements on the mesh of
        those sizes: ``SizedSnapshot``)."""
        key = (cls, s)
        if key not in self._local:
            tid, dist_cls = self.names[cls]
            mesh = self._meshes.setdefault(s, self.mesh if s == self.mesh.shape else DeviceMesh.row_major(s, self.mesh.axis_names))
            self._local[key] = self._sized.sharding(dist_cls, mesh, self.fusion.tensors[tid].shape,
                                                    self.ids).local_shape
        return self._local[key]

    def _law(self, p: Pricing, n: ENode, k: int | None, copies: int) -> Law:
        return lambda s: int(p.formula(self.prof, self._quantities(p, n, k, copies, s)))

    def _candidates(self, n: ENode) -> list[Law]:
        """The laws node ``n`` may have been priced by, in the order they are tried
        (``cost_laws.PRICINGS``; a collective with each count of reorder copies it may pay)."""
        k = self.snap.i64(n.args[0]) if n.ctor in OP_CTORS else None
        out: list[Law] = []
        for p in PRICINGS:
            if n.ctor not in p.ctors or p.selector and k not in self._selected[p.selector]:
                continue
            if p.fixed:
                raise ReshardError(f"symbolic mesh: {p.fixed} cannot be re-priced at other sizes; optimize it at "
                                   "each size")
            copies = range(TEAM_CTORS[n.ctor].reorder_copies + 1) if n.ctor in TEAM_CTORS else range(1)
            out += [self._law(p, n, k, c) for c in copies]
        return out

    def _identify(self, n: ENode, base: tuple[int, ...]) -> Law:
        """The law of node ``n``: the first candidate giving its e-graph cost at ``base``."""
        if n.ctor == "InAt":
            return lambda s: 0
        for law in self._candidates(n):
            if law(base) == n.cost:
                return law
        raise ReshardError(f"internal: e-node {n.ctor}{n.args} costs {n.cost} ps in the e-graph, and no cost law "
                           "re-pricing knows gives that; it cannot be priced at other mesh sizes")

    def prices(self, sizes: Sequence[int]) -> list[int]:
        """The cost of every node at mesh sizes ``sizes`` (per axis, in the mesh's order)."""
        s = tuple(sizes)
        return [law(s) for law in self.laws]


class SizedSnapshot:
    """``snap`` (saturated on ``base``) read on another mesh of the same axes: every attribute
    is the snapshot's, but ``sharding`` decodes on ``base`` and rebuilds the sharding from its
    placements on the mesh asked for (the sizes' class keeps the placements even there)."""

    def __init__(self, snap: Snapshot | MergedSnapshot, base: DeviceMesh) -> None:
        self._snap, self._base = snap, base

    def __getattr__(self, name: str) -> Any:
        return getattr(self._snap, name)

    def sharding(self, dist_cls: Any, mesh: DeviceMesh, shape: tuple[int, ...], ids: dict[Any, Any]
                 ) -> TensorSharding:
        """Distribution class ``dist_cls`` of a value of ``shape`` on ``mesh`` (``Snapshot.sharding``
        on the e-graph's own mesh, rebuilt from its placements on another)."""
        ts = self._snap.sharding(dist_cls, self._base, shape, ids)
        if mesh == self._base:
            return ts
        if ts.placements is None:  # a fused shard decoded in its other form
            axes = tuple(p if isinstance(p, (Replicate, Partial)) else _block_of_cyclic(p) for p in ts.axes)
            ts = TensorSharding(ts.mesh, ts.shape, axes, ts.true_shape)
        if ts.placements is None:
            raise ReshardError(f"symbolic mesh: the plan holds a value at {ts}, a sharding with no placement "
                               f"list, which cannot be read at mesh shape {mesh.shape}; optimize at that size")
        out = TensorSharding.from_placements(shape, ts.placements, mesh)
        if out.true_shape is not None:
            raise ReshardError(f"internal: {ts.placements} of shape {shape} is uneven at mesh shape {mesh.shape}, "
                               "in a size class that keeps it even")
        return out


def _block_of_cyclic(x: ID) -> ID:
    """``x`` with each ``Inner(Outer(y, P), p)`` (p | P) written ``Outer(Inner(y, p), P/p)``, the
    form ``TensorSharding.placements`` reads as a ``FusedShard`` (``rules.id_algebra``'s
    outer-inner law: both are (y mod e/p) div e/P)."""
    if isinstance(x, Inner) and isinstance(x.x, Outer) and x.x.parts % x.parts == 0:
        return Outer(Inner(_block_of_cyclic(x.x.x), x.parts), x.x.parts // x.parts)
    if isinstance(x, (Outer, Inner)):
        return type(x)(_block_of_cyclic(x.x), x.parts)
    if isinstance(x, Merge):
        return Merge(_block_of_cyclic(x.x), _block_of_cyclic(x.y))
    return x
