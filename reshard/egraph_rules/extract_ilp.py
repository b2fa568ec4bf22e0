"""Exact DAG extraction by integer linear programming (scipy's HiGHS ``milp``).

The greedy extractor (``extract.greedy_dag``) is fast but not optimal: a class's best entry
is fixed before the classes that share its sub-plans are known.  This module solves the same
problem exactly, for e-graphs small enough (tests, small programs) to prove optimality:

* binary ``x[n]`` per e-node (chosen), binary ``y[c]`` per T class (needed);
* ``y[r] = 1`` for every root (output) class;
* ``sum(x[n] for n in c) = y[c]``: a needed class picks exactly one node (with non-negative
  costs an optimum never needs two, so this is the same optimum as ``>= 1``);
* ``x[n] <= y[d]`` for every child class ``d`` of ``n``: a chosen node needs its operands;
* acyclicity: the e-graph has cycles (``redistribute`` loops between the distributions of one
  value, zero-cost views).  Only classes in one strongly connected component of the class
  graph can close a cycle, so only they get a continuous level ``l[c] in [0, |SCC| - 1]``,
  and a chosen node ``n`` of class ``c`` with a child ``d`` of the same SCC forces
  ``l[c] >= l[d] + 1`` (big-M, M = |SCC|).  ``acyclic="lazy"`` instead solves without
  ordering and cuts off each cycle of the solution (``_Model.cut``) until none is left; it
  is an independent check of the level encoding but slower (on 85 small programs: 83 s
  against 8.7 s in total; 48 re-solves on a 192-node e-graph), so "levels" is the default;
* minimize ``sum(cost[n] * x[n])``: the DAG cost, each chosen node paid once; exactly the
  greedy's objective (its total is the cost of the union of the chosen nodes).  The greedy's
  union may hold two nodes of one class (an entry built on an older entry of a class that
  later improved); keeping, per class, the node of least derivation height gives an acyclic
  one-node-per-class selection of no greater cost, so the ILP optimum is never above the
  greedy's total.

Before solving, the e-graph is pruned: nodes with a child class that cannot be produced at all
(no well-founded term), nodes that are their own operand, and dominated nodes (another node
of the class needs a subset of their child classes at no greater cost) are dropped, then
everything not reachable from the roots.

Size: HiGHS proves optimality in ~10-50 ms for the e-graphs of small programs (<= 100 T
e-nodes), but the big-M relaxation is weak on dense resharding networks (2-D meshes, ~16
distributions per value, every pair linked by collectives): one 14-op program with 397
pruned nodes takes ~20 s, so this extractor is for tests and small programs, not the default.

Time limit: when HiGHS does not prove optimality within ``time_limit_s``, ``ilp_dag`` does
not raise; it returns the better of HiGHS' incumbent (if any) and the greedy extraction, with
``optimal=False`` and the solver status in the result (``Plan.extraction`` carries it, and
``extract`` warns).  An infeasible program (a root that cannot be produced) leaves the root
out of ``best``, like the greedy, so ``extract`` raises its usual "found no way" error.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, csr_matrix
from scipy.sparse.csgraph import connected_components

from ..ir.errors import ReshardError
from .extract import ENode, Entry, _Costs, greedy_dag, share_communication

#: extractors ``extract``/``optimize`` accept
EXTRACTORS = ("greedy", "ilp")


def check_extractor(extractor: object) -> str:
    """``extractor`` if it names a known extractor, else ReshardError."""
    if not isinstance(extractor, str) or extractor not in EXTRACTORS:
        raise ReshardError(f"optimize: unknown extractor {extractor!r}; expected one of {', '.join(EXTRACTORS)}")
    return extractor


@dataclass
class ExtractionReport:
    """How a plan was extracted.  ``optimal`` is True only when the ILP proved it; ``fallback``
    is True when the ILP timed out and the greedy extraction was the better plan."""

    extractor: str = "greedy"
    optimal: bool = False
    cost: int | None = None
    status: str = ""
    seconds: float = 0.0
    variables: int = 0
    constraints: int = 0
    fallback: bool = False
    #: greedy only: re-extractions of the sharing search, and the plan cost before it
    search_evals: int = 0
    greedy_cost: int | None = None

    def __str__(self) -> str:
        if self.extractor == "greedy":
            text = f"greedy extraction, {self.seconds:.3f} s"
            if self.search_evals:
                text += f", sharing search: {self.search_evals} re-extractions"
                if self.greedy_cost is not None and self.cost is not None and self.cost < self.greedy_cost:
                    text += f", {self.greedy_cost / 1e6:.1f} -> {self.cost / 1e6:.1f} us"
            return text
        state = "proved optimal" if self.optimal else f"NOT proved optimal ({self.status})"
        if self.fallback:
            state += ", greedy plan used"
        return f"ILP extraction {state}, {self.variables} vars, {self.constraints} rows, {self.seconds:.3f} s"


@dataclass
class Pruned:
    """The part of the e-graph an extraction of ``roots`` can use: ``by_class`` maps each class
    reachable from the roots through producible nodes to those nodes."""

    roots: list[Any]
    by_class: dict[Any, list[ENode]] = field(default_factory=dict)

    @property
    def nodes(self) -> list[ENode]:
        return [n for ns in self.by_class.values() for n in ns]


def prune(nodes: list[ENode], roots: list[Any]) -> Pruned:
    """Keep the nodes an acyclic extraction of ``roots`` can use (see module docstring)."""
    nodes = [n for n in nodes if n.cls not in n.children]
    parents: dict[Any, list[ENode]] = defaultdict(list)
    for n in nodes:
        for c in set(n.children):
            parents[c].append(n)
    # producible classes: least fixpoint (a class with a node whose children are all producible)
    missing = {n.id: len(set(n.children)) for n in nodes}
    producible: set[Any] = set()
    stack = [n for n in nodes if not n.children]
    while stack:
        n = stack.pop()
        if n.cls in producible:
            continue
        producible.add(n.cls)
        for p in parents[n.cls]:
            missing[p.id] -= 1
            if missing[p.id] == 0:
                stack.append(p)
    ok: dict[Any, list[ENode]] = defaultdict(list)
    for n in nodes:
        if all(c in producible for c in n.children):
            ok[n.cls].append(n)
    for c, ns in ok.items():
        ok[c] = _undominated(ns)
    out = Pruned(list(roots))
    stack = [r for r in dict.fromkeys(roots) if r in producible]
    while stack:
        c = stack.pop()
        if c in out.by_class:
            continue
        out.by_class[c] = ok[c]
        for n in ok[c]:
            stack.extend(d for d in n.children if d not in out.by_class)
    return out


def _undominated(ns: list[ENode]) -> list[ENode]:
    """Drop a node when another node of its class needs a subset of its child classes at no
    greater cost (ties: the earlier node stays).  Swapping the dominated node for the other in
    any selection keeps it valid and acyclic (its edges are a subset) and costs no more."""
    keys = [(n.cost, len(set(n.children)), k) for k, n in enumerate(ns)]
    keep: list[ENode] = []
    for _, _, k in sorted(keys):
        n = ns[k]
        kids = set(n.children)
        if not any(m.cost <= n.cost and set(m.children) <= kids for m in keep):
            keep.append(n)
    return keep


@dataclass
class ILPResult:
    """``best``: class -> Entry for every needed class (as ``greedy_dag`` returns, restricted to
    what the roots need); ``cost``: the DAG cost of the roots' plan."""

    best: dict[Any, Entry]
    cost: int | None
    report: ExtractionReport


def entries(selection: dict[Any, ENode], costs: _Costs) -> dict[Any, Entry]:
    """Entries (sub-DAG bitsets and costs) of an acyclic selection of one node per class.
    Raises ReshardError if the selection has a cycle or a missing operand."""
    cls_bit = {c: 1 << i for i, c in enumerate(selection)}
    indeg = {c: len(set(n.children)) for c, n in selection.items()}
    users: dict[Any, list[Any]] = defaultdict(list)
    for c, n in selection.items():
        for d in set(n.children):
            if d not in selection:
                raise ReshardError(f"internal: ILP selection uses class {d} without choosing a node for it")
            users[d].append(c)
    ready = [c for c, k in indeg.items() if k == 0]
    best: dict[Any, Entry] = {}
    while ready:
        c = ready.pop()
        n = selection[c]
        kids = tuple(best[d] for d in n.children)
        bits, classes = 1 << n.id, cls_bit[c]
        for e in kids:
            bits |= e.nodes
            classes |= e.classes
        best[c] = Entry(costs.of(bits), n, kids, bits, classes)
        for u in users[c]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    if len(best) != len(selection):
        raise ReshardError("internal: ILP selection is cyclic")
    return best


def root_cost(best: dict[Any, Entry], roots: list[Any], costs: _Costs) -> int:
    bits = 0
    for r in roots:
        bits |= best[r].nodes
    return costs.of(bits)


def selection_cycles(selection: dict[Any, ENode]) -> list[list[Any]]:
    """Class cycles of a selection (one node per class; edges class -> its node's children),
    one per back edge of a depth-first search; empty when the selection is acyclic."""
    state: dict[Any, int] = {}  # 1 on the stack, 2 done
    cycles: list[list[Any]] = []
    for start in selection:
        if start in state:
            continue
        path = [start]
        its = [iter(dict.fromkeys(selection[start].children))]
        state[start] = 1
        while its:
            d = next(its[-1], None)
            if d is None:
                state[path.pop()] = 2
                its.pop()
            elif state.get(d) == 1:
                cycles.append(path[path.index(d):])
            elif d not in state:
                state[d] = 1
                path.append(d)
                its.append(iter(dict.fromkeys(selection[d].children)))
    return cycles


class _Model:
    """The ILP (see module docstring) over the pruned e-graph; ``acyclic`` is "levels" (SCC
    level variables, one solve) or "lazy" (no ordering; each cycle of a solution is cut off by
    ``sum(x[n] : n in c_i with child c_i+1) <= k - 1`` over its classes c_1..c_k, re-solve)."""

    def __init__(self, pr: Pruned, roots: list[Any], acyclic: str) -> None:
        if acyclic not in ("levels", "lazy"):
            raise ReshardError(f"extract_ilp: unknown acyclicity encoding {acyclic!r}; expected 'levels' or 'lazy'")
        self.kept = pr.nodes
        self.classes = list(pr.by_class)
        self.cidx = {c: i for i, c in enumerate(self.classes)}
        nx, ny = self.nx, self.ny = len(self.kept), len(self.classes)
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.members: dict[int, list[int]] = defaultdict(list)
        for j, n in enumerate(self.kept):
            self.members[self.cidx[n.cls]].append(j)
        for i in range(ny):  # sum x[n in c] - y[c] == 0
            self.row([(j, 1.0) for j in self.members[i]] + [(nx + i, -1.0)], 0.0, 0.0)
        for j, n in enumerate(self.kept):  # x[n] <= y[d]
            for d in dict.fromkeys(n.children):
                self.row([(j, 1.0), (nx + self.cidx[d], -1.0)], -np.inf, 0.0)
        nvar = nx + ny
        lvl_ub: list[float] = []
        if acyclic == "levels":
            src = [self.cidx[n.cls] for n in self.kept for d in set(n.children)]
            dst = [self.cidx[d] for n in self.kept for d in set(n.children)]
            graph = csr_matrix((np.ones(len(src)), (src, dst)), shape=(ny, ny))
            _, comp = connected_components(graph, directed=True, connection="strong")
            size = np.bincount(comp, minlength=ny)
            lidx: dict[int, int] = {}
            for i in range(ny):
                if size[comp[i]] > 1:
                    lidx[i] = nvar + len(lidx)
                    lvl_ub.append(float(size[comp[i]] - 1))
            for j, n in enumerate(self.kept):
                ci = self.cidx[n.cls]
                for d in dict.fromkeys(n.children):
                    di = self.cidx[d]
                    if comp[ci] == comp[di]:  # x[n] = 1 => l[c] >= l[d] + 1:  l[d] - l[c] + M x[n] <= M - 1
                        m = float(size[comp[ci]])
                        self.row([(lidx[di], 1.0), (lidx[ci], -1.0), (j, m)], -np.inf, m - 1.0)
            nvar += len(lidx)
        self.nvar = nvar
        self.c = np.zeros(nvar)
        self.c[:nx] = [float(n.cost) for n in self.kept]
        self.integrality = np.zeros(nvar)
        self.integrality[:nx + ny] = 1
        self.lb = np.zeros(nvar)
        self.ub = np.ones(nvar)
        self.ub[nx + ny:] = lvl_ub
        for r in roots:
            self.lb[nx + self.cidx[r]] = 1.0

    def row(self, entries_: list[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(self.lo)
        for j, v in entries_:
            self.rows.append(r)
            self.cols.append(j)
            self.vals.append(v)
        self.lo.append(lb)
        self.hi.append(ub)

    def cut(self, cycle: list[Any]) -> None:
        """Forbid the class cycle ``cycle`` (c_1 -> c_2 -> ... -> c_k -> c_1)."""
        terms = []
        for k, c in enumerate(cycle):
            nxt = cycle[(k + 1) % len(cycle)]
            terms += [(j, 1.0) for j in self.members[self.cidx[c]] if nxt in self.kept[j].children]
        self.row(terms, -np.inf, float(len(cycle) - 1))

    def solve(self, time_limit_s: float | None) -> Any:
        a = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.lo), self.nvar)).tocsr()
        options: dict[str, Any] = {"mip_rel_gap": 0.0}
        if time_limit_s is not None:
            options["time_limit"] = max(0.01, float(time_limit_s))
        return milp(self.c, constraints=LinearConstraint(a, self.lo, self.hi), integrality=self.integrality,
                    bounds=Bounds(self.lb, self.ub), options=options)

    def selection(self, x: np.ndarray) -> dict[Any, ENode]:
        needed = x[self.nx:self.nx + self.ny] > 0.5
        out: dict[Any, ENode] = {}
        for j in np.flatnonzero(x[:self.nx] > 0.5):
            n = self.kept[j]
            if needed[self.cidx[n.cls]]:
                out.setdefault(n.cls, n)
        return out


def ilp_dag(nodes: list[ENode], costs: _Costs, roots: list[Any], *, time_limit_s: float | None = 30.0,
            acyclic: str = "levels") -> ILPResult:
    """Minimum-DAG-cost extraction of ``roots`` (see module docstring).  Roots that cannot be
    produced are left out of ``best``; the others are extracted optimally (or, past
    ``time_limit_s``, as well as found, with ``report.optimal`` False)."""
    if time_limit_s is not None and (isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float))
                                     or not time_limit_s >= 0):
        raise ReshardError(f"optimize: ilp_time_limit_s must be a number >= 0 or None, got {time_limit_s!r}")
    t0 = time.perf_counter()
    report = ExtractionReport("ilp")
    pr = prune(nodes, [r for r in roots if r is not None])
    roots_ok = [r for r in dict.fromkeys(pr.roots) if r in pr.by_class]
    if not roots_ok:
        report.optimal, report.status, report.cost = True, "nothing to extract", 0
        report.seconds = time.perf_counter() - t0
        return ILPResult({}, 0, report)
    model = _Model(pr, roots_ok, acyclic)
    best: dict[Any, Entry] | None = None
    solves = 0
    while True:
        left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            report.status = "time limit reached " + ("while cutting cycles" if solves else "before solving")
            break
        res = model.solve(left)
        solves += 1
        report.status = res.message
        if res.x is None:
            break
        selection = model.selection(res.x)
        cycles = selection_cycles(selection)
        if not cycles:
            best = entries(selection, costs)
            report.optimal = res.status == 0
            break
        if res.status != 0:  # a cyclic incumbent is no plan
            break
        for cyc in cycles:
            model.cut(cyc)
    report.variables, report.constraints = model.nvar, len(model.lo)
    if solves > 1:
        report.status += f" ({solves} solves)"
    if report.optimal and best is not None:
        cost = root_cost(best, roots_ok, costs)
    else:
        # not proved optimal (time limit) or no solution: the better of incumbent and greedy
        greedy = share_communication(nodes, costs, roots_ok, greedy_dag(nodes, costs))[0]
        g_cost = root_cost(greedy, roots_ok, costs) if all(r in greedy for r in roots_ok) else None
        cost = root_cost(best, roots_ok, costs) if best is not None else None
        if g_cost is not None and (cost is None or g_cost < cost):
            best, cost, report.fallback = greedy, g_cost, True
        if best is None:
            raise ReshardError(f"optimize: the ILP extractor found no plan ({report.status}) and the greedy none either")
    report.cost = cost
    report.seconds = time.perf_counter() - t0
    return ILPResult(best, cost, report)
