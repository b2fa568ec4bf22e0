"""Meshes whose axis sizes are symbols: the sizes a plan is made for, the divisibility facts a
user declares, and the size classes within which one saturated e-graph serves every size.

``SymbolicMesh`` names its axes, the sizes each may take (its domain) and the divisibility
facts (``divisible={"tp": [4096, 32]}``: tp divides 4096 and 32; a tuple of axes, the product
of their sizes).  ``at(tp=8)`` is the concrete ``DeviceMesh`` at those sizes (ranks in
row-major order).  A program on a symbolic mesh is a function of the concrete mesh (its
shapes may read the sizes), built at each size.

**Size classes** (``size_class``).  The e-graph of a program depends on the mesh sizes only
through the guards of its rules, and every guard compares a product of axis sizes with an
extent the program makes: it divides it, equals it, or is a multiple of it (the IterDomain
laws: ``p | e(x)``, ``p = e(x)``, ``e(x) | p``; the candidates: which dims a product of axes
divides).  The extents are the program's dims and, where an op splits or merges dims
(a reshape), the products of consecutive dims and their quotients (``extents``).  Two sizes with
the same answers to every such question, for the same prepared program (ops, shapes,
placements), saturate to the same e-graph up to the sizes themselves: one is saturated and
the other re-priced from it.  This is an argument over the rules of ``rules.id_algebra`` and
``rules.resharding`` as they are, checked by the tests (each size's plan equal to the concrete
``optimize``'s), not a proof the e-graph checks.  A question whose answer differs puts the sizes in different
classes (each saturated once), so the key errs on the side of saturating more.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ReshardError
from .fused_shard import FusedShard
from .ids import ID, Inner, Merge, Outer, Root, extent, root_dims
from .fusion import Fusion, Op, Tensor
from .mesh import DeviceMesh
from .ops import op_kind
from .ops.registry import RED
from .sharding import Partial, Replicate, TensorSharding

#: an axis, or a tuple of axes whose sizes multiply
AxisGroup = str | tuple[str, ...]
#: sizes by axis name
Sizes = dict[str, int]


@dataclass(frozen=True)
class Fact:
    """``axes`` (the product of their sizes) divides ``extent``."""

    axes: tuple[str, ...]
    extent: int

    def holds(self, sizes: Mapping[str, int]) -> bool:
        """Whether the product of the axes' ``sizes`` divides the extent."""
        return self.extent % math.prod(sizes[a] for a in self.axes) == 0

    def __str__(self) -> str:
        return f"{'*'.join(self.axes)} | {self.extent}"


class SymbolicMesh:
    """A mesh of named axes whose sizes are symbols ranging over ``sizes`` (a domain per axis),
    with the divisibility facts ``divisible`` (module docstring).  Bad input: ``ReshardError``."""

    def __init__(self, axis_names: Sequence[str], sizes: Mapping[str, Iterable[int]],
                 divisible: Mapping[AxisGroup, Iterable[int]] | None = None) -> None:
        names = tuple(axis_names)
        if not names or len(set(names)) != len(names) or not all(isinstance(a, str) for a in names):
            raise ReshardError(f"DeviceMesh.symbolic: axis names must be distinct strings, got {axis_names!r}")
        if set(sizes) != set(names):
            raise ReshardError(f"DeviceMesh.symbolic: sizes are given for {sorted(sizes)}, the axes are {list(names)}")
        domain: dict[str, tuple[int, ...]] = {}
        for a in names:
            vals = tuple(sorted(set(sizes[a])))
            if not vals or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in vals):
                raise ReshardError(f"DeviceMesh.symbolic: the sizes of axis {a!r} must be positive ints, "
                                   f"got {sizes[a]!r}")
            domain[a] = vals
        facts = []
        for group, extents in (divisible or {}).items():
            axes = (group,) if isinstance(group, str) else tuple(group)
            unknown = [a for a in axes if a not in names]
            if unknown or not axes:
                raise ReshardError(f"DeviceMesh.symbolic: divisibility fact for {group!r} names no axis of "
                                   f"{list(names)}")
            for e in extents:
                if not isinstance(e, int) or isinstance(e, bool) or e < 1:
                    raise ReshardError(f"DeviceMesh.symbolic: divisibility fact {group!r} | {e!r}: the extent "
                                       "must be a positive int")
                facts.append(Fact(axes, e))
        self.axis_names = names
        self.domain = domain
        self.facts = tuple(facts)
        for point in self.points():
            self.check(point)

    def __repr__(self) -> str:
        return (f"SymbolicMesh(axes={self.axis_names}, sizes={self.domain}, "
                f"divisible=[{', '.join(map(str, self.facts))}])")

    def points(self) -> list[Sizes]:
        """Every combination of the axes' sizes, in lexicographic order of the axes."""
        return [dict(zip(self.axis_names, c)) for c in itertools.product(*(self.domain[a] for a in self.axis_names))]

    def point(self, given: Mapping[str, int], where: str, fusion: Fusion | None = None) -> Sizes:
        """``given`` as sizes of this mesh: every axis named once, a positive int, every fact
        holding there (in the domain or not); else ``ReshardError`` (naming, given the program
        ``fusion``, the tensor dims the broken fact splits)."""
        if set(given) != set(self.axis_names):
            raise ReshardError(f"{where}: give a size for each axis {list(self.axis_names)}, got {sorted(given)}")
        out = {a: given[a] for a in self.axis_names}
        for a, n in out.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ReshardError(f"{where}: {a}={n!r}: a size is a positive int")
        self.check(out, fusion)
        return out

    def check(self, sizes: Mapping[str, int], fusion: Fusion | None = None) -> None:
        """Every declared fact holds at ``sizes``; else ``ReshardError`` naming the fact and,
        given the program ``fusion``, the dims its fixed shardings split by it."""
        for f in self.facts:
            if not f.holds(sizes):
                at = ", ".join(f"{a}={sizes[a]}" for a in f.axes)
                dims = [] if fusion is None else [
                    f"{name} dim {d}" for name, ts in fixed_shardings(fusion) for d, axes in sharded_dims(ts).items()
                    if ts.shape[d] == f.extent and tuple(ts.mesh.axis_names[a] for a in axes) == f.axes]
                split = f", which splits {', '.join(dims)}" if dims else ""
                raise ReshardError(f"SymbolicMesh: {at} violates the divisibility fact {f} (declared in "
                                   f"divisible=){split}: {math.prod(sizes[a] for a in f.axes)} does not divide "
                                   f"{f.extent}")

    def at(self, **sizes: int) -> DeviceMesh:
        """The concrete mesh at ``sizes`` (ranks 0.. in row-major order), checked by ``point``."""
        point = self.point(sizes, "SymbolicMesh.at")
        return DeviceMesh.row_major([point[a] for a in self.axis_names], self.axis_names)

    def check_program(self, fusion: Any, sizes: Mapping[str, int]) -> None:
        """Every dim a fixed sharding (an input's, an output's, a redistribute target's) of
        ``fusion`` splits over mesh axes A is covered by a declared fact ``A | extent``, so
        that the split is even at every size of the domain; else ``ReshardError`` naming the
        tensor, the dim and the fact to declare."""
        for name, ts in fixed_shardings(fusion):
            for d, axes in sharded_dims(ts).items():
                group = tuple(self.axis_names[a] for a in axes)
                declare = repr(group if len(group) > 1 else group[0])
                if not any(f.axes == group and f.extent == ts.shape[d] for f in self.facts):
                    raise ReshardError(
                        f"symbolic mesh: {name} dim {d} (extent {ts.shape[d]}) is split over "
                        f"{'*'.join(group)} (={math.prod(sizes[a] for a in group)} here), but no divisibility fact "
                        f"says {'*'.join(group)} | {ts.shape[d]}: declare it (divisible={{{declare}: "
                        f"[{ts.shape[d]}]}}) or shard another dim")


def mesh_for(fusion: Fusion, sizes: Mapping[str, Iterable[int]]) -> SymbolicMesh:
    """A symbolic mesh of ``fusion``'s axes whose facts are the splits its fixed shardings make
    (each dim an input, output or redistribute target splits over axes A: ``A | extent``) and
    whose domain is every combination of ``sizes`` (per axis) satisfying them (an axis keeps
    the sizes of those combinations)."""
    names = fusion.tensors[0].mesh.axis_names if fusion.tensors else ()
    facts: dict[AxisGroup, set[int]] = {}
    for _, ts in fixed_shardings(fusion):
        for d, axes in sharded_dims(ts).items():
            group = tuple(names[a] for a in axes)
            facts.setdefault(group if len(group) > 1 else group[0], set()).add(ts.shape[d])
    rules = [Fact((g,) if isinstance(g, str) else g, e) for g, es in facts.items() for e in es]
    if set(sizes) != set(names):
        raise ReshardError(f"mesh_for: sizes are given for {sorted(sizes)}, the program's axes are {list(names)}")
    ok = [dict(zip(names, c)) for c in itertools.product(*(sizes[a] for a in names))]
    ok = [c for c in ok if all(f.holds(c) for f in rules)]
    if not ok:
        raise ReshardError(f"mesh_for: no combination of {dict(sizes)} splits every fixed dim evenly "
                           f"({', '.join(map(str, rules))})")
    domain = {a: sorted({c[a] for c in ok}) for a in names}
    return SymbolicMesh(names, domain, {g: sorted(es) for g, es in facts.items()})


def fixed_shardings(fusion: Fusion) -> list[tuple[str, TensorSharding]]:
    """(where, sharding) of every sharding ``fusion`` fixes (``Fusion.fixed_shardings``: inputs,
    redistribute targets, outputs; a redistribute's operand is its target's twin)."""
    return [(f"{what} {fusion.tensors[tid].name}", ts) for what, tid, ts in fusion.fixed_shardings()
            if what != "redistribute operand"]


def sharded_dims(ts: TensorSharding) -> dict[int, tuple[int, ...]]:
    """dim -> the mesh axes its placements split it over (``TensorSharding.placements``; a
    sharding with no placement list: every dim an axis's index reads, with all its axes)."""
    out: dict[int, list[int]] = {}
    if ts.placements is not None:
        for a, p in enumerate(ts.placements):
            if not isinstance(p, (Replicate, Partial)):
                out.setdefault(p.dim, []).append(a)
    else:
        for a in ts.bound_axes:
            for d in root_dims(ts.axes[a]):
                out.setdefault(d, []).append(a)
    return {d: tuple(a) for d, a in out.items()}


def _placement_key(ts: TensorSharding | None) -> Any:
    """A sharding as its placements (the same at every size), or its IDs when it has none (a
    key naming the sizes: such programs get a class per size)."""
    if ts is None:
        return None
    if ts.placements is not None:
        return ("placements", ts.shape, tuple(repr(p) for p in ts.placements), ts.true_shape)
    return ("ids", ts.shape, tuple(str(p) for p in ts.axes), ts.mesh.shape, ts.true_shape)


def _attr_key(v: Any) -> Any:
    if isinstance(v, TensorSharding):
        return _placement_key(v)
    if isinstance(v, DeviceMesh):
        return ("mesh", v.axis_names)
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _attr_key(x)) for k, x in v.items()))
    return repr(v)


def program_key(fusion: Any) -> tuple:
    """What of a (prepared) Fusion the e-graph reads, with each sharding as its placements: two
    sizes whose programs have equal keys differ only in the mesh sizes."""
    tensors = tuple((t.name, t.shape, t.dtype, _placement_key(t.sharding)) for t in fusion.tensors)
    ops = tuple((op.kind, op.inputs, op.output, _attr_key(op.attrs)) for op in fusion.ops)
    outs = tuple((t, _placement_key(ts)) for t, ts in fusion.outputs)
    return tensors, ops, outs


def _subterms(x: ID) -> Iterable[ID]:
    yield x
    if isinstance(x, (Outer, Inner)):
        yield from _subterms(x.x)
    elif isinstance(x, Merge):
        yield from _subterms(x.x)
        yield from _subterms(x.y)


def _runs(shape: Sequence[int]) -> set[int]:
    """The products of consecutive dims of ``shape``."""
    return {math.prod(shape[i:j]) for i in range(len(shape)) for j in range(i + 1, len(shape) + 1)}


def extents(fusion: Any) -> list[int]:
    """The extents the e-graph's guards compare mesh sizes with (module docstring): every dim;
    for an op whose index map splits or merges dims (a reshape, a slice of parts), the products
    of consecutive dims of its operands and result, and the extents and split factors of its
    index terms; a fused shard's parts.  (A split of a merge leaves a product of the dims after
    the split point, itself consecutive: ``Outer(Inner(M, p), q)`` with ``p`` a product of leading
    dims of ``M``'s group.)"""
    out: set[int] = {e for t in fusion.tensors for e in t.shape}
    for op in fusion.ops:
        kind = op_kind(op.kind)
        if kind.strategy == "input":
            continue
        terms: list[ID] = []
        for slot in range(kind.slots(op)):
            terms += [img for img in kind.index_map(fusion, op, slot) if img is not None and img != RED]
            for x, y in kind.part_map(fusion, op, slot):
                terms += [x, y]
        if all(isinstance(x, Root) for x in terms):
            continue
        for t in (*op.inputs, op.output):
            out |= _runs(fusion.tensors[t].shape)
        for x in terms:
            for sub in _subterms(x):
                out.add(extent(sub))
                if isinstance(sub, (Outer, Inner)):
                    out.add(sub.parts)
    for _, ts in fixed_shardings(fusion):
        for p in ts.placements or ():
            if isinstance(p, FusedShard):
                out |= {p.groups, ts.shape[p.dim] // p.groups}
    out.discard(0)
    return sorted(out)


def size_class(fusion: Any, sizes: Mapping[str, int], axis_names: Sequence[str]) -> tuple:
    """The class of ``sizes`` for the prepared ``fusion`` (module docstring): its program key
    and, for every product P of a nonempty set of axes and every extent e (``extents``),
    whether P divides e and whether e divides P, and whether each product divides each other
    (and which axes have size 1: such an axis is ``Replicate`` everywhere)."""
    prods = [math.prod(sizes[a] for a in sub) for r in range(1, len(axis_names) + 1)
             for sub in itertools.combinations(axis_names, r)]
    es = extents(fusion)
    rel = tuple((e % p == 0, p % e == 0) for p in prods for e in es)
    among = tuple(q % p == 0 for p in prods for q in prods)
    return program_key(fusion), rel, among, tuple(sizes[a] == 1 for a in axis_names)


def on_mesh(fusion: Fusion, mesh: DeviceMesh) -> Fusion:
    """``fusion`` (built on one mesh) with every tensor on ``mesh``, a mesh of the same axis
    names and other sizes: each fixed sharding rebuilt from its placements at its tensor's
    shape.  A sharding with no placement list names concrete sizes (a cyclic or merged split):
    ``ReshardError`` (give the program as a function of the mesh instead)."""
    meshes = {t.mesh for t in fusion.tensors}
    if len(meshes) != 1:
        raise ReshardError(f"symbolic mesh: the program uses {len(meshes)} meshes; a symbolic program has one")
    old = meshes.pop()
    if old.axis_names != mesh.axis_names:
        raise ReshardError(f"symbolic mesh: the program's mesh has axes {old.axis_names}, the symbolic mesh "
                           f"{mesh.axis_names}")

    def remesh(ts: TensorSharding, shape: tuple[int, ...], where: str) -> TensorSharding:
        if ts.placements is None:
            raise ReshardError(f"symbolic mesh: {where} has the sharding {ts}, which names concrete sizes of "
                               f"{old}; it needs the mesh's sizes: give the program as a function of the mesh")
        return TensorSharding.from_placements(shape, ts.placements, mesh, where)

    def attr(v: Any, shape: tuple[int, ...], where: str) -> Any:
        if isinstance(v, TensorSharding):
            return remesh(v, shape, where)
        return mesh if isinstance(v, DeviceMesh) else v

    out = fusion.copy()
    out.tensors = [Tensor(t.id, t.name, t.shape, t.dtype, mesh,
                          None if t.sharding is None else remesh(t.sharding, t.shape, f"input {t.name}"))
                   for t in fusion.tensors]
    out.ops = [Op(op.index, op.kind, op.inputs, op.output,
                  {k: attr(v, fusion.tensors[op.output].shape, f"op{op.index} {op.kind}") for k, v in op.attrs.items()})
               for op in fusion.ops]
    out.outputs = [(t, remesh(ts, fusion.tensors[t].shape, f"output {fusion.tensors[t].name}"))
                   for t, ts in fusion.outputs]
    return out
