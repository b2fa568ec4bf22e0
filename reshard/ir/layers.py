"""Repeated layers of a Fusion: found, checked identical, and cut down to a few.

A deep program repeats one layer (a decoder block, forward and backward): the same ops,
shapes and shardings up to renaming.  ``find_stack(fusion)`` finds such a stack:

- **Seeds.** A value named after a numbered child of one container (``layers.3.mlp.up``,
  ``grad.model.layers.3``, ``saved.h.3.attn``: the container is the most common such name
  among the Fusion's values, ``from_torch`` names them by module path, ``examples`` by hand)
  belongs to that child's layer.
- **Joins.** An unnamed op (``t<N>``: a gradient's steps, a bucket's cats and slices) joins
  the last layer its operands come from (inputs aside; none, or an operand computed outside
  the layers: it stays outside; a backward step reading a saved input of layer k+1, layer
  k's output, and a gradient of layer k+1 is layer k+1's; an input's ``saved`` copy counts as
  an input);
  an input that no name places (a folded constant) joins the one layer that reads it, its
  ``saved`` copy (``autodiff`` keeps an input a rebuilt broadcast reads) counting as that
  layer's when that layer alone reads the copy.  A
  value named otherwise (``model.norm``) is outside.
- **Per-layer terms.** Where the ops so grouped make no regular stack, they are grouped again
  with each layer's *terms* (a sum over the layers computed after them: a mixture's
  load-balancing loss adds a term of each layer's router to the terms of the layers before,
  its gradient read by every layer's term; such ops are outside and read middle layers, law
  3).  In program order, an op outside that reads a layer before the last joins the last
  layer it reads, counting a layer a forward op outside reads through such ops (the last
  layer's term feeds the running sum that joins the last layer); an unnamed op that reads a
  term is a term; an unnamed op may also read values made outside from no layer (the
  embedding's saved output: its step is the layer's own, as in the layers after); then an
  op outside that reads no layer and that one layer alone reads, after that layer's first
  op, joins it (a constant broadcast for a term, a layer's share of the terms' gradient).  A
  layer lists its terms apart (``_ordered``): first those read outside the layer (the running
  sum, at the same places in every layer), then its own ops, then its other terms.  The
  laws below are checked the same way; the terms only group ops differently, so a stack
  found without them is the stack found before.

A stack is *regular* (``Stack``; the laws ``reduce_stack`` and layer reuse rest on) when
1. every middle layer (not the first, not the last) has the same *form*: its ops in order
   (``Stack.layers``), each with its kind, attributes (an input's name aside; a value an attribute names,
   as a reference), result shape, dtype, mesh, fixed sharding and the shardings it is an
   output at, and its operands as positions in its own layer (``s``), the previous layer
   (``p``), the next one (``n``), or as the same value outside the layers (``o``);
2. no layer reads a layer two or more away;
3. no op outside the layers reads a middle layer.
The first and the last layer may differ from the middle ones (the last one's output gradient
comes from a norm, not from another layer).

``reduce_stack(fusion, stack, keep)`` is then the Fusion with the first ``keep - 1`` layers
and the last one: the last layer reads layer ``keep - 2`` where it read the one before it,
and layer ``keep - 2`` reads the last layer where it read the one after it, at the same
positions, each such operand of the same shape and dtype (else there is no reduced Fusion).
It computes other values than ``fusion`` (fewer layers), but every op of it is an op of
``fusion`` whose operands sit at the same positions with the same shapes: a plan for it is a
plan for those layers, and a middle layer's steps, repeated, fill the gap
(``extract.layer_reuse``).
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .fusion import Fusion, Tensor
from .names import base_name
from .ops import op_kind

#: a numbered child of a container in a value's name: ``layers.3`` in ``grad.model.layers.3.mlp``
_CHILD = re.compile(r"(?:^|\.)((?:[A-Za-z_]\w*\.)*?[A-Za-z_]\w*)\.(\d+)(?=\.|$)")
#: the name of an unnamed value (``Fusion._new``'s ``t<N>``)
_AUTO = re.compile(r"t\d+")


def _child(name: str) -> tuple[str, int] | None:
    """(container, index) of ``name``'s first numbered child, derived prefixes dropped."""
    m = _CHILD.search(base_name(name))
    return None if m is None else (m.group(1), int(m.group(2)))


@dataclass(frozen=True)
class Stack:
    """A regular stack of layers (module docstring): ``layers[k]`` are layer k's op indices,
    its computing ops in program order, then its inputs in program order (the first layer's
    extra input, the stack's own, leaves the positions of its ops as the others'); ``layer_of``
    maps each of those ops to its layer; ``pos`` to its position."""

    container: str
    layers: tuple[tuple[int, ...], ...]
    layer_of: dict[int, int]
    pos: dict[int, int]

    @property
    def depth(self) -> int:
        return len(self.layers)


def membership(fusion: Fusion) -> tuple[str, dict[int, int]] | None:
    """(container, op -> layer) by seeds and joins (module docstring), with the per-layer terms
    joined where only they make the layers a stack (``find_stack``: a mixture's router terms of
    the load-balancing loss then belong to their layers); None without a container."""
    found = _membership(fusion, False)
    if found is None:
        return None
    stack = find_stack(fusion)  # (a stack found without terms holds the same ops at the same layers)
    return found[0], {**found[1], **(stack.layer_of if stack is not None else {})}


def _membership(fusion: Fusion, terms: bool, min_depth: int = 0) -> tuple[str, dict[int, int], set[int]] | None:
    """(container, op -> layer, the ops joined as per-layer terms) by seeds and joins, with
    ``terms`` per-layer terms too (module docstring); None without a container, or with
    ``terms`` and fewer than ``min_depth`` layers."""
    children = {op.index: _child(fusion.tensors[op.output].name) for op in fusion.ops}
    counts = Counter(c[0] for c in children.values() if c is not None)
    if not counts:
        return None
    container = counts.most_common(1)[0][0]
    last = max(c[1] for c in children.values() if c is not None and c[0] == container)
    if terms and last + 1 < min_depth:
        return None
    seed = next((op.index for op in fusion.ops if op.kind == "grad_seed"), len(fusion.ops))
    layer_of: dict[int, int] = {}
    reach: dict[int, int] = {}  # a forward op outside -> the last layer it reads, through such ops too
    joined: set[int] = set()  # the per-layer terms
    free: set[int] = set()  # ops outside reading no layer, directly or not (the embedding)
    for op in fusion.ops:  # program order: operands first
        c = children[op.index]
        if c is not None and c[0] == container:
            layer_of[op.index] = c[1]
        elif op.kind != "input":
            producers = [fusion.producer[t] for t in op.inputs]
            found = [layer_of[p] for p in producers if p in layer_of]
            beyond = found + [reach[p] for p in producers if p in reach]
            if found and _AUTO.fullmatch(fusion.tensors[op.output].name) and \
                    all(p in layer_of or _input_like(fusion, p) or p in free for p in producers):
                layer_of[op.index] = max(found)
                if any(p in joined for p in producers):  # a step on a term is a term
                    joined.add(op.index)
            elif terms and found and min(found) < last:  # a term of a layer before the last
                layer_of[op.index] = max(beyond)
                joined.add(op.index)
            elif terms and op.index < seed and beyond:
                reach[op.index] = max(beyond)
            elif terms and all(p in free or fusion.ops[p].kind == "input" for p in producers):
                free.add(op.index)
    if terms:
        _join_alone(fusion, layer_of, joined, last)
    readers = _readers(fusion, layer_of)
    for op in fusion.ops:  # an input's saved copy that one layer reads goes with that layer
        if op_kind(op.kind).boundary == "saved" and op.index not in layer_of \
                and fusion.ops[fusion.producer[op.inputs[0]]].kind == "input":
            r = readers.get(op.index, set())
            if len(r) == 1 and None not in r:
                layer_of[op.index] = next(iter(r))
    readers = _readers(fusion, layer_of)
    for op in fusion.ops:
        if op.kind == "input" and op.index not in layer_of:
            r = readers.get(op.index, set())
            if len(r) == 1 and None not in r:
                layer_of[op.index] = next(iter(r))
    return container, layer_of, joined


def _join_alone(fusion: Fusion, layer_of: dict[int, int], joined: set[int], last: int) -> None:
    """Per-layer terms: an op outside that reads no layer and that one layer before the last
    alone reads, after that layer's first op (a constant's broadcast in a layer's term, the
    layer's share of the terms' gradient; not the embedding before the first layer, nor the
    final norm's backward that the last layer reads), joins that layer; ops in reverse program
    order, so a chain of them joins whole.  A ``saved`` copy does not: its class holds the
    recompute of the value it copies, an op outside."""
    starts: dict[int, int] = {}
    for i, k in layer_of.items():
        if fusion.ops[i].kind != "input":
            starts[k] = min(starts.get(k, i), i)
    readers: dict[int, list[int]] = {}
    for op in fusion.ops:
        for t in op.inputs:
            readers.setdefault(fusion.producer[t], []).append(op.index)
    reads_layer = {op.index for op in fusion.ops if any(fusion.producer[t] in layer_of for t in op.inputs)}
    for op in reversed(fusion.ops):
        if op.kind == "input" or op.index in layer_of or op_kind(op.kind).boundary == "saved" \
                or op.index in reads_layer:
            continue
        r = {layer_of.get(i) for i in readers.get(op.index, ())}
        if len(r) == 1 and (k := next(iter(r))) is not None and k < last and op.index > starts.get(k, len(fusion.ops)):
            layer_of[op.index] = k
            joined.add(op.index)


def _input_like(fusion: Fusion, k: int) -> bool:
    """Is op ``k`` an input, or an input's ``saved`` copy (one several layers read: a constant
    mask every layer's attention gradient reads)?"""
    op = fusion.ops[k]
    return op.kind == "input" or op_kind(op.kind).boundary == "saved" and \
        fusion.ops[fusion.producer[op.inputs[0]]].kind == "input"


def _readers(fusion: Fusion, layer_of: dict[int, int]) -> dict[int, set[int | None]]:
    """Per op, the layers of the ops that read its value (None: an op outside the layers)."""
    readers: dict[int, set[int | None]] = {}
    for op in fusion.ops:
        for t in op.inputs:
            readers.setdefault(fusion.producer[t], set()).add(layer_of.get(op.index))
    return readers


def _attr(op: Any, key: str, ref: Any) -> Any:
    value = op.attrs[key]
    if key == "of":  # (``unbucket``) a value of the Fusion
        return ("ref", ref(int(value)))
    return repr(value)


def _forms(fusion: Fusion, layers: list[list[int]], layer_of: dict[int, int], pos: dict[int, int]) -> list[tuple]:
    """Per layer, its form (module docstring)."""
    outputs: dict[int, list[str]] = {}
    for tid, ts in fusion.outputs:
        outputs.setdefault(tid, []).append(repr(ts))
    forms = []
    for k, ops in enumerate(layers):
        def ref(tid: int, k: int = k) -> tuple:
            p = fusion.producer[tid]
            lk = layer_of.get(p)
            if lk is None:
                return ("o", tid)
            return ({0: "s", -1: "p", 1: "n"}.get(lk - k, f"x{lk - k}"), pos[p])
        form = []
        for i in ops:
            op = fusion.ops[i]
            t = fusion.tensors[op.output]
            attrs = tuple((key, _attr(op, key, ref)) for key in sorted(op.attrs)
                          if not (op.kind == "input" and key == "name"))
            form.append((op.kind, t.shape, t.dtype, repr(t.mesh), repr(t.sharding), tuple(outputs.get(op.output, ())),
                         attrs, tuple(ref(x) for x in op.inputs)))
        forms.append(tuple(form))
    return forms


def _ordered(fusion: Fusion, layer_of: dict[int, int], joined: set[int], depth: int) -> list[list[int]]:
    """Each layer's ops in program order: the per-layer terms read outside their layer (a
    running sum's value: at the same places in every layer, though the first and the last
    layer's own ops may differ), the layer's own ops, its other terms, its inputs."""
    passed = {fusion.producer[t] for op in fusion.ops for t in op.inputs
              if fusion.producer[t] in joined and layer_of.get(op.index) != layer_of[fusion.producer[t]]}

    def rank(op: Any) -> int:
        if op.kind == "input":
            return 3
        return 1 if op.index not in joined else 0 if op.index in passed else 2

    layers: list[list[int]] = [[] for _ in range(depth)]
    for op in sorted(fusion.ops, key=rank):  # (stable: program order within)
        if op.index in layer_of:
            layers[layer_of[op.index]].append(op.index)
    return layers


def find_stack(fusion: Fusion, min_depth: int = 3) -> Stack | None:
    """The Fusion's regular stack of at least ``min_depth`` layers (module docstring), or None
    (no numbered container, too few layers, or a law does not hold, with the per-layer terms
    joined or without)."""
    return _stack(fusion, min_depth, False) or _stack(fusion, min_depth, True)


def _stack(fusion: Fusion, min_depth: int, terms: bool) -> Stack | None:
    found = _membership(fusion, terms, min_depth)
    if found is None or terms and not found[2]:
        return None
    container, layer_of, joined = found
    depth = max(layer_of.values(), default=-1) + 1
    if depth < min_depth:
        return None
    for op in fusion.ops:  # (3), checked first: it needs no forms (a mixture's terms fail it)
        if op.index not in layer_of and any(0 < layer_of.get(fusion.producer[t], 0) < depth - 1 for t in op.inputs):
            return None
    layers = _ordered(fusion, layer_of, joined, depth)
    if any(not ops for ops in layers):
        return None
    pos = {i: p for ops in layers for p, i in enumerate(ops)}
    forms = _forms(fusion, layers, layer_of, pos)
    if len(set(forms[1:-1])) != 1:
        return None  # (1)
    if any(r[0].startswith("x") for form in forms for *_, refs in form for r in refs):
        return None  # (2)
    return Stack(container, tuple(tuple(ops) for ops in layers), layer_of, pos)


def _topological(fusion: Fusion, reads: dict[int, list[Any]]) -> list[int]:
    """The ops of ``reads`` (op -> the values it reads) in an order that puts every value's
    producer first, program order where that allows (a layer's saved input is made where the
    next layer's backward first reads it; rewired, an earlier layer's may be read before)."""
    waiting = {i: {fusion.producer[v] for v in vs} for i, vs in reads.items()}
    users: dict[int, list[int]] = {}
    for i, ps in waiting.items():
        for p in ps:
            users.setdefault(p, []).append(i)
    ready = [i for i, ps in waiting.items() if not ps]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            waiting[u].discard(i)
            if not waiting[u]:
                heapq.heappush(ready, u)
    return order


@dataclass(frozen=True)
class Reduced:
    """``reduce_stack``'s result: the Fusion, its layers (``kept[j]`` is the original layer its
    layer j is), and its values' and ops' originals (``value_of``, ``op_of``: reduced id ->
    ``fusion``'s)."""

    fusion: Fusion
    stack: Stack
    kept: tuple[int, ...]
    value_of: dict[int, int]
    op_of: dict[int, int]


def reduce_stack(fusion: Fusion, stack: Stack, keep: int) -> Reduced | None:
    """``fusion`` with layers ``0 .. keep-2`` and the last one (module docstring), its ops in an
    order that defines every operand first; None when a rewired operand has no value of its
    shape and dtype, or the rewiring makes a cycle."""
    depth = stack.depth
    kept = tuple(range(keep - 1)) + (depth - 1,)
    gone = {i for k in range(keep - 1, depth - 1) for i in stack.layers[k]}

    def source(tid: int, reader: int) -> int | None:
        """The value op ``reader`` reads instead of ``tid`` (None: no value of its shape and
        dtype there): the last layer reads layer ``keep - 2`` for its removed neighbour, and
        layer ``keep - 2`` the last one."""
        p = fusion.producer[tid]
        if p not in gone:
            return tid
        layer = stack.layers[keep - 2 if stack.layer_of.get(reader, 0) == depth - 1 else depth - 1]
        if stack.pos[p] >= len(layer):
            return None
        v, t = fusion.tensors[fusion.ops[layer[stack.pos[p]]].output], fusion.tensors[tid]
        return v.id if (v.shape, v.dtype, v.mesh) == (t.shape, t.dtype, t.mesh) else None

    reads: dict[int, list[int | None]] = {}
    for op in fusion.ops:
        if op.index not in gone:
            reads[op.index] = [source(x, op.index) for x in op.inputs] + (
                [source(int(op.attrs["of"]), op.index)] if "of" in op.attrs else [])
    if any(None in r for r in reads.values()):
        return None
    order = _topological(fusion, reads)
    if len(order) < len(reads):
        return None  # (a cycle through the rewired operands)
    out = Fusion()
    new: dict[int, Tensor] = {}
    op_of: dict[int, int] = {}
    for i in order:
        op = fusion.ops[i]
        t = fusion.tensors[op.output]
        srcs = reads[i]  # (the operands', then an ``of`` value's)
        if op.kind == "input":
            v = out.input(t.name, t.shape, t.dtype, t.mesh, t.sharding)
        else:
            attrs = dict(op.attrs)
            if "of" in attrs:
                attrs["of"] = new[srcs[-1]].id
            v = out._op(op.kind, [new[s] for s in srcs[:len(op.inputs)]], out._new(t.shape, t.dtype, t.mesh, t.name, t.sharding),
                        **attrs)
        new[t.id] = v
        op_of[len(out.ops) - 1] = op.index
    for tid, sharding in fusion.outputs:
        if fusion.producer[tid] not in gone:
            out.outputs.append((new[tid].id, sharding))
    index = {old: new_op for new_op, old in op_of.items()}
    layers = tuple(tuple(index[i] for i in stack.layers[k]) for k in kept)
    layer_of = {i: j for j, ops in enumerate(layers) for i in ops}
    pos = {i: p for ops in layers for p, i in enumerate(ops)}
    return Reduced(out, Stack(stack.container, layers, layer_of, pos), kept, {v.id: k for k, v in new.items()}, op_of)


__all__ = ["Stack", "Reduced", "find_stack", "reduce_stack"]
