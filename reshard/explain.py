"""``Plan.explain()``: the chosen plan as a table, each collective with the cheapest way
extraction rejected to get the same value at the same sharding, and per op the cheapest
rejected strategy (priced by ``egraph_rules.alternatives``).

A plan of more than ``summary.SUMMARY_ABOVE`` steps is explained in brief by default
(``summary``: totals, parts, collectives, changed placements); ``full=True`` gives the table.
Plain text with aligned columns is the default; ``print_explanation`` uses ``rich`` when it
is importable and the output is a terminal (``rich`` is not a dependency).

Values are shown by name (``Fusion`` ops take ``name=``); a rejected alternative that uses a
value the plan does not compute spells it out in values the table shows (``inline_values``).
Repeated layers (values named ``layers.3.*``, ``h.3.*``: ``layer_of``) whose steps equal an
earlier layer's up to renaming are one line each (``repeated_layers``; ``summarize=False``
shows everything).

A training plan's table is in two sections, the forward pass then the backward pass
(``node_passes``: ``ir.phases``), each opened by a heading row and closed by its totals row
(``pass_totals``: steps, collectives, bytes received, modeled time), so that what the backward
pass costs reads off the table; the two passes' totals add up to the plan's.  A plan without a
backward pass has neither.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from .egraph_rules.alternatives import Alternative, op_label
from .egraph_rules.plan_node import PlanNode
from .egraph_rules.received import COMMS, TRANSFERS, received_bytes
from .codegen.lower import Communication, LoweredPlan
from .codegen.program import Step
from .egraph_rules.schema import LOCAL_RESHARDS, OP_CTORS
from .ir.collective_kinds import BY_CTOR
from .ir.fusion import Fusion
from .ir.phases import backward_values

PS = 1e-12


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
    if n.kind == "InAt":
        return "input"
    if n.kind in OP_CTORS:
        return op_label(plan.fusion, n.op)
    return BY_CTOR[n.kind].label if n.kind in BY_CTOR else LOCAL_RESHARDS[n.kind]


def node_team(plan: PlanView, n: PlanNode) -> str:
    """``on tp (2 ranks)``: the mesh axis and team size of a resharding node ('' for others)."""
    if n.kind in TRANSFERS:
        return f"from mesh {list(n.args[0].sharding.mesh.ranks)} to {list(n.sharding.mesh.ranks)}"
    if n.axis is None:
        return ""
    mesh = n.sharding.mesh
    return f"on {mesh.axis_names[n.axis]} ({mesh.shape[n.axis]} ranks)"


def node_moved(plan: PlanView, n: PlanNode) -> int:
    """Bytes each rank receives in this node (0 unless it is a collective; ``received``)."""
    if n.kind not in COMMS:
        return 0
    return received_bytes(n.kind, n.args[0].sharding, n.sharding, plan.fusion.tensors[n.value].itemsize, n.axis)


def chosen_description(plan: PlanView, n: PlanNode) -> str:
    """The chosen node in the words ``Alternative.description`` uses."""
    names = plan.fusion.tensors
    if n.kind == "InAt":
        return f"input {n.input_name} fed as {n.sharding}"
    if n.kind in OP_CTORS:
        ops = ", ".join(f"{names[a.value].name}{'.T (view)' if t else ''} {a.sharding}"
                        for a, t in zip(n.args, n.transposed))
        return f"{op_label(plan.fusion, n.op)}({ops}) -> {n.sharding}"
    if n.kind in TRANSFERS:
        return f"{node_op(plan, n)} of {names[n.value].name} {n.args[0].sharding} -> {n.sharding} across meshes"
    mesh = n.sharding.mesh
    return (f"{node_op(plan, n)} of {names[n.value].name} {n.args[0].sharding} -> {n.sharding} "
            f"on '{mesh.axis_names[n.axis]}' (team {mesh.shape[n.axis]})")


@dataclass(frozen=True)
class Row:
    step: int
    value: str
    op: str
    sharding: str
    collective: str
    bytes: int
    cost_s: float


HEADER = ("#", "value", "op", "sharding in -> out", "collective", "bytes", "time")


def rows(plan: PlanView) -> list[Row]:
    """One row per plan node, in program order."""
    out = []
    for i, n in enumerate(plan.lowered.nodes):
        ins = "" if n.kind == "InAt" else ", ".join(str(a.sharding) for a in n.args)
        coll = f"{BY_CTOR[n.kind].label} {node_team(plan, n)}" if n.kind in COMMS else (
            f"no collective: local, {node_team(plan, n)}" if n.kind in LOCAL_RESHARDS else "")
        out.append(Row(i, plan.fusion.tensors[n.value].name, node_op(plan, n), f"{ins} -> {n.sharding}".strip(),
                       coll, node_moved(plan, n), n.cost_ps * PS))
    return out


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
    backward-phase value (``ir.phases.backward_values``: a recomputed op and a collective on
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
        out.append(PassTotal(name, len(mine), sum(n.kind in COMMS for n in mine),
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
        sig.append((t.name[len(layer):], n.kind, node_op(plan, n), node_team(plan, n), str(n.sharding), t.shape,
                    t.dtype, n.transposed, node_moved(plan, n), n.cost_ps, refs))
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


def _pass_row(t: PassTotal) -> tuple[str, ...]:
    """The totals row closing a pass's section of the table."""
    return ("", f"{t.name} pass total", f"{t.steps} steps", "", f"{t.collectives} collectives",
            fmt_bytes(t.bytes), fmt_time(t.cost_s))


def _cells(plan: PlanView, layers: Layers) -> tuple[list[tuple[str, ...]], list[bool], tuple[str, ...]]:
    """Table body (with one row per run of hidden layers and, for a training plan, each pass
    opened by a heading row and closed by its totals row), which body rows communicate, and
    the totals row."""
    all_rows = rows(plan)
    runs = {pos: (members, ref) for pos, members, ref in layer_runs(plan, layers)}
    passes = node_passes(plan)
    totals = {t.name: t for t in pass_totals(plan)}
    body: list[tuple[str, ...]] = []
    moves: list[bool] = []
    for r, n in zip(all_rows, plan.lowered.nodes):
        if passes is not None and (r.step == 0 or passes[r.step - 1] != passes[r.step]):
            if r.step > 0:
                body.append(_pass_row(totals[passes[r.step - 1]]))
                moves.append(False)
            body.append(("", f"{passes[r.step]} pass:", "", "", "", "", ""))
            moves.append(False)
        if r.step in runs:
            members, ref = runs[r.step]
            mine = [(q, m) for q, m in zip(all_rows, plan.lowered.nodes) if layers.of.get(m.uid) in members]
            k = len([m for _, m in mine if m.kind in COMMS])
            moved = sum(q.bytes for q, _ in mine)
            body.append(("", layer_span(members), layer_count(members), repeats_text(members, ref),
                         f"{len(mine)} steps, {k} collectives", fmt_bytes(moved) if moved else "",
                         fmt_time(sum(q.cost_s for q, _ in mine))))
            moves.append(moved > 0)
        if layers.hidden(n):
            continue
        body.append((str(r.step), r.value, r.op, r.sharding, r.collective, fmt_bytes(r.bytes) if r.bytes else "",
                     fmt_time(r.cost_s)))
        moves.append(r.bytes > 0)
    if passes is not None and passes:
        body.append(_pass_row(totals[passes[-1]]))
        moves.append(False)
    total = ("", "total", f"{len(plan.lowered.nodes)} steps", "", f"{len(plan.communications)} collectives",
             fmt_bytes(plan.comm_bytes), fmt_time(total_cost_s(plan)))
    return body, moves, total


# ---- saved and recomputed values of a training plan ----------------------------------------

def recomputed(plan: PlanView, n: PlanNode) -> bool:
    """Is ``n`` an op run in the backward pass on saved operands (``egraph_rules.remat``'s
    twin): the op of another value, placed in the class of that value's ``saved`` result?"""
    return n.kind in OP_CTORS and plan.fusion.ops[n.op].output != n.value


def saved_lines(plan: PlanView) -> list[str]:
    """One line per saved activation (``Program.saved_buffers``): value, sharding, bytes per
    rank, and the backward values that read it."""
    by_buffer = {f"b{n.uid}": n for n in plan.lowered.nodes}
    backward = backward_values(plan.fusion)
    readers: dict[int, list[str]] = {}
    for n in plan.lowered.nodes:
        for a in n.args:
            if n.value in backward:
                readers.setdefault(a.uid, []).append(plan.fusion.tensors[n.value].name)
    out = []
    for b in plan.lowered.program.saved_buffers:
        n = by_buffer[b]
        t = plan.fusion.tensors[n.value]
        read = ", ".join(dict.fromkeys(readers.get(n.uid, [])))
        out.append(f"{t.name} {n.sharding}: {fmt_bytes(math.prod(n.sharding.local_shape) * t.itemsize)}, "
                   f"read by {read}")
    return out


# ---- the sections after the table ---------------------------------------------------------
#: a value name in an alternative's description: before its sharding ``[...]``, or before
#: ``.T (view)`` (an operand read transposed)
_NAME_IN_TEXT = re.compile(r"(?<=[(\s,])([^\s(),\[\]]+?)(?=(?:\.T \(view\))? \[)")
#: how many levels of ops a value that the plan does not compute is spelled out to
INLINE_DEPTH = 3


def _definition(plan: PlanView, tid: int, computed: set[str], depth: int) -> str:
    """A value the plan does not compute, in terms of values it does (``permute(attn.k)``)."""
    f = plan.fusion
    t = f.tensors[tid]
    op = f.producer.get(tid)
    if t.name in computed or depth == 0 or op is None or f.ops[op].kind == "input":
        return t.name
    args = ", ".join(_definition(plan, a, computed, depth - 1) for a in f.ops[op].inputs)
    return f"{op_label(f, op)}({args})"


def inline_values(plan: PlanView, text: str, computed: set[str]) -> str:
    """``text`` with every value name that is not in ``computed`` (the table's values)
    replaced by its definition (``_definition``), so that a footnote names only values the
    table shows."""
    by_name = {t.name: t.id for t in plan.fusion.tensors}

    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name in computed or name not in by_name:
            return name
        return _definition(plan, by_name[name], computed, INLINE_DEPTH)
    return _NAME_IN_TEXT.sub(sub, text)


def _bytes_text(a: Alternative) -> str:
    """The bytes of an alternative's own sub-plan, with the reason when there are none."""
    if a.bytes:
        return fmt_bytes(a.bytes)
    local = [k for k in LOCAL_RESHARDS.values() if a.description.startswith(k)]
    if local:
        return f"0 B (a {local[0]}: no communication)"
    return "0 B (its operands need no communication)"


def _alt_line(plan: PlanView, a: Alternative, base_s: float, computed: set[str]) -> str:
    delta = a.plan_cost_ps * PS - base_s
    then = " before the 'then' step" if ", then " in a.description else ""
    return (f"rejected: {inline_values(plan, a.description, computed)}: sub-plan{then} "
            f"{fmt_time(a.cost_ps * PS)}, {_bytes_text(a)}; whole plan {fmt_time(a.plan_cost_ps * PS)} "
            f"({'+' if delta >= 0 else '-'}{fmt_time(abs(delta))}), {fmt_bytes(a.plan_bytes)}")


def sections(plan: PlanView, layers: Layers | None = None) -> list[tuple[str, list[str]]]:
    """The explanation sections after the table: (heading, lines); empty ones are not printed.
    Nodes of ``layers``' hidden layers are left out (one line says so)."""
    from .whynot import changed_lines  # (whynot builds on this module)
    layers = layers or Layers()
    base = plan.cost
    computed = {plan.fusion.tensors[n.value].name for n in plan.lowered.nodes}
    comms: list[str] = []
    coll_nodes = [n for n in plan.lowered.nodes if n.kind in COMMS]  # lowering's order
    for c, n in zip(plan.communications, coll_nodes):
        if layers.hidden(n):
            continue
        comms.append(f"comm {c.kind} on axis {c.axis!r} (team {c.team_size}) of {c.tensor}: {c.src} -> {c.dst}, "
                     f"{c.bytes} B buffer, {c.moved_bytes} B received, {c.cost_s * 1e6:.1f} us; "
                     f"sub-plan {fmt_time(n.subplan_cost_ps * PS)}, {fmt_bytes(n.subplan_bytes)}")
        values = [a for a in n.alternatives if a.scope == "value"]
        comms.append("    " + (_alt_line(plan, values[0], base, computed) if values
                                 else "rejected: no other way found"))
    strategies: list[str] = []
    for n in plan.lowered.nodes:
        if n.kind not in OP_CTORS or layers.hidden(n):
            continue
        alts = [a for a in n.alternatives if a.scope == "strategy"]
        if alts:
            strategies.append(f"{plan.fusion.tensors[n.value].name} = {chosen_description(plan, n)}")
            strategies.append("    " + _alt_line(plan, alts[0], base, computed))
    by_buffer = {f"b{n.uid}": n for n in plan.lowered.nodes}
    kernels = []
    for s in plan.steps:
        members = [by_buffer[b] for b in s.attr("fused") or ()] if s.attr("fop") == "pointwise" else []
        if members and not all(layers.hidden(m) for m in members):
            kernels.append(", ".join(f"{plan.fusion.tensors[m.value].name} = {node_op(plan, m)}" for m in members))
    padding = getattr(plan, "padding", None)
    out = [("uneven dims (padded inside the plan to even blocks; DTensor's torch.chunk pieces outside):",
            list(padding.notes) if padding is not None else []),
           (f"saved activations (forward buffers the backward pass reads, alive together at the boundary: "
            f"{fmt_bytes(plan.lowered.saved_bytes)} per rank):", saved_lines(plan)),
           ("recomputed in the backward pass from saved operands (instead of keeping the forward value):",
            [f"{plan.fusion.tensors[n.value].name} = {chosen_description(plan, n)}"
             for n in plan.lowered.nodes if recomputed(plan, n) and not layers.hidden(n)]),
           ("communications (each with the cheapest rejected way to get that value at that sharding):", comms),
           ("placements the plan changed (fed inputs resharded by a collective, and why):",
            changed_lines(plan, layers.hidden)),
           ("op strategies (each with the cheapest rejected strategy, priced in the whole plan):", strategies),
           ("fused elementwise chains (one kernel each; the table prices every op on its own):", kernels)]
    if layers.same:
        runs = layer_runs(plan, layers)
        out.append(("repeated layers (each as the layer named, with its own number in its values' names):",
                    [same_as_text(m, ref) for _, m, ref in runs]))
    return out


def explain_text(plan: PlanView, *, full: bool | None = None, summarize: bool = True) -> str:
    """The plain-text explanation.  ``full`` None: in brief (``summary.summary_text``) for a plan
    of more than ``summary.SUMMARY_ABOVE`` steps, else in full; ``full=True``: header, aligned
    table with totals, then sections (``summarize``: a layer whose steps repeat an earlier
    layer's, ``repeated_layers``, is one line, in the table and in the sections)."""
    from .summary import SUMMARY_ABOVE, summary_text  # (summary builds on this module)
    if not full and (full is False or len(plan.lowered.nodes) > SUMMARY_ABOVE):
        return summary_text(plan)
    layers = repeated_layers(plan) if summarize else Layers()
    body, _, total = _cells(plan, layers)
    table = [HEADER] + body + [total]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    right = {0, 5, 6}

    def fmt(r: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    lines = [f"reshard plan: modeled {plan.cost * 1e6:.1f} us, {len(plan.communications)} collectives, "
             f"{plan.comm_bytes} bytes received per rank, peak {fmt_bytes(plan.lowered.peak_bytes)} held per rank  "
             f"[{plan.report}]", fmt(HEADER),
             "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in body]
    lines += ["  ".join("-" * w for w in widths), fmt(total)]
    for head, sec in sections(plan, layers):
        if sec:
            lines += ["", head] + ["  " + s for s in sec]
    return "\n".join(lines)


def print_explanation(plan: PlanView, file: TextIO | None = None, *, use_rich: bool | None = None,
                      full: bool | None = None, summarize: bool = True) -> None:
    """Print the explanation: with ``rich`` when importable and ``file`` is a terminal (or
    ``use_rich=True``), else the plain text of ``explain_text`` (``full``, ``summarize`` as
    there; a summary is plain text either way)."""
    from .summary import SUMMARY_ABOVE
    file = file if file is not None else sys.stdout
    if not full and (full is False or len(plan.lowered.nodes) > SUMMARY_ABOVE):
        use_rich = False
    if use_rich is None:
        use_rich = hasattr(file, "isatty") and file.isatty()
    if use_rich:
        try:
            from rich.console import Console
            from rich.markup import escape
            from rich.table import Table
        except ImportError:
            use_rich = False
    if not use_rich:
        print(explain_text(plan, full=full, summarize=summarize), file=file)
        return
    layers = repeated_layers(plan) if summarize else Layers()
    console = Console(file=file)
    body, moves, total = _cells(plan, layers)
    table = Table(title=f"reshard plan: modeled {fmt_time(plan.cost)}, {len(plan.communications)} collectives, "
                        f"{fmt_bytes(plan.comm_bytes)} received per rank", caption=str(plan.report))
    for i, h in enumerate(HEADER):
        table.add_column(h, justify="right" if i in (0, 5, 6) else "left")
    for r, moved in zip(body, moves):
        table.add_row(*map(escape, r), style="bold magenta" if moved else None)
    table.add_section()
    table.add_row(*map(escape, total), style="bold")
    console.print(table)
    for head, sec in sections(plan, layers):
        if sec:
            console.print(f"\n[bold]{head}[/bold]")
            for s in sec:
                console.print("  " + s, markup=False, highlight=False)
