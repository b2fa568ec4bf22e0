"""Greedy vs ILP extraction on one saturated e-graph, and a brute-force optimum for tiny ones.

Shared by ``tests/extract/test_extract_ilp.py`` and ``benchmarks/extractor_gap.py``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

import reshard as rs
from reshard.extract.dag import ENode, _Costs, collect_enodes, greedy_dag, share_communication
from reshard.search.snapshot import real_classes
from reshard.extract.extract_ilp import selection_cycles, root_cost, ilp_dag
from reshard.plan import Saturated
from reshard.testing import fuzz_programs as FP


def sample_fusions(n: int, seed: int = 0, min_ops: int = 1, max_ops: int = 8) -> list[rs.Fusion]:
    """``n`` distinct random Fusions from ``fuzz_programs.fusions()``, deterministic for a
    ``seed`` (hypothesis' generate phase under ``@seed``, no example database)."""
    out: dict[str, rs.Fusion] = {}

    @hypothesis_seed(seed)
    @settings(max_examples=4 * n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(f=FP.fusions(min_ops=min_ops, max_ops=max_ops))
    def collect(f: rs.Fusion) -> None:
        if len(out) < n:
            out.setdefault(FP.fusion_source(f), f)

    collect()
    return list(out.values())


@dataclass
class Problem:
    """The extraction problem of a saturated e-graph: all T e-nodes, their cost vector, and the
    output (root) classes."""

    sat: Saturated
    nodes: list[ENode]
    costs: _Costs
    roots: list[Any]


def problem(sat: Saturated) -> Problem:
    snap = sat.snapshot
    nodes = collect_enodes(snap)
    by_name = {v: k for k, v in real_classes(snap).items()}
    roots = [by_name.get((tid, snap.let(let))) for let, (tid, _) in zip(sat.encoding.output_lets, sat.fusion.outputs)]
    return Problem(sat, nodes, _Costs(nodes), roots)


@dataclass
class Comparison:
    greedy_cost: int
    ilp_cost: int
    optimal: bool
    greedy_s: float
    ilp_s: float
    #: the ILP was not proved optimal and the greedy plan was the better one
    fallback: bool = False
    #: the ILP's status: how optimality was proved (a bound or HiGHS), or why not
    status: str = ""

    @property
    def gap(self) -> float:
        """How much more the greedy plan costs than the ILP's, as a fraction of the ILP cost."""
        if self.greedy_cost == self.ilp_cost:
            return 0.0
        return (self.greedy_cost - self.ilp_cost) / max(self.ilp_cost, 1)


def compare(p: Problem, time_limit_s: float = 30.0) -> Comparison | None:
    """Both extractors' DAG cost of the roots (None when no plan exists)."""
    if any(r is None for r in p.roots):
        return None
    t0 = time.perf_counter()
    g = share_communication(p.nodes, p.costs, p.roots, greedy_dag(p.nodes, p.costs))[0]  # the default extractor
    t1 = time.perf_counter()
    if not all(r in g for r in p.roots):
        return None
    g_cost = root_cost(g, p.roots, p.costs)
    t2 = time.perf_counter()
    res = ilp_dag(p.nodes, p.costs, p.roots, time_limit_s=time_limit_s)
    t3 = time.perf_counter()
    return Comparison(g_cost, res.cost, res.report.optimal, t1 - t0, t3 - t2, res.report.fallback, res.report.status)


class TooMany(Exception):
    pass


def brute_force(p: Problem, limit: int = 20000) -> tuple[int, int] | None:
    """(minimum DAG cost, number of complete selections) over every selection of one node per
    needed class (needed: the roots and, recursively, the classes of the chosen nodes'
    children) that is acyclic; no pruning, no solver.  None when there are more than
    ``limit`` complete selections (or ``50 * limit`` partial ones) or no root class."""
    if any(r is None for r in p.roots):
        return None
    by_class: dict[Any, list[ENode]] = {}
    for n in p.nodes:
        by_class.setdefault(n.cls, []).append(n)
    best: list[int | None] = [None]
    count = [0, 0]
    assign: dict[Any, ENode] = {}

    def rec(todo: list[Any]) -> None:
        count[1] += 1
        if count[1] > 50 * limit:
            raise TooMany
        todo = [c for c in todo if c not in assign]
        if not todo:
            count[0] += 1
            if count[0] > limit:
                raise TooMany
            if not selection_cycles(assign):
                cost = sum(n.cost for n in assign.values())
                if best[0] is None or cost < best[0]:
                    best[0] = cost
            return
        c, rest = todo[0], todo[1:]
        for n in by_class.get(c, []):
            assign[c] = n
            rec(rest + [d for d in n.children if d not in assign])
            del assign[c]

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10000))
    try:
        rec(list(dict.fromkeys(p.roots)))
    except TooMany:
        return None
    finally:
        sys.setrecursionlimit(old)
    return None if best[0] is None else (best[0], count[0])
