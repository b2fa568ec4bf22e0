"""Extracted plan (PlanNodes) -> SPMD host program.

``lower`` runs an ordered list of named passes over one ``_Lowering`` state, once per order of
the plan's nodes (``node_orders``: depth-first, and ``codegen.schedule``'s, freeing memory early,
where it differs; the program whose allocation plan peaks lower is kept): ``order_nodes``
(the nodes' phases), ``emit_steps`` (the steps of
each node, below), ``read_through_transposes`` (``codegen.transposes``: a matmul reads the
buffer its operand is a transposed copy of, a fused attention step the buffer its operand is a
permuted copy of), ``accumulate_into`` (``codegen.scatter_add``: a scatter added to a buffer
adds into it), ``fuse_elementwise`` (``codegen.fuse``), ``pads_into_kernels``
(``codegen.padded_results``: a pointwise step writes the padded buffer a pad of its result
made), ``free_buffers`` (``codegen.alloc``),
``assemble_program``, ``reuse_buffers`` (``codegen.alloc``: an elementwise step writes into an
operand's memory that dies with it); then each rank's allocation plan gives ``peak_bytes`` and
``saved_bytes``.

Each PlanNode becomes a few steps on buffers named after it, by its ``Tag`` (and form):

* ``INPUT``: a program input (the caller feeds the local shard at the chosen sharding);
* ``APPLY``: one ``apply`` step (``reshape`` and ``redistribute`` to the dist a
  value already has are views; chains of elementwise steps are then fused into one
  ``apply pointwise`` step, ``codegen.fuse``), with ``transposed`` set for the matmul
  operands it reads through a view of the permute's operand;
* ``COLLECTIVE`` allgather: flatten -> ``allgather`` -> ``remap gather``; allreduce:
  ``allreduce``; reduce_scatter: ``remap scatter`` -> ``reduce_scatter`` (with the Partial's
  op) -> view; all_to_all: ``remap a2a_send`` -> ``all_to_all`` -> ``remap a2a_recv``;
* ``LOCAL`` local slice: ``remap slice``; local partial: ``partial``
  (``runtime.local_ops.make_partial``); neither communicates;
* ``TRANSFER`` send_recv: ``send_recv`` over the pairs (A[i], B[i]); broadcast: ``broadcast``
  on the explicit team [A[src]] + B (root 0); scatter: ``remap pieces`` on A[src] (a dummy
  piece for itself, then B's pieces in rank order) -> ``scatter`` on [A[src]] + B -> view.

A training Fusion (``passes.phases``) runs its forward-phase nodes first, then its backward-phase
ones (``Program.backward_from``), so the forward buffers the backward pass reads, the saved
activations (``Program.saved_buffers``), are alive together only at that boundary.

A Fusion on several meshes (cross-mesh transfers) lowers to a multi-mesh program
(``Program.meshes``): each step of a value on mesh j carries ``on=j`` and its collectives run on
stacked axis a + 1.  One-mesh Fusions lower exactly as before.

Collectives always act on flat buffers along dim 0 (what NCCL moves); the remaps put
elements where the shardings say.  Buffers are freed after their last use.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..extract import second_core
from ..extract.plan_node import PlanNode, Tag
from ..extract.received import collective_bytes, transfer_bytes
from ..extract.second_core import Forked
from ..ir.collective_kinds import KIND
from ..ir.dtypes import DTYPES
from ..ir.errors import ReshardError
from ..ir.fusion import Fusion, Tensor
from ..ir.fusion_meshes import fusion_meshes
from ..ir.ids import Outer, Root
from ..ir.mesh import DeviceMesh
from ..ir.ops import op_kind
from ..passes.phases import backward_values
from ..ir.sharding import Partial, TensorSharding
from .aligned_matmuls import align_matmuls
from .alloc import alike_ranks, allocate, last_uses, reuse_memory
from .fuse import ELEMENTWISE, fuse_pointwise, spread_casts
from .padded_results import pads_into_producers
from .program import COLLECTIVES, Program, Step
from .scatter_add import accumulate_scatters
from .schedule import memory_order
from .unpick_chains import casts_before_reshapes, unpicks_as_pointwise
from .step_attrs import attrs_of
from .transposes import read_through


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
    #: communicated dim is outermost; see ``CollectiveKind.reorder_copies``)
    reorder_copies: int = 0


@dataclass(frozen=True)
class LoweredPlan:
    program: Program
    inputs: tuple[tuple[str, str, TensorSharding], ...]      # buffer, input name, sharding
    outputs: tuple[tuple[str, TensorSharding], ...]          # buffer, sharding
    local_inputs: dict[str, tuple[tuple[int, ...], str]]     # buffer -> (local shape, dtype)
    communications: tuple[Communication, ...]
    nodes: tuple[PlanNode, ...]
    #: bytes per rank of the saved activations (``Program.saved_buffers``): the forward
    #: buffers alive at the forward / backward boundary for the backward pass, each storage
    #: once, an input's (the caller's memory) not at all (``Allocation.saved_bytes``)
    saved_bytes: int = 0
    #: the most bytes a rank holds at once, its inputs included (``codegen.alloc``: each
    #: rank's allocation plan; the largest over the ranks)
    peak_bytes: int = 0


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
    """The ``apply`` step of Fusion op ``op_index`` (its kind's step attributes, ``step_attrs``, the
    sharding of the operand it ``carries_sharding`` of as ``src``, the result's as ``dst`` when
    it ``carries_result``)."""
    op = fusion.ops[op_index]
    spec = op_kind(op.kind)
    src = {} if spec.carries_sharding is None else {"src": out.args[spec.carries_sharding].sharding}
    dst = {"dst": out.sharding} if spec.carries_result else {}
    return {"op": "apply", "fop": op.kind, **attrs_of(fusion, op, out.sharding.local_shape), **src, **dst}


def _outermost(p: object) -> bool:
    """A block split of dim 0 (``Root`` itself when the dim has one element per device)."""
    return isinstance(p, Root) and p.dim == 0 or isinstance(p, Outer) and isinstance(p.x, Root) and p.x.dim == 0


def reorder_copies(kind: str, src: object, dst: object) -> int:
    """How many reorder copies a collective's buffers need (the law of the cost rules'
    ``CollectiveKind.reorder_copies`` and layout variants): one fewer when the communicated
    dim is the outermost one on one of the kind's ``outermost_sides`` (the gathered source,
    the scattered target, either side of an all-to-all)."""
    ck = KIND[kind]
    sides = {"operand": src, "result": dst}
    return ck.reorder_copies - any(_outermost(sides[s]) for s in ck.outermost_sides)


@dataclass
class _Lowering:
    """What the passes of ``lower`` read and build."""

    fusion: Fusion
    roots: list[PlanNode]
    seconds_per_ps: float
    meshes: list[DeviceMesh] = field(default_factory=list)
    order: list[PlanNode] = field(default_factory=list)
    backward: set[int] = field(default_factory=set)             # uids of backward-phase plan nodes
    backward_outs: set[str] = field(default_factory=set)        # buffers their steps write
    buf: dict[int, str] = field(default_factory=dict)            # plan node uid -> its buffer
    steps: list[Step] = field(default_factory=list)
    inputs: list[tuple[str, str, TensorSharding]] = field(default_factory=list)
    local_inputs: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    comms: list[Communication] = field(default_factory=list)
    meta: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # buffer -> local (shape, dtype)
    outputs: tuple[tuple[str, TensorSharding], ...] = ()
    program: Program | None = None


#: plan nodes from which ``lower`` lowers the later node orders on the second core
#: (``extract.second_core``): below, forking and reading the program back cost about what they
#: save (the 8-layer Llama-2-7B dp 2 x tp 4 step, 2,239 nodes: 0.10 s an order, its program
#: pickled and read back in 0.04 s; at 32 layers, 8,500 nodes: 0.45 s an order)
FORK_MIN_NODES = 4_000


def lower(fusion: Fusion, roots: list[PlanNode], seconds_per_ps: float = 1e-12) -> LoweredPlan:
    """Turn the extracted plan into a host program (identical on every rank): the passes below, in
    order, on each of the plan's node orders (``node_orders``), keeping the program whose
    allocation plan peaks lowest (the first of equals: the depth-first order).  On a large plan
    the later orders are lowered on a spare core meanwhile (``second_core.Forked``: the same
    programs wherever they are lowered)."""
    first, *later = node_orders(fusion, roots)
    spare = bool(later) and len(first) >= FORK_MIN_NODES and second_core.available()
    ahead = [Forked(functools.partial(_lowered, fusion, roots, seconds_per_ps, o), spare=spare) for o in later]
    best = _lowered(fusion, roots, seconds_per_ps, first)
    for forked in ahead:
        got = forked.result()
        if got.peak_bytes < best.peak_bytes:
            best = got
    return best


def _lowered(fusion: Fusion, roots: list[PlanNode], seconds_per_ps: float, order: list[PlanNode]) -> LoweredPlan:
    """The plan's program with its nodes in ``order`` (``lower``)."""
    lo = _Lowering(fusion, roots, seconds_per_ps, order=order)
    for lowering_pass in (order_nodes, emit_steps, read_through_transposes, align_matmul_operands, accumulate_into,
                          fuse_elementwise, pads_into_kernels,
                          free_buffers,
                          assemble_program, reuse_buffers):
        lowering_pass(lo)
    assert lo.program is not None
    plans = [allocate(lo.program, lo.meta, r) for r in alike_ranks(lo.program, lo.meta)]
    return LoweredPlan(lo.program, tuple(lo.inputs), lo.outputs, lo.local_inputs, tuple(lo.comms), tuple(lo.order),
                       max(a.saved_bytes(lo.program) for a in plans), max(a.peak for a in plans))


def node_orders(fusion: Fusion, roots: list[PlanNode]) -> list[list[PlanNode]]:
    """The orders lowering tries for the plan's nodes, each operands first and forward-phase
    nodes before backward-phase ones (``passes.phases``; no forward value reads a backward one):
    the depth-first post-order from the roots so partitioned, and, where it differs,
    ``codegen.schedule``'s (a node freeing at least the bytes it allocates as soon as it is ready,
    the others in that depth-first order).  Both are tried because the schedule's gains are
    local: a large result taken early is held from then on (the Llama L4 h2048 bf16 step peaks
    2317.6 MB depth-first, 2032.4 MB by the schedule; GPT-2's tied lm head weight gradient, taken
    while the saved activations are still held, raised the h256 step's peak 210.1 -> 220.4 MiB)."""
    dfs = _topo(roots)
    backward = backward_values(fusion)
    back = {n.uid for n in dfs if n.value in backward}
    first = [n for n in dfs if n.uid not in back] + [n for n in dfs if n.uid in back]
    inputs = {n.uid for n in dfs if n.head.tag is Tag.INPUT}
    views = {n.uid for n in dfs if n.head.tag is Tag.APPLY
             and op_kind(fusion.ops[n.head.op].kind).cost in ("view", "kept")}  # the operand's buffer
    free = inputs | views  # allocate nothing
    nbytes = {n.uid: 0 if n.uid in free else
              math.prod(n.sharding.local_shape) * DTYPES[fusion.tensors[n.value].dtype].itemsize for n in dfs}
    fusable = {n.uid for n in dfs if n.head.tag is Tag.APPLY and fusion.ops[n.head.op].kind in ELEMENTWISE}
    second = memory_order(dfs, back, nbytes, views, inputs | {r.uid for r in roots}, fusable)
    return [first] if [n.uid for n in second] == [n.uid for n in first] else [first, second]


def order_nodes(lo: _Lowering) -> None:
    """The phase of the plan's nodes (their order is given: ``node_orders``), and the Fusion's
    meshes."""
    lo.meshes = fusion_meshes(lo.fusion)
    backward = backward_values(lo.fusion)
    lo.backward = {n.uid for n in lo.order if n.value in backward}


def emit_steps(lo: _Lowering) -> None:
    """The steps of every plan node, on buffers named after it (module docstring); the
    outputs' buffers.  In a multi-mesh program each value's steps run on its mesh (``_place``)."""
    for n in lo.order:
        t = lo.fusion.tensors[n.value]
        first = len(lo.steps)
        name = _emitter(n)(lo, n, t, f"b{n.uid}", [lo.buf[a.uid] for a in n.args])
        if len(lo.meshes) > 1 and n.head.tag is not Tag.TRANSFER:
            _place(lo.steps, first, lo.meshes.index(n.sharding.mesh))
        if n.uid in lo.backward:
            lo.backward_outs.update(s.out for s in lo.steps[first:])
        lo.buf[n.uid] = name
        lo.meta[name] = (n.sharding.local_shape, t.dtype)
    lo.outputs = tuple((lo.buf[r.uid], ts) for r, (_, ts) in zip(lo.roots, lo.fusion.outputs))


def read_through_transposes(lo: _Lowering) -> None:
    """Matmuls read the buffers their operands are transposed copies of, fused attention steps
    those their operands are permuted copies of (``codegen.transposes``)."""
    lo.steps = read_through(lo.steps, lo.meta, _kept(lo))


def align_matmul_operands(lo: _Lowering) -> None:
    """16-bit matmuls read their operands zero-padded to cuBLAS's alignment, each buffer padded
    once per phase (``codegen.aligned_matmuls``)."""
    lo.steps = align_matmuls(lo.steps, _kept(lo), lo.meta, lo.backward_outs)


def accumulate_into(lo: _Lowering) -> None:
    """A scatter added to a buffer adds into it (``codegen.scatter_add``)."""
    lo.steps = accumulate_scatters(lo.steps, _kept(lo), lo.meta)


def fuse_elementwise(lo: _Lowering) -> None:
    """Chains of elementwise steps become one ``apply pointwise`` step (``codegen.fuse``), after
    casts read by several steps that can each compute them are computed by each (``spread_casts``)
    and unpicks added into a fusable step's result are pointwise steps, casts of reshapes of one
    reshapes of the cast (``codegen.unpick_chains``)."""
    lo.steps = spread_casts(lo.steps, _kept(lo), lo.meta, lo.backward_outs)
    lo.steps = unpicks_as_pointwise(lo.steps, _kept(lo), lo.meta, lo.backward_outs)
    lo.steps = casts_before_reshapes(lo.steps, _kept(lo), lo.meta, lo.backward_outs)
    lo.steps = fuse_pointwise(lo.steps, _kept(lo), lo.meta, lo.backward_outs)


def pads_into_kernels(lo: _Lowering) -> None:
    """A pad of a pointwise step's result is that step writing the padded buffer
    (``codegen.padded_results``)."""
    lo.steps = pads_into_producers(lo.steps, _kept(lo), lo.meta, lo.backward_outs)


def free_buffers(lo: _Lowering) -> None:
    """Each buffer but the inputs and outputs is freed after the step that reads it last, or
    after the step that writes it when none reads it (``codegen.alloc.last_uses``)."""
    drops = last_uses(lo.steps, _kept(lo))
    lo.steps = [s if i not in drops else Step(s.kind, s.out, s.ins, tuple(sorted(s.attrs + (("free", tuple(sorted(
        drops[i]))),)))) for i, s in enumerate(lo.steps)]


def assemble_program(lo: _Lowering) -> None:
    """The ``Program``: on the one mesh, or stacked meshes for a multi-mesh Fusion."""
    outs = tuple(b for b, _ in lo.outputs)
    back = next((i for i, s in enumerate(lo.steps) if s.out in lo.backward_outs), None)
    if len(lo.meshes) == 1:
        mesh = lo.meshes[0]
        lo.program = Program(tuple(mesh.shape), tuple(mesh.ranks), tuple(lo.local_inputs), outs, tuple(lo.steps),
                             backward_from=back)
        return
    ranks = tuple(r for m in lo.meshes for r in m.ranks)
    lo.program = Program((len(lo.meshes),) + tuple(lo.meshes[0].shape), ranks, tuple(lo.local_inputs), outs,
                         tuple(lo.steps), len(lo.meshes), tuple(lo.meshes.index(ts.mesh) for _, _, ts in lo.inputs),
                         tuple(lo.meshes.index(ts.mesh) for _, ts in lo.outputs), back)


def reuse_buffers(lo: _Lowering) -> None:
    """Elementwise steps write into an operand's memory that dies with them (``into``:
    ``codegen.alloc.reuse_memory``)."""
    assert lo.program is not None
    lo.program = reuse_memory(lo.program, lo.meta)


def _kept(lo: _Lowering) -> set[str]:
    """Buffers that must stay: the program's outputs and inputs."""
    return {b for b, _ in lo.outputs} | set(lo.local_inputs)


# ---- the steps of one plan node (``emit_steps``); each returns the node's buffer ----------

def _emit_input(lo: _Lowering, n: PlanNode, t: Tensor, name: str, ins: list[str]) -> str:
    """``INPUT``: a program input, fed by the caller at the chosen sharding."""
    name = f"{n.head.input_name}@{n.uid}"
    lo.inputs.append((name, n.head.input_name, n.sharding))
    lo.local_inputs[name] = (n.sharding.local_shape, t.dtype)
    return name


def _emit_op(lo: _Lowering, n: PlanNode, t: Tensor, name: str, ins: list[str]) -> str:
    """``APPLY``: the op's ``apply`` step (a redistribute to the dist its operand has: that buffer)."""
    h = n.head
    if lo.fusion.ops[h.op].kind == "redistribute":
        return ins[0]
    views = {"transposed": h.transposed} if any(h.transposed) else {}  # ``alias``: no permute copy
    lo.steps.append(Step.make("local", name, ins, **_apply_attrs(lo.fusion, h.op, n), **views))
    return name


def _emit_transfer(lo: _Lowering, n: PlanNode, t: Tensor, name: str, ins: list[str]) -> str:
    """``TRANSFER``: a cross-mesh transfer (``_transfer``); a scatter's pieces are the result's block
    once per team member, its piece one block."""
    comm = _transfer(n, name, ins, t, lo.meshes, lo.steps, lo.seconds_per_ps)
    lo.comms.append(comm)
    if n.head.form == "scatter":
        piece = math.prod(n.sharding.local_shape)
        lo.meta[name + ".send"] = ((piece * comm.team_size,), t.dtype)
        lo.meta[name + ".piece"] = ((piece,), t.dtype)
    return name


def _emit_local_slice(lo: _Lowering, n: PlanNode, t: Tensor, name: str, ins: list[str]) -> str:
    """local slice: ``remap slice`` (no communication)."""
    lo.steps.append(Step.make("local", name, ins, op="remap", mode="slice", src=n.args[0].sharding,
                              dst=n.sharding, axis=n.head.axis))
    return name


def _emit_allgather(lo: _Lowering, n: PlanNode, t: Tensor, name: str, ins: list[str]) -> str:
    """allgather: flatten -> ``allgather`` -> ``remap gather``."""
    lo.steps.append(Step.make("local", name + ".flat", ins, op="view", shape=(-1,)))
    lo.steps.append(Step.make("allgather", name + ".all", [name + ".flat"], axis=n.head.axis, dim=0))
    _flat(lo, n, t, name, (".flat", 1), (".all", n.sharding.mesh.shape[n.head.axis]))
    lo.steps.append(Step.make("local", name, [name + ".all"], op="remap", mode="gather", src=n.args[0].sharding,
                              dst=n.sharding, axis=n.head.axis))
    return _communicated(lo, n, t, name)


def _emit_allreduce(lo: _Lowering, n: PlanNode, t: Tensor, name: str, ins: list[str]) -> str:
    """allreduce: ``allreduce`` with the Partial's op."""
    lo.steps.append(Step.make("allreduce", name, ins, axis=n.head.axis, op=_partial_op(n.args[0].sharding, n.head.axis)))
    return _communicated(lo, n, t, name)


def _emit_make_partial(lo: _Lowering, n: PlanNode, t: Tensor, name: str, ins: list[str]) -> str:
    """local partial: ``partial`` (no communication; ``runtime.local_ops.make_partial``)."""
    lo.steps.append(Step.make("local", name, ins, op="partial", src=n.args[0].sharding, dst=n.sharding,
                              axis=n.head.axis, reduce=_partial_op(n.sharding, n.head.axis)))
    return name


def _emit_reduce_scatter(lo: _Lowering, n: PlanNode, t: Tensor, name: str, ins: list[str]) -> str:
    """reduce_scatter: ``remap scatter`` -> ``reduce_scatter`` (with the Partial's op) -> view."""
    lo.steps.append(Step.make("local", name + ".send", ins, op="remap", mode="scatter", src=n.args[0].sharding,
                              dst=n.sharding, axis=n.head.axis))
    lo.steps.append(Step.make("reduce_scatter", name + ".flat", [name + ".send"], axis=n.head.axis, dim=0,
                              op=_partial_op(n.args[0].sharding, n.head.axis)))
    lo.steps.append(Step.make("local", name, [name + ".flat"], op="view", shape=n.sharding.local_shape))
    _flat(lo, n, t, name, (".send", 1), (".flat", 1 / n.sharding.mesh.shape[n.head.axis]))
    return _communicated(lo, n, t, name)


def _emit_all_to_all(lo: _Lowering, n: PlanNode, t: Tensor, name: str, ins: list[str]) -> str:
    """all_to_all: ``remap a2a_send`` -> ``all_to_all`` -> ``remap a2a_recv``."""
    src, dst = n.args[0].sharding, n.sharding
    lo.steps.append(Step.make("local", name + ".send", ins, op="remap", mode="a2a_send", src=src, dst=dst,
                              axis=n.head.axis))
    lo.steps.append(Step.make("all_to_all", name + ".recv", [name + ".send"], axis=n.head.axis, split_dim=0, cat_dim=0))
    lo.steps.append(Step.make("local", name, [name + ".recv"], op="remap", mode="a2a_recv", src=src,
                              dst=dst, axis=n.head.axis))
    _flat(lo, n, t, name, (".send", 1), (".recv", 1))
    return _communicated(lo, n, t, name)


#: the steps of each kind of plan node: by tag, and by form for collectives and local reshards
_EMIT = {Tag.INPUT: _emit_input, Tag.APPLY: _emit_op, Tag.TRANSFER: _emit_transfer}
_EMIT_FORM = {(Tag.LOCAL, "local slice"): _emit_local_slice, (Tag.LOCAL, "local partial"): _emit_make_partial,
              (Tag.COLLECTIVE, "allgather"): _emit_allgather, (Tag.COLLECTIVE, "allreduce"): _emit_allreduce,
              (Tag.COLLECTIVE, "reduce_scatter"): _emit_reduce_scatter,
              (Tag.COLLECTIVE, "all_to_all"): _emit_all_to_all}


def _emitter(n: PlanNode) -> Callable[[_Lowering, PlanNode, Tensor, str, list[str]], str]:
    """The function emitting node ``n``'s steps; a node no entry lowers is an internal error."""
    h = n.head
    emit = _EMIT.get(h.tag) or _EMIT_FORM.get((h.tag, h.form))
    if emit is None:
        raise ReshardError(f"internal: cannot lower plan node {h.tag.value} {h.form!r}")
    return emit


def _communicated(lo: _Lowering, n: PlanNode, t: Tensor, name: str) -> str:
    """Record node ``n``'s collective (a ``Communication``); returns ``name``."""
    src, a, mesh = n.args[0].sharding, n.head.axis, n.sharding.mesh
    kind, team = n.head.form, mesh.shape[a]
    size, moved = collective_bytes(kind, src, n.sharding, t.itemsize, team)
    lo.comms.append(Communication(kind, mesh.axis_names[a], team, t.name, str(src), str(n.sharding), size, moved,
                                  n.cost_ps * lo.seconds_per_ps, reorder_copies(kind, src.axes[a], n.sharding.axes[a])))
    return name


def _flat(lo: _Lowering, n: PlanNode, t: Tensor, name: str, *parts: tuple[str, float]) -> None:
    """The local (shape, dtype) of node ``n``'s flat intermediate buffers: ``name`` + suffix,
    holding ``factor`` times the elements of its operand's local block."""
    numel = math.prod(n.args[0].sharding.local_shape)
    for suffix, factor in parts:
        lo.meta[name + suffix] = ((round(numel * factor),), t.dtype)


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
    kind = n.head.form
    moved = transfer_bytes(kind, src, dst, t.itemsize)
    if kind == "send_recv":
        steps.append(Step.make("send_recv", name, ins, pairs=tuple(zip(a.ranks, b.ranks))))
        team, size = 2, moved
    else:
        team_ranks = (a.ranks[n.head.src],) + tuple(b.ranks)
        team = len(team_ranks)
        if kind == "broadcast":
            steps.append(Step.make("broadcast", name, ins, ranks=team_ranks, root=0))
            size = moved
        else:
            steps.append(Step.make("local", name + ".send", ins, op="remap", mode="pieces",
                                   src=src, dst=dst, ranks=team_ranks[:1]))
            steps.append(Step.make("scatter", name + ".piece", [name + ".send"], ranks=team_ranks, root=0, dim=0))
            steps.append(Step.make("local", name, [name + ".piece"], op="view", shape=dst.local_shape, on=jb))
            size = moved * team
    return Communication(kind, f"mesh{ja}->mesh{jb}", team, t.name, str(src), str(dst), size, moved,
                         n.cost_ps * seconds_per_ps)
