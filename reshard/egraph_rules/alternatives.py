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
twice; a plan class the sub-plan produces otherwise is taken from it, see
``Explainer._price``).  Bytes are what each rank receives over the collectives of the
sub-plan / plan (``received``).

Acyclic pricing law: an alternative for the classes ``X`` (the class explained, plus the
classes a strategy reshards into) may only use children sub-plans that contain no class of
``X`` (else it would need the value it is meant to produce).  A child's best entry is used
when it satisfies that; otherwise (it is cyclic through ``X``, or the greedy built none
because it would have been) the children are re-extracted by ``greedy_dag`` restricted to
the sub-DAG below the alternative with ``X`` removed (``Explainer.acyclic``): classes whose
best entries avoid ``X`` are its seeds, only the classes between them and the alternative
are re-priced.  An alternative is reported as missing ("no other way found") only when that
re-extraction finds no way either; the re-extraction's work is bounded by
``ACYCLIC_BUDGET`` (e-nodes visited per plan; past it an alternative is left unpriced).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..ir.fusion import Fusion
from ..ir.mesh import DeviceMesh
from .dag import ENode, Entry, _bits, _Costs, greedy_dag
from ..search.snapshot import Snapshot
from .plan_node import Alternative, PlanNode
from .received import COLLECTIVES, COMMS, TRANSFERS, Received
from ..rules.schema import LOCAL_RESHARDS, OP_CTORS

RESHARDS = set(COLLECTIVES) | set(LOCAL_RESHARDS)
#: alternatives kept per plan node and scope (cheapest first)
KEEP = 4
#: e-nodes the acyclic re-extractions of one plan's explanation may visit in all
ACYCLIC_BUDGET = 200_000


#: op kinds shown under another name: the shape op ``broadcast`` as torch names it, apart from
#: the collective ``broadcast`` (``ir.collective_kinds``)
OP_SHOWN_AS = {"broadcast": "broadcast_to"}


def op_label(fusion: Fusion, op_index: int) -> str:
    """``matmul``, ``unary(gelu)``, ``broadcast_to``, ...: an op's kind (``OP_SHOWN_AS``) and function."""
    op = fusion.ops[op_index]
    fn = op.attrs.get("fn")
    kind = OP_SHOWN_AS.get(op.kind, op.kind)
    return f"{kind}({fn})" if isinstance(fn, str) else kind


class Pricer:
    """Prices rejected alternatives against one extracted plan: the e-node ``n`` for its class,
    on children sub-plans avoiding the classes it produces (``_kids``), and the whole plan so
    changed (``_price``).  ``best``: the extractor's best entries (children sub-plans)."""

    def __init__(self, nodes: list["ENode"], costs: "_Costs", best: dict[Any, "Entry"]) -> None:
        self.nodes, self.costs, self.best = nodes, costs, best
        self.by_cls: dict[Any, list[ENode]] = defaultdict(list)
        self.cls_mask: dict[Any, int] = defaultdict(int)
        for n in nodes:
            self.by_cls[n.cls].append(n)
            self.cls_mask[n.cls] |= 1 << n.id
        self._rest: dict[frozenset, int] = {}
        self._plan_classes: set = set()
        self._plan_roots: list | None = None
        self._acyclic: dict[tuple, dict[Any, "Entry"]] = {}
        #: acyclic re-extractions done, kept across ``new_round``s: (entries, e-nodes visited,
        #: classes re-priced)
        self._known: dict[tuple, tuple[dict[Any, "Entry"], int, int]] = {}
        #: e-nodes the acyclic re-extractions may still visit (``ACYCLIC_BUDGET``)
        self.work_left = ACYCLIC_BUDGET

    def new_round(self) -> None:
        """Price as a new Pricer on the same ``best`` would: the work bound is whole again
        (``acyclic`` charges a re-extraction done in an earlier round as if done again, and
        answers it without redoing it)."""
        self._acyclic, self.work_left = {}, ACYCLIC_BUDGET

    def ids_of(self, bits: int) -> list[int]:
        return [int(i) for i in self.costs.members(bits)] if bits else []

    # ---- pricing ------------------------------------------------------------------------
    def rest_bits(self, roots: list["Entry"], cut: frozenset) -> int:
        """Node set of the plan without the classes in ``cut`` and what only they need: the
        part of the chosen plan an alternative for those classes still pays for.  (The plan's
        entries reachable from ``roots`` without passing through ``cut``, found by removing
        the cut entries and, by counting parents, every entry only removed entries use: work
        proportional to what is removed, not to the plan.)"""
        cut = frozenset(c for c in cut if c in self._plan_classes)  # others change nothing
        if cut in self._rest:
            return self._rest[cut]
        if self._plan_roots is not roots:
            self._index_plan(roots)
        stack = [e for c in cut for e in self._plan_entries[c]]
        removed = {id(e) for e in stack}
        left: dict[int, int] = {}
        gone: dict[int, int] = defaultdict(int)  # e-node id -> removed entries holding it
        while stack:
            e = stack.pop()
            gone[e.node.id] += 1
            for k in {id(k): k for k in e.children}.values():
                if id(k) in removed:
                    continue
                left[id(k)] = left.get(id(k), self._users[id(k)]) - 1
                if left[id(k)] == 0 and id(k) not in self._root_ids:
                    removed.add(id(k))
                    stack.append(k)
        drop = 0
        for i, count in gone.items():
            if count == self._node_entries[i]:  # no kept entry still runs that e-node
                drop |= 1 << i
        bits = self._plan_bits & ~drop
        self._rest[cut] = bits
        return bits

    def _index_plan(self, roots: list["Entry"]) -> None:
        """Entries of the plan by class, their plan users and e-nodes (for ``rest_bits``), and
        the plan classes made from each class (for ``_price``)."""
        self._plan_roots, self._root_ids = roots, {id(r) for r in roots}
        self._root_classes = {r.node.cls for r in roots}
        self._consumers: dict[Any, set] = defaultdict(set)  # class -> the plan classes made from it
        self._plan_entries: dict[Any, list[Entry]] = defaultdict(list)
        self._users: dict[int, int] = defaultdict(int)
        self._node_entries: dict[int, int] = defaultdict(int)
        self._plan_bits = 0
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            e = stack.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            self._plan_bits |= e.nodes
            self._plan_entries[e.node.cls].append(e)
            self._node_entries[e.node.id] += 1
            for k in {id(k): k for k in e.children}.values():
                self._users[id(k)] += 1
                self._consumers[k.node.cls].add(e.node.cls)
                stack.append(k)
        self._rest = {}

    def _mask(self, classes: frozenset) -> int:
        mask = 0
        for c in classes:
            mask |= self.cls_mask[c]
        return mask

    def _kids(self, n: "ENode", classes: frozenset) -> tuple["Entry", ...] | None:
        """Entries for ``n``'s children whose sub-DAGs hold no class of ``classes``: their best
        entries when those qualify, else an acyclic re-extraction (``acyclic``); None when
        there is no such way (or the work bound is spent)."""
        if any(c in classes for c in n.children):
            return None  # n needs one of the classes it is meant to produce
        mask = self._mask(classes)
        kids = tuple(self.best.get(c) for c in n.children)
        if all(k is not None and not k.nodes & mask for k in kids):
            return kids  # type: ignore[return-value]
        sub = self.acyclic(classes, mask, tuple(dict.fromkeys(n.children)))
        kids = tuple(sub.get(c) for c in n.children)
        return None if any(k is None for k in kids) else kids  # type: ignore[return-value]

    def acyclic(self, excluded: frozenset, mask: int, targets: tuple) -> dict[Any, "Entry"]:
        """Entries of the ``targets`` classes (those it finds) over the e-graph without the
        ``excluded`` classes (``mask``: their e-nodes): ``greedy_dag``'s incremental form,
        seeded with every best entry that avoids ``excluded`` and re-pricing only the region
        below ``targets`` whose best entries do not (see the module docstring).  Region
        entries may use only region nodes and seeds, so none holds an excluded class; the
        cycle check of ``greedy_dag`` runs on region-local class bits.  Returns {} once
        ``work_left`` is spent."""
        key = (excluded, targets)
        if key in self._acyclic:
            return self._acyclic[key]
        if key in self._known:  # charged as the walk below would: it fails iff it visits a class past the bound
            out, work, visited = self._known[key]
            self.work_left -= work
            self._acyclic[key] = out if not visited or self.work_left >= 0 else {}
            return self._acyclic[key]
        work_before = self.work_left
        region: dict[Any, None] = {}
        seeds: dict[Any, Entry] = {}
        stack = list(targets)
        while stack:
            c = stack.pop()
            if c in region or c in seeds or c in excluded:
                continue
            e = self.best.get(c)
            if e is not None and not e.nodes & mask:
                seeds[c] = e
                continue
            region[c] = None
            self.work_left -= len(self.by_cls[c])
            if self.work_left < 0:
                self._acyclic[key] = {}
                return {}
            for m in self.by_cls[c]:
                stack.extend(d for d in m.children if d not in region and d not in seeds)
        cls_bit = {c: 1 << i for i, c in enumerate(region)}
        parents: dict[Any, list[ENode]] = defaultdict(list)
        for c in region:
            for m in self.by_cls[c]:
                if not any(d in excluded for d in m.children):
                    for d in dict.fromkeys(m.children):
                        parents[d].append(m)
        local: dict[Any, Entry] = {}
        in_region = self._mask(frozenset(region))
        for c, e in seeds.items():  # the seeds' classes in region-local bits
            bits = 0
            for i in self.ids_of(e.nodes & in_region):
                bits |= cls_bit[self.nodes[i].cls]
            local[c] = Entry(e.cost, e.node, e.children, e.nodes, bits)
        out = greedy_dag([], self.costs, local, list(seeds), (parents, cls_bit))
        self._acyclic[key] = out
        self._known[key] = (out, work_before - self.work_left, len(region))
        return out

    def _price(self, n: "ENode", kids: tuple["Entry", ...], extra: tuple["ENode", ...], roots: list["Entry"],
               plan: int) -> tuple[int, int, int, int, "ENode", tuple] | None:
        """(sub-plan cost, whole-plan cost, sub-plan bits, whole-plan bits, n, extra) of
        implementing ``n``'s class by ``n`` (and each class of ``extra`` by that reshard of
        ``n``'s result); None when that would need one of those classes to build itself.

        The whole plan is the sub-plan plus the chosen plan without the classes the sub-plan
        implements otherwise (and what only they need): a plan class the sub-plan produces by
        an e-node the plan does not run is consumed from the sub-plan, so the whole plan is
        acyclic and holds one implementation of it (never a chosen reshard back to it).  None
        too when the sub-plan so produces every class the plan makes from ``n``'s class (e.g.
        ``n`` makes the value Partial from the very sharding the plan reduce-scatters it to):
        nothing would use ``n``."""
        own = 1 << n.id
        for k in kids:
            own |= k.nodes
        classes = frozenset([n.cls, *(r.cls for r in extra)])
        fixed = 1 << n.id
        mask = self._mask(classes)
        for r in extra:
            fixed |= 1 << r.id
        if own & mask & ~fixed:
            return None
        cut = set(classes)
        for i in self.ids_of(own & ~plan):  # the sub-plan's own e-nodes: usually a few
            if self.nodes[i].cls in self._plan_classes:
                cut.add(self.nodes[i].cls)
        if self._plan_roots is not roots:
            self._index_plan(roots)
        if not extra and n.cls not in self._root_classes and self._consumers[n.cls] <= cut:
            return None  # the sub-plan rebuilds every plan value made from n's class: nothing would use n
        whole = self.rest_bits(roots, frozenset(cut)) | own | fixed
        return self.costs.of(own), self.costs.of(whole), own, whole, n, extra

    def plan_entries(self, roots: list["Entry"]) -> dict[int, "Entry"]:
        """Every entry of the plan under ``roots`` (by ``id``); sets the plan's classes."""
        entries: dict[int, Entry] = {}
        stack = list(roots)
        while stack:
            e = stack.pop()
            if id(e) not in entries:
                entries[id(e)] = e
                stack.extend(e.children)
        self._plan_classes = {e.node.cls for e in entries.values()}
        self._rest = {}
        return entries

    def value_alternatives(self, e: "Entry", roots: list["Entry"], plan: int) -> list[tuple]:
        """The other e-nodes of ``e``'s class, priced (``_price``), cheapest sub-plan first."""
        priced = []
        for n in self.by_cls[e.node.cls]:
            if n.id == e.node.id or n.ctor == "InAt":
                continue
            kids = self._kids(n, frozenset([n.cls]))
            if kids is not None:
                p = self._price(n, kids, (), roots, plan)
                if p is not None:
                    priced.append(p)
        priced.sort(key=lambda p: (p[0], p[1], p[4].id))
        return priced

class Explainer(Pricer):
    """Prices alternatives against one extracted plan (``roots`` entries, ``built``:
    ``id(entry)`` -> PlanNode) and describes them."""

    def __init__(self, snap: "Snapshot", fusion: Fusion, mesh: DeviceMesh, nodes: list["ENode"],
                 costs: "_Costs", best: dict[Any, "Entry"], names: dict[Any, tuple[int, Any]],
                 ids: dict[Any, Any], received: Received | None = None) -> None:
        super().__init__(nodes, costs, best)
        self.snap, self.fusion, self.mesh, self.names, self.ids = snap, fusion, mesh, names, ids
        #: class shardings and bytes received per e-node (shared with a communication budget's search)
        self.received = received if received is not None else Received(snap, fusion, nodes, names, ids)

    # ---- decoding -----------------------------------------------------------------------
    def _sh(self, cls: Any) -> str:
        ts = self.received.sharding(cls)
        return "?" if ts is None else str(ts)

    def _name(self, cls: Any) -> str:
        return self.fusion.tensors[self.names[cls][0]].name if cls in self.names else "?"

    def _axis(self, n: "ENode") -> int:
        return self.snap.i64(n.args[1])

    def bytes_of(self, bits: int) -> int:
        """Bytes each rank receives over the communicating e-nodes of bitset ``bits``."""
        return self.received.bytes_of(bits, self.costs)

    def describe(self, n: "ENode") -> str:
        """One e-node in words: ``matmul(x [R], w [R]) -> [R]``, ``allgather of x [S(0)] -> [R]
        on 'tp' (team 2)``."""
        if n.ctor == "InAt":
            return f"input {self.snap.string(n.args[0])} fed as {self._sh(n.cls)}"
        if n.ctor in OP_CTORS:
            side = self.snap.i64(n.args[3]) if n.ctor == "MMT" else 0  # operands read transposed (``alias``)
            ops = ", ".join(f"{self._name(c)}{'.T (view)' if side >> i & 1 else ''} {self._sh(c)}"
                            for i, c in enumerate(n.children))
            return f"{op_label(self.fusion, self.snap.i64(n.args[0]))}({ops}) -> {self._sh(n.cls)}"
        if n.ctor in TRANSFERS:  # cross-mesh (``crossmesh``): k, t[, source device index]
            src = f" from source device {self.snap.i64(n.args[2])}" if n.ctor in ("Bcast", "Scatter") else ""
            return (f"{TRANSFERS[n.ctor]} of {self._name(n.cls)} {self._sh(n.children[0])} -> {self._sh(n.cls)} "
                    f"to another mesh{src}")
        a = self._axis(n)
        mesh = self.fusion.tensors[self.names[n.cls][0]].mesh if n.cls in self.names else self.mesh
        kind = COLLECTIVES.get(n.ctor) or LOCAL_RESHARDS[n.ctor]
        return (f"{kind} of {self._name(n.cls)} {self._sh(n.children[0])} -> {self._sh(n.cls)} "
                f"on '{mesh.axis_names[a]}' (team {mesh.shape[a]})")

    def _finish(self, scope: str, priced: tuple, plan: int) -> Alternative:
        cost, plan_cost, own, whole, n, extra = priced
        new = [self.nodes[i] for i in self.ids_of(whole & ~plan & self.received.mask)]
        new = [m for m in new if m.id != n.id and m not in extra]
        desc = self.describe(n)
        if new:
            desc += " after " + ", ".join(self.describe(m) for m in new)
        if extra:
            desc += ", then " + ", ".join(self.describe(m) for m in extra)
        return Alternative(scope, desc, cost, self.bytes_of(own), plan_cost, self.bytes_of(whole),
                           tuple(self.describe(m) for m in new), n.id, whole)

    def annotate(self, roots: list["Entry"], built: dict[int, "PlanNode"]) -> None:
        """Fill ``subplan_*`` and ``alternatives`` of every PlanNode of the plan."""
        plan = 0
        for r in roots:
            plan |= r.nodes
        entries = self.plan_entries(roots)
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
            if n.ctor in OP_CTORS and n.cls in self.names:
                loc_by_value[self.names[n.cls][0]].append(n)
        done_values: set[int] = set()
        for e in entries.values():
            pn = built[id(e)]
            pn.subplan_cost_ps = e.cost
            pn.subplan_bytes = self.bytes_of(e.nodes)
            alts = [self._finish("value", p, plan) for p in self.value_alternatives(e, roots, plan)[:KEEP]]
            v = self.names[e.node.cls][0]
            if e.node.ctor in OP_CTORS and v not in done_values:
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
                kids = self._kids(n, frozenset([n.cls, *(r.cls for r in extra)]))
                p = None if kids is None else self._price(n, kids, tuple(extra), roots, plan)
                if p is not None:
                    out.append(p)
        out.sort(key=lambda p: (p[1], p[0], p[4].id))
        return out
