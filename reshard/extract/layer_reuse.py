"""A stack's plan from the plan of a few of its layers: one middle layer's steps repeated.

``ir.layers`` finds a program's regular stack and cuts it down to its first ``keep - 1``
layers and its last (``Reduced``).  That small program is saturated and extracted as any
other; ``expand`` turns its plan into a plan for the whole program:

- the reduced plan's layers ``0 .. t-1`` are the program's first layers, its layers after
  ``t`` the program's last ones, and its layer ``t`` (a middle layer, the *template*) is
  repeated for every layer between (``depth - keep + 1`` copies); the nodes outside the layers
  are the program's as they are;
- a copy of a template node runs the same step (kind, sharding, collective and axis, cost) on
  the corresponding value, op and input of its layer; an operand in the template's own layer
  is the same copy's, one in the previous (next) layer is the previous (next) copy's, or the
  reduced plan's own node where that layer is not a copy.

Law (``template_closed``): the expansion is a plan of the whole program iff every operand a
copy reads exists: for each template node reading the previous (next) layer's value at
position i and sharding D, the template itself holds a node for its own value at i and D
(the previous copy is the template again).  Every expanded node then runs the program's op
at its position on operands of the shardings the template's step read, which is what the
template's step computes (the middle layers' ops are identical up to renaming,
``ir.layers`` law 1).  The plan's cost is the sum over its distinct nodes: the reduced
plan's, plus the template's for each further copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..ir.fusion import Fusion
from ..ir.layers import Reduced, Stack
from .dag import fold_dag
from .plan_node import PlanNode


def _owner(fusion: Fusion, stack: Stack, n: PlanNode) -> int | None:
    """The layer of the value node ``n`` computes (None: outside the layers)."""
    return stack.layer_of.get(fusion.producer[n.value])


def _key(fusion: Fusion, stack: Stack, n: PlanNode) -> tuple[int, str]:
    """A layer value's node by its position and sharding (one node per class in a plan)."""
    return stack.pos[fusion.producer[n.value]], repr(n.sharding)


def layer_nodes(red: Reduced, roots: list[PlanNode]) -> dict[int, dict[tuple[int, str], PlanNode]]:
    """The plan's nodes of each layer of the reduced program, by position and sharding."""
    out: dict[int, dict[tuple[int, str], PlanNode]] = {}

    def visit(n: PlanNode, _: list) -> None:
        layer = _owner(red.fusion, red.stack, n)
        if layer is not None:
            out.setdefault(layer, {})[_key(red.fusion, red.stack, n)] = n

    fold_dag(roots, lambda n: n.args, visit)
    return out


def template_closed(red: Reduced, nodes: dict[int, dict[tuple[int, str], PlanNode]], t: int) -> bool:
    """Whether layer ``t``'s nodes can be repeated (module docstring's law); ``nodes``: the
    reduced plan's ``layer_nodes``."""
    own = nodes.get(t, {})
    for n in own.values():
        for a in n.args:
            layer = _owner(red.fusion, red.stack, a)
            if layer in (t - 1, t + 1) and _key(red.fusion, red.stack, a) not in own:
                return False
    return True


@dataclass
class _Expansion:
    """What ``expand`` maps: the reduced program ``red`` of ``fusion``, the template layer
    ``t`` and the program's layer of each copy (``first .. last``)."""

    fusion: Fusion
    full: Stack
    red: Reduced
    t: int
    template: dict[tuple[int, str], PlanNode]

    @property
    def first(self) -> int:
        return self.red.kept[self.t]

    @property
    def last(self) -> int:
        return self.full.depth - len(self.red.kept) + self.t

    def native_layer(self, layer: int) -> int:
        """The program's layer of the reduced program's layer ``layer`` (not a copy)."""
        return layer if layer < self.t else self.full.depth - len(self.red.kept) + layer

    def value_in(self, rvalue: int, layer: int) -> int:
        """The program's value at the position of reduced value ``rvalue`` in program layer ``layer``."""
        rop = self.red.fusion.producer[rvalue]
        return self.fusion.ops[self.full.layers[layer][self.red.stack.pos[rop]]].output

    def op_in(self, rop: int, layer: int) -> int:
        return self.full.layers[layer][self.red.stack.pos[rop]]


@dataclass
class Shift:
    """What the repeated layers add to the reduced plan: modeled time (ps) and bytes received
    per rank (set by the caller, who lowers the plan); a copy's explanation moves its template's
    whole-plan figures by them."""

    ps: int = 0
    bytes: int = 0


def expand(fusion: Fusion, full: Stack, red: Reduced, roots: list[PlanNode],
           nodes: dict[int, dict[tuple[int, str], PlanNode]], t: int) -> tuple[list[PlanNode], int, Shift]:
    """The plan of ``fusion`` from the plan ``roots`` of its reduced program, layer ``t``
    repeated (module docstring; ``template_closed`` must hold): (the outputs' nodes, in
    ``fusion.outputs`` order, the plan's cost in ps, and its ``Shift`` from the reduced plan,
    ``bytes`` left for the caller; ``nodes``: the reduced plan's ``layer_nodes``)."""
    rf, rs = red.fusion, red.stack
    ex = _Expansion(fusion, full, red, t, nodes.get(t, {}))
    keys: dict[tuple, tuple] = {}

    def key(*k: Any) -> tuple:
        return keys.setdefault(k, k)

    def children(k: tuple) -> list[tuple]:
        kind, n = k[0], k[1]
        out = []
        for a in n.args:
            layer = _owner(rf, rs, a)
            if kind == "copy":
                copy = k[2]
                if layer == t:
                    out.append(key("copy", a, copy))
                elif layer in (t - 1, t + 1):
                    nxt = copy + (layer - t)
                    if ex.first <= nxt <= ex.last:
                        out.append(key("copy", ex.template[_key(rf, rs, a)], nxt))
                    else:
                        out.append(key("native", a))
                else:
                    out.append(key("native", a))
            else:  # a native node reading the template's layer reads the adjacent copy
                mine = _owner(rf, rs, n)
                if layer == t:
                    out.append(key("copy", a, ex.first if mine is not None and mine < t else ex.last))
                else:
                    out.append(key("native", a))
        return out

    built: list[PlanNode] = []

    def build(k: tuple, args: list[PlanNode]) -> PlanNode:
        kind, n = k[0], k[1]
        layer = k[2] if kind == "copy" else None
        if layer is None:
            owner = _owner(rf, rs, n)
            layer = None if owner is None else ex.native_layer(owner)
        h = n.head
        if layer is None:
            value, op, name = red.value_of[n.value], None if h.op is None else red.op_of[h.op], h.input_name
        else:
            value = ex.value_in(n.value, layer)
            op = None if h.op is None else ex.op_in(h.op, layer)
            name = None if h.input_name is None else fusion.tensors[value].name
        node = PlanNode(len(built), replace(h, op=op, input_name=name), value, n.sharding, tuple(args), n.cost_ps)
        node.pending = _priced_as(n, shift)
        built.append(node)
        return node

    shift = Shift()  # (known once every node is built)
    outputs: list[tuple] = []
    reduced_output: dict[tuple[int, str], PlanNode] = {}
    for r, (tid, ts) in zip(roots, rf.outputs):
        reduced_output.setdefault((tid, repr(ts)), r)
    reduced_value = {o: r for r, o in red.value_of.items()}
    for tid, ts in fusion.outputs:
        layer = full.layer_of.get(fusion.producer[tid])
        if layer is not None and ex.first <= layer <= ex.last:
            rtid = rf.ops[red.stack.layers[t][full.pos[fusion.producer[tid]]]].output
            outputs.append(key("copy", reduced_output[(rtid, repr(ts))], layer))
        else:
            rtid = reduced_value[tid] if layer is None else \
                rf.ops[red.stack.layers[layer if layer < t else layer - full.depth + len(red.kept)][
                    full.pos[fusion.producer[tid]]]].output
            outputs.append(key("native", reduced_output[(rtid, repr(ts))]))
    done = fold_dag(outputs, children, build)
    cost = sum(n.cost_ps for n in built)
    shift.ps = cost - sum(n.cost_ps for n in _distinct(roots))
    return [done[id(k)] for k in outputs], cost, shift


def _distinct(roots: list[PlanNode]) -> list[PlanNode]:
    found: list[PlanNode] = []
    fold_dag(roots, lambda n: n.args, lambda n, _: found.append(n))
    return found


def _priced_as(template: PlanNode, shift: Shift) -> Callable[[PlanNode], None]:
    """A node's explanation pricing: the reduced plan's node ``template``'s sub-plan and
    rejected alternatives, each alternative's whole-plan figures moved by ``shift``."""
    def price(node: PlanNode) -> None:
        node.pending = None
        node.subplan_cost_ps, node.subplan_bytes = template.subplan_cost_ps, template.subplan_bytes
        node.alternatives = [replace(a, plan_cost_ps=a.plan_cost_ps + shift.ps, plan_bytes=a.plan_bytes + shift.bytes,
                                     enode=-1, plan_nodes=0) for a in template.alternatives]
    return price


__all__ = ["Shift", "layer_nodes", "template_closed", "expand"]
