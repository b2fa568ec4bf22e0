"""``Plan.explain()``: the chosen plan as a table, each collective with the cheapest way
extraction rejected to get the same value at the same sharding, and per op the cheapest
rejected strategy (priced by ``egraph_rules.alternatives``).

Plain text with aligned columns is the default; ``print_explanation`` uses ``rich`` when it
is importable and the output is a terminal (``rich`` is not a dependency).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from .egraph_rules.alternatives import COLLECTIVES, COMMS, TRANSFERS, Alternative, collective_bytes, op_label, \
    transfer_bytes
from .egraph_rules.extract import PlanNode
from .egraph_rules.schema import OP_CTORS

if TYPE_CHECKING:  # pragma: no cover
    from .plan import Plan

PS = 1e-12


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


def node_op(plan: "Plan", n: PlanNode) -> str:
    """What a plan node runs: ``input``, ``matmul``, ``allgather``, ``local slice``."""
    if n.kind == "InAt":
        return "input"
    if n.kind in OP_CTORS:
        return op_label(plan.fusion, n.op)
    return COMMS.get(n.kind, "local slice")


def node_team(plan: "Plan", n: PlanNode) -> str:
    """``on tp (2 ranks)``: the mesh axis and team size of a resharding node ('' for others)."""
    if n.kind in TRANSFERS:
        return f"from mesh {list(n.args[0].sharding.mesh.ranks)} to {list(n.sharding.mesh.ranks)}"
    if n.axis is None:
        return ""
    mesh = n.sharding.mesh
    return f"on {mesh.axis_names[n.axis]} ({mesh.shape[n.axis]} ranks)"


def node_moved(plan: "Plan", n: PlanNode) -> int:
    """Bytes each rank receives in this node (0 unless it is a collective)."""
    if n.kind not in COMMS:
        return 0
    t = plan.fusion.tensors[n.value]
    if n.kind in TRANSFERS:
        return transfer_bytes(TRANSFERS[n.kind], n.args[0].sharding, n.sharding, t.itemsize)
    return collective_bytes(COLLECTIVES[n.kind], n.args[0].sharding, n.sharding, t.itemsize,
                            n.sharding.mesh.shape[n.axis])[1]


def chosen_description(plan: "Plan", n: PlanNode) -> str:
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


def rows(plan: "Plan") -> list[Row]:
    """One row per plan node, in program order."""
    out = []
    for i, n in enumerate(plan.lowered.nodes):
        ins = "" if n.kind == "InAt" else ", ".join(str(a.sharding) for a in n.args)
        coll = f"{COMMS[n.kind]} {node_team(plan, n)}" if n.kind in COMMS else (
            f"none, local {node_team(plan, n)}" if n.kind == "LocalSlice" else "")
        out.append(Row(i, plan.fusion.tensors[n.value].name, node_op(plan, n), f"{ins} -> {n.sharding}".strip(),
                       coll, node_moved(plan, n), n.cost_ps * PS))
    return out


def total_cost_s(plan: "Plan") -> float:
    """Sum of the plan's distinct e-nodes' costs (a node shared by two uses is paid once):
    equals ``plan.cost``."""
    seen: dict[int, int] = {}
    for n in plan.lowered.nodes:
        seen[n.enode if n.enode >= 0 else -1 - n.uid] = n.cost_ps
    return sum(seen.values()) * PS


def _cells(plan: "Plan") -> tuple[list[tuple[str, ...]], tuple[str, ...]]:
    body = [(str(r.step), r.value, r.op, r.sharding, r.collective, fmt_bytes(r.bytes) if r.bytes else "",
             fmt_time(r.cost_s)) for r in rows(plan)]
    total = ("", "total", f"{len(plan.lowered.nodes)} steps", "", f"{len(plan.communications)} collectives",
             fmt_bytes(plan.comm_bytes), fmt_time(total_cost_s(plan)))
    return body, total


def _alt_line(plan: "Plan", a: Alternative, base_s: float) -> str:
    delta = a.plan_cost_ps * PS - base_s
    return (f"rejected: {a.description}: {fmt_bytes(a.bytes)}, sub-plan {fmt_time(a.cost_ps * PS)}; "
            f"whole plan {fmt_time(a.plan_cost_ps * PS)} ({'+' if delta >= 0 else '-'}{fmt_time(abs(delta))}), "
            f"{fmt_bytes(a.plan_bytes)}")


def sections(plan: "Plan") -> list[tuple[str, list[str]]]:
    """The explanation sections after the table: (heading, lines); empty ones are not printed."""
    base = plan.cost
    comms: list[str] = []
    coll_nodes = [n for n in plan.lowered.nodes if n.kind in COMMS]  # lowering's order
    for c, n in zip(plan.communications, coll_nodes):
        comms.append(f"comm {c.kind} on axis {c.axis!r} (team {c.team_size}) of {c.tensor}: {c.src} -> {c.dst}, "
                     f"{c.bytes} B buffer, {c.moved_bytes} B received, {c.cost_s * 1e6:.1f} us; "
                     f"sub-plan {fmt_time(n.subplan_cost_ps * PS)}, {fmt_bytes(n.subplan_bytes)}")
        values = [a for a in n.alternatives if a.scope == "value"]
        comms.append("    " + (_alt_line(plan, values[0], base) if values else "rejected: no other way found"))
    strategies: list[str] = []
    for n in plan.lowered.nodes:
        alts = [a for a in n.alternatives if a.scope == "strategy"]
        if n.kind in OP_CTORS and alts:
            strategies.append(f"{plan.fusion.tensors[n.value].name} = {chosen_description(plan, n)}")
            strategies.append("    " + _alt_line(plan, alts[0], base))
    by_buffer = {f"b{n.uid}": n for n in plan.lowered.nodes}
    kernels = [", ".join(f"{plan.fusion.tensors[by_buffer[b].value].name} = {node_op(plan, by_buffer[b])}"
                         for b in s.attr("fused"))
               for s in plan.steps if s.attr("fop") == "pointwise"]
    return [("communications (each with the cheapest rejected way to get that value at that sharding):", comms),
            ("op strategies (each with the cheapest rejected strategy, priced in the whole plan):", strategies),
            ("fused elementwise chains (one kernel each; the table prices every op on its own):", kernels)]


def explain_text(plan: "Plan") -> str:
    """The plain-text explanation: header, aligned table with totals, then sections."""
    body, total = _cells(plan)
    table = [HEADER] + body + [total]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    right = {0, 5, 6}

    def fmt(r: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    lines = [f"reshard plan: modeled {plan.cost * 1e6:.1f} us, {len(plan.communications)} collectives, "
             f"{plan.comm_bytes} bytes received per rank  [{plan.report}]", fmt(HEADER),
             "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in body]
    lines += ["  ".join("-" * w for w in widths), fmt(total)]
    for head, sec in sections(plan):
        if sec:
            lines += ["", head] + ["  " + s for s in sec]
    return "\n".join(lines)


def print_explanation(plan: "Plan", file: TextIO | None = None, *, use_rich: bool | None = None) -> None:
    """Print the explanation: with ``rich`` when importable and ``file`` is a terminal (or
    ``use_rich=True``), else the plain text of ``explain_text``."""
    file = file if file is not None else sys.stdout
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
        print(explain_text(plan), file=file)
        return
    console = Console(file=file)
    body, total = _cells(plan)
    table = Table(title=f"reshard plan: modeled {fmt_time(plan.cost)}, {len(plan.communications)} collectives, "
                        f"{fmt_bytes(plan.comm_bytes)} received per rank", caption=str(plan.report))
    for i, h in enumerate(HEADER):
        table.add_column(h, justify="right" if i in (0, 5, 6) else "left")
    for r, row in zip(body, rows(plan)):
        table.add_row(*map(escape, r), style="bold magenta" if row.bytes else None)
    table.add_section()
    table.add_row(*map(escape, total), style="bold")
    console.print(table)
    for head, sec in sections(plan):
        if sec:
            console.print(f"\n[bold]{head}[/bold]")
            for s in sec:
                console.print("  " + s, markup=False, highlight=False)
