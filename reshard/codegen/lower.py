"""Extracted plan (PlanNodes) -> SPMD host program.

Each PlanNode becomes a few steps on buffers named after it:

* ``InAt``: a program input (the caller feeds the local shard at the chosen sharding);
* ``Loc``/``Loc2``: one ``apply`` step (``reshape`` and ``redistribute`` to the dist a
  value already has are views; chains of elementwise steps are then fused into one
  ``apply pointwise`` step, ``codegen.fuse``); ``MMT``: the matmul's ``apply`` step with
  ``transposed`` set for the operands it reads through a view of the permute's operand;
* ``AllGather``: flatten -> ``allgather`` -> ``remap gather``;
* ``LocalSlice``: ``remap slice`` (no communication);
* ``AllReduce``: ``allreduce``;
* ``ReduceScatter``: ``remap scatter`` -> ``reduce_scatter`` (with the Partial's op) -> view;
* ``MakePartial``: ``partial`` (no communication; ``runtime.local_ops.make_partial``);
* ``AllToAll``: ``remap a2a_send`` -> ``all_to_all`` -> ``remap a2a_recv``;
* cross-mesh ``SendRecv``: ``send_recv`` over the pairs (A[i], B[i]); ``Bcast``: ``broadcast``
  on the explicit team [A[src]] + B (root 0); ``Scatter``: ``remap pieces`` on A[src] (a dummy
  piece for itself, then B's pieces in rank order) -> ``scatter`` on [A[src]] + B -> view.

A Fusion on several meshes (cross-mesh transfers) lowers to a multi-mesh program
(``Program.meshes``): each step of a value on mesh j carries ``on=j`` and its collectives run on
stacked axis a + 1.  One-mesh Fusions lower exactly as before.

Collectives always act on flat buffers along dim 0 (what NCCL moves); the remaps put
elements where the shardings say.  Buffers are freed after their last use.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..egraph_rules.alternatives import COLLECTIVES as COLLECTIVE_KINDS
from ..egraph_rules.alternatives import TRANSFERS, collective_bytes, transfer_bytes
from ..egraph_rules.cost import COPIES
from ..egraph_rules.encode import fusion_meshes
from ..egraph_rules.extract import PlanNode
from ..egraph_rules.schema import OP_CTORS
from ..ir.errors import ReshardError
from ..ir.fusion import Fusion, Tensor
from ..ir.ids import Outer, Root
from ..ir.mesh import DeviceMesh
from ..ir.ops import op_kind
from ..ir.sharding import Partial, TensorSharding, sharding_to_spec
from .fuse import fuse_pointwise
from .program import COLLECTIVES, Program, Step


@dataclass(frozen=True)
class Communication:
    """One collective of a plan.  ``bytes`` is the per-rank buffer NCCL is handed (result
    of an allgather, operand of the others); ``moved_bytes`` what each rank receives."""

    kind: str
    axis: str
    team_size: int
    tensor: str
    src: str
    dst: str
    bytes: int
    moved_bytes: int
    #: modeled time: α-β of the collective plus its buffers' reorder copies
    cost_s: float
    #: local copies that put the buffer in the order the collective needs (0 when the
    #: communicated dim is outermost; see ``egraph_rules.cost.COPIES``)
    reorder_copies: int = 0


@dataclass(frozen=True)
class LoweredPlan:
    program: Program
    inputs: tuple[tuple[str, str, TensorSharding], ...]      # buffer, input name, sharding
    outputs: tuple[tuple[str, TensorSharding], ...]          # buffer, sharding
    local_inputs: dict[str, tuple[tuple[int, ...], str]]     # buffer -> (local shape, dtype)
    communications: tuple[Communication, ...]
    nodes: tuple[PlanNode, ...]


def _topo(roots: list[PlanNode]) -> list[PlanNode]:
    order: list[PlanNode] = []
    seen: set[int] = set()
    stack: list[tuple[PlanNode, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n.uid in seen:
            continue
        seen.add(n.uid)
        stack.append((n, True))
        stack.extend((a, False) for a in reversed(n.args) if a.uid not in seen)
    return order


def _apply_attrs(fusion: Fusion, op_index: int, out: PlanNode) -> dict:
    """The ``apply`` step of Fusion op ``op_index`` (its registered ``step_attrs``)."""
    op = fusion.ops[op_index]
    return {"op": "apply", "fop": op.kind, **op_kind(op.kind).step_attrs(fusion, op, out.sharding.local_shape)}


def _outermost(p: object) -> bool:
    """A block split of dim 0 (``Root`` itself when the dim has one element per device)."""
    return isinstance(p, Root) and p.dim == 0 or isinstance(p, Outer) and isinstance(p.x, Root) and p.x.dim == 0


def reorder_copies(kind: str, src: object, dst: object) -> int:
    """How many reorder copies a collective's buffers need (the law of the cost rules'
    ``COPIES`` and layout variants): one fewer when the communicated dim is the outermost
    one (the gathered source, the scattered target, either side of an all-to-all)."""
    outer = {"allgather": _outermost(src), "reduce_scatter": _outermost(dst),
             "all_to_all": _outermost(src) or _outermost(dst)}.get(kind, False)
    return COPIES[kind] - 1 if outer else COPIES.get(kind, 0)


def lower(fusion: Fusion, roots: list[PlanNode], seconds_per_ps: float = 1e-12) -> LoweredPlan:
    """Turn the extracted plan into a host program (identical on every rank)."""
    meshes = fusion_meshes(fusion)
    multi = len(meshes) > 1
    order = _topo(roots)
    buf: dict[int, str] = {}
    steps: list[Step] = []
    inputs: list[tuple[str, str, TensorSharding]] = []
    local_inputs: dict[str, tuple[tuple[int, ...], str]] = {}
    comms: list[Communication] = []
    meta: dict[str, tuple[tuple[int, ...], str]] = {}  # buffer -> local (shape, dtype), for ``fuse``
    for n in order:
        t = fusion.tensors[n.value]
        name = f"b{n.uid}"
        mesh = n.sharding.mesh
        first = len(steps)
        spec_out = sharding_to_spec(n.sharding)
        ins = [buf[a.uid] for a in n.args]
        if n.kind == "InAt":
            name = f"{n.input_name}@{n.uid}"
            inputs.append((name, n.input_name, n.sharding))
            local_inputs[name] = (n.sharding.local_shape, t.dtype)
        elif n.kind in OP_CTORS:
            op = fusion.ops[n.op]
            if op.kind == "redistribute":
                name = ins[0]
            else:
                views = {"transposed": n.transposed} if n.kind == "MMT" else {}  # ``alias``: no permute copy
                steps.append(Step.make("local", name, ins, **_apply_attrs(fusion, n.op, n), **views))
        elif n.kind in TRANSFERS:
            comms.append(_transfer(n, name, ins, t, meshes, steps, seconds_per_ps))
            buf[n.uid] = name
            meta[name] = (n.sharding.local_shape, t.dtype)
            continue
        else:
            a = n.axis
            src = n.args[0].sharding
            spec_in = sharding_to_spec(src)
            team = mesh.shape[a]
            kind = COLLECTIVE_KINDS.get(n.kind)
            if n.kind == "LocalSlice":
                steps.append(Step.make("local", name, ins, op="remap", mode="slice", src=spec_in, dst=spec_out,
                                       axis=a))
            elif n.kind == "AllGather":
                steps.append(Step.make("local", name + ".flat", ins, op="view", shape=(-1,)))
                steps.append(Step.make("allgather", name + ".all", [name + ".flat"], axis=a, dim=0))
                steps.append(Step.make("local", name, [name + ".all"], op="remap", mode="gather", src=spec_in,
                                       dst=spec_out, axis=a))
            elif n.kind == "AllReduce":
                steps.append(Step.make("allreduce", name, ins, axis=a, op=_partial_op(src, a)))
            elif n.kind == "MakePartial":
                steps.append(Step.make("local", name, ins, op="partial", src=spec_in, dst=spec_out, axis=a,
                                       reduce=_partial_op(n.sharding, a)))
            elif n.kind == "ReduceScatter":
                steps.append(Step.make("local", name + ".send", ins, op="remap", mode="scatter", src=spec_in,
                                       dst=spec_out, axis=a))
                steps.append(Step.make("reduce_scatter", name + ".flat", [name + ".send"], axis=a, dim=0,
                                       op=_partial_op(src, a)))
                steps.append(Step.make("local", name, [name + ".flat"], op="view", shape=n.sharding.local_shape))
            elif n.kind == "AllToAll":
                steps.append(Step.make("local", name + ".send", ins, op="remap", mode="a2a_send", src=spec_in,
                                       dst=spec_out, axis=a))
                steps.append(Step.make("all_to_all", name + ".recv", [name + ".send"], axis=a, split_dim=0,
                                       cat_dim=0))
                steps.append(Step.make("local", name, [name + ".recv"], op="remap", mode="a2a_recv",
                                       src=spec_in, dst=spec_out, axis=a))
            else:
                raise ReshardError(f"internal: cannot lower plan node kind {n.kind!r}")
            if kind is not None:
                size, moved = collective_bytes(kind, src, n.sharding, t.itemsize, team)
                comms.append(Communication(kind, mesh.axis_names[a], team, t.name, str(src), str(n.sharding),
                                           size, moved, n.cost_ps * seconds_per_ps,
                                           reorder_copies(kind, src.axes[a], n.sharding.axes[a])))
        if multi:
            _place(steps, first, meshes.index(mesh))
        buf[n.uid] = name
        meta[name] = (n.sharding.local_shape, t.dtype)
    outputs = tuple((buf[r.uid], ts) for r, (_, ts) in zip(roots, fusion.outputs))
    keep = {b for b, _ in outputs} | set(local_inputs)
    steps = _add_frees(fuse_pointwise(steps, keep, meta), keep)
    if not multi:
        mesh = meshes[0]
        program = Program(tuple(mesh.shape), tuple(mesh.ranks), tuple(local_inputs), tuple(b for b, _ in outputs),
                          tuple(steps))
    else:
        ranks = tuple(r for m in meshes for r in m.ranks)
        program = Program((len(meshes),) + tuple(meshes[0].shape), ranks, tuple(local_inputs),
                          tuple(b for b, _ in outputs), tuple(steps), len(meshes),
                          tuple(meshes.index(ts.mesh) for _, _, ts in inputs),
                          tuple(meshes.index(ts.mesh) for _, ts in outputs))
    return LoweredPlan(program, tuple(inputs), outputs, local_inputs, tuple(comms), tuple(order))


def _partial_op(ts: TensorSharding, a: int) -> str:
    """The reduce op of axis ``a``'s Partial placement in ``ts``."""
    p = ts.axes[a]
    if not isinstance(p, Partial):
        raise ReshardError(f"internal: axis {a} of {ts} is not Partial")
    return p.op


def _place(steps: list[Step], first: int, j: int) -> None:
    """Steps ``first..`` of a value on mesh ``j`` of a multi-mesh program: run them on mesh j
    (``on``), collectives on the stacked axis (mesh axis + 1)."""
    for i in range(first, len(steps)):
        s = steps[i]
        attrs = dict(s.attrs)
        attrs["on"] = j
        if s.kind in COLLECTIVES and "axis" in attrs:
            attrs["axis"] = attrs["axis"] + 1
        steps[i] = Step.make(s.kind, s.out, s.ins, **attrs)


def _transfer(n: PlanNode, name: str, ins: list[str], t: Tensor, meshes: list[DeviceMesh], steps: list[Step],
              seconds_per_ps: float) -> Communication:
    """Steps of a cross-mesh transfer node (module docstring); returns its Communication."""
    src, dst = n.args[0].sharding, n.sharding
    a, b = src.mesh, dst.mesh
    ja, jb = meshes.index(a), meshes.index(b)
    kind = TRANSFERS[n.kind]
    moved = transfer_bytes(kind, src, dst, t.itemsize)
    if n.kind == "SendRecv":
        steps.append(Step.make("send_recv", name, ins, pairs=tuple(zip(a.ranks, b.ranks))))
        team, size = 2, moved
    else:
        team_ranks = (a.ranks[n.src],) + tuple(b.ranks)
        team = len(team_ranks)
        if n.kind == "Bcast":
            steps.append(Step.make("broadcast", name, ins, ranks=team_ranks, root=0))
            size = moved
        else:
            steps.append(Step.make("local", name + ".send", ins, op="remap", mode="pieces",
                                   src=sharding_to_spec(src), dst=sharding_to_spec(dst), ranks=team_ranks[:1]))
            steps.append(Step.make("scatter", name + ".piece", [name + ".send"], ranks=team_ranks, root=0, dim=0))
            steps.append(Step.make("local", name, [name + ".piece"], op="view", shape=dst.local_shape, on=jb))
            size = moved * team
    return Communication(kind, f"mesh{ja}->mesh{jb}", team, t.name, str(src), str(dst), size, moved,
                         n.cost_ps * seconds_per_ps)


def _add_frees(steps: list[Step], keep: set[str]) -> list[Step]:
    """Attach ``free`` to the step after which a buffer is last read."""
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        for b in s.ins:
            last[b] = i
    frees: dict[int, list[str]] = {}
    for b, i in last.items():
        if b not in keep:
            frees.setdefault(i, []).append(b)
    out = []
    for i, s in enumerate(steps):
        if i in frees:
            s = Step(s.kind, s.out, s.ins, tuple(sorted(s.attrs + (("free", tuple(sorted(frees[i]))),))))
        out.append(s)
    return out
