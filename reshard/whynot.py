""""Why not what you asked": the fed inputs whose placement the plan changes by a collective,
each with the price of keeping it (for ``Plan.explain``; it reports, it decides nothing).

An input is fed at the placement its user gave (``param_placements``, ``in_placements``)
or, left open, at the one the optimizer chose.  When a collective reads a fed input (an
``allgather`` of a vocab-parallel ``lm_head.weight``) the plan changed that placement, and
``changed_inputs`` says so: the collective with its bytes and modeled time, the ops that read
its result, and the reason, from the alternatives extraction already priced
(``alternatives``): among those ops' rejected strategies, the cheapest that reads
the input at its fed placement, with the whole plan's modeled time had it been chosen (never
less than the plan's: the extractor chose the cheaper).  No such strategy: no op found reads
the input at that placement.

Laws: one ``Changed`` per collective reading a fed input, in program order; ``kept`` is the
cheapest strategy (by whole-plan cost) whose operand list names the input at its fed sharding.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .extract.plan_node import Alternative, PlanNode, Tag
from .plan_view import PS, PlanView, fmt_bytes, fmt_time, node_moved, node_op

#: `` on 'tp' (team 2)`` and ``of lm_head [S(2)] ``: a collective's team and operand in an
#: alternative's description (said once already: the why line drops them)
_TEAM = re.compile(r" on '[^']*' \(team \d+\)")
_OPERAND = re.compile(r"\b(then|after) (\w+) of \S+ (?=\[)")


@dataclass(frozen=True)
class Changed:
    """A fed input (``fed``) that collective ``comm`` reshards, read by ``readers``; ``kept``:
    the cheapest rejected strategy of a reader that takes the input at its fed sharding."""

    step: int
    fed: PlanNode
    comm: PlanNode
    readers: tuple[PlanNode, ...]
    kept: Alternative | None


def _reads_at(a: Alternative, name: str, sharding: str) -> bool:
    """Does strategy ``a`` read value ``name`` at ``sharding`` (in its operand list, before
    ``) ->``)?  ``name [S(0)]`` or ``name.T (view) [S(0)]``."""
    head = a.description.split(") -> ", 1)[0]
    return f"{name} {sharding}" in head or f"{name}.T (view) {sharding}" in head


def changed_inputs(plan: PlanView) -> list[Changed]:
    """Every collective reading a fed input, with the cheapest way to keep it as fed (module docstring)."""
    nodes = plan.lowered.nodes
    readers: dict[int, list[PlanNode]] = {}
    for n in nodes:
        for a in n.args:
            readers.setdefault(a.uid, []).append(n)
    out = []
    for i, c in enumerate(nodes):
        if not c.head.communicates or c.args[0].head.tag is not Tag.INPUT:
            continue
        fed = c.args[0]
        name, sharding = plan.fusion.tensors[fed.value].name, str(fed.sharding)
        ops = tuple(r for r in readers.get(c.uid, []) if r.head.tag is Tag.APPLY)
        kept = [a for r in ops for a in r.alternatives if a.scope == "strategy" and _reads_at(a, name, sharding)]
        out.append(Changed(i, fed, c, ops, min(kept, key=lambda a: a.plan_cost_ps, default=None)))
    return out


def changed_lines(plan: PlanView, hidden: Callable[[PlanNode], bool] = lambda n: False) -> list[str]:
    """Two lines per ``Changed``: what the plan does with the input, and why (the price of
    keeping it); one line counts those whose collective is ``hidden`` (in a folded layer)."""
    names = plan.fusion.tensors
    out = []
    changed = changed_inputs(plan)
    folded = sum(hidden(ch.comm) for ch in changed)
    for ch in changed:
        if hidden(ch.comm):
            continue
        name = names[ch.fed.value].name
        use = ", ".join(dict.fromkeys(f"{names[r.value].name} ({node_op(plan, r)})" for r in ch.readers))
        use = use or "the outputs"
        out.append(f"{name}: fed at {ch.fed.sharding}, made {ch.comm.sharding} by the {node_op(plan, ch.comm)} of "
                   f"step {ch.step} ({fmt_bytes(node_moved(plan, ch.comm))}, {fmt_time(ch.comm.cost_ps * PS)}) "
                   f"for {use}")
        if ch.kept is None:
            out.append(f"    why: no op reading it was found that takes it at {ch.fed.sharding}")
            continue
        delta = (ch.kept.plan_cost_ps * PS) - plan.cost
        way = _OPERAND.sub(r"\1 \2 ", _TEAM.sub("", ch.kept.description))
        out.append(f"    why: kept at {ch.fed.sharding}, {way}: whole plan "
                   f"{fmt_time(ch.kept.plan_cost_ps * PS)} ({'+' if delta >= 0 else '-'}{fmt_time(abs(delta))})")
    if folded:
        out.append(f"and {folded} more in the layers that repeat others' steps")
    return out
