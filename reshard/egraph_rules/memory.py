"""A per-rank memory budget for saved activations, met by extraction (a Lagrange multiplier).

Keeping a forward value for the backward pass (``saved``'s node reading class ``(v, d)``)
holds ``kept(k, t)`` bytes per rank (``remat``'s ``kept-bytes``; 0 for program inputs);
recomputing it instead (``remat``'s twins) costs the op's time.  Without a budget only time
counts, so a plan keeps whatever is cheaper to keep than to recompute.  With a budget ``B``,
extraction minimizes the Lagrangian

    time(plan) + lambda * kept(plan)

over the same saturated e-graph (node costs ``cost + round(lambda * kept)``; no re-saturation),
and the multiplier is searched: ``lambda = 0`` first (the time-only plan; kept if it fits),
then ``lambda_max`` (one byte priced above the whole e-graph's time, within i64 for every
plan: the plan keeping the fewest bytes the extractor finds; when that does not fit either,
``ReshardError`` says the minimum), then bisection on ``log2(lambda)`` between them (to
``PRECISION``: about 8 extractions); the fastest plan that fits is returned.  Which values
are kept, recomputed, or kept sharded and gathered in the backward pass stays the
extractor's choice under those costs: nothing here decides per value.  ``kept(plan)`` is the
sum over the distinct kept nodes of the plan (a shared one once).  A Lagrangian search finds
only plans on the convex hull of (time, kept bytes): a budget between two hull points gets
the one below it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.errors import ReshardError
from .dag import ENode, Entry, Snapshot, _Costs, fold_dag

#: the bisection on log2(lambda) stops when its interval is this narrow (lambda within 19%);
#: each step is one extraction of the saturated e-graph
PRECISION = 0.25
#: every plan's Lagrangian stays below this (i64 node costs summed over a plan)
_LIMIT = 1 << 62

#: one extraction at given node costs: (best entry per class, the plan's root entries)
Choose = Callable[[list[ENode], _Costs], tuple[dict[Any, Entry], list[Entry]]]


def kept_bytes(snap: Snapshot, nodes: list[ENode]) -> np.ndarray:
    """Per e-node (by id), the bytes per rank it keeps across the boundary (table ``kept``)."""
    table = {tuple(r.inputs): snap.i64(r.output) for r in snap.rows("kept")}
    out = np.zeros(len(nodes), dtype=np.int64)
    for n in nodes if table else ():
        if n.ctor == "Loc" and n.args in table:
            out[n.id] = table[n.args]
    return out


@dataclass
class Fit:
    """The plan a budget search chose: its entries (``best``, ``roots``, under true costs),
    the bytes it keeps, the multiplier (picoseconds per byte) and how many extractions ran."""

    best: dict[Any, Entry]
    roots: list[Entry]
    kept: int
    multiplier: float
    extractions: int


def union_bits(roots: list[Entry]) -> int:
    bits = 0
    for e in roots:
        bits |= e.nodes
    return bits


def _true(entries: dict[Any, Entry], roots: list[Entry], nodes: list[ENode], costs: _Costs
          ) -> tuple[dict[Any, Entry], list[Entry]]:
    """Entries chosen under Lagrangian costs, re-priced with the true nodes and costs."""
    done = fold_dag([*entries.values(), *roots], lambda e: e.children,
                    lambda e, kids: Entry(costs.of(e.nodes), nodes[e.node.id], tuple(kids), e.nodes, e.classes))
    return {c: done[id(e)] for c, e in entries.items()}, [done[id(e)] for e in roots]


def fit(nodes: list[ENode], mem: np.ndarray, budget: int, choose: Choose) -> Fit:
    """The fastest plan found whose kept bytes are at most ``budget`` (module docstring);
    ``choose`` extracts at given node costs.  ``ReshardError`` when even the plan at the
    largest multiplier keeps more."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ReshardError(f"optimize: memory_budget must be a non-negative int (bytes per rank of saved "
                           f"activations) or None, got {budget!r}")
    costs = _Costs(nodes)
    runs = 0

    def at(lam: float) -> tuple[dict[Any, Entry], list[Entry], int, int]:
        """(entries, roots, kept bytes, time) of the extraction at multiplier ``lam``."""
        nonlocal runs
        runs += 1
        if lam == 0:
            best, roots = choose(nodes, costs)
        else:
            priced = [ENode(n.id, n.ctor, n.cls, n.args, n.children, n.cost + int(round(lam * int(mem[n.id]))))
                      for n in nodes]
            best, roots = _true(*choose(priced, _Costs(priced)), nodes, costs)
        bits = union_bits(roots)
        return best, roots, int(mem[costs.members(bits)].sum()), costs.of(bits)

    best, roots, kept, _ = at(0.0)
    if kept <= budget:
        return Fit(best, roots, kept, 0.0, runs)
    total_mem = max(1, int(mem.sum()))
    # above 2^hi one byte outweighs the whole e-graph's time (or the Lagrangian would leave i64)
    hi = math.log2(max(1.0, min(int(costs.costs.sum()) + 1, (_LIMIT - int(costs.costs.sum())) / total_mem)))
    found = at(2.0 ** hi)
    if found[2] > budget:
        raise ReshardError(f"optimize: memory_budget={budget} bytes per rank of saved activations cannot be met: "
                           f"the plan keeping the fewest ({found[2]} bytes per rank, recomputing what can be "
                           f"recomputed from saved operands) is the minimum found; give at least {found[2]}")
    lam, lo = 2.0 ** hi, -math.log2(total_mem)  # below 2^lo, no node's price reaches one picosecond
    while hi - lo > PRECISION:
        mid = (lo + hi) / 2
        got = at(2.0 ** mid)
        if got[2] <= budget:
            hi = mid
            if got[3] <= found[3]:
                found, lam = got, 2.0 ** mid
        else:
            lo = mid
    return Fit(found[0], found[1], found[2], lam, runs)
