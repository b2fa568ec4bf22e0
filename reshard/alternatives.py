"""What extraction rejected, priced and described: the explanations behind ``Plan.explain``.

For every chosen plan node two kinds of rejected alternatives are computed from the
extractor's best entries (``extract.dag.greedy_dag``):

* ``scope="value"``: another e-node of the same class (the same value at the same
  sharding), e.g. "matmul on replicated operands" instead of "allgather after the matmul";
* ``scope="strategy"`` (for op nodes only): the same op computed with other operand /
  result shardings (any class of the value), followed by the one collective that turns its
  result into each sharding the rest of the plan consumes.

Each alternative is priced by ``extract.pricing.Pricer`` (its law there): ``cost_ps`` is its
own sub-plan's DAG cost (compare with the chosen node's ``PlanNode.subplan_cost_ps``),
``plan_cost_ps`` the whole plan's cost with the alternative substituted.  Bytes are what
each rank receives over the collectives of the sub-plan / plan (``extract.received``).
Pricing costs about as much as extraction, so it runs when an explanation first reads a
plan node's alternatives (``defer_pricing``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from weakref import WeakValueDictionary

from .extract.dag import ENode, Entry, _Costs
from .extract.extract import PlanPricing
from .extract.plan_node import Alternative, PlanNode, Tag, enode_head, tag_of
from .extract.pricing import Pricer
from .extract.received import Received
from .ir.fusion import Fusion
from .ir.mesh import DeviceMesh
from .plan_view import op_label
from .search.snapshot import Snapshot

#: the tags of the nodes that change one mesh axis's placement of a value
RESHARDS = (Tag.COLLECTIVE, Tag.LOCAL)
#: alternatives kept per plan node and scope (cheapest first)
KEEP = 4


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

    def bytes_of(self, bits: int) -> int:
        """Bytes each rank receives over the communicating e-nodes of bitset ``bits``."""
        return self.received.bytes_of(bits, self.costs)

    def describe(self, n: "ENode") -> str:
        """One e-node in words: ``matmul(x [R], w [R]) -> [R]``, ``allgather of x [S(0)] -> [R]
        on 'tp' (team 2)``."""
        h = enode_head(self.snap, n)
        if h.tag is Tag.INPUT:
            return f"input {h.input_name} fed as {self._sh(n.cls)}"
        if h.tag is Tag.APPLY:  # operands read through a transposed view (``alias``)
            ops = ", ".join(f"{self._name(c)}{'.T (view)' if t else ''} {self._sh(c)}"
                            for c, t in zip(n.children, h.transposed))
            return f"{op_label(self.fusion, h.op)}({ops}) -> {self._sh(n.cls)}"
        if h.tag is Tag.TRANSFER:
            src = f" from source device {h.src}" if h.src is not None else ""
            return (f"{h.form} of {self._name(n.cls)} {self._sh(n.children[0])} -> {self._sh(n.cls)} "
                    f"to another mesh{src}")
        a = h.axis
        mesh = self.fusion.tensors[self.names[n.cls][0]].mesh if n.cls in self.names else self.mesh
        return (f"{h.form} of {self._name(n.cls)} {self._sh(n.children[0])} -> {self._sh(n.cls)} "
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

    def annotate(self, roots: list["Entry"], built: Mapping[int, "PlanNode"]) -> None:
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
            if tag_of(n.ctor) is Tag.APPLY and n.cls in self.names:
                loc_by_value[self.names[n.cls][0]].append(n)
        done_values: set[int] = set()
        for e in entries.values():
            pn = built.get(id(e))
            if pn is None:
                continue  # a node the caller has dropped
            pn.subplan_cost_ps = e.cost
            pn.subplan_bytes = self.bytes_of(e.nodes)
            alts = [self._finish("value", p, plan) for p in self.value_alternatives(e, roots, plan)[:KEEP]]
            v = self.names[e.node.cls][0]
            if tag_of(e.node.ctor) is Tag.APPLY and v not in done_values:
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
                hops = [r for r in self.by_cls[c] if tag_of(r.ctor) in RESHARDS and r.children[0] == n.cls]
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


def defer_pricing(pricing: PlanPricing) -> None:
    """Price the extracted plan's rejected alternatives (``Explainer.annotate``) when an
    explanation first reads one of its nodes' (``PlanNode.pending``).  The pricing holds the
    plan's nodes weakly (the nodes hold the pricing): a dropped plan is freed at once, with
    its e-graph snapshot, by reference counting; the nodes still alive when an explanation is
    read are priced."""
    nodes = list(pricing.built.values())
    pricing = replace(pricing, built=WeakValueDictionary(pricing.built))

    def price(_: PlanNode) -> None:
        for pn in pricing.built.values():
            pn.pending = None
        Explainer(pricing.snap, pricing.fusion, pricing.mesh, pricing.nodes, pricing.costs, pricing.best,
                  pricing.names, pricing.ids, pricing.received).annotate(pricing.roots, pricing.built)

    for pn in nodes:
        pn.pending = price
