"""DAG-aware extraction over the e-graph's table snapshot, and decoding of the result.

egglog's own extractor sums costs over trees (shared subterms paid once per use, u64
overflow on deep DAGs), so reshard reads ``egraph.freeze()`` rows and extracts itself:
a worklist greedy-DAG extractor.  A class's best entry is (cost, node, child entries,
node set); a node's cost is the sum of the distinct nodes in its sub-DAG, so a shared
value (a gathered weight used twice) is paid once.  Entries only point at older entries,
so the result is acyclic by construction.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import egglog.bindings as eb
import numpy as np

from ..ir.errors import ReshardError
from ..ir.fusion import Fusion
from ..ir.ids import ID, Inner, Merge, Outer, Root
from ..ir.mesh import DeviceMesh
from ..ir.sharding import Partial, Replicate, TensorSharding
from .schema import T_CONSTRUCTORS


@dataclass(frozen=True)
class ENode:
    id: int
    ctor: str
    cls: Any
    args: tuple
    children: tuple  # T classes
    cost: int


@dataclass(frozen=True, eq=False)
class Entry:
    """A class's best implementation so far: ``nodes``/``classes`` are bitsets (Python ints,
    bit i = ENode.id / class index i) of its sub-DAG; ``cost`` the sum over ``nodes``."""

    cost: int
    node: ENode
    children: tuple["Entry", ...]
    nodes: int
    classes: int


class _Costs:
    """Sum of node costs over a bitset, vectorized (bitsets of shared sub-plans can be large)."""

    def __init__(self, nodes: list[ENode]) -> None:
        self.costs = np.array([n.cost for n in nodes], dtype=np.int64)
        self.nbytes = (len(nodes) + 7) // 8

    def of(self, bits: int) -> int:
        if not bits:
            return 0
        raw = np.frombuffer(bits.to_bytes(self.nbytes, "little"), dtype=np.uint8)
        idx = np.flatnonzero(np.unpackbits(raw, bitorder="little"))
        return int(self.costs[idx].sum())


@dataclass(eq=False)
class PlanNode:
    """One chosen implementation: ``kind`` is a T constructor name; ``value`` the Fusion
    tensor id; ``sharding`` its distribution; ``args`` the operand PlanNodes."""

    uid: int
    kind: str
    value: int
    sharding: TensorSharding
    args: tuple["PlanNode", ...]
    cost_ps: int
    op: int | None = None
    axis: int | None = None
    input_name: str | None = None
    alternatives: list[tuple[str, int]] = field(default_factory=list)


class Snapshot:
    """Rows of the frozen e-graph, indexed for extraction and decoding."""

    def __init__(self, egraph: eb.EGraph) -> None:
        self.egraph = egraph
        frozen = egraph.freeze()
        self.tables = {name: fn for name, fn in frozen.functions.items()}
        self.by_class: dict[str, dict[Any, list[tuple[str, tuple]]]] = defaultdict(lambda: defaultdict(list))
        for name, fn in self.tables.items():
            if fn.is_let_binding or name.startswith("cost_"):
                continue
            for row in fn.rows:
                if row.subsumed:
                    continue
                self.by_class[fn.output_sort][row.output].append((name, tuple(row.inputs)))
        self.ext = {row.inputs[0]: egraph.value_to_i64(row.output) for row in self.rows("ext")}

    def rows(self, name: str) -> list:
        fn = self.tables.get(name)
        return [] if fn is None else [r for r in fn.rows if not r.subsumed]

    def i64(self, v: Any) -> int:
        return self.egraph.value_to_i64(v)

    def string(self, v: Any) -> str:
        return self.egraph.value_to_string(v)

    def let(self, name: str) -> Any:
        rows = self.rows(name)
        if not rows:
            raise ReshardError(f"internal: e-graph has no binding {name}")
        return rows[0].output

    # ---- decoding of IDs / placements / dists -------------------------------------
    def id_terms(self) -> dict[Any, ID]:
        """Smallest Root/Outer/Inner/Merge term of every ID class with an extent."""
        best: dict[Any, tuple[int, ID]] = {}
        nodes = [(cls, name, args) for cls, lst in self.by_class["ID"].items() for name, args in lst
                 if name in ("Root", "Outer", "Inner", "Merge")]
        changed = True
        while changed:
            changed = False
            for cls, name, args in nodes:
                if name == "Root":
                    size, term = 1, Root(self.i64(args[1]), self.i64(args[2]))
                elif name in ("Outer", "Inner"):
                    if args[0] not in best:
                        continue
                    s, x = best[args[0]]
                    size, term = s + 1, (Outer if name == "Outer" else Inner)(x, self.i64(args[1]))
                else:
                    if args[0] not in best or args[1] not in best:
                        continue
                    (s1, x), (s2, y) = best[args[0]], best[args[1]]
                    size, term = s1 + s2 + 1, Merge(x, y)
                if cls in self.ext and (cls not in best or size < best[cls][0]):
                    best[cls] = (size, term)
                    changed = True
        return {cls: term for cls, (_, term) in best.items()}

    def sharding(self, dist_cls: Any, mesh: DeviceMesh, shape: tuple[int, ...], ids: dict[Any, ID]) -> TensorSharding:
        for name, args in self.by_class["Dist"].get(dist_cls, []):
            if name != "D":
                continue
            axes = []
            for p in args:
                axes.append(self._placement(p, ids))
            if all(a is not None for a in axes):
                return TensorSharding(mesh, shape, tuple(axes))
        raise ReshardError("internal: a chosen distribution has no decodable D(...) term")

    def _placement(self, p_cls: Any, ids: dict[Any, ID]) -> Any:
        found = None
        for name, args in self.by_class["P"].get(p_cls, []):
            if name == "Rep":
                return Replicate()
            if name == "Part":
                return Partial(self.string(args[0]))
            if name == "Bind" and args[0] in ids:
                found = ids[args[0]]
        return found


def _arg_value(snap: Snapshot, sort: str, v: Any) -> Any:
    if sort == "i64":
        return snap.i64(v)
    if sort == "String":
        return snap.string(v)
    return v


def collect_enodes(snap: Snapshot) -> list[ENode]:
    nodes: list[ENode] = []
    for ctor, sorts in T_CONSTRUCTORS.items():
        costs = {tuple(r.inputs): snap.i64(r.output) for r in snap.rows(f"cost_{ctor}")}
        for row in snap.rows(ctor):
            key = tuple(row.inputs)
            if ctor == "InAt":
                c = 0
            elif key in costs:
                c = costs[key]
            else:
                continue  # no cost known: not a well-formed implementation
            children = tuple(v for s, v in zip(sorts, key) if s == "T")
            nodes.append(ENode(len(nodes), ctor, row.output, key, children, c))
    return nodes


def greedy_dag(nodes: list[ENode], costs: _Costs) -> dict[Any, Entry]:
    """Best entry per T class (see module docstring)."""
    parents: dict[Any, list[ENode]] = defaultdict(list)
    for n in nodes:
        for c in set(n.children):
            parents[c].append(n)
    cls_bit = {c: 1 << i for i, c in enumerate(dict.fromkeys(n.cls for n in nodes))}
    best: dict[Any, Entry] = {}
    queue = deque(n for n in nodes if not n.children)
    queued = {n.id for n in queue}
    while queue:
        n = queue.popleft()
        queued.discard(n.id)
        kids = []
        for c in n.children:
            e = best.get(c)
            if e is None or e.classes & cls_bit[n.cls]:
                break
            kids.append(e)
        else:
            # DAG cost: shared sub-plans are paid once (inclusion-exclusion over the kids)
            node_set, cost = 1 << n.id, n.cost
            for e in kids:
                shared = node_set & e.nodes
                cost += e.cost - (costs.of(shared) if shared else 0)
                node_set |= e.nodes
            cur = best.get(n.cls)
            if cur is None or cost < cur.cost:
                classes = cls_bit[n.cls]
                for e in kids:
                    classes |= e.classes
                best[n.cls] = Entry(cost, n, tuple(kids), node_set, classes)
                for p in parents[n.cls]:
                    if p.id not in queued:
                        queued.add(p.id)
                        queue.append(p)
    return best


def real_classes(snap: Snapshot) -> dict[Any, tuple[int, Any]]:
    """T class -> (Fusion value id, Dist class); a class with two different names is an
    unsound merge and raises."""
    out: dict[Any, tuple[int, Any]] = {}
    for row in snap.rows("real"):
        key = (snap.i64(row.inputs[0]), row.inputs[1])
        prev = out.setdefault(row.output, key)
        if prev != key:
            raise ReshardError(f"internal: e-graph merged value {prev[0]} and {key[0]} or two distributions; "
                               "a rule is unsound")
    return out


def extract(snap: Snapshot, fusion: Fusion, mesh: DeviceMesh, output_lets: list[str],
            perturb: random.Random | None = None) -> tuple[list[PlanNode], int]:
    """Extract the plan for every output; returns (root PlanNodes, total cost in ps).

    ``perturb`` replaces every node's cost by a random one: soundness tests use it to
    extract (and then check) plans the real cost model would never choose.
    """
    nodes = collect_enodes(snap)
    if perturb is not None:
        nodes = [ENode(n.id, n.ctor, n.cls, n.args, n.children, perturb.randrange(1, 1000)) for n in nodes]
    costs = _Costs(nodes)
    best = greedy_dag(nodes, costs)
    names = real_classes(snap)
    by_name = {v: k for k, v in names.items()}
    ids = snap.id_terms()
    roots: list[Entry] = []
    for let, (tid, ts) in zip(output_lets, fusion.outputs):
        cls = by_name.get((tid, snap.let(let)))
        if cls is None or cls not in best:
            raise ReshardError(f"optimize: found no way to produce output {fusion.tensors[tid]!r} with sharding {ts}")
        roots.append(best[cls])
    # alternatives per class, for explanations: the cheapest other node per class
    alt: dict[Any, list[tuple[str, int]]] = defaultdict(list)
    for n in nodes:
        alt[n.cls].append((n.ctor, n.cost))
    built: dict[int, PlanNode] = {}

    def build(e: Entry) -> PlanNode:
        if id(e) in built:
            return built[id(e)]
        args = tuple(build(k) for k in e.children)
        tid, dcls = names[e.node.cls]
        t = fusion.tensors[tid]
        ts = snap.sharding(dcls, mesh, t.shape, ids)
        n = e.node
        vals = [_arg_value(snap, s, v) for s, v in zip(T_CONSTRUCTORS[n.ctor], n.args)]
        pn = PlanNode(len(built), n.ctor, tid, ts, args, n.cost,
                      op=vals[0] if n.ctor in ("Loc", "Loc2") else None,
                      axis=vals[1] if n.ctor in ("AllGather", "LocalSlice", "AllReduce", "ReduceScatter",
                                                 "AllToAll") else None,
                      input_name=vals[0] if n.ctor == "InAt" else None,
                      alternatives=sorted(x for x in alt[n.cls] if x != (n.ctor, n.cost)))
        built[id(e)] = pn
        return pn

    plan_roots = [build(e) for e in roots]
    union = 0
    for e in roots:
        union |= e.nodes
    total = costs.of(union)
    return plan_roots, total
