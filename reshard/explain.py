"""``Plan.explain()``: the chosen plan as a table, each collective with the cheapest way
extraction rejected to get the same value at the same sharding, and per op the cheapest
rejected strategy (priced by ``alternatives``).

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
(``node_passes``: ``passes.phases``), each opened by a heading row and closed by its totals row
(``pass_totals``: steps, collectives, bytes received, modeled time), so that what the backward
pass costs reads off the table; the two passes' totals add up to the plan's.  A plan without a
backward pass has neither.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from typing import TextIO

from .extract.plan_node import LOCAL_FORMS, Alternative, Tag
from .passes.phases import backward_values
from .plan_view import (PS, Layers, PassTotal, PlanView, chosen_description, fmt_bytes, fmt_time, layer_count,
                        layer_runs, layer_span, node_moved, node_op, node_passes, node_team, op_label,
                        pass_totals, recomputed, repeated_layers, repeats_text, same_as_text, total_cost_s)
from .summary import SUMMARY_ABOVE, summary_text
from .whynot import changed_lines


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
        h = n.head
        ins = "" if h.tag is Tag.INPUT else ", ".join(str(a.sharding) for a in n.args)
        coll = f"{h.label} {node_team(plan, n)}" if h.communicates else (
            f"no collective: local, {node_team(plan, n)}" if h.tag is Tag.LOCAL else "")
        out.append(Row(i, plan.fusion.tensors[n.value].name, node_op(plan, n), f"{ins} -> {n.sharding}".strip(),
                       coll, node_moved(plan, n), n.cost_ps * PS))
    return out


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
            k = len([m for _, m in mine if m.head.communicates])
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
    local = [k for k in LOCAL_FORMS if a.description.startswith(k)]
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
    layers = layers or Layers()
    base = plan.cost
    computed = {plan.fusion.tensors[n.value].name for n in plan.lowered.nodes}
    comms: list[str] = []
    coll_nodes = [n for n in plan.lowered.nodes if n.head.communicates]  # lowering's order
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
        if n.head.tag is not Tag.APPLY or layers.hidden(n):
            continue
        alts = [a for a in n.alternatives if a.scope == "strategy"]
        if alts:
            strategies.append(f"{plan.fusion.tensors[n.value].name} = {chosen_description(plan, n)}")
            strategies.append("    " + _alt_line(plan, alts[0], base, computed))
    by_buffer = {f"b{n.uid}": n for n in plan.lowered.nodes}
    kernels = []
    for s in plan.steps:
        # a buffer lowering derived from a node's (``<node buffer>.<suffix>``: a cast moved before its
        # view, a raw read of a view) describes that node
        members = list({id(m): m for m in (by_buffer[b.split(".")[0]] for b in s.attr("fused") or ())}.values()) \
            if s.attr("fop") == "pointwise" else []
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
