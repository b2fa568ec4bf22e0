"""One saturated e-graph read at other mesh sizes: its e-nodes re-priced, its shardings rebuilt.

An e-graph saturated at sizes ``s0`` serves every size ``s`` of the same size class
(``ir.symbolic``): the same e-nodes exist, with each mesh-size split ``Outer(x, s0_a)`` read
as ``Outer(x, s_a)``.  Only the costs and the shardings change:

* ``Repricer``: the cost of each e-node at ``s``.  The cost rules (``rules.cost`` and the
  families' ``cost-*`` rules) are functions of the local bytes of the node's classes, the
  team size and the node's op; local bytes at ``s`` are ``nbytes(v) / prod(s_a)`` over the
  axes a distribution binds.  Each node's law is identified at ``s0`` by its op's cost facts
  (``viewop``, ``memop``, ``mm``, ``lkgather``, ``atflops``) and checked there: the law
  evaluated at ``s0`` must give the e-graph's own cost exactly (else ``ReshardError``), so
  the Python laws below cannot drift from the rules without failing.  Then it is evaluated
  at ``s``, in the rules' integer arithmetic.
* ``SizedSnapshot``: the snapshot whose decoded shardings are rebuilt on the mesh at ``s``
  from their placements (``TensorSharding.placements``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..ir.collective_kinds import KIND
from ..ir.errors import ReshardError
from ..ir.mesh import DeviceMesh
from ..ir.fusion import Fusion
from ..ir.ids import ID, Inner, Merge, Outer
from ..ir.sharding import Partial, Replicate, TensorSharding
from ..rules.collectives import BY_CTOR
from ..rules.cost import _bw_scale, _mbps
from ..rules.cost_profile import CostProfile
from ..search.segments import MergedSnapshot
from ..search.snapshot import Snapshot, real_classes
from .dag import ENode

#: a law: the cost in ps at mesh sizes ``s`` (per axis)
Law = Callable[[tuple[int, ...]], int]


def _floor_scaled(x: int, k: int, d: int) -> int:
    """floor(x·k/d) as the rules compute it: (x/d)·k + ((x mod d)·k)/d."""
    return (x // d) * k + ((x % d) * k) // d


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
        self._ops = {rel: {snap.i64(r.inputs[0]) for r in snap.rows(rel)}
                     for rel in ("viewop", "memop", "mm", "lkgather")}
        self._i64 = {tab: {snap.i64(r.inputs[0]): snap.i64(r.output) for r in snap.rows(tab)}
                     for tab in ("mmK", "mmitem", "mmpeak", "atflops", "atpeak")}
        self.launch, self.hbm = profile.ps(profile.launch_us), _mbps(profile.hbm_gbps)
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
    def _mem(self, weights: Sequence[tuple[int, Any]]) -> Law:
        """launch + (Σ w·lb(class)) / hbm."""
        return lambda s: self.launch + sum(w * self.lb(c, s) for w, c in weights) * 1000000 // self.hbm

    def _collective(self, n: ENode, copies: int) -> Law:
        """α + bytes·mul(n-1)/n / busbw + ``copies`` reorder copies (``rules.cost._coll``)."""
        kind = BY_CTOR[n.ctor].name
        ck, prof, axis = KIND[kind], self.prof, self.snap.i64(n.args[1])
        buf = n.cls if ck.law_buffer == "result" else n.children[0]

        def law(s: tuple[int, ...]) -> int:
            t = s[axis]
            if prof.collectives.get(kind):
                alpha, gbps = prof.collective(kind, t)
                n_max = t
            else:
                alpha, gbps, n_max = prof.alpha_us[kind], prof.busbw_gbps[kind], max(s)
            m, scale = _bw_scale(gbps, ck.bus_mul, n_max)
            b = self.lb(buf, s)
            copy = self.launch + 2 * b * 1000000 // self.hbm
            return prof.ps(alpha) + _floor_scaled(b, ck.bus_mul * (t - 1) * scale, t * m) + copies * copy
        return law

    def _matmul(self, n: ENode) -> Law:
        """max(memory, launch + flops / Πkf / peak) (``rules.cost.local_rules``): kf_a is the
        axis size where the lhs is split and the result Partial(sum)."""
        k = self.snap.i64(n.args[0])
        ta, tb = n.children[0], n.children[1]
        K, isz, peak = self._i64["mmK"][k], self._i64["mmitem"][k], self._i64["mmpeak"][k]
        mem = self._mem([(1, ta), (1, tb), (1, n.cls)])
        lhs, out = self.axes(ta), self.axes(n.cls)

        def law(s: tuple[int, ...]) -> int:
            kprod = math.prod(t for t, a, o in zip(s, lhs, out) if a == "B" and o == "P:sum")
            flops = 2 * (self.lb(n.cls, s) // isz * K) // kprod
            return max(mem(s), self.launch + _floor_scaled(flops, 1000000, peak))
        return law

    def _attention(self, n: ENode) -> Law:
        """launch + max(bytes / hbm, flops / shards / peak) (``rules.attention``)."""
        k = self.snap.i64(n.args[0])
        fl, pk = self._i64["atflops"][k], self._i64["atpeak"][k]
        kids = [n.cls, *n.children]

        def law(s: tuple[int, ...]) -> int:
            moved = sum(self.lb(c, s) for c in kids) * 1000000 // self.hbm
            return self.launch + max(moved, _floor_scaled(fl // self.shards(n.cls, s), 1000000, pk))
        return law

    def _candidates(self, n: ENode) -> list[Law]:
        """The laws node ``n`` may have been priced by, in the order they are tried."""
        zero: Law = lambda s: 0  # noqa: E731
        kids, out = n.children, n.cls
        if n.ctor in BY_CTOR:
            ck = BY_CTOR[n.ctor]
            if ck.cross_mesh:
                raise ReshardError("symbolic mesh: a program moving values between meshes (cross-mesh transfers) "
                                   "cannot be re-priced at other sizes; optimize it at each size")
            return [self._collective(n, c) for c in range(ck.reorder_copies + 1)]
        if n.ctor == "LocalSlice":
            return [zero, self._mem([(2, out)])]
        if n.ctor == "MakePartial":
            return [zero, self._mem([(1, out)]), self._mem([(1, out), (2, kids[0])])]
        if n.ctor in ("Loc3", "Loc4", "Loc5"):
            return [self._attention(n)]
        if n.ctor == "Expand":
            return [self._mem([(1, kids[0]), (1, out)])]
        k = self.snap.i64(n.args[0])
        if n.ctor == "MMT" or n.ctor == "Loc2" and k in self._ops["mm"]:
            return [self._matmul(n)]
        if n.ctor == "Loc2" and k in self._ops["lkgather"]:
            return [self._mem([(1, kids[1]), (2, out)])]
        if k in self._ops["viewop"]:
            return [zero]
        if k in self._ops["memop"]:
            return [self._mem([(1, c) for c in kids] + [(1, out)])]
        return []

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
