"""Exact windows: the ILP on overlapping windows of the program improves the greedy plan.

The greedy extractor (``dag.greedy_dag``) prices each class's sub-plan on its own and the
sharing search (``dag.share_communication``) only frees one communication at a time, so a
choice that pays off only jointly over a few ops (one all-gather of a norm's output feeding
q, k and v, then heads-sharded attention, instead of gathering two weights and all-to-alling
the third) is missed: two Llama-2-7B layers at tp 8, greedy 4511.5 us, the exact ILP
4183.4 us.  The ILP of the whole program proves that on two layers, not on 32.

Law of the search: the program's ops are cut into windows of ``WINDOW_OPS`` consecutive ops
(by position: an op's index; an input's, its first consumer's), overlapping by half.  For a
window W, the current plan outside W is kept: the classes of W's values that plan nodes
outside W read (and the program's outputs in W) are the roots of a sub-problem whose nodes
are those of W's classes; a class outside W that they read is a leaf priced at what its
current entry adds to the plan outside W (a node whose outside operand depends on W is left
out: no cycle through the kept plan).  ``extract_ilp.ilp_dag`` solves it exactly; when it is
proved cheaper than the plan's nodes in W, its nodes are assumed paid for and the program is
re-extracted greedily (``dag.free_trial``, as the sharing search does), and the result is
kept iff its true cost is lower.  So every plan kept is a valid greedy extraction, never
costlier than the one before; windows whose ILP is not proved optimal within
``WINDOW_NODE_LIMIT`` branch-and-bound nodes are skipped, and so are windows whose sub-problem
holds more than ``WINDOW_SUB_NODES`` e-nodes (work bounds, not a time limit: every rank
extracts the same plan; ``WINDOW_TIME_LIMIT_S`` is only a safety net), and
``stop()`` (optimize()'s time limit) ends the pass.
The two Llama layers: 12 windows, 4511.5 -> 4183.4 us, the ILP's optimum.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..ir.errors import ReshardError
from ..ir.fusion import Fusion
from .dag import ClassGraph, ENode, Entry, _Costs, _graph, _plan_bits, _plan_cost, free_trial
from .extract_ilp import ILPResult, ilp_dag

#: ops per window; consecutive windows overlap by half (on Llama-2-7B layers at tp 8, of 16-60 ops with and
#: without overlaps, 30 overlapping came closest to the ILP for its time)
WINDOW_OPS = 30
#: branch-and-bound nodes HiGHS may spend proving one window (a deterministic work bound)
WINDOW_NODE_LIMIT = 200
#: e-nodes a window's classes may hold: a window over ops with many alternatives each (a 2-D mesh) has fewer
#: ops (Llama-2-7B layers: at most ~700 at tp 8, up to 6,000 on dp 2 x tp 4, where HiGHS proved none of them
#: within the time limit), so a window's size, and its ILP's time, is bounded by work
WINDOW_NODES = 800
#: e-nodes of a window's sub-problem (its classes' nodes and the leaves it reads) past which it is skipped: on
#: Llama-2-7B's dp 2 x tp 4 stack the windows of 834-888 took 3-5 s each in HiGHS, some reached
#: ``WINDOW_TIME_LIMIT_S`` (the plan then depended on the machine's speed), and none improved the plan (skipped:
#: the same plan, windows 115 -> 23 s, every solved window proved optimal); later, with grouped-query
#: attention, those of 760-820 did the same (16 of the stack's 184 windows, 22 of its 39 s of HiGHS, one at
#: the time limit, none improving the plan: skipped, the same plan, the 32-layer step planned in 77 s, not 147;
#: the cost: the tiny GPT-2 of the training tests at 2 x 2 and 4 layers loses the one window of that size that
#: improved it, 1974.0 -> 1990.2 us modeled, +0.8%; GPT-2 XL's 32-layer dp 2 x tp 4 plan got 0.7% cheaper).
#: Then 650: on Mixtral-8x7B's dp 2 x tp 4 stack (dense experts) windows of 670-722 spent 4-11 s each in HiGHS
#: (the root's strong branching and cuts; up to 200 nodes without a proof) for a plan 0.13% cheaper at 4 layers
#: and none at 32 (58 -> 26 s and 60 -> 32 s planned); the Llama-2-7B and GPT-2 XL dp 2 x tp 4 plans 0.00-0.12%
#: *cheaper* without them (later windows improve more); the plans of every 1-D mesh (tp 2 / 4 / 8, Mixtral's
#: tp 8 too) and of the tiny training configs the same (their windows of that size improved none in the end)
WINDOW_SUB_NODES = 650
#: and seconds, a safety net only (a 32-layer stack at tp 8 once ran past 10 minutes without it), far above
#: what ``WINDOW_NODE_LIMIT`` nodes take: at 5 s, GPT-2 XL's 32-layer tp 4 stack had a window whose 200 nodes
#: took 4.9-5.0 s on an idle box, so the clock, not the work bound, decided it (26910.5 us modeled where it
#: proved in time, 26930.9 where it did not: the plan depended on the machine's speed and load)
WINDOW_TIME_LIMIT_S = 30.0



def op_positions(fusion: Fusion) -> dict[int, int]:
    """Tensor id -> position in the program: its producing op's index, an input's first
    consumer's (inputs are listed first but belong where they are used)."""
    first_use: dict[int, int] = {}
    for op in reversed(fusion.ops):
        for t in op.inputs:
            first_use[t] = op.index
    return {op.output: first_use.get(op.output, op.index) if op.kind == "input" else op.index for op in fusion.ops}


def exact_windows(nodes: list[ENode], costs: _Costs, roots: list[Any], best: dict[Any, Entry],
                  position: dict[Any, int], width: int = WINDOW_OPS, stride: int | None = None,
                  stop: Callable[[], bool] | None = None, graph: ClassGraph | None = None,
                  solved_before: dict[tuple, ILPResult | None] | None = None,
                  progress: Callable[[str], None] | None = None, most_nodes: int = WINDOW_SUB_NODES
                  ) -> tuple[dict[Any, Entry], int, int | None, int | None]:
    """Improve ``best`` window by window (see module docstring); ``position``: T class ->
    position of its value; ``graph``: see ``dag.share_communication``.  ``solved_before``: the
    windows' sub-problems solved so far on these nodes and costs, by their nodes and roots (None:
    no solution within the work bounds), filled in: a sub-problem met again (a second candidate
    plan, ``extract.select``, mostly equal to the first outside a few windows) is not solved
    again, its solution is the same.  ``progress``: told before each window ("k/n": windows
    done / windows).  ``most_nodes``: the most e-nodes a window's sub-problem may hold to be
    solved.  Returns (best, windows solved, cost before, cost after)."""
    before = cur = _plan_cost(best, roots, costs)
    if cur is None or not position:
        return best, 0, before, cur
    graph = graph or _graph(nodes)
    cls_bit = graph.cls_bit
    by_cls: dict[Any, list[ENode]] = defaultdict(list)
    for n in nodes:
        by_cls[n.cls].append(n)
    by_id = {n.id: n for n in nodes}  # (``nodes`` may be a part of the e-nodes: ids are not positions)
    in_window: dict[int, list[Any]] = defaultdict(list)
    for c in by_cls:
        if c in position:
            in_window[position[c]].append(c)
    top, stride = max(position.values()), stride or max(1, width // 2)
    weight = {p: sum(len(by_cls[c]) for c in cs) for p, cs in in_window.items()}
    free, cur_costs, solved = 0, costs, 0
    plan = _PlanIndex.of(by_id, costs, roots, best, position)
    spans = _spans(weight, top, width, stride, WINDOW_NODES)
    for k, (start, end) in enumerate(spans):
        if stop is not None and stop():
            break
        if progress is not None:
            progress(f"{k}/{len(spans)}")
        window = {c for p in range(start, end) for c in in_window.get(p, ())}
        if plan.best is not best:
            plan = _PlanIndex.of(by_id, costs, roots, best, position)
        sub = _subproblem(by_id, costs, roots, best, by_cls, cls_bit, window, plan, range(start, end),
                          most_nodes)
        if sub is None:
            continue
        sub_nodes, back, sub_roots, now = sub
        sub_costs = _Costs(sub_nodes)
        res = _solve(sub_nodes, sub_costs, sub_roots, now, {} if solved_before is None else solved_before)
        solved += 1
        if res is None or not res.report.optimal or res.cost is None or res.cost >= now or \
                any(r not in res.best for r in sub_roots):
            continue
        chosen = 0
        for r in sub_roots:
            for k in sub_costs.members(res.best[r].nodes):
                if back[k] is not None:
                    chosen |= 1 << back[k]
        delta = chosen & ~free
        if not delta:
            continue
        changed = list({d for i in costs.members(delta) for d in (by_id[i].cls, *by_id[i].children)})
        trial, trial_costs = free_trial(nodes, costs, cur_costs, best, delta, changed, graph, by_id)
        t = _plan_cost(trial, roots, costs)
        if t is not None and t < cur:
            best, cur, free, cur_costs = trial, t, free | delta, trial_costs
    return best, solved, before, cur


def _solve(sub_nodes: list[ENode], sub_costs: _Costs, sub_roots: list[Any], now: int,
           known: dict[tuple, ILPResult | None]) -> ILPResult | None:
    """The ILP's solution of a window's sub-problem if one may cost less than ``now`` (what the
    plan pays in the window: ``extract_ilp.ilp_dag``'s cutoff), or None when it found no plan
    within the node limit; from ``known`` (by the sub-problem's nodes, roots and ``now``) when
    solved before, else solved and added."""
    key = (tuple(sub_nodes), tuple(sub_roots), now)
    if key not in known:
        try:
            known[key] = ilp_dag(sub_nodes, sub_costs, sub_roots, time_limit_s=WINDOW_TIME_LIMIT_S, share=False,
                                 node_limit=WINDOW_NODE_LIMIT, cutoff=now)
        except ReshardError:
            known[key] = None
    return known[key]


def _spans(weight: dict[int, int], top: int, width: int, stride: int, most: int) -> list[tuple[int, int]]:
    """The windows ``[start, end)`` of positions ``0..top``: ``width`` positions each, ``stride``
    apart, unless a window's classes would hold more than ``most`` e-nodes (``weight``: per
    position): then it ends before the position that would overflow it (at least one position)
    and the next starts half its length on.  The last window reaches ``top``."""
    out, start = [], 0
    while True:
        end, held = start, 0
        while end <= top and end - start < width and (end == start or held + weight.get(end, 0) <= most):
            held += weight.get(end, 0)
            end += 1
        out.append((start, end))
        if end > top:
            return out
        start += stride if end - start == width else max(1, (end - start) // 2)


@dataclass(frozen=True)
class _PlanIndex:
    """The plan of ``best`` for the roots, indexed for its windows: its node set (``used``), its
    nodes by the position of their class (``at``) and, per class, the plan nodes reading it
    (``readers``, ascending ids)."""

    best: dict[Any, Entry]
    used: int
    at: dict[int, list[int]]
    readers: dict[Any, list[int]]

    @staticmethod
    def of(nodes: dict[int, ENode], costs: _Costs, roots: list[Any], best: dict[Any, Entry],
           position: dict[Any, int]) -> "_PlanIndex":
        used = _plan_bits(best, roots) or 0
        at: dict[int, list[int]] = defaultdict(list)
        readers: dict[Any, list[int]] = defaultdict(list)
        for i in costs.members(used).tolist():
            n = nodes[i]
            if n.cls in position:
                at[position[n.cls]].append(i)
            for d in dict.fromkeys(n.children):
                readers[d].append(i)
        return _PlanIndex(best, used, at, readers)


def _bitset(ids: list[int]) -> int:
    """The bitset of ``ids``."""
    if not ids:
        return 0
    flags = np.zeros(max(ids) + 1, dtype=bool)
    flags[ids] = True
    return int.from_bytes(np.packbits(flags, bitorder="little").tobytes(), "little")


def _subproblem(nodes: dict[int, ENode], costs: _Costs, roots: list[Any], best: dict[Any, Entry],
                by_cls: dict[Any, list[ENode]], cls_bit: dict[Any, int], window: set[Any], plan: _PlanIndex,
                span: range, most: int) -> tuple[list[ENode], list[int | None], list[Any], int] | None:
    """The window's sub-problem: (its nodes renumbered from 0, leaves last; original id per
    node, None for a leaf; its roots; what the current plan pays for nodes in the window),
    or None when the plan needs nothing from the window or the sub-problem would hold more
    than ``most`` nodes (known before its leaves are priced: each reads a node set as wide
    as the e-graph) (``window``: the classes at the positions of ``span``; ``plan``: the plan
    of ``best`` indexed)."""
    inside = [i for p in span for i in plan.at.get(p, ())]
    inside_bits = _bitset(inside)
    outside = (plan.used | inside_bits) ^ inside_bits  # (``x & ~y`` as ``(x | y) ^ y``: no complement of a set
    # as wide as the e-graph, several times slower)
    reading = sorted({i for c in window for i in plan.readers.get(c, ()) if nodes[i].cls not in window})
    sub_roots = list(dict.fromkeys([d for i in reading for d in nodes[i].children if d in window]
                                   + [r for r in roots if r in window]))
    if not sub_roots:
        return None
    wbits = 0
    for c in window:
        wbits |= cls_bit.get(c, 0)
    sub: list[ENode] = []
    back: list[int | None] = []
    leaves: dict[Any, None] = {}
    # per child class: does a node reading it leave the sub-problem (outside the window, with no
    # entry or one whose sub-plan passes through the window: a cycle through the kept plan)?
    leaves_out: dict[Any, bool] = {}
    for c in window:
        for n in by_cls[c]:
            out = False
            for d in n.children:
                x = leaves_out.get(d)
                if x is None:
                    e = best.get(d)
                    x = leaves_out[d] = d not in window and (e is None or bool(e.classes & wbits))
                if x:
                    out = True
                    break
            if out:
                continue
            sub.append(ENode(len(sub), n.ctor, n.cls, n.args, n.children, n.cost))
            back.append(n.id)
            for d in n.children:
                if d not in window:
                    leaves[d] = None
    if len(sub) + len(leaves) > most:
        return None
    for d in leaves:
        sub.append(ENode(len(sub), "Leaf", d, (), (), costs.of((best[d].nodes | outside) ^ outside)))
        back.append(None)
    return sub, back, sub_roots, int(costs.costs[inside].sum()) if inside else 0
