"""Per-rank byte budgets met by extraction: a Lagrange multiplier per budget, searched.

A budget bounds a sum of per-e-node bytes over a plan's distinct e-nodes (a shared node
once): the bytes a plan keeps for the backward pass (``memory``: ``memory_budget``) or the
bytes each rank receives over its communications (``received``: ``comm_budget``).  Without a
budget only time counts.  With a budget ``B`` on weights ``w``, extraction minimizes the
Lagrangian

    time(plan) + lambda * w(plan)

over the same saturated e-graph (node costs ``cost + round(lambda * w)``; no re-saturation),
and the multiplier is searched: ``lambda = 0`` first (the time-only plan; kept if it fits),
then ``lambda_max`` (one byte priced above the whole e-graph's time, within i64 for every
plan: the plan with the fewest bytes the extractor finds; when that does not fit either,
``OverBudget`` says the fewer of its bytes and the time-only plan's), then bisection on
``log2(lambda)`` between them (to ``PRECISION``: about 8 extractions); the fastest plan that
fits is returned.  What the plan
keeps, recomputes or communicates stays the extractor's choice under those costs: nothing
here decides per value.  A Lagrangian search finds only plans on the convex hull of
(time, bytes): a budget between two hull points gets the one below it, and the extractor is
a heuristic, so "the minimum" is the fewest bytes found, not a proof.

Several budgets nest: the last one's multiplier is searched outermost, and each of its
extractions is the search of the others at its node costs (which then minimizes time plus
the outer price, within the inner budgets); an extraction whose inner budgets cannot be met
counts as over the outer budget.  The plan returned meets every budget, or ``OverBudget``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.errors import ReshardError
from .dag import ENode, Entry, _Costs, true_priced

#: the bisection on log2(lambda) stops when its interval is this narrow (lambda within 19%);
#: each step is one extraction of the saturated e-graph
PRECISION = 0.25
#: every plan's Lagrangian stays below this (i64 node costs summed over a plan)
_LIMIT = 1 << 62

#: one extraction at given node costs: (best entry per class, the plan's root entries)
Choose = Callable[[list[ENode], _Costs], tuple[dict[Any, Entry], list[Entry]]]


class OverBudget(ReshardError):
    """No plan found within a budget: the message says the minimum found, ``least`` too (None
    when, at the largest multiplier, no plan met the other budgets)."""

    def __init__(self, message: str, least: int | None = None) -> None:
        super().__init__(message)
        self.least = least


@dataclass(frozen=True)
class Budget:
    """One budget: ``optimize``'s keyword, what its bytes are (``counts``), the plan with the
    fewest of them in words (``fewest``, with ``{bytes}``), the bytes per e-node (by id) and
    the bound."""

    keyword: str
    counts: str
    fewest: str
    weights: np.ndarray
    value: int


def check_budget(keyword: str, value: Any, counts: str) -> None:
    """``ReshardError`` unless ``value`` is None or a non-negative int (not a bool)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ReshardError(f"optimize: {keyword} must be a non-negative int ({counts}) or None, got {value!r}")


@dataclass
class Fit:
    """The plan a budget search chose: its entries (``best``, ``roots``, under true costs) and
    each budget's multiplier (picoseconds per byte, by keyword; 0: the time-only plan fit)."""

    best: dict[Any, Entry]
    roots: list[Entry]
    multipliers: dict[str, float]


def union_bits(roots: list[Entry]) -> int:
    bits = 0
    for e in roots:
        bits |= e.nodes
    return bits


def fit(nodes: list[ENode], budgets: Sequence[Budget], choose: Choose) -> Fit:
    """The fastest plan found within every budget of ``budgets`` (module docstring; none:
    ``choose``'s plan); ``choose`` extracts at given node costs.  ``OverBudget`` when even the
    plan at the largest multiplier exceeds one."""
    if not budgets:
        return Fit(*choose(nodes, _Costs(nodes)), {})
    *inner, outer = budgets
    w = outer.weights
    costs = _Costs(nodes)

    def at(lam: float) -> tuple[Fit, int, int] | OverBudget:
        """(the inner search's plan under true costs, its bytes, its time) at multiplier
        ``lam``, or why the inner budgets cannot be met there (at ``lam = 0``: raised)."""
        priced = nodes if lam == 0 else [
            ENode(n.id, n.ctor, n.cls, n.args, n.children, n.cost + int(round(lam * int(w[n.id])))) for n in nodes]
        try:
            sub = fit(priced, inner, choose)
        except OverBudget as e:
            if lam == 0:
                raise
            return e
        if lam:
            sub.best, sub.roots = true_priced(sub.best, sub.roots, nodes, costs)
        sub.multipliers[outer.keyword] = lam
        bits = union_bits(sub.roots)
        return sub, int(w[costs.members(bits)].sum()), costs.of(bits)

    first = at(0.0)
    assert not isinstance(first, OverBudget)
    if first[1] <= outer.value:
        return first[0]
    total = max(1, int(w.sum()))
    # above 2^hi one byte outweighs the whole e-graph's time (or the Lagrangian would leave i64)
    hi = math.log2(max(1.0, min(int(costs.costs.sum()) + 1, (_LIMIT - int(costs.costs.sum())) / total)))
    found = at(2.0 ** hi)
    with_inner = "".join(f" with {b.keyword}={b.value}" for b in inner)
    if isinstance(found, OverBudget):
        raise OverBudget(f"optimize: {outer.keyword}={outer.value} {outer.counts} cannot be met together"
                         f"{with_inner}: pricing them above all time, {found}")
    if found[1] > outer.value:  # (the extractor is a heuristic: the time-only plan may have fewer)
        least = min(found[1], first[1])
        raise OverBudget(f"optimize: {outer.keyword}={outer.value} {outer.counts} cannot be met{with_inner}: "
                         f"{outer.fewest.format(bytes=least)} is the minimum found; give at least {least}", least)
    lo = -math.log2(total)  # below 2^lo, no node's price reaches one picosecond
    while hi - lo > PRECISION:
        mid = (lo + hi) / 2
        got = at(2.0 ** mid)
        if not isinstance(got, OverBudget) and got[1] <= outer.value:
            hi = mid
            if got[2] <= found[2]:
                found = got
        else:
            lo = mid
    return found[0]
