"""What extraction rejected, priced: the explanations behind ``Plan.explain``.

For every chosen plan node two kinds of rejected alternatives are computed from the
extractor's best entries (``greedy_dag``):

* ``scope="value"``: another e-node of the same class (the same value at the same
  sharding), e.g. "matmul on replicated operands" instead of "allgather after the matmul";
* ``scope="strategy"`` (for op nodes only): the same op computed with other operand /
  result shardings (any class of the value), followed by the one collective that turns its
  result into each sharding the rest of the plan consumes.

Each alternative is priced two ways: ``cost_ps`` is its own sub-plan's DAG cost (its node
plus the union of its children's best sub-plans, shared nodes paid once; compare with the
chosen node's ``PlanNode.subplan_cost_ps``), and ``plan_cost_ps`` is the whole plan's cost
with the alternative substituted (sub-plans the chosen plan already pays for are not paid
twice).  Bytes are what each rank receives over the collectives of the sub-plan / plan.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..ir.errors import ReshardError
from ..ir.fusion import Fusion
from ..ir.mesh import DeviceMesh
from ..ir.sharding import TensorSharding
from .cost import _FACTOR

if TYPE_CHECKING:  # pragma: no cover
    from .extract import ENode, Entry, PlanNode, Snapshot, _Costs

#: T constructor -> collective name (LocalSlice moves nothing)
COLLECTIVES = {"AllGather": "allgather", "AllReduce": "allreduce", "ReduceScatter": "reduce_scatter",
               "AllToAll": "all_to_all"}
#: cross-mesh transfer constructors -> their communication (``codegen.lower.TRANSFERS``)
TRANSFERS = {"SendRecv": "send_recv", "Bcast": "broadcast", "Scatter": "scatter"}
#: every constructor that communicates
COMMS = {**COLLECTIVES, **TRANSFERS}
RESHARDS = set(COLLECTIVES) | {"LocalSlice"}
#: alternatives kept per plan node and scope (cheapest first)
KEEP = 4


def collective_bytes(kind: str, src: TensorSharding, dst: TensorSharding, itemsize: int, team: int
                     ) -> tuple[int, int]:
    """(per-rank buffer NCCL is handed, bytes each rank receives) of one collective: the
    buffer is the result of an allgather and the operand of the others."""
    size = math.prod(dst.local_shape if kind == "allgather" else src.local_shape) * itemsize
    return size, moved_bytes(kind, size, team)


def moved_bytes(kind: str, buffer: int, team: int) -> int:
    """Bytes each rank receives from a team collective on a ``buffer``-byte buffer: the α-β
    law's bus factor (``cost._FACTOR``) times the buffer, e.g. 2(n-1)/n of it for an allreduce."""
    return buffer * _FACTOR[kind][0] * (team - 1) // team


def transfer_bytes(kind: str, src: TensorSharding, dst: TensorSharding, itemsize: int) -> int:
    """Bytes a receiving rank gets in a cross-mesh transfer: its whole operand shard for a
    send_recv / broadcast, its piece of the result for a scatter."""
    return math.prod((dst if kind == "scatter" else src).local_shape) * itemsize


@dataclass(frozen=True)
class Alternative:
    """One rejected way to produce a plan node's value (see module docstring).

    ``new_comms`` describes the collectives of the alternative's sub-plan that the chosen
    plan does not run (e.g. the allgather *before* a matmul)."""

    scope: str
    description: str
    cost_ps: int
    bytes: int
    plan_cost_ps: int
    plan_bytes: int
    new_comms: tuple[str, ...] = ()


def op_label(fusion: Fusion, op_index: int) -> str:
    """``matmul``, ``unary(gelu)``, ...: an op's kind and function."""
    op = fusion.ops[op_index]
    fn = op.attrs.get("fn")
    return f"{op.kind}({fn})" if isinstance(fn, str) else op.kind


class Explainer:
    """Prices alternatives against one extracted plan (``roots`` entries, ``built``:
    ``id(entry)`` -> PlanNode)."""

    def __init__(self, snap: "Snapshot", fusion: Fusion, mesh: DeviceMesh, nodes: list["ENode"],
                 costs: "_Costs", best: dict[Any, "Entry"], names: dict[Any, tuple[int, Any]],
                 ids: dict[Any, Any]) -> None:
        self.snap, self.fusion, self.mesh = snap, fusion, mesh
        self.nodes, self.costs, self.best, self.names, self.ids = nodes, costs, best, names, ids
        self.by_cls: dict[Any, list[ENode]] = defaultdict(list)
        self.cls_mask: dict[Any, int] = defaultdict(int)
        coll = 0
        for n in nodes:
            self.by_cls[n.cls].append(n)
            self.cls_mask[n.cls] |= 1 << n.id
            if n.ctor in COMMS:
                coll |= 1 << n.id
        self.coll_mask = coll
        self._ts: dict[Any, TensorSharding | None] = {}
        self._moved: dict[int, int] = {}
        self._rest: dict[frozenset, int] = {}
        self._plan_classes: set = set()

    # ---- decoding -----------------------------------------------------------------------
    def ids_of(self, bits: int) -> list[int]:
        return [int(i) for i in self.costs.members(bits)] if bits else []

    def sharding(self, cls: Any) -> TensorSharding | None:
        if cls not in self._ts:
            ts = None
            if cls in self.names:
                tid, dcls = self.names[cls]
                try:
                    t = self.fusion.tensors[tid]
                    ts = self.snap.sharding(dcls, t.mesh, t.shape, self.ids)  # the value's own mesh
                except ReshardError:
                    ts = None
            self._ts[cls] = ts
        return self._ts[cls]

    def _sh(self, cls: Any) -> str:
        ts = self.sharding(cls)
        return "?" if ts is None else str(ts)

    def _name(self, cls: Any) -> str:
        return self.fusion.tensors[self.names[cls][0]].name if cls in self.names else "?"

    def _axis(self, n: "ENode") -> int:
        return self.snap.i64(n.args[1])

    def moved(self, n: "ENode") -> int:
        """Bytes each rank receives for communicating e-node ``n`` (0 for other nodes)."""
        if n.ctor not in COMMS:
            return 0
        if n.id not in self._moved:
            src, dst = self.sharding(n.children[0]), self.sharding(n.cls)
            if src is None or dst is None or n.cls not in self.names:
                self._moved[n.id] = 0
            else:
                a = None if n.ctor in TRANSFERS else self._axis(n)
                t = self.fusion.tensors[self.names[n.cls][0]]
                self._moved[n.id] = (transfer_bytes(TRANSFERS[n.ctor], src, dst, t.itemsize) if n.ctor in TRANSFERS
                                     else collective_bytes(COLLECTIVES[n.ctor], src, dst, t.itemsize,
                                                           dst.mesh.shape[a])[1])
        return self._moved[n.id]

    def bytes_of(self, bits: int) -> int:
        return sum(self.moved(self.nodes[i]) for i in self.ids_of(bits & self.coll_mask))

    def describe(self, n: "ENode") -> str:
        """One e-node in words: ``matmul(x [R], w [R]) -> [R]``, ``allgather of x [S(0)] -> [R]
        on 'tp' (team 2)``."""
        if n.ctor == "InAt":
            return f"input {self.snap.string(n.args[0])} fed as {self._sh(n.cls)}"
        if n.ctor in ("Loc", "Loc2"):
            ops = ", ".join(f"{self._name(c)} {self._sh(c)}" for c in n.children)
            return f"{op_label(self.fusion, self.snap.i64(n.args[0]))}({ops}) -> {self._sh(n.cls)}"
        if n.ctor in TRANSFERS:  # cross-mesh (``crossmesh``): k, t[, source device index]
            src = f" from source device {self.snap.i64(n.args[2])}" if n.ctor in ("Bcast", "Scatter") else ""
            return (f"{TRANSFERS[n.ctor]} of {self._name(n.cls)} {self._sh(n.children[0])} -> {self._sh(n.cls)} "
                    f"to another mesh{src}")
        a = self._axis(n)
        mesh = self.fusion.tensors[self.names[n.cls][0]].mesh if n.cls in self.names else self.mesh
        kind = COLLECTIVES.get(n.ctor, "local slice")
        return (f"{kind} of {self._name(n.cls)} {self._sh(n.children[0])} -> {self._sh(n.cls)} "
                f"on '{mesh.axis_names[a]}' (team {mesh.shape[a]})")

    # ---- pricing ------------------------------------------------------------------------
    def rest_bits(self, roots: list["Entry"], cut: frozenset) -> int:
        """Node set of the plan without the classes in ``cut`` and what only they need: the
        part of the chosen plan an alternative for those classes still pays for."""
        cut = frozenset(c for c in cut if c in self._plan_classes)  # others change nothing
        if cut in self._rest:
            return self._rest[cut]
        mask = 0
        for c in cut:
            mask |= self.cls_mask[c]
        bits = 0
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            e = stack.pop()
            if id(e) in seen or e.node.cls in cut:
                continue
            seen.add(id(e))
            if not e.nodes & mask:
                bits |= e.nodes
            else:
                bits |= 1 << e.node.id
                stack.extend(e.children)
        self._rest[cut] = bits
        return bits

    def _kids(self, n: "ENode") -> tuple["Entry", ...] | None:
        kids = tuple(self.best.get(c) for c in n.children)
        return None if any(k is None for k in kids) else kids  # type: ignore[return-value]

    def _price(self, n: "ENode", kids: tuple["Entry", ...], extra: tuple["ENode", ...], roots: list["Entry"],
               plan: int) -> tuple[int, int, int, int, "ENode", tuple] | None:
        """(sub-plan cost, whole-plan cost, sub-plan bits, whole-plan bits, n, extra) of
        implementing ``n``'s class by ``n`` (and each class of ``extra`` by that reshard of
        ``n``'s result); None when that would need one of those classes to build itself."""
        own = 1 << n.id
        for k in kids:
            own |= k.nodes
        classes = frozenset([n.cls, *(r.cls for r in extra)])
        fixed = 1 << n.id
        mask = 0
        for c in classes:
            mask |= self.cls_mask[c]
        for r in extra:
            fixed |= 1 << r.id
        if own & mask & ~fixed:
            return None
        whole = self.rest_bits(roots, classes) | own | fixed
        return self.costs.of(own), self.costs.of(whole), own, whole, n, extra

    def _finish(self, scope: str, priced: tuple, plan: int) -> Alternative:
        cost, plan_cost, own, whole, n, extra = priced
        new = [self.nodes[i] for i in self.ids_of(whole & ~plan & self.coll_mask)]
        new = [m for m in new if m.id != n.id and m not in extra]
        desc = self.describe(n)
        if new:
            desc += " after " + ", ".join(self.describe(m) for m in new)
        if extra:
            desc += ", then " + ", ".join(self.describe(m) for m in extra)
        return Alternative(scope, desc, cost, self.bytes_of(own), plan_cost, self.bytes_of(whole),
                           tuple(self.describe(m) for m in new))

    def annotate(self, roots: list["Entry"], built: dict[int, "PlanNode"]) -> None:
        """Fill ``subplan_*`` and ``alternatives`` of every PlanNode of the plan."""
        plan = 0
        for r in roots:
            plan |= r.nodes
        entries: dict[int, Entry] = {}
        stack = list(roots)
        while stack:
            e = stack.pop()
            if id(e) not in entries:
                entries[id(e)] = e
                stack.extend(e.children)
        self._plan_classes = {e.node.cls for e in entries.values()}
        self._rest = {}
        # classes of each value that the rest of the plan (other values, outputs) consumes
        consumed: dict[int, set] = defaultdict(set)
        for e in roots:
            consumed[self.names[e.node.cls][0]].add(e.node.cls)
        chosen_by_value: dict[int, set[int]] = defaultdict(set)
        entry_of_cls: dict[Any, Entry] = {}
        for e in entries.values():
            v = self.names[e.node.cls][0]
            chosen_by_value[v].add(e.node.id)
            entry_of_cls.setdefault(e.node.cls, e)
            for k in e.children:
                if self.names[k.node.cls][0] != v:
                    consumed[self.names[k.node.cls][0]].add(k.node.cls)
        loc_by_value: dict[int, list[ENode]] = defaultdict(list)
        for n in self.nodes:
            if n.ctor in ("Loc", "Loc2") and n.cls in self.names:
                loc_by_value[self.names[n.cls][0]].append(n)
        done_values: set[int] = set()
        for e in entries.values():
            pn = built[id(e)]
            pn.subplan_cost_ps = e.cost
            pn.subplan_bytes = self.bytes_of(e.nodes)
            priced = []
            for n in self.by_cls[e.node.cls]:
                if n.id == e.node.id or n.ctor == "InAt":
                    continue
                kids = self._kids(n)
                if kids is not None:
                    p = self._price(n, kids, (), roots, plan)
                    if p is not None:
                        priced.append(p)
            priced.sort(key=lambda p: (p[0], p[1], p[4].id))
            alts = [self._finish("value", p, plan) for p in priced[:KEEP]]
            v = self.names[e.node.cls][0]
            if e.node.ctor in ("Loc", "Loc2") and v not in done_values:
                done_values.add(v)
                strategies = self._strategies(loc_by_value[v], chosen_by_value[v], consumed[v], entry_of_cls,
                                              roots, plan)
                alts += [self._finish("strategy", p, plan) for p in strategies[:KEEP]]
            pn.alternatives = alts

    def _strategies(self, locs: list["ENode"], chosen: set[int], consumed: set, entry_of_cls: dict,
                    roots: list["Entry"], plan: int) -> list[tuple]:
        """The op producing a value computed by another strategy (operand/result
        shardings), resharded by one collective into every sharding the plan consumes it
        in; priced, cheapest whole plan first."""
        out = []
        for n in locs:
            if n.id in chosen:
                continue
            kids = self._kids(n)
            if kids is None:
                continue
            extra = []
            ok = True
            for c in consumed:
                if c == n.cls:
                    continue
                cur = entry_of_cls.get(c)
                if cur is not None and n.cls in cur.node.children:
                    continue  # the plan already reshards from that class
                hops = [r for r in self.by_cls[c] if r.ctor in RESHARDS and r.children[0] == n.cls]
                if not hops:
                    ok = False
                    break
                extra.append(min(hops, key=lambda r: (r.cost, r.id)))
            if ok:
                p = self._price(n, kids, tuple(extra), roots, plan)
                if p is not None:
                    out.append(p)
        out.sort(key=lambda p: (p[1], p[0], p[4].id))
        return out
