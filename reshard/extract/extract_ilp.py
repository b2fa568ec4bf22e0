"""Exact DAG extraction by integer linear programming (scipy's HiGHS ``milp``).

The greedy extractor (``dag.greedy_dag``) is fast but not optimal: a class's best entry
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

Strengthening.  The rows above alone have a weak LP relaxation: a needed class may be split
over several alternatives (0.25 each through four classes of an operand value), each reading
an operand class at that fraction only, so every collective of the operand is paid a
fraction (on the demo block the relaxation gave 8.9 us of a 60.1 us optimum; HiGHS did not
close that gap in 30 s).  Mandatory components fix most of it (``_Model._mandatory``): an
acyclic derivation of a class of a strongly connected component K leaves K through an *exit*
(a node of K with no child in K), so every plan uses the components that all exits of K
need, recursively from the roots' components; each such component gets the row
``sum(x[n] for exits n) >= 1`` (the operand value is computed once in full, not in
fractions; the demo block's relaxation becomes 46.7 us).

Proof without branching.  The greedy plan is often optimal; ``ilp_dag`` returns it as proved
when its cost meets a lower bound: the tree bound (``tree_bound``: costs of single
derivations, adding what cannot be shared; 60.05 us on the demo block) or the LP relaxation,
and only solves the ILP otherwise (``bounds=False`` always solves it).

Before solving, the e-graph is pruned: nodes with a child class that cannot be produced at all
(no well-founded term), nodes that are their own operand, and dominated nodes (another node
of the class needs a subset of their child classes at no greater cost) are dropped, then
everything not reachable from the roots.

Size (CPU seconds on a 2-core box, e-graphs of the current rules): of 331 e-graphs (300
random programs of 1-12 ops from ``benchmarks/extractor_gap.py``, the test programs, the demo
block; up to 549 T e-nodes) every one is proved optimal, 7 s in all and 2.3 s at most (most
at a bound: median 1.3 ms).  Larger e-graphs are proved too: a 2-block transformer stack (1,554
variables), 4 blocks (3,098), a 2-block GPT-2 body (4,636) and a 600-op chain (9,010) in
0.6-1.3 s each.  The ILP is still meant for tests
and small programs, not as the default.

Time limit: when HiGHS does not prove optimality within ``time_limit_s``, ``ilp_dag`` does
not raise; it returns the better of HiGHS' incumbent (if any) and the greedy extraction, with
``optimal=False`` and the solver status in the result (``Plan.extraction`` carries it, and
``extract`` warns).  ``extract`` then finishes the greedy extractor's candidates too (sharing
search, buckets, adoption: more than ``ilp_dag``'s own greedy) and keeps the cheapest, so a
cut ILP never returns a plan costlier than the default extractor's (``fallback``: not the
ILP's incumbent).  An infeasible program (a root that cannot be produced) leaves the root
out of ``best``, like the greedy, so ``extract`` raises its usual "found no way" error.
"""

from __future__ import annotations

import functools
import heapq
import time
from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, csr_matrix
from scipy.sparse.csgraph import connected_components

from ..ir.errors import ReshardError
from .dag import ENode, Entry, _Costs, greedy_dag, parents_of, share_communication

#: extractors ``extract``/``optimize`` accept
EXTRACTORS = ("greedy", "ilp", "windows")


def check_extractor(extractor: object) -> str:
    """``extractor`` if it names a known extractor, else ReshardError."""
    if not isinstance(extractor, str) or extractor not in EXTRACTORS:
        raise ReshardError(f"optimize: unknown extractor {extractor!r}; expected one of {', '.join(EXTRACTORS)}")
    return extractor


@dataclass
class ExtractionReport:
    """How a plan was extracted.  ``optimal`` is True only when the ILP proved it; ``fallback``
    is True when the ILP timed out and a greedy extraction was the better plan (the module
    docstring's "Time limit")."""

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
    #: windows only: windows the exact-window search solved (``windows.exact_windows``)
    windows: int = 0
    #: bytes per rank the plan keeps for the backward pass, and the multiplier (ps per byte)
    #: that priced them under a memory budget (``memory``; None: no budget)
    kept_bytes: int = 0
    multiplier: float | None = None
    #: bytes each rank receives over the plan's communications (``received``), and the
    #: multiplier (ps per byte) that priced them under a communication budget (None: no budget)
    comm_bytes: int = 0
    comm_multiplier: float | None = None
    #: the candidate whose plan was chosen (``extract.Candidate.what``: "plain", "data-axis",
    #: "model-parallel", "output trials", "ilp"; "" before extraction)
    candidate: str = ""

    def __str__(self) -> str:
        if self.extractor in ("greedy", "windows"):
            text = f"{self.extractor} extraction, {self.seconds:.3f} s"
            if self.search_evals:
                text += f", sharing search: {self.search_evals} re-extractions"
            if self.windows:
                text += f", {self.windows} exact windows"
            if self.multiplier:
                text += f", memory budget met at {self.multiplier:.3g} ps per kept byte ({self.kept_bytes} B kept)"
            if self.comm_multiplier:
                text += (f", comm budget met at {self.comm_multiplier:.3g} ps per received byte "
                         f"({self.comm_bytes} B received)")
            if self.greedy_cost is not None and self.cost is not None and self.cost < self.greedy_cost:
                text += f", {self.greedy_cost / 1e6:.1f} -> {self.cost / 1e6:.1f} us"
            if self.candidate not in ("", "plain"):
                text += f", the {self.candidate} candidate's plan"
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
    parents = parents_of(nodes)
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


#: e-node visits the tree bound may spend on its refinement passes (past it, overlapping
#: children count as the larger one only): deterministic, so every rank proves the same
BOUND_BUDGET = 2_000_000


def tree_bound(pr: Pruned, comp: np.ndarray | None = None) -> int:
    """A lower bound on the DAG cost of every plan of ``pr.roots``, from ``h[c]``, a lower
    bound on the DAG cost of every derivation of class ``c``:

        h[c] = min over nodes n of c of  cost(n) + together(n's children)

    where ``together`` bounds the cost of derivations of several classes: children that can
    reach no common class share no node, so their bounds add; for two children a, b that may
    share, ``h[a] + h_R[b]`` (either way round), ``h_R`` being the same bound with the nodes
    of the classes a can reach (R) free: a's derivation holds no other node, so what b's
    derivation holds outside R is paid on top.  The roots combine the same way.  h is
    computed cheapest first (Knuth's generalization of Dijkstra: a node's value is never
    below a child's), so cycles need no special care.  ``comp``: the strongly connected
    components of the class graph (reachability is computed on their condensation)."""
    return _TreeBound(pr, comp).roots()


class _TreeBound:
    """``tree_bound``'s passes: ``h(free)`` for each set of free components (a bitset)."""

    def __init__(self, pr: Pruned, comp: np.ndarray | None) -> None:
        self.pr = pr
        cidx = {c: i for i, c in enumerate(pr.by_class)}
        comp = _components(pr.nodes, cidx) if comp is None else comp
        self.comp = {c: int(comp[i]) for c, i in cidx.items()}
        succ: dict[int, set[int]] = defaultdict(set)
        for n in pr.nodes:
            for d in n.children:
                if self.comp[d] != self.comp[n.cls]:
                    succ[self.comp[n.cls]].add(self.comp[d])
        reach: dict[int, int] = {}  # component -> bitset of the components it reaches (itself included)
        for k0 in set(self.comp.values()):
            stack = [k0]
            while stack:
                k = stack[-1]
                if k in reach:
                    stack.pop()
                    continue
                todo = [d for d in succ[k] if d not in reach]
                if todo:
                    stack.extend(todo)
                    continue
                stack.pop()
                bits = 1 << k
                for d in succ[k]:
                    bits |= reach[d]
                reach[k] = bits
        self.reach = {c: reach[k] for c, k in self.comp.items()}
        self.parents = parents_of(pr.nodes)
        self.passes: dict[int, dict[Any, int]] = {}
        self.work = 0

    def roots(self) -> int:
        h = self.h(0)
        return self.together(h, [r for r in self.pr.roots if r in h], 0)

    def h(self, free: int) -> dict[Any, int]:
        """Bounds of every producible class, the nodes of classes of ``free`` components
        costing nothing."""
        if free in self.passes:
            return self.passes[free]
        self.work += len(self.pr.nodes)
        h: dict[Any, int] = {}
        self.passes[free] = h

        def cost(n: ENode) -> int:
            return 0 if free >> self.comp[n.cls] & 1 else n.cost

        heap = [(cost(n), n.id, n) for n in self.pr.nodes if not n.children]
        heapq.heapify(heap)
        while heap:
            v, _, n = heapq.heappop(heap)
            if n.cls in h:
                continue
            h[n.cls] = v
            for p in self.parents[n.cls]:
                if p.cls not in h and all(d in h for d in p.children):
                    heapq.heappush(heap, (cost(p) + self.together(h, list(p.children), free), p.id, p))
        return h

    def together(self, h: dict[Any, int], cs: list[Any], free: int) -> int:
        """A lower bound on the cost of derivations of all of ``cs`` (see ``tree_bound``;
        refined only in the pass without free nodes, within ``BOUND_BUDGET``)."""
        cs = list(dict.fromkeys(cs))
        best = _disjoint_sum([(h[c], self.reach[c]) for c in cs])
        if free or len(cs) != 2 or not self.reach[cs[0]] & self.reach[cs[1]]:
            return best
        for a, b in (cs, cs[::-1]):
            if self.work + len(self.pr.nodes) > BOUND_BUDGET and self.reach[a] not in self.passes:
                continue
            best = max(best, h[a] + self.h(self.reach[a]).get(b, 0))
        return best


def _disjoint_sum(items: list[tuple[int, int]]) -> int:
    """The largest sum of bounds over a subset of ``items`` (bound, reachable components
    bitset) whose reachable sets are pairwise disjoint: exactly for up to 10 items, else
    greedily (largest bound first); any such subset is a valid bound."""
    if len(items) > 10:
        total, used = 0, 0
        for b, r in sorted(items, key=lambda it: -it[0]):
            if not r & used:
                total, used = total + b, used | r
        return total
    best = 0
    for mask in range(1, 1 << len(items)):
        total, used = 0, 0
        for i, (b, r) in enumerate(items):
            if mask >> i & 1:
                if r & used:
                    break
                total, used = total + b, used | r
        else:
            best = max(best, total)
    return best


def _components(nodes: list[ENode], cidx: dict[Any, int]) -> np.ndarray:
    """Strongly connected component of every class (by ``cidx``) in the graph class -> child class."""
    src = [cidx[n.cls] for n in nodes for d in set(n.children)]
    dst = [cidx[d] for n in nodes for d in set(n.children)]
    graph = csr_matrix((np.ones(len(src)), (src, dst)), shape=(len(cidx), len(cidx)))
    return connected_components(graph, directed=True, connection="strong")[1]


class _Model:
    """The ILP (see module docstring) over the pruned e-graph; ``acyclic`` is "levels" (SCC
    level variables, one solve) or "lazy" (no ordering; each cycle of a solution is cut off by
    ``sum(x[n] : n in c_i with child c_i+1) <= k - 1`` over its classes c_1..c_k, re-solve)."""

    def __init__(self, pr: Pruned, roots: list[Any], acyclic: str, bound: tuple[np.ndarray, int] | None = None
                 ) -> None:
        """``bound``: the components of the class graph and ``tree_bound``, when computed already
        (``ilp_dag``: a window's cutoff is checked against the tree bound before the model is built)."""
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
        comp = _components(self.kept, self.cidx) if bound is None else bound[0]
        size = np.bincount(comp, minlength=ny)
        exits = self._exits(comp)
        for k in self._mandatory(comp, exits, roots):  # an exit of every mandatory component
            self.row([(j, 1.0) for j in exits[k]], 1.0, np.inf)
        #: ``tree_bound``: no plan costs less (only for ``ilp_dag``'s proof: as a row of the model
        #: it made HiGHS slower about as often as faster)
        self.bound = tree_bound(pr, comp) if bound is None else bound[1]
        nvar = nx + ny
        lvl_ub: list[float] = []
        if acyclic == "levels":
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

    def _exits(self, comp: np.ndarray) -> dict[int, list[int]]:
        """Per strongly connected component of the class graph: its exit nodes (variables of
        nodes of its classes with no child in it)."""
        exits: dict[int, list[int]] = defaultdict(list)
        for j, n in enumerate(self.kept):
            k = comp[self.cidx[n.cls]]
            if all(comp[self.cidx[d]] != k for d in n.children):
                exits[int(k)].append(j)
        return exits

    def _mandatory(self, comp: np.ndarray, exits: dict[int, list[int]], roots: list[Any]) -> list[int]:
        """Components every plan of ``roots`` uses (see module docstring): ``need[k]``, the
        components every derivation of a class of k uses, is k plus what all of k's exits
        need (every derivation leaves k by an exit: an acyclic one bottoms out), in
        topological order of the condensation (a bitset per component)."""
        children: dict[int, list[list[int]]] = {k: [sorted({int(comp[self.cidx[d]]) for d in self.kept[j].children})
                                                     for j in js] for k, js in exits.items()}
        need: dict[int, int] = {}
        for k0 in {int(comp[self.cidx[r]]) for r in roots}:
            stack = [k0]
            while stack:  # depth first over the condensation: a component after its exits' children
                k = stack[-1]
                if k in need:
                    stack.pop()
                    continue
                todo = [d for kids in children.get(k, []) for d in kids if d not in need]
                if todo:
                    stack.extend(todo)
                    continue
                stack.pop()
                common = -1  # all bits: the intersection over no exit is never taken (k has one)
                for kids in children.get(k, []):
                    bits = 0
                    for d in kids:
                        bits |= need[d]
                    common &= bits
                need[k] = (1 << k) | (common if k in children else 0)
        total = 0
        for r in roots:
            total |= need[int(comp[self.cidx[r]])]
        return [k for k in range(total.bit_length()) if total >> k & 1]

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

    def solve(self, time_limit_s: float | None, relax: bool = False, node_limit: int | None = None,
              cutoff: int | None = None) -> Any:
        """HiGHS on the model, or with ``relax`` on its LP relaxation; with ``node_limit``
        (``windows``' small sub-problems) and no restart where scipy's HiGHS binding allows it
        (``_solve_no_restart``, which also takes ``cutoff``: only a solution costing less is of
        use)."""
        if node_limit is not None and not relax and _highs() is not None:
            return self._solve_no_restart(time_limit_s, node_limit, cutoff)
        a = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.lo), self.nvar)).tocsr()
        options: dict[str, Any] = {"mip_rel_gap": 0.0}
        if time_limit_s is not None:
            options["time_limit"] = max(0.01, float(time_limit_s))
        if node_limit is not None:
            options["node_limit"] = node_limit
        return milp(self.c, constraints=LinearConstraint(a, self.lo, self.hi),
                    integrality=np.zeros(self.nvar) if relax else self.integrality,
                    bounds=Bounds(self.lb, self.ub), options=options)

    def _solve_no_restart(self, time_limit_s: float | None, node_limit: int, cutoff: int | None = None) -> Any:
        """``solve``'s HiGHS run with ``mip_allow_restart`` off, through scipy's HiGHS binding
        (``_highs``: ``milp`` cannot set that option), read back as ``milp``'s result
        (``status`` 0: proved optimal, 1: stopped at a limit, 2: infeasible; ``x``, ``fun``,
        ``message``).  A restart presolves the model again after the root and runs its cuts
        and heuristics anew: on the windows that cost most it was most of their time (the
        32-layer Llama-2-7B step at dp 2 x tp 4: 4.8 -> 2.7 s and 2.9 -> 2.0 s; GPT-2 XL's
        5.0 -> 2.9 s), the optimum the same.  (A restart with a starting incumbent, HiGHS'
        ``setSolution``, even lost better solutions: never pass one.)

        ``cutoff`` is HiGHS' ``objective_bound``: branch-and-bound prunes what cannot cost
        less, and the root spends less on cuts and heuristics for plans it need not find.  Law:
        every solution below ``cutoff`` is in the pruned search, so the optimum is the same
        wherever it costs less than ``cutoff``; where none does, what comes back is no answer
        (HiGHS 1.x may then call a solution at or above the bound "optimal" that is not:
        ``ilp_dag`` reads any result at or above its cutoff as no plan).  The costliest window
        of the 4-layer Llama-2-7B stack at dp 2 x tp 4, which nothing improves (974 variables,
        37 nodes either way): 2.14 -> 0.66 s with the plan's own cost as the cutoff.
        """
        hc = _highs()
        a = coo_matrix((self.vals, (self.rows, self.cols)), shape=(len(self.lo), self.nvar)).tocsc()
        lp = hc.HighsLp()
        lp.num_col_, lp.num_row_ = self.nvar, len(self.lo)
        lp.col_cost_ = np.asarray(self.c, dtype=float)
        lp.col_lower_, lp.col_upper_ = np.asarray(self.lb, dtype=float), np.asarray(self.ub, dtype=float)
        lo, hi = np.asarray(self.lo, dtype=float), np.asarray(self.hi, dtype=float)
        lp.row_lower_ = np.where(np.isinf(lo), -hc.kHighsInf, lo)
        lp.row_upper_ = np.where(np.isinf(hi), hc.kHighsInf, hi)
        lp.a_matrix_.format_ = hc.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = self.nvar, len(self.lo)
        lp.integrality_ = [hc.HighsVarType.kInteger if v else hc.HighsVarType.kContinuous for v in self.integrality]
        h = hc._Highs()
        for name, value in (("output_flag", False), ("mip_rel_gap", 0.0), ("mip_max_nodes", int(node_limit)),
                            ("mip_allow_restart", False)):
            h.setOptionValue(name, value)
        if time_limit_s is not None:
            h.setOptionValue("time_limit", max(0.01, float(time_limit_s)))
        if cutoff is not None:
            h.setOptionValue("objective_bound", float(cutoff))
        h.passModel(lp)
        h.run()
        status, info = h.getModelStatus(), h.getInfo()
        x = np.array(h.getSolution().col_value) if info.primal_solution_status else None
        code = 0 if status == hc.HighsModelStatus.kOptimal else 2 if status == hc.HighsModelStatus.kInfeasible else 1
        return SimpleNamespace(status=code, x=x, fun=info.objective_function_value if x is not None else None,
                               message=h.modelStatusToString(status))

    def selection(self, x: np.ndarray) -> dict[Any, ENode]:
        needed = x[self.nx:self.nx + self.ny] > 0.5
        out: dict[Any, ENode] = {}
        for j in np.flatnonzero(x[:self.nx] > 0.5):
            n = self.kept[j]
            if needed[self.cidx[n.cls]]:
                out.setdefault(n.cls, n)
        return out


def _proved(greedy: dict[Any, Entry], cost: int, report: ExtractionReport, model: _Model, why: str,
            t0: float) -> ILPResult:
    """The greedy plan, proved optimal without branching (a lower bound meets its cost)."""
    report.optimal, report.status, report.cost = True, why, cost
    report.variables, report.constraints = model.nvar, len(model.lo)
    report.seconds = time.perf_counter() - t0
    return ILPResult(greedy, cost, report)


def _none_below(cutoff: int, report: ExtractionReport, model: _Model | None, why: str, t0: float) -> ILPResult:
    """No plan: ``why`` (a lower bound) shows none costs less than ``cutoff`` (``model``: None
    when it was not built, no variables or constraints reported)."""
    report.status, report.cost = f"no plan below {cutoff} ({why})", None
    if model is not None:
        report.variables, report.constraints = model.nvar, len(model.lo)
    report.seconds = time.perf_counter() - t0
    return ILPResult({}, None, report)


@functools.cache
def _highs() -> Any:
    """scipy's HiGHS binding where it can run ``_Model._solve_no_restart`` (scipy >= 1.15),
    else None (``milp``, restarts and all)."""
    try:
        from scipy.optimize._highspy import _core as hc
    except ImportError:
        return None
    names = ("_Highs", "HighsLp", "HighsVarType", "HighsModelStatus", "MatrixFormat", "kHighsInf")
    return hc if all(hasattr(hc, n) for n in names) else None


def ilp_dag(nodes: list[ENode], costs: _Costs, roots: list[Any], *, time_limit_s: float | None = 30.0,
            acyclic: str = "levels", bounds: bool = True, stop: Callable[[], bool] | None = None,
            share: bool = True, node_limit: int | None = None, cutoff: int | None = None) -> ILPResult:
    """Minimum-DAG-cost extraction of ``roots`` (see module docstring).  Roots that cannot be
    produced are left out of ``best``; the others are extracted optimally (or, past
    ``time_limit_s``, as well as found, with ``report.optimal`` False).  ``bounds``: first
    try to prove the greedy plan optimal by the tree bound, then the LP bound, and branch
    only when neither meets its cost (False: always solve the ILP, as tests of the model do).
    ``stop``: ends the sharing search that improves the greedy incumbent (``share_communication``);
    ``share=False``: the incumbent is the plain greedy extraction; ``node_limit``: HiGHS'
    branch-and-bound nodes, a deterministic work bound (``windows``: small sub-problems).
    ``cutoff``: only a plan costing less is of use (``windows``: what the plan pays in a window):
    the result has no plan (``best`` {}, ``cost`` None, not ``optimal``) where none costing less
    was found: shown by the tree bound or the LP bound before any branching (with ``bounds``),
    or by the ILP's search (HiGHS bounded by ``cutoff``, ``_Model._solve_no_restart``)."""
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
    known = None
    if bounds and cutoff is not None:  # (the tree bound first: most windows end at it, with no model built)
        comp = _components(pr.nodes, {c: i for i, c in enumerate(pr.by_class)})
        known = comp, tree_bound(pr, comp)
        if known[1] > cutoff - 0.5:
            return _none_below(cutoff, report, None, "the tree bound", t0)
    greedy = greedy_dag(nodes, costs)
    if share:
        greedy = share_communication(nodes, costs, roots_ok, greedy, stop=stop)[0]
    g_cost = root_cost(greedy, roots_ok, costs) if all(r in greedy for r in roots_ok) else None
    model = _Model(pr, roots_ok, acyclic, known)
    best: dict[Any, Entry] | None = None
    solves = 0
    if bounds and g_cost is not None:
        if g_cost <= model.bound:
            return _proved(greedy, g_cost, report, model, "greedy plan at the tree bound", t0)
        left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - t0)
        lp = model.solve(left, relax=True) if left is None or left > 0 else None
        # costs are integers: an LP bound above g_cost - 1 leaves no cheaper plan (within
        # HiGHS' tolerances, as for the ILP's own proof)
        if lp is not None and lp.status == 0 and max(lp.fun, model.bound) > g_cost - 0.5:
            return _proved(greedy, g_cost, report, model, "greedy plan at the LP bound", t0)
        if cutoff is not None and lp is not None and lp.status == 0 and lp.fun > cutoff - 0.5:
            return _none_below(cutoff, report, model, "the LP bound", t0)
    while True:
        left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            report.status = "time limit reached " + ("while cutting cycles" if solves else "before solving")
            break
        res = model.solve(left, node_limit=node_limit, cutoff=cutoff)
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
        cost = root_cost(best, roots_ok, costs) if best is not None else None
        if g_cost is not None and (cost is None or g_cost < cost):
            best, cost, report.fallback = greedy, g_cost, True
    if cutoff is not None and (cost is None or cost >= cutoff):
        report.optimal = False
        return _none_below(cutoff, report, model, "the ILP's search", t0)
    if best is None:
        raise ReshardError(f"optimize: the ILP extractor found no plan ({report.status}) and the greedy none either")
    report.cost = cost
    report.seconds = time.perf_counter() - t0
    return ILPResult(best, cost, report)
