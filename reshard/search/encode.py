"""Fusion -> egglog program: declarations, every rule family, and one fact per op.

Facts are emitted one command per op (no nested mega-expression).  Candidate dists per
tensor (``cand``) are the ones resharding may target: every combination of Replicate /
Shard(d) per mesh axis that splits each dim along one axis at most (``unnested_shardings``;
``rules.candidates`` builds them from the value's dims, the ``cdim`` facts, one per dim rather
than one per dist; on a data axis only the leading dim: ``data_axes``), plus each fixed
sharding (inputs, redistribute targets, outputs) with any subset of its axes replicated, and,
for a fixed sharding with Partial axes, every simple combination with some of those axes
Partial (``partial_steps``); ``resharding``'s rules
add the realized dists and their steps (``keep-partial``, ``slice-candidate``), and ``nesting``'s
the nested ones a realized dist is one step from along a flattened dim (``nest-candidate``).
Open inputs are fed at every simple candidate.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

from ..ir.dim_classes import parameters
from ..ir.errors import ReshardError
from ..ir.fusion import Fusion, Op, Tensor
from ..ir.fusion_meshes import fusion_meshes
from ..ir.ids import ID, Inner, Merge, Outer, Root
from ..ir.mesh import DeviceMesh
from ..ir.ops import op_kind
from ..ir.ops.views import reshape_groups
from ..ir.sharding import Partial, Replicate, Shard, TensorSharding
from ..rules import candidates as candidates_rules
from ..rules import cost as cost_rules
from ..rules import (alias, attention, crossmesh, expand, id_algebra, loading, lookup, nesting, placements, propagation,
                     remat, resharding)
from ..rules.rule import Rule, render_all
from ..rules.schema import schema
from ..rules.transport import RED, index_map, part_map


def id_term(x: ID, space: int) -> str:
    """``x`` as an egglog term over the roots of index space ``space`` (a tensor id, or
    ``contraction_space(k)``): roots of different tensors are different e-nodes."""
    if isinstance(x, Root):
        return f"(Root {space} {x.dim} {x.extent})"
    if isinstance(x, Outer):
        return f"(Outer {id_term(x.x, space)} {x.parts})"
    if isinstance(x, Inner):
        return f"(Inner {id_term(x.x, space)} {x.parts})"
    if isinstance(x, Merge):
        return f"(Merge {id_term(x.x, space)} {id_term(x.y, space)})"
    raise ReshardError(f"internal: not an ID {x!r}")


def contraction_space(k: int) -> int:
    """The index space of matmul op ``k``'s contracted dim (tensor spaces are ids >= 0)."""
    return -(k + 1)


def dist_term(ts: TensorSharding, space: int) -> str:
    """``ts`` as an egglog ``D`` term over index space ``space``.  A mesh axis of size 1 is
    written ``(Rep)`` whatever ``ts`` places there: its one device holds the whole value
    under every placement (``resharding``: no step is ever built on a team of one)."""
    parts = []
    for p, n in zip(ts.axes, ts.mesh.shape):
        if isinstance(p, Replicate) or n == 1:
            parts.append("(Rep)")
        elif isinstance(p, Partial):
            parts.append(f'(Part "{p.op}")')
        else:
            parts.append(f"(Bind {id_term(p, space)})")
    return "(D " + " ".join(parts) + ")"


def seam_facts(ts: TensorSharding, v: int, key: int) -> list[str]:
    """The facts that make value ``v``'s class at ``ts`` the fed class ``key``
    (``(union (real v D) (Seam key))``, ``D`` = ``dist_term(ts, v)``): when every placement is
    Rep, Part or one block of one dim (``Bind(Root)``, ``Bind(Outer(Root))``), flat rows
    (``seamv`` and one ``seam<kind>`` row per axis) that ``search.load`` reads in bulk and the
    ``loading`` rules turn into that union; else the union itself."""
    rows = [f"(seamv {v} {key})"]
    for a, (p, n) in enumerate(zip(ts.axes, ts.mesh.shape)):
        if isinstance(p, Replicate) or n == 1:
            rows.append(f"(seamrep {key} {a})")
        elif isinstance(p, Partial):
            rows.append(f'(seampart {key} {a} "{p.op}")')
        elif isinstance(p, Root):
            rows.append(f"(seamroot {key} {a} {v} {p.dim} {p.extent})")
        elif isinstance(p, Outer) and isinstance(p.x, Root):
            rows.append(f"(seamouter {key} {a} {v} {p.x.dim} {p.x.extent} {p.parts})")
        else:
            return [f"(union (real {v} {dist_term(ts, v)}) (Seam {key}))"]
    return rows


def code(k: int, slot: int) -> int:
    """The transport code of op k's operand ``slot`` (0, 1: into the result; matmul only:
    2, 3: operands into the contraction space; 4, 5: the operand dims that may stay sharded
    while the other operand is replicated)."""
    return 6 * k + slot + 1


def simple_shardings(shape: tuple[int, ...], mesh: DeviceMesh) -> list[TensorSharding]:
    """Every Replicate/Shard(d) combination over the mesh axes that divides evenly."""
    return list(_simple_shardings(tuple(shape), mesh))


@functools.lru_cache(maxsize=4096)
def _simple_shardings(shape: tuple[int, ...], mesh: DeviceMesh) -> tuple[TensorSharding, ...]:
    """``simple_shardings``, once per shape and mesh (the tensors of a program share a few shapes)."""
    out = []
    choices = [Replicate()] + [Shard(d) for d in range(len(shape))]
    for combo in itertools.product(choices, repeat=mesh.ndim):
        try:
            ts = TensorSharding.from_placements(shape, combo, mesh)
        except ReshardError:
            continue
        if ts.true_shape is None:  # uneven ones exist only padded (passes.padding), never inside a plan
            out.append(ts)
    return tuple(out)


def unnested_shardings(shape: tuple[int, ...], mesh: DeviceMesh) -> list[TensorSharding]:
    """The simple shardings (``simple_shardings``) that split each dim along one mesh axis at
    most: the resharding targets every value gets (``candidates``).

    A dim split along several axes (``[S(0), S(0)]``: nested blocks) is a candidate where a fixed
    sharding names it (an input's, an output's, a redistribute's, and their steps) and where a
    realized dist is one step from it along a flattened dim (``nesting``'s ``nest-candidate``);
    a value may also be realized so by a strategy (a reshape merging two dims split along two
    axes, an op on operands so split).  Enumerated for every value, such dists and the
    collectives between them and every other dist were a quarter of a 2 x 2 training step's
    e-graph (the tiny Llama: 634k e-nodes, 464k without them).  On one mesh axis every simple
    sharding is unnested."""
    return list(_unnested_shardings(tuple(shape), mesh))


@functools.lru_cache(maxsize=4096)
def _unnested_shardings(shape: tuple[int, ...], mesh: DeviceMesh) -> tuple[TensorSharding, ...]:
    out = []
    for ts in _simple_shardings(shape, mesh):
        dims = [p.dim for p in ts.placements if isinstance(p, Shard)]
        if len(dims) == len(set(dims)):
            out.append(ts)
    return tuple(out)


#: op kinds whose result may be a *view image* of its operand (``view_image``)
VIEW_IMAGE_KINDS = ("reshape", "detach")


def _splits_are_images(src: tuple[int, ...], dst: tuple[int, ...], mesh: DeviceMesh) -> bool:
    """Is every block split a mesh axis of size n may make of one of ``dst``'s dims
    (``Outer(Root(dst, j, e), n)``, n | e: the simple placements, ``rules.candidates``) the image,
    through the reshape ``src`` -> ``dst``, of the block split of one of ``src``'s dims i, in a
    layout class no dearer: i is dim 0 when j is (a collective or a local slice of a block split
    of dim 0 costs one reorder copy fewer, or nothing: ``rules.cost``'s ``OUTERMOST``; ``src``'s
    step then costs no more than ``dst``'s)?"""
    sizes = [n for n in mesh.shape if n > 1]
    for gi, gj in reshape_groups(src, dst):
        for j in gj:
            for n in sizes:
                if dst[j] % n:
                    continue
                # Outer(dst_j, n) is a block split of src's dim gi[0] iff j leads its group and n | that extent
                if j != gj[0] or src[gi[0]] % n or (j == 0 and gi[0] != 0):
                    return False
    return True


def _free_view(fusion: Fusion, op: Op) -> bool:
    """Is ``op`` a reshape or identity (free at every dist) keeping its operand's dtype, mesh and size?"""
    if op.kind not in VIEW_IMAGE_KINDS or len(op.inputs) != 1:
        return False
    u, v = fusion.tensors[op.inputs[0]], fusion.tensors[op.output]
    return u.dtype == v.dtype and u.mesh == v.mesh and u.numel == v.numel


def view_image(fusion: Fusion, op: Op, mesh: DeviceMesh) -> int | None:
    """The operand u of which ``op``'s result v is a *view image*, or None: op is a free view
    (a reshape, the identity ``detach``: cost 0 at every dist, u's bytes) and every simple
    placement of v is the image of one of u's in a layout class no dearer
    (``_splits_are_images``).  Then every simple dist of v is the transport of a simple dist of
    u, and a resharding step at v costs no less than the same step at u (same local bytes, same
    team, a layout no cheaper): the law in ``rules.resharding``'s docstring."""
    if not _free_view(fusion, op):
        return None
    u, v = fusion.tensors[op.inputs[0]], fusion.tensors[op.output]
    return u.id if _splits_are_images(tuple(u.shape), tuple(v.shape), mesh) else None


def view_preimage(fusion: Fusion, op: Op, mesh: DeviceMesh) -> int | None:
    """The operand u of which ``op``'s result v is a *view preimage* target, or None: op is a
    free view and every simple placement of u is the image of one of v's in a layout class no
    dearer (``_splits_are_images`` the other way: a reshape splitting a dim, ``[b, s, h] -> [b, s,
    heads, d]``, or dropping a leading unit dim, whose v is no view image).  Then every simple
    dist of u carries to a simple dist of v, and a step at u costs no less than the same step
    at v."""
    if not _free_view(fusion, op):
        return None
    u, v = fusion.tensors[op.inputs[0]], fusion.tensors[op.output]
    return u.id if _splits_are_images(tuple(v.shape), tuple(u.shape), mesh) else None


def view_images(fusion: Fusion, mesh: DeviceMesh, cands: dict[int, list[str]],
                nested: dict[int, list[int]]) -> tuple[dict[int, int], dict[int, int]]:
    """Values that get no resharding of their own (no ``made`` or ``cdim`` facts; law in
    ``rules.resharding``'s docstring), on meshes of several axes: (image -> operand, operand ->
    image).  A view image v of u (``view_image``) has none: its steps are u's, carried through
    the view; and an operand u whose only reader (no other op, not an output) is a free view to
    a v with resharding of its own, every simple placement of u the image of one of v's
    (``view_preimage``), has none: its steps are v's, taken after the view.  Either way only a
    value with no fixed candidates (not an output, no redistribute reads it at a dist of its
    own), no nested dims, and that no other op's nodes join (``stands_for``).  Such steps were
    8% of the tiny Llama's 2 x 2 training e-graph (86 of its 125 reshapes are view images)."""
    if mesh.ndim < 2:
        return {}, {}
    joined = {op_kind(op.kind).stands_for(op) for op in fusion.ops} - {op.output for op in fusion.ops}
    outs = {tid for tid, _ in fusion.outputs}
    readers: dict[int, int] = {}
    for op in fusion.ops:
        for t in op.inputs:
            readers[t] = readers.get(t, 0) + 1

    def free(v: int) -> bool:
        return not (v in outs or v in joined or cands.get(v) or nested.get(v))

    images: dict[int, int] = {}
    for op in fusion.ops:
        u = view_image(fusion, op, mesh) if free(op.output) else None
        if u is not None:
            images[op.output] = u
    pre: dict[int, int] = {}
    for op in reversed(fusion.ops):  # a view's result that has no steps of its own is no target
        if (op.output in images or op.output in pre or not op.inputs or readers.get(op.inputs[0]) != 1
                or op.inputs[0] in images):
            continue
        u = view_preimage(fusion, op, mesh) if free(op.inputs[0]) else None
        if u is not None and op_kind(fusion.ops[fusion.producer[u]].kind).strategy != "input":
            pre[u] = op.output
    return images, pre


def partial_steps(ts: TensorSharding) -> list[TensorSharding]:
    """Every unnested simple sharding (``unnested_shardings``) with any subset of its axes
    replaced by ts's Partial placements there: the dists a value passes through on its way to
    a target with Partial axes, made Partial locally one axis at a time (``resharding``'s
    ``partial-of-*`` laws) from whatever simple dist it has.  Empty when ts has no Partial."""
    part = ts.partial_axes
    if not part:
        return []
    out = []
    for sub in unnested_shardings(ts.shape, ts.mesh):
        for keep in itertools.product([True, False], repeat=len(part)):
            axes = list(sub.axes)
            for a, k in zip(part, keep):
                if k:
                    axes[a] = ts.axes[a]
            try:
                out.append(TensorSharding(ts.mesh, ts.shape, tuple(axes)))
            except ReshardError:
                continue
    return out


def replicated_subsets(ts: TensorSharding) -> list[TensorSharding]:
    """ts with every subset of its axes replaced by Replicate (steps toward ts)."""
    out = []
    axes = range(len(ts.axes))
    for keep in itertools.product([True, False], repeat=len(ts.axes)):
        new = tuple(ts.axes[a] if keep[a] else Replicate() for a in axes)
        try:
            out.append(TensorSharding(ts.mesh, ts.shape, new))
        except ReshardError:
            continue
    return out


@dataclass
class Encoding:
    """The egglog program for a Fusion and what decoding needs to read back."""

    fusion: Fusion
    mesh: DeviceMesh
    declarations: str
    #: facts in topological order: the mesh, then one group per Fusion op (its result's size
    #: and candidate dists, then the op's own facts)
    groups: list[list[str]]
    rules: list[Rule]
    output_lets: list[str] = field(default_factory=list)
    #: per output, the fact binding ``output_lets[i]`` to its required dist
    output_facts: list[str] = field(default_factory=list)
    #: view image -> its operand (``view_images``): values with no ``made`` or ``cdim`` facts, so no
    #: resharding of their own; a segment that is fed the operand makes the image (``made_facts``)
    images: dict[int, int] = field(default_factory=dict)

    def made_facts(self, v: int) -> list[str]:
        """The facts that make view image ``v`` after all (its operand fed from an earlier
        segment): ``made`` and its dims (``cdim``), which its op's facts leave out."""
        return [f"(made {v})"] + [f"(cdim {v} {j} {e})" for j, e in enumerate(self.fusion.tensors[v].shape)]

    @property
    def mesh_facts(self) -> list[str]:
        return self.groups[0]

    def op_facts(self, k: int) -> list[str]:
        """The facts of Fusion op ``k`` (its result's size and candidates, then its own)."""
        return self.groups[1 + k]

    def facts(self, groups: list[list[str]] | None = None) -> list[str]:
        """The facts of consecutive groups (default: the whole program's and its outputs'), in order."""
        return [f for g in (self.groups + [self.output_facts] if groups is None else groups) for f in g]


def fusion_mesh(fusion: Fusion) -> DeviceMesh:
    """The Fusion's (first) mesh; every mesh has its shape (``fusion_meshes``)."""
    if not fusion.outputs:
        raise ReshardError("optimize: the Fusion has no outputs (call f.output(t, placements))")
    return fusion_meshes(fusion)[0]


def rule_families(mesh_shape: tuple[int, ...], profile: cost_rules.CostProfile, transfers: bool,
                  lookups: bool = False, expands: bool = False, remats: bool = False,
                  attentions: bool = False) -> dict[str, list[Rule]]:
    """Every rule of a program on a mesh of ``mesh_shape``, by family (the module stating
    it), in the order the e-graph gets them; ``transfers``: the program moves values between
    meshes (``crossmesh``); ``lookups``: it has lookup ops (``lookup``); ``expands``: it has
    ops with expanded dims (``expand``); ``remats``: it starts a backward pass (``remat``);
    ``attentions``: it has fused attention ops (``attention``)."""
    m = len(mesh_shape)
    families = {
        "loading": loading.rules(m), "id_algebra": id_algebra.RULES, "placements": placements.rules(m),
        "propagation": propagation.rules(m),
        "candidates": candidates_rules.rules(m), "resharding": resharding.rules(m), "nesting": nesting.rules(m),
        "cost": (cost_rules.rules(profile, mesh_shape) + cost_rules.partial_rules(profile, m)
                 + cost_rules.local_rules(profile, m) + cost_rules.kf_rules()),
        "alias": alias.rules(),
    }
    if lookups:
        families["lookup"] = lookup.rules(m, profile)
    if expands:
        families["expand"] = expand.rules(m, profile)
    if attentions:
        families["attention"] = attention.rules(profile)
    if remats:
        families["remat"] = remat.rules(profile, expands, lookups, attentions)
    if transfers:
        families["crossmesh"] = crossmesh.rules(m) + crossmesh.cost_rules(profile, math.prod(mesh_shape))
    return families


def encode(fusion: Fusion, profile: cost_rules.CostProfile) -> Encoding:
    mesh = fusion_mesh(fusion)
    m = mesh.ndim
    transfers = any(is_transfer(fusion, op) for op in fusion.ops)
    lookups = any(op_kind(op.kind).strategy == "lookup" for op in fusion.ops)
    expands = any(op_kind(op.kind).expanded_dims(fusion, op) for op in fusion.ops)
    remats = remat.trains(fusion)
    readers = fusion.readers() if remats else None
    attentions = any(op_kind(op.kind).strategy == "attention" for op in fusion.ops)
    rules: list[Rule] = [r for rs in rule_families(mesh.shape, profile, transfers, lookups, expands, remats,
                                                   attentions).values() for r in rs]
    cands, nested = fixed_candidates(fusion, mesh), nested_dims(fusion)
    images, pre = view_images(fusion, mesh, cands, nested)
    groups: list[list[str]] = [[f"(set (axsize {a}) {n})" for a, n in enumerate(mesh.shape)]
                               + axis_dim_facts(fusion, mesh)]
    for op in fusion.ops:
        out = fusion.tensors[op.output]
        facts = [f"(set (nbytes {out.id}) {out.numel * out.itemsize})"]
        facts += [f"(made {v})" for v in dict.fromkeys((out.id, op_kind(op.kind).stands_for(op)))
                  if v not in images and v not in pre]
        if out.id not in images and out.id not in pre:
            facts += [f"(cdim {out.id} {j} {e})" for j, e in enumerate(out.shape)]
        facts += [f"(cand {out.id} {d})" for d in cands[out.id]]
        facts += [f"(nestable {out.id} {j})" for j in nested.get(out.id, ())]
        facts += op_facts(fusion, op, mesh, profile, readers)
        groups.append(facts)
    lets = [f"$out{i}" for i in range(len(fusion.outputs))]
    let_facts = [f"(let $out{i} {dist_term(ts, tid)})" for i, (tid, ts) in enumerate(fusion.outputs)]
    return Encoding(fusion, mesh, schema(m, transfers, lookups, expands, remats, attentions) + render_all(rules),
                    groups, rules, lets, let_facts, images)


def data_axes(fusion: Fusion, mesh: DeviceMesh) -> frozenset[int]:
    """The *data axes* of a training program (``rules.remat.trains``): mesh axes of more than
    one device over which every parameter (an input whose gradient is an output,
    ``grad.<name>``: ``passes.autodiff.joint``'s law) is replicated, every other input is
    replicated or split along its leading dim (``Shard(0)``), some input is split (the batch),
    and every sharding the program fixes besides (``Fusion.fixed_shardings``: redistributes,
    outputs) is Replicate, Partial or ``Shard(0)``, all on ``mesh`` (a program spanning meshes
    has none).  On a data axis a value's candidates and
    slices split only its leading dim (``axis_dim_facts``): another dim reaches a value split
    on that axis only through an op's strategy or a fixed sharding, and an open input (no fixed
    sharding: ``passes.padding``'s masks too) is fed at those candidates.  (A forward program
    has none: a vocab- or column-parallel weight is split along dim 0 too, and its consumers
    then need their other dims split over that axis.)  Law: the search space shrinks, no plan
    is made unsound (every plan is still extracted from the rules' equalities); measured: the
    tiny training configs on a 2 x 2 dp x tp mesh kept their plans with 45-55% fewer e-nodes."""
    if not remat.trains(fusion):
        return frozenset()
    params = parameters(fusion)
    fixed = [(what == "input" and tid in params, what, ts) for what, tid, ts in fusion.fixed_shardings()]
    axes = set()
    for a, n in enumerate(mesh.shape):
        split = False
        for param, what, ts in fixed:
            p = None if ts.placements is None or ts.mesh != mesh else ts.placements[a]
            if not (type(p) is Replicate or not param and type(p) is Shard and p.dim == 0
                    or type(p) is Partial and what != "input"):
                break
            split |= what == "input" and type(p) is Shard
        else:
            if n > 1 and split:
                axes.add(a)
    return frozenset(axes)


def axis_dims(fusion: Fusion, mesh: DeviceMesh) -> list[range]:
    """Per mesh axis, the dims it may split a value along into a candidate (``rules.candidates``,
    ``resharding``'s ``slice-candidate``): every dim of the program's values, but only dim 0 on a
    data axis (``data_axes``)."""
    rank = max((len(t.shape) for t in fusion.tensors), default=0)
    lead = data_axes(fusion, mesh)
    return [range(1 if a in lead else rank) for a in range(mesh.ndim)]


def axis_dim_facts(fusion: Fusion, mesh: DeviceMesh) -> list[str]:
    """``(axdim a j)`` for each dim j mesh axis a may split (``axis_dims``)."""
    return [f"(axdim {a} {j})" for a, dims in enumerate(axis_dims(fusion, mesh)) for j in dims]


def candidates(fusion: Fusion, mesh: DeviceMesh) -> dict[int, list[str]]:
    """Per tensor, the dists resharding may target (see the module docstring): the simple ones
    (``rules.candidates`` builds them in the e-graph) and the fixed shardings' steps."""
    return _candidates(fusion, mesh, simple=True)


def fixed_candidates(fusion: Fusion, mesh: DeviceMesh) -> dict[int, list[str]]:
    """Per tensor, the candidates its fixed shardings add to the simple ones: the facts
    ``encode`` states (``rules.candidates`` builds the simple ones from each value's dims)."""
    return _candidates(fusion, mesh, simple=False)


def _candidates(fusion: Fusion, mesh: DeviceMesh, simple: bool) -> dict[int, list[str]]:
    cands: dict[int, dict[str, None]] = {t.id: {} for t in fusion.tensors}
    dims = axis_dims(fusion, mesh)  # (the simple ones the rules build: ``axis_dim_facts``)
    for t in fusion.tensors:
        for ts in unnested_shardings(t.shape, mesh):
            if all(not isinstance(p, Shard) or p.dim in dims[a] for a, p in enumerate(ts.placements)):
                cands[t.id][dist_term(ts, t.id)] = None
    fixed: dict[int, dict[str, None]] = {t.id: {} for t in fusion.tensors}
    for _, tid, ts in fusion.fixed_shardings():
        for sub in replicated_subsets(ts) + partial_steps(ts):
            term = dist_term(sub, tid)
            if term not in cands[tid]:
                fixed[tid][term] = None
    return {tid: list(cands[tid]) + list(fixed[tid]) if simple else list(fixed[tid]) for tid in cands}


def nested_dims(fusion: Fusion) -> dict[int, list[int]]:
    """Per tensor, the dims a fixed sharding of it (``Fusion.fixed_shardings``) splits along
    several mesh axes: ``nesting``'s ``nestable`` facts."""
    out: dict[int, dict[int, None]] = {}
    for _, tid, ts in fusion.fixed_shardings():
        dims = [p.dim for p in ts.placements or () if isinstance(p, Shard)]  # (None: no placement list)
        out.setdefault(tid, {}).update(dict.fromkeys(d for d in dims if dims.count(d) > 1))
    return {tid: list(ds) for tid, ds in out.items() if ds}


def unmet_redistribute(fusion: Fusion, reachable: set[int]) -> ReshardError | None:
    """The error naming the first pinned redistribute (program order) whose operand has a
    plan but whose result has none (``reachable``: the tensor ids with a plan at some dist),
    or None.  A pinned redistribute's result is only ever made by the redistribute itself (at
    the requested dist; every other dist of it by resharding that one), so such a result
    means the requested sharding cannot be met there, whatever the outputs then report."""
    for op in fusion.ops:
        if op.kind != "redistribute" or not op.attrs.get("pin") or is_transfer(fusion, op):
            continue
        src, res = fusion.tensors[op.inputs[0]], fusion.tensors[op.output]
        if src.id in reachable and res.id not in reachable:
            return ReshardError(f"optimize: found no way to meet the pinned redistribute op{op.index}: "
                                f"{res!r} = redistribute({src!r} -> {op.attrs['sharding']}); no plan makes "
                                f"{src.name} that sharding at this point{stuck_hint(fusion)}")
    return None


def replicable_axis_by_axis(ts: TensorSharding) -> bool:
    """Does every subset of ``ts``'s axes replaced by Replicate give a valid sharding (each
    single-axis step towards or away from it exists, ``replicated_subsets``)?"""
    return len(replicated_subsets(ts)) == 2 ** len(ts.axes)


def stuck_inputs(fusion: Fusion) -> list[Tensor]:
    """The inputs fed at a loop-domain sharding that no single-axis step leaves: replacing some
    of its axes by Replicate gives no valid sharding (a rank's elements would not form a
    rectangle, ``replicated_subsets``), and every resharding step moves one mesh axis, so a
    value computed from one reaches only the shardings its ops carry it to."""
    return [t for i in fusion.inputs if (t := fusion.tensors[i]).sharding is not None
            and not replicable_axis_by_axis(t.sharding)]


def stuck_hint(fusion: Fusion) -> str:
    """What a "no plan" error adds: the inputs fed at a sharding no single-axis step leaves
    (``stuck_inputs``), the likely cause ("" when none is)."""
    stuck = stuck_inputs(fusion)
    return "" if not stuck else "; " + ", ".join(f"input {t.name!r} is fed at {t.sharding}" for t in stuck) + (
        ", which no step on one mesh axis leaves (replicating any one of its axes gives no valid sharding): "
        "feed it at a sharding whose axes can each be replicated, or redistribute it from one")


def no_output_plan(fusion: Fusion, tid: int, ts: TensorSharding) -> ReshardError:
    """The error for output ``tid`` having no plan at its required sharding ``ts`` (``stuck_hint``)."""
    return ReshardError(f"optimize: found no way to produce output {fusion.tensors[tid]!r} with sharding {ts}"
                        + stuck_hint(fusion))


def is_transfer(fusion: Fusion, op: Op) -> bool:
    """Is ``op`` a redistribute to another mesh (a cross-mesh transfer)?"""
    return op.kind == "redistribute" and fusion.tensors[op.inputs[0]].mesh != fusion.tensors[op.output].mesh


def input_feeds(fusion: Fusion, op: Op, mesh: DeviceMesh) -> list[str]:
    """The dist terms input op ``op``'s value is fed at (its sharding, or every simple one)."""
    out = fusion.tensors[op.output]
    feeds = [out.sharding] if out.sharding is not None else simple_shardings(out.shape, mesh)
    return [dist_term(ts, out.id) for ts in feeds]


def attention_strategies(fusion: Fusion, op: Op, mesh: DeviceMesh) -> list[tuple[str, list[str], int, int, int]]:
    """The local strategies of a fused op (``strategy`` ``"attention"``): per combination of
    Replicate / Shard(d) / Partial over the mesh axes that splits its result evenly, each choice
    of the operands' placements its declaration gives per axis (``OpKind.operand_strategies``),
    as dist terms (the result's, the operands'), with the local step's work on those shards
    (``OpKind.local_work``: flops, bytes, kernels); combinations whose operand dists split unevenly have
    none."""
    spec = op_kind(op.kind)
    out = fusion.tensors[op.output]
    ins = [fusion.tensors[i] for i in op.inputs]
    places = [Replicate()] + [Shard(d) for d in range(len(out.shape))] + [Partial("sum"), Partial("max")]
    found = []
    for combo in itertools.product(places, repeat=mesh.ndim):
        for lays in itertools.product(*(spec.operand_strategies(fusion, op, p) for p in combo)):
            try:
                res = TensorSharding.from_placements(out.shape, list(combo), mesh)
                opers = [TensorSharding.from_placements(t.shape, [ps[i] for ps in lays], mesh)
                         for i, t in enumerate(ins)]
            except ReshardError:
                continue
            if res.true_shape is None and all(ts.true_shape is None for ts in opers):
                work = spec.local_work([ts.local_shape for ts in opers], res.local_shape, out.itemsize)
                found.append((dist_term(res, out.id), [dist_term(ts, t.id) for ts, t in zip(opers, ins)], *work))
    return found


def op_facts(fusion: Fusion, op: Op, mesh: DeviceMesh, profile: cost_rules.CostProfile,
             readers: dict[int, list[Op]] | None = None) -> list[str]:
    """The facts that describe Fusion op ``op``, from its registered declaration
    (``reshard.ir.ops``): fed inputs, index maps, linearity (``keeps``, ``redop``), the strategy
    relation (``unop``, ``binop``, ``mm``, ``lookup``), cost-law selectors; ``readers``
    (``Fusion.readers``) in a program that trains: ``rules.remat``'s facts."""
    k = op.index
    spec = op_kind(op.kind)
    out = fusion.tensors[spec.stands_for(op)]  # an op declared equal to another value joins its classes
    facts: list[str] = []
    if spec.strategy == "input":
        return [f'(union (real {out.id} {dt}) (InAt "{out.name}" {dt}))' for dt in input_feeds(fusion, op, mesh)]
    transfer = is_transfer(fusion, op)
    if op.kind == "redistribute" and not transfer:
        # the requested dist, and (as an identity unary op below) every dist of the operand:
        # the communication the user wrote may then move to where it is cheapest (after a
        # reduction, a cast to a narrower dtype, ...)
        ts = op.attrs["sharding"]
        u = op.inputs[0]
        facts.append(f"(redist {k} {u} {out.id} {dist_term(ts, u)} {dist_term(ts, out.id)})")
        if op.attrs.get("pin"):  # materialized exactly as asked: not an identity op
            return facts + cost_rules.local_cost_facts(k, spec.cost, profile)
    for slot in range(spec.slots(op)):
        c = code(k, slot)
        src = fusion.tensors[op.inputs[slot % 2]]
        dst_space = contraction_space(k) if slot in (2, 3) else out.id
        for d, img in enumerate(index_map(fusion, op, slot)):
            if img is None:
                continue
            if isinstance(img, Root):  # the common case, a row loaded in bulk (``load``)
                facts.append(f"(rootmap {src.id} {d} {src.shape[d]} {c} {dst_space} {img.dim} {img.extent})")
                continue
            rhs = "(Red)" if img == RED else id_term(img, dst_space)
            facts.append(f"(union (Tr (Root {src.id} {d} {src.shape[d]}) {c}) {rhs})")
        for x, y in part_map(fusion, op, slot):
            facts.append(f"(union (Tr {id_term(x, src.id)} {c}) {id_term(y, dst_space)})")
        red = spec.reduces(op)
        if red is not None:
            facts.append(f'(redop {c} "{red}")')
        facts += [f'(keeps {c} "{p}")' for p in spec.keeps(op)]
    strategy = spec.strategy or ("binop" if len(op.inputs) == 2 else "unop")
    if strategy == "mm":
        a, b = op.inputs
        facts.append(f"(mm {k} {a} {b} {out.id})")
        facts.append(f"(mmcodes {k} {' '.join(str(code(k, s)) for s in range(6))})")
        facts += cost_rules.local_cost_facts(k, spec.cost, profile, contraction=fusion.tensors[a].shape[-1],
                                             itemsize=out.itemsize)
    elif strategy == "attention":
        facts += attention.facts(k, out.id, op.inputs, attention_strategies(fusion, op, mesh),
                                 cost_rules.peak_rate(profile, out.itemsize))
    elif strategy == "lookup":  # a gather's cost law is the family's cost-lookup, a scatter's its declared one
        rows = spec.scattered_dims(fusion, op)
        facts += lookup.facts(k, op.inputs[0], op.inputs[1], out.id, [code(k, s) for s in range(6)], rows)
        if rows:
            facts += cost_rules.local_cost_facts(k, spec.cost, profile)
    elif strategy == "binop":
        a, b = op.inputs
        facts.append(f"(binop {k} {a} {b} {out.id} {code(k, 0)} {code(k, 1)})")
        facts += cost_rules.local_cost_facts(k, spec.cost, profile)
    elif transfer:
        u = op.inputs[0]
        facts += crossmesh.facts(k, u, out.id, code(k, 0), fusion.tensors[u].mesh.size, out.mesh.size)
    else:
        facts.append(f"(unop {k} {op.inputs[0]} {out.id} {code(k, 0)})")
        facts += cost_rules.local_cost_facts(k, spec.cost, profile)
        facts += expand.facts(out.id, spec.expanded_dims(fusion, op))
        if alias.is_view_transpose(op):
            facts.append(f"(tview {k})")
    if readers is not None:
        facts += remat.facts(fusion, k, code(k, 0), readers)
    return facts
