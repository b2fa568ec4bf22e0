"""A rejected alternative priced against an extracted plan (``Pricer``): an e-node ``n`` for
its class, on children sub-plans that avoid the classes it produces, and the whole plan so
changed.  Extraction adopts alternatives whose whole plan is cheaper
(``extract.adopt_alternatives``); the explanations price every plan node's alternatives with
it (``reshard.alternatives``).

Each alternative is priced two ways: its own sub-plan's DAG cost (its node plus the union of
its children's best sub-plans, shared nodes paid once), and the whole plan's cost with the
alternative substituted (sub-plans the chosen plan already pays for are not paid twice; a
plan class the sub-plan produces otherwise is taken from it, see ``Pricer._price``).

Acyclic pricing law: an alternative for the classes ``X`` (the class explained, plus the
classes a strategy reshards into) may only use children sub-plans that contain no class of
``X`` (else it would need the value it is meant to produce).  A child's best entry is used
when it satisfies that; otherwise (it is cyclic through ``X``, or the greedy built none
because it would have been) the children are re-extracted by ``greedy_dag`` restricted to
the sub-DAG below the alternative with ``X`` removed (``Pricer.acyclic``): classes whose
best entries avoid ``X`` are its seeds, only the classes between them and the alternative
are re-priced.  One walk serves all the alternatives of a class (``Pricer._targets``: below
the children of them all): a class below one alternative reads only classes below it, and
``greedy_dag`` visits nodes by (key, id) whatever else the region holds, so each gets the
entries a walk of its own would give (tiny Llama 2 x 2 training step: 940 walks for 281
classes before the budget ran out -> 583 walks, one a class, the budget not spent; adoption
1.35 -> 0.98 s, the plans the same).  An alternative is missing ("no other
way found") only when that re-extraction finds no way either; the re-extraction's work is
bounded by ``ACYCLIC_BUDGET`` (e-nodes visited per plan; past it an alternative is left
unpriced).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .dag import ClassGraph, ENode, Entry, _Costs, greedy_dag

#: e-nodes the acyclic re-extractions of one plan's explanation may visit in all
ACYCLIC_BUDGET = 200_000


class Pricer:
    """Prices rejected alternatives against one extracted plan: the e-node ``n`` for its class,
    on children sub-plans avoiding the classes it produces (``_kids``), and the whole plan so
    changed (``_price``).  ``best``: the extractor's best entries (children sub-plans)."""

    def __init__(self, nodes: list["ENode"], costs: "_Costs", best: dict[Any, "Entry"]) -> None:
        self.nodes, self.costs, self.best = nodes, costs, best
        self.by_cls: dict[Any, list[ENode]] = defaultdict(list)
        for n in nodes:
            self.by_cls[n.cls].append(n)
        #: class -> the bitset of its e-nodes, made on first use (``_mask``: few classes are read)
        self._cls_mask: dict[Any, int] = {}
        self._rest: dict[frozenset, tuple[int, int]] = {}
        self._plan_classes: set = set()
        self._plan_roots: list | None = None
        self._acyclic: dict[tuple, dict[Any, "Entry"]] = {}
        #: acyclic re-extractions done, kept across ``new_round``s: (entries, e-nodes visited,
        #: classes re-priced)
        self._known: dict[tuple, tuple[dict[Any, "Entry"], int, int]] = {}
        #: e-nodes the acyclic re-extractions may still visit (``ACYCLIC_BUDGET``)
        self.work_left = ACYCLIC_BUDGET
        #: (class, classes avoided) -> the classes one acyclic walk re-extracts (``_targets``)
        self._class_targets: dict[tuple, tuple] = {}

    def new_round(self) -> None:
        """Price as a new Pricer on the same ``best`` would: the work bound is whole again
        (``acyclic`` charges a re-extraction done in an earlier round as if done again, and
        answers it without redoing it)."""
        self._acyclic, self.work_left = {}, ACYCLIC_BUDGET

    def ids_of(self, bits: int) -> list[int]:
        return [int(i) for i in self.costs.members(bits)] if bits else []

    # ---- pricing ------------------------------------------------------------------------
    def rest(self, roots: list["Entry"], cut: frozenset) -> tuple[int, int]:
        """Node set of the plan without the classes in ``cut`` and what only they need: the
        part of the chosen plan an alternative for those classes still pays for, and its cost.
        (The plan's entries reachable from ``roots`` without passing through ``cut``, found by
        removing the cut entries and, by counting parents, every entry only removed entries
        use: work proportional to what is removed, not to the plan; its cost is the plan's less
        the nodes dropped, not a sum over the plan.)"""
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
        bits = (self._plan_bits | drop) ^ drop  # (``x & ~y``: no complement of a set as wide as the e-graph)
        self._rest[cut] = bits, self._plan_cost - self.costs.of(drop)
        return self._rest[cut]

    def _index_plan(self, roots: list["Entry"]) -> None:
        """Entries of the plan by class, their plan users and e-nodes (for ``rest``), and
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
        self._plan_cost = self.costs.of(self._plan_bits)
        self._rest = {}

    def _mask(self, classes: frozenset) -> int:
        """The bitset of the e-nodes of ``classes``."""
        mask = 0
        for c in classes:
            bits = self._cls_mask.get(c)
            if bits is None:
                bits = self._cls_mask[c] = sum(1 << n.id for n in self.by_cls.get(c, ()))
            mask |= bits
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
        sub = self.acyclic(classes, mask, self._targets(n.cls, classes))
        kids = tuple(sub.get(c) for c in n.children)
        return None if any(k is None for k in kids) else kids  # type: ignore[return-value]

    def _targets(self, cls: Any, classes: frozenset) -> tuple:
        """The children of every alternative of ``cls`` that reads no class of ``classes``:
        the classes one ``acyclic`` walk re-extracts for all of them (``_kids``)."""
        key = (cls, classes)
        got = self._class_targets.get(key)
        if got is None:
            got = self._class_targets[key] = tuple(dict.fromkeys(
                d for m in self.by_cls[cls] if classes.isdisjoint(m.children) for d in m.children))
        return got

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
                stack.extend(m.children)  # (those in region or seeds already are skipped when popped)
        cls_bit = {c: 1 << i for i, c in enumerate(region)}
        parents: dict[Any, list[ENode]] = defaultdict(list)
        parent_ids: dict[Any, list[int]] = defaultdict(list)
        node_of: dict[int, ENode] = {}
        for c in region:
            for m in self.by_cls[c]:
                kids = m.children
                if excluded.isdisjoint(kids):
                    node_of[m.id] = m
                    for d in (kids if len(kids) == 1 else dict.fromkeys(kids)):
                        parents[d].append(m)
                        parent_ids[d].append(m.id)
        local: dict[Any, Entry] = {}
        in_region = self._mask(frozenset(region))
        for c, e in seeds.items():  # the seeds' classes in region-local bits
            bits = 0
            for i in self.ids_of(e.nodes & in_region):
                bits |= cls_bit[self.nodes[i].cls]
            local[c] = Entry(e.cost, e.node, e.children, e.nodes, bits)
        out = greedy_dag([], self.costs, local, list(seeds), ClassGraph(parents, cls_bit, parent_ids, node_of))
        self._acyclic[key] = out
        self._known[key] = (out, work_before - self.work_left, len(region))
        return out

    def _price(self, n: "ENode", kids: tuple["Entry", ...], extra: tuple["ENode", ...], roots: list["Entry"],
               plan: int, below: int | None = None) -> tuple[int, int, int, int, "ENode", tuple] | None:
        """(sub-plan cost, whole-plan cost, sub-plan bits, whole-plan bits, n, extra) of
        implementing ``n``'s class by ``n`` (and each class of ``extra`` by that reshard of
        ``n``'s result); None when that would need one of those classes to build itself, or,
        given ``below``, when the whole plan would cost ``below`` or more (its sub-plan, a sum
        over a set as deep as the program, then not priced).

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
        if (own & mask | fixed) ^ fixed:  # (``x & ~y`` without complementing a wide set, as below)
            return None
        cut = set(classes)
        for i in self.ids_of((own | plan) ^ plan):  # the sub-plan's own e-nodes: usually a few
            if self.nodes[i].cls in self._plan_classes:
                cut.add(self.nodes[i].cls)
        if self._plan_roots is not roots:
            self._index_plan(roots)
        if not extra and n.cls not in self._root_classes and self._consumers[n.cls] <= cut:
            return None  # the sub-plan rebuilds every plan value made from n's class: nothing would use n
        rest, rest_cost = self.rest(roots, frozenset(cut))
        added = own | fixed
        added ^= added & rest  # (what the sub-plan adds to the rest: usually a few nodes)
        whole = rest_cost + self.costs.of(added)
        if below is not None and whole >= below:
            return None
        return self.costs.of(own), whole, own, rest | added, n, extra

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

    def value_alternatives(self, e: "Entry", roots: list["Entry"], plan: int, below: int | None = None) -> list[tuple]:
        """The other e-nodes of ``e``'s class, priced (``_price``; given ``below``, those whose
        whole plan costs less), cheapest sub-plan first."""
        priced = []
        for n in self.by_cls[e.node.cls]:
            if n.id == e.node.id or n.ctor == "InAt":
                continue
            kids = self._kids(n, frozenset([n.cls]))
            if kids is not None:
                p = self._price(n, kids, (), roots, plan, below)
                if p is not None:
                    priced.append(p)
        priced.sort(key=lambda p: (p[0], p[1], p[4].id))
        return priced
