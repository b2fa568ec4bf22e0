"""What explanations and drawings read of a plan (``PlanView``) and the facts they share:
byte and time formatting, a step's op, team and received bytes, the forward and backward
passes (``node_passes``, ``pass_totals``), repeated layers (``repeated_layers``: a layer whose
steps equal an earlier layer's up to renaming) and recomputed steps.  ``explain``, ``summary``,
``whynot`` and ``draw`` build on this module; it imports none of them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from .codegen.lower import Communication, LoweredPlan
from .codegen.program import Step
from .extract.plan_node import PlanNode, Tag
from .extract.received import received_bytes
from .ir.fusion import Fusion
from .passes.phases import backward_values

PS = 1e-12

#: op kinds shown under another name: the shape op ``broadcast`` as torch names it, apart from
#: the collective ``broadcast`` (``ir.collective_kinds``)
OP_SHOWN_AS = {"broadcast": "broadcast_to"}


def op_label(fusion: Fusion, op_index: int) -> str:
    """``matmul``, ``unary(gelu)``, ``broadcast_to``, ...: an op's kind (``OP_SHOWN_AS``) and function."""
    op = fusion.ops[op_index]
    fn = op.attrs.get("fn")
    kind = OP_SHOWN_AS.get(op.kind, op.kind)
    return f"{kind}({fn})" if isinstance(fn, str) else kind



class PlanView(Protocol):
    """What explanations and drawings read of a plan (a ``reshard.Plan``): typed by its
    shape, so that this module and ``draw`` do not import ``plan``, whose ``Plan.explain`` /
    ``Plan.draw`` call them."""

    @property
    def fusion(self) -> Fusion: ...

    @property
    def lowered(self) -> LoweredPlan: ...

    @property
    def cost(self) -> float: ...

    @property
    def report(self) -> object: ...

    @property
    def steps(self) -> tuple[Step, ...]: ...

    @property
    def communications(self) -> tuple[Communication, ...]: ...

    @property
    def comm_bytes(self) -> int: ...


def fmt_bytes(n: int) -> str:
    """1536 -> '1.5 kB' (decimal units, like the MB/GB of bandwidths)."""
    if n < 1000:
        return f"{n} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if n < scale * 1000 or unit == "GB":
            return f"{n / scale:.1f} {unit}"
    raise AssertionError("unreachable")


def fmt_time(seconds: float) -> str:
    """Modeled seconds -> '9.0 us' / '0.80 ms' / '1.20 s'."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def node_op(plan: PlanView, n: PlanNode) -> str:
    """What a plan node runs: ``input``, ``matmul``, ``allgather``, ``local slice``, ``local partial``."""
    h = n.head
    if h.tag is Tag.INPUT:
        return "input"
    if h.tag is Tag.APPLY:
        return op_label(plan.fusion, h.op)
    return h.label


def node_team(plan: PlanView, n: PlanNode) -> str:
    """``on tp (2 ranks)``: the mesh axis and team size of a resharding node ('' for others)."""
    if n.head.tag is Tag.TRANSFER:
        return f"from mesh {list(n.args[0].sharding.mesh.ranks)} to {list(n.sharding.mesh.ranks)}"
    a = n.head.axis
    if a is None:
        return ""
    mesh = n.sharding.mesh
    return f"on {mesh.axis_names[a]} ({mesh.shape[a]} ranks)"


def node_moved(plan: PlanView, n: PlanNode) -> int:
    """Bytes each rank receives in this node (0 unless it is a collective; ``received``)."""
    if not n.head.communicates:
        return 0
    return received_bytes(n.head.form, n.args[0].sharding, n.sharding, plan.fusion.tensors[n.value].itemsize,
                          n.head.axis)


def chosen_description(plan: PlanView, n: PlanNode) -> str:
    """The chosen node in the words ``Alternative.description`` uses."""
    names, h = plan.fusion.tensors, n.head
    if h.tag is Tag.INPUT:
        return f"input {h.input_name} fed as {n.sharding}"
    if h.tag is Tag.APPLY:
        ops = ", ".join(f"{names[a.value].name}{'.T (view)' if t else ''} {a.sharding}"
                        for a, t in zip(n.args, h.transposed))
        return f"{op_label(plan.fusion, h.op)}({ops}) -> {n.sharding}"
    if h.tag is Tag.TRANSFER:
        return f"{node_op(plan, n)} of {names[n.value].name} {n.args[0].sharding} -> {n.sharding} across meshes"
    mesh = n.sharding.mesh
    return (f"{node_op(plan, n)} of {names[n.value].name} {n.args[0].sharding} -> {n.sharding} "
            f"on '{mesh.axis_names[h.axis]}' (team {mesh.shape[h.axis]})")


def nodes_cost_s(nodes: "list[PlanNode] | tuple[PlanNode, ...]") -> float:
    """Sum of the distinct e-nodes' costs among ``nodes`` (a node shared by two uses is paid once)."""
    seen: dict[int, int] = {}
    for n in nodes:
        seen[n.enode if n.enode >= 0 else -1 - n.uid] = n.cost_ps
    return sum(seen.values()) * PS


def total_cost_s(plan: PlanView) -> float:
    """Sum of the plan's distinct e-nodes' costs (``nodes_cost_s``): equals ``plan.cost``."""
    return nodes_cost_s(plan.lowered.nodes)


# ---- the forward and backward passes of a training plan ------------------------------------
PASSES = ("forward", "backward")


def node_passes(plan: PlanView) -> list[str] | None:
    """The pass of each plan node, in program order: ``backward`` for a node computing a
    backward-phase value (``passes.phases.backward_values``: a recomputed op and a collective on
    a backward value included), else ``forward``; None for a plan without a backward pass.
    Lowering runs every forward step first, so the list is forward nodes then backward ones."""
    back = backward_values(plan.fusion)
    if not back:
        return None
    return [PASSES[n.value in back] for n in plan.lowered.nodes]


@dataclass(frozen=True)
class PassTotal:
    """One pass's share of the plan: steps, collectives, bytes received per rank and modeled
    time (its distinct e-nodes' costs).  The passes' figures add up to the plan's: a plan
    node, hence an e-node (a value at a sharding), belongs to one pass."""

    name: str
    steps: int
    collectives: int
    bytes: int
    cost_s: float


def pass_totals(plan: PlanView) -> list[PassTotal]:
    """``PassTotal`` of the forward and the backward pass; [] for a plan without a backward pass."""
    passes = node_passes(plan)
    if passes is None:
        return []
    out = []
    for name in PASSES:
        mine = [n for n, p in zip(plan.lowered.nodes, passes) if p == name]
        out.append(PassTotal(name, len(mine), sum(n.head.communicates for n in mine),
                             sum(node_moved(plan, n) for n in mine), nodes_cost_s(mine)))
    return out


# ---- repeated layers ---------------------------------------------------------------------
_LAYER = re.compile(r"^((?:[^.]+\.)+?\d+)(?:\.|$)")


def layer_of(name: str) -> str | None:
    """The layer a value belongs to by its name: the prefix up to its first numeric
    component (``layers.3.attn.qkv`` -> ``layers.3``, ``transformer.h.0`` -> itself, the
    paths of ``nn.ModuleList`` children); None for a name without one (``x``, ``mlp.w1``)."""
    m = _LAYER.match(name)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Layers:
    """Repeated layers of a plan: ``of`` maps each plan node (uid) of a layer to it;
    ``same[L] = R`` when layer L's steps are layer R's up to renaming (R the first layer
    with those steps, shown in full in L's place)."""

    of: dict[int, str] = field(default_factory=dict)
    same: dict[str, str] = field(default_factory=dict)

    def hidden(self, n: PlanNode) -> bool:
        """Whether ``n`` belongs to a layer shown as its reference layer."""
        return self.of.get(n.uid) in self.same


def _signature(plan: PlanView, layer: str, nodes: list[PlanNode]) -> tuple:
    """A layer's steps up to renaming: per node its op, name within the layer, shardings,
    shape and dtype, team, bytes and cost, and its operands as positions within the layer
    or, for values from outside it, numbered by first use."""
    local = {n.uid: i for i, n in enumerate(nodes)}
    outside: dict[int, int] = {}
    sig = []
    for n in nodes:
        t = plan.fusion.tensors[n.value]
        refs = tuple(("in", local[a.uid]) if a.uid in local else
                     ("out", outside.setdefault(a.uid, len(outside)), str(a.sharding)) for a in n.args)
        sig.append((t.name[len(layer):], n.head.tag, n.head.form, node_op(plan, n), node_team(plan, n),
                    str(n.sharding), t.shape, t.dtype, n.head.transposed, node_moved(plan, n), n.cost_ps, refs))
    return tuple(sig)


def repeated_layers(plan: PlanView) -> Layers:
    """Group the plan's nodes by ``layer_of`` their value's name (a group of one value, such
    as ``split.1``, is no layer); a layer whose step sequence equals an earlier layer's up to
    renaming (``_signature``) is ``same`` as the first one."""
    names = plan.fusion.tensors
    by_layer: dict[str, list[PlanNode]] = {}
    for n in plan.lowered.nodes:
        layer = layer_of(names[n.value].name)
        if layer is not None:
            by_layer.setdefault(layer, []).append(n)
    by_layer = {k: v for k, v in by_layer.items() if len({n.value for n in v}) > 1}
    first: dict[tuple, str] = {}
    same: dict[str, str] = {}
    for layer, nodes in by_layer.items():
        ref = first.setdefault(_signature(plan, layer, nodes), layer)
        if ref != layer:
            same[layer] = ref
    return Layers({n.uid: layer for layer, nodes in by_layer.items() for n in nodes}, same)


def layer_span(members: list[str]) -> str:
    """``layers.1 .. layers.30`` (or the one layer)."""
    return members[0] if len(members) == 1 else f"{members[0]} .. {members[-1]}"


def layer_count(members: list[str]) -> str:
    return "1 layer" if len(members) == 1 else f"{len(members)} layers"


def repeats_text(members: list[str], ref: str) -> str:
    """``each repeats the steps of layers.0 above`` (``ref``: the layer shown in full, earlier
    in the table, whose steps ``members`` run again with their own numbers)."""
    return f"{'each repeats' if len(members) > 1 else 'repeats'} the steps of {ref} above"


def same_as_text(members: list[str], ref: str) -> str:
    """``layers.1 .. layers.30 (30 layers): each repeats the steps of layers.0 above``."""
    return f"{layer_span(members)} ({layer_count(members)}): {repeats_text(members, ref)}"


def layer_runs(plan: PlanView, layers: Layers) -> list[tuple[int, list[str], str]]:
    """The hidden layers as runs of consecutive layers with the same reference, each with the
    program position of its first step: (position, layers, reference)."""
    runs: list[tuple[int, list[str], str]] = []
    placed: set[str] = set()
    last_kept = -1
    for i, n in enumerate(plan.lowered.nodes):
        layer = layers.of.get(n.uid)
        if layer not in layers.same:
            last_kept = i
            continue
        if layer in placed:
            continue
        placed.add(layer)
        if runs and runs[-1][2] == layers.same[layer] and runs[-1][0] > last_kept:
            runs[-1][1].append(layer)
        else:
            runs.append((i, [layer], layers.same[layer]))
    return runs


def recomputed(plan: PlanView, n: PlanNode) -> bool:
    """Is ``n`` an op run in the backward pass on saved operands (``rules.remat``'s
    twin): the op of another value, placed in the class of that value's ``saved`` result?"""
    return n.head.tag is Tag.APPLY and plan.fusion.ops[n.head.op].output != n.value
