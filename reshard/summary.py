"""``Plan.explain()`` in brief: the default explanation of a plan of more than
``SUMMARY_ABOVE`` steps (``explain.explain_text``; ``full=True`` gives every step).

Sections: a header (the planner's report, the only line that differs between equal plans;
modeled time, collectives, bytes received per rank, steps); per pass (a training plan has two,
``plan_view.node_passes``) its totals and one line per *part* (below); each collective outside
folded layers with what the cheapest other way to get its value would cost the whole plan; the
fed inputs whose placement the plan changed and why (``whynot``); then one line each for saved
activations, recomputed ops, fused chains and padding.

Parts: a step belongs to the layer of the program's numbered container that
``ir.layers.membership`` gives its op (``model.layers.3``: its gradients and saved values too; a
mixture's terms of its load-balancing loss too), else to the module its value's name starts with
(the shortest proper prefix of the name, ``grad.`` and ``saved.`` dropped, that names another
value: ``lm_head`` for ``lm_head.weight``); an unnamed value (``t<N>``, a constant ``_c<N>``, a
step on one: ``_c4.saved``) or a top-level one (``view``) belongs to the part of the step before
it (the plan's first steps: to the first part named).  A layer whose steps in a pass equal an
earlier layer's in that pass up to renumbering (``_form``) *repeats* it: consecutive repeating
layers with the same reference are one line.

Laws: every line is at most ``WIDTH`` characters (a long name is cut in its middle); a pass's
parts' steps, collectives and bytes add up to the pass's; the lines do not grow with the number of
layers that repeat a shown one.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass

from .extract.plan_node import PlanNode, Tag
from .ir.layers import membership
from .ir.names import GRAD, SAVED, base_name
from .plan_view import (PS, PlanView, fmt_bytes, fmt_time, node_moved, node_op, node_passes, node_team, nodes_cost_s,
                      pass_totals, recomputed, total_cost_s)
from .whynot import changed_lines

#: plans of more steps are summarized by default
SUMMARY_ABOVE = 48
#: the longest line of a summary, and of a value name in it
WIDTH, NAME_WIDTH = 160, 56
#: padding notes listed before "and N more"
NOTES = 4
_AUTO = re.compile(r"(t|_c)\d+")


def clip(s: str, n: int) -> str:
    """``s`` cut in its middle to at most ``n`` characters (``model.layers.0…o_proj.weight``)."""
    if len(s) <= n:
        return s
    head = (n - 1) // 2
    return s[:head] + "\u2026" + s[len(s) - (n - 1 - head):]


@dataclass
class Part:
    """The steps of one part of one pass: its name, the layer number (None outside the
    container), its nodes in program order, and the earlier layer it repeats (``ref``)."""

    name: str
    layer: int | None
    nodes: list[PlanNode]
    ref: str | None = None


def _part_names(plan: PlanView) -> list[tuple[str, int | None]]:
    """(part, layer) of each plan node, in program order (module docstring)."""
    f = plan.fusion
    found = membership(f)
    container, layer_of = found if found is not None else ("", {})
    values = {base_name(t.name) for t in f.tensors}
    out: list[tuple[str, int | None] | None] = []  # None: an unnamed step before any named one
    for n in plan.lowered.nodes:
        k = layer_of.get(f.producer.get(n.value, -1))
        name = base_name(f.tensors[n.value].name)
        if k is not None:
            out.append((f"{container}.{k}", k))
            continue
        dots = [i for i, c in enumerate(name) if c == "."]
        module = next((name[:i] for i in dots if name[:i] in values), name)
        if _AUTO.fullmatch(module) or module == name and not dots:  # (a step on a constant: ``_c4.saved``)
            out.append(out[-1] if out else None)
        else:
            out.append((module, None))
    first = next((p for p in out if p is not None), ("", None))  # the plan's first steps: the first part's
    return [first if p is None else p for p in out]


def _form(plan: PlanView, part: Part) -> tuple:
    """A layer's steps up to renumbering: per node its name with the layer's number replaced
    (an unnamed value's name left out, and a name outside the layer's, a per-layer term of a
    loss computed after the layers: ``model.histc_3``), op, team, shardings, shape, dtype, bytes
    and cost, and its operands as positions in the part or, from outside it, numbered by first
    use."""
    number = re.compile(rf"(?<!\w){re.escape(part.name)}(?=\.|$)")
    local = {n.uid: i for i, n in enumerate(part.nodes)}
    outside: dict[int, int] = {}
    form = []
    for n in part.nodes:
        t = plan.fusion.tensors[n.value]
        name = number.sub("#", t.name.replace(GRAD, "g.").replace(SAVED, "s."))
        name = "" if _AUTO.fullmatch(t.name) or "#" not in name else name
        refs = tuple(("in", local[a.uid]) if a.uid in local else
                     ("out", outside.setdefault(a.uid, len(outside)), str(a.sharding)) for a in n.args)
        form.append((name, n.head.tag, n.head.form, node_op(plan, n), node_team(plan, n), str(n.sharding), t.shape,
                     t.dtype, n.head.transposed, node_moved(plan, n), n.cost_ps, refs))
    return tuple(form)


def parts(plan: PlanView) -> dict[str, list[Part]]:
    """Pass -> its parts, ordered by their median step (a fed input counted last), each layer that
    repeats an earlier one's steps in that pass with ``ref`` set (module docstring); a plan
    without a backward pass has one pass, ``plan``."""
    passes = node_passes(plan) or ["plan"] * len(plan.lowered.nodes)
    by: dict[tuple[str, str], Part] = {}
    steps: dict[tuple[str, str], list[int]] = {}
    for i, (n, p, (name, k)) in enumerate(zip(plan.lowered.nodes, passes, _part_names(plan))):
        by.setdefault((p, name), Part(name, k, [])).nodes.append(n)
        steps.setdefault((p, name), []).append(i + (len(passes) if n.head.tag is Tag.INPUT else 0))  # fed inputs last
    out: dict[str, list[Part]] = {}
    for (p, _), part in sorted(by.items(), key=lambda kv: statistics.median_low(steps[kv[0]])):
        out.setdefault(p, []).append(part)
    for ps in out.values():
        seen: dict[tuple, str] = {}
        for part in ps:
            if part.layer is not None:
                ref = seen.setdefault(_form(plan, part), part.name)
                part.ref = ref if ref != part.name else None
    return out


def collective_kinds(nodes: list[PlanNode]) -> str:
    """``allreduce x2, allgather``: the collectives among ``nodes``."""
    c = Counter(n.head.form for n in nodes if n.head.communicates)
    return ", ".join(f"{k}{f' x{m}' if m > 1 else ''}" for k, m in c.items())


def _table(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


def runs(ps: list[Part]) -> list[list[Part]]:
    """``ps`` in runs: each part alone, but consecutive parts repeating the same layer together."""
    out: list[list[Part]] = []
    for p in ps:
        if out and p.ref is not None and out[-1][-1].ref == p.ref:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def run_name(run: list[Part], width: int) -> str:
    """``model.layers.2 .. model.layers.30 (29 layers)``, or the one part's name, in ``width`` characters."""
    if len(run) == 1:
        return clip(run[0].name, width)
    n = f" ({len(run)} layers)"
    half = (width - len(n) - 4) // 2
    return f"{clip(run[0].name, half)} .. {clip(run[-1].name, half)}{n}"


def _part_rows(plan: PlanView, ps: list[Part]) -> list[tuple[str, ...]]:
    """One row per run of parts (``runs``)."""
    rows: list[tuple[str, ...]] = [("part", "steps", "collectives", "received", "time", "")]
    for run in runs(ps):
        nodes = [n for p in run for n in p.nodes]
        name = run_name(run, NAME_WIDTH)
        moved = sum(node_moved(plan, n) for n in nodes)
        note = f"{'each repeats' if len(run) > 1 else 'repeats'} the steps of {run[0].ref} above" if run[0].ref else ""
        rows.append((name, str(len(nodes)), collective_kinds(nodes), fmt_bytes(moved) if moved else "",
                     fmt_time(nodes_cost_s(nodes)), note))
    return rows


def _collective_rows(plan: PlanView, hidden: set[int], part_of: dict[int, str]) -> list[tuple[str, ...]]:
    """One row per collective not in ``hidden``; an unnamed value (``t<N>``) is named with its
    part (``part_of``: uid -> part name)."""
    rows: list[tuple[str, ...]] = [("step", "collective", "value", "sharding", "received", "time",
                                    "the cheapest other way")]
    for i, n in enumerate(plan.lowered.nodes):
        if not n.head.communicates or n.uid in hidden:
            continue
        others = [a for a in n.alternatives if a.scope == "value"]
        other = min((a.plan_cost_ps for a in others), default=None)
        name = plan.fusion.tensors[n.value].name
        name = f"{name} (a value of {part_of[n.uid]})" if _AUTO.fullmatch(name) else name
        rows.append((str(i), f"{node_op(plan, n)} {node_team(plan, n)}", clip(name, NAME_WIDTH),
                     f"{n.args[0].sharding} -> {n.sharding}", fmt_bytes(node_moved(plan, n)), fmt_time(n.cost_ps * PS),
                     "none found" if other is None else f"+{fmt_time(other * PS - plan.cost)} in the whole plan"))
    return rows


def summary_text(plan: PlanView) -> str:
    """The summary (module docstring)."""
    nodes = plan.lowered.nodes
    lines = [f"reshard plan: {plan.report}",
             f"modeled {fmt_time(total_cost_s(plan))}, {len(plan.communications)} collectives, "
             f"{fmt_bytes(plan.comm_bytes)} received per rank, {len(nodes)} steps "
             "(in brief; plan.explain(full=True) lists every step)"]
    totals = {t.name: t for t in pass_totals(plan)}
    hidden: set[int] = set()
    by_pass = parts(plan)
    part_of = {n.uid: part.name for ps in by_pass.values() for part in ps for n in part.nodes}
    for p, ps in by_pass.items():
        t = totals.get(p)
        lines.append("\nsteps by layer or module:" if t is None else
                     f"\n{p} pass: {t.steps} steps, {t.collectives} collectives, "
                     f"{fmt_bytes(t.bytes)} received per rank, modeled {fmt_time(t.cost_s)}")
        lines += _table(_part_rows(plan, ps), {1, 3, 4})
        hidden |= {n.uid for part in ps if part.ref is not None for n in part.nodes}
    comms = _collective_rows(plan, hidden, part_of)
    if len(comms) > 1:
        lines += ["", "collectives (those of repeating layers aside):"] + _table(comms, {0, 4, 5})
    changed = changed_lines(plan, lambda n: n.uid in hidden)
    if changed:
        lines += ["", "placements the plan changed (fed inputs resharded by a collective, and why):"]
        lines += ["  " + s for s in changed]
    lines += [""] + _notes(plan)
    return "\n".join(clip(s, WIDTH) for s in "\n".join(lines).split("\n"))


def _notes(plan: PlanView) -> list[str]:
    """One line each: saved activations, recomputed ops, fused chains; then padding notes."""
    out = []
    saved = plan.lowered.program.saved_buffers
    if saved:
        out.append(f"saved activations: {len(saved)} buffers, {fmt_bytes(plan.lowered.saved_bytes)} per rank, alive "
                   "together at the forward/backward boundary")
    again = sum(recomputed(plan, n) for n in plan.lowered.nodes)
    if again:
        out.append(f"recomputed in the backward pass from saved operands: {again} ops")
    chains = sum(1 for s in plan.steps if s.attr("fop") == "pointwise" and s.attr("fused"))
    if chains:
        out.append(f"fused elementwise chains: {chains} kernels")
    padding = getattr(plan, "padding", None)
    notes = list(padding.notes) if padding is not None else []
    if notes:
        out.append("uneven dims (padded inside the plan to even blocks):")
        out += ["  " + s for s in notes[:NOTES]] + ([f"  and {len(notes) - NOTES} more"] if len(notes) > NOTES else [])
    out.append("every step, rejected alternatives per op, saved values and fused chains: plan.explain(full=True)")
    return out
