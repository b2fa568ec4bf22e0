"""Fusion of elementwise steps in the host program: one ``pointwise`` step per group.

Law: a group of elementwise ``apply`` steps (``unary``, ``binary``, ``scale``, ``cast``,
``masked``) of one local shape, each a producer of another member but the last (its sink, j),
computes at j the same local tensors as the members do, when the result of every member but
the sink is read only by members, or else (an *extra output*) also by steps after j or as a
program output, and in j's phase (forward or backward, ``Program.backward_from``): one step
``apply pointwise`` at j whose instruction list evaluates the members in program order and
writes the sink's result (``out``) and every extra output (``extra_outs``, each the value
``extra_values`` names, (token, dtype)).  Every input of the group is ready at j (each is an
input of a member at or before j), and no step before j reads what the group writes, so no
read moves before its write.  Groups grow backward from each sink, the last sinks first, a step
joining one group at most; a member whose other readers lie before the sink stays out (the
intermediate a matmul reads between two members is written by its own step).
Only steps a generated kernel computes join (ops of ``kernels.POINTWISE_OPS`` on
float32/bf16/fp16/bool/int64/int32 buffers, ``kernels.POINTWISE_DTYPES``), so that a float64
cast, say, does not pull its neighbours off the kernel path.  So a comparison, a logical op
and a ``masked`` fuse with their float neighbours: relu's backward ``masked(g, y > -y, True)``
is one kernel; cross entropy's ``where(labels != ignore, labels, 0)`` on int64 labels is too;
silu's result saved for the backward is an extra output of the kernel computing ``silu(a) * b``.

The instruction list (``ops``) is ``kernels.pointwise_kernel``'s language: operands
``inK`` (the step's K-th input buffer) and ``tK`` (instruction K's value); ``unary``/``binary``
become their function name, ``scale`` ``mul_scalar``, ``cast`` ``cast``, ``masked``
``masked``.  After every member but the last whose result is a 16-bit float or an int32
(``kernels.WIDER_IN_REGISTERS``) a ``cast`` to its dtype follows (a bool is exact: 0 or 1; an
int64 is its 64-bit register) (the last one's result is converted to the step's ``dtype``), so
that a kernel computing in float32 (64-bit ints) rounds (wraps) where the unfused ops did;
evaluated with torch ops
(``local_ops.pointwise_local``) those casts change nothing and the result is bit-identical
to the unfused steps.  Its ``fused`` attribute names the members' buffers (for
``plan.explain()``).

A ``broadcast`` step (float or bool dtypes) read only by members joins the group as a leaf:
its input becomes a group input read through the broadcast's index map (attributes ``shape``,
the local result shape, and ``bcast``, per input ``()`` or ``(input shape, dims)``), so the
expanded copy is never written.

A pointwise step (a group, or one elementwise step) whose result a reduction reads (on the
same mesh and phase, a float dtype) moves into that step (its broadcast reads too: ``shape``,
``bcast``): the reduction
(``OpKind.takes_prologue``: a ``reduce`` over adjacent dims) reads the group's inputs and
computes its operand element by element (attribute ``prologue``: the instructions and the
operand's dtype, the value rounded to it as the stored operand was), and writes the group's
extra outputs, and its result where another step reads it too, as its own when no step
between the group and the reduction reads them: RMSNorm's ``x.float()`` (kept for the
backward) and the sum of its squares are one kernel, LayerNorm's centred squares and their
mean too.  The CPU step evaluates the prologue with ``pointwise_local``, then the op: the
tensors of the unfused steps.  Where a step in between reads an extra output but only the
reduction reads the result, the group stays, writing its extra outputs only (its
instructions up to the last of them), and the reduction computes the result again.  A result
read elsewhere too that an input of its shape and dtype could hold stays its group's, which
may write it into that input's dying memory (``codegen.alloc``): softmax's ``exp(x - max)``
over the logits keeps one logits buffer.

Which steps fuse is a layout-free codegen decision (every member already has its
sharding, chosen by the e-graph); it saves one kernel launch and one round trip of the
intermediate through device memory per fused member (an extra output is written once and
not read back by the group).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from ..ir.ops import OPS, op_kind
from .kernels import FLOAT_DTYPES, POINTWISE_DTYPES, POINTWISE_OPS, WIDER_IN_REGISTERS
from .program import Step

__all__ = ["ELEMENTWISE", "fuse_pointwise"]

#: ``apply`` kinds that fuse (the op registry's elementwise kinds).
ELEMENTWISE = frozenset(k for k, spec in OPS.items() if spec.elementwise)


def _readers(steps: list[Step]) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Each buffer's reading steps (indices, in order) and each step result's step."""
    readers: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for b in set(s.ins):
            readers.setdefault(b, []).append(i)
    return readers, {s.out: i for i, s in enumerate(steps)}


def _elementwise(s: Step) -> bool:
    return s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") in ELEMENTWISE


def fuse_pointwise(steps: list[Step], keep: set[str], meta: Mapping[str, tuple[tuple[int, ...], str]],
                   backward: Set[str] = frozenset()) -> list[Step]:
    """``steps`` with every fusable group of two or more elementwise steps replaced by one
    ``apply pointwise`` step at the group's last member, then pointwise steps moved into the
    reductions that read them (module docstring).  ``keep``: buffers that must stay (program
    outputs and inputs); ``meta``: local (shape, dtype) of every buffer; ``backward``: the
    buffers backward-phase steps write (an extra output never crosses phases)."""
    readers, producer = _readers(steps)

    def kernel_op(s: Step) -> bool:
        """Elementwise, and a generated kernel computes it (float32/bf16/fp16/bool throughout)."""
        return (_elementwise(s) and op_kind(s.attr("fop")).pointwise(s, list(s.ins))[0] in POINTWISE_OPS
                and all(meta[b][1] in POINTWISE_DTYPES for b in (*s.ins, s.out)))

    def read_broadcast(s: Step) -> bool:
        """A ``broadcast`` step of a float or bool buffer (its reads can move into a kernel)."""
        return (s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == "broadcast"
                and all(meta[b][1] in POINTWISE_DTYPES for b in (*s.ins, s.out)))

    def joins(i: int, members: set[int], j: int) -> bool:
        """Step i joins the group ending at step j: elementwise (or a broadcast leaf) on the
        group's shape and mesh, its result read only by members, or (an extra output, not of a
        broadcast) also by steps after j or the program's outputs, in j's phase."""
        p, sink = steps[i], steps[j]
        if meta[p.out][0] != meta[sink.out][0] or p.attr("on") != sink.attr("on"):
            return False
        outside = [k for k in readers.get(p.out, ()) if k not in members]
        if read_broadcast(p):
            return not outside and p.out not in keep
        if not kernel_op(p):
            return False
        return (not outside and p.out not in keep
                or all(k > j for k in outside) and (p.out in backward) == (sink.out in backward))

    taken: set[int] = set()
    groups: dict[int, list[int]] = {}  # last member -> members in program order
    for j in reversed(range(len(steps))):
        if j in taken or not kernel_op(steps[j]):
            continue
        members = {j}
        grown = True
        while grown:  # until no producer of a member joins (a join may let another one join)
            grown = False
            for c in sorted(members):
                if not _elementwise(steps[c]):  # a broadcast is a leaf: its input is read through it
                    continue
                for b in steps[c].ins:
                    i = producer.get(b)
                    if i is not None and i not in members and i not in taken and joins(i, members, j):
                        members.add(i)
                        grown = True
        if len(members) > 1:
            taken |= members
            groups[j] = sorted(members)
    out: list[Step] = []
    alone: dict[int, Step] = {}  # a kernel op fused with nothing (out index) -> its pointwise form
    for j, s in enumerate(steps):
        if j in groups:
            out.append(_fused(steps, groups[j], meta, readers, keep))
        elif j not in taken:
            if kernel_op(s):
                alone[len(out)] = _fused(steps, [j], meta, readers, keep)
            out.append(s)
    return _into_reductions(out, alone, keep, meta, backward)


def _into_reductions(steps: list[Step], alone: Mapping[int, Step], keep: set[str],
                     meta: Mapping[str, tuple[tuple[int, ...], str]], backward: Set[str]) -> list[Step]:
    """``steps`` with each pointwise step (a fused one, or ``alone``'s form of an elementwise
    one) whose result a reduction reads (``OpKind.takes_prologue``) moved into that step as its
    ``prologue``, its extra outputs (and its result, read elsewhere too, unless an operand of
    its shape and dtype could hold it) the reduction's, when nothing reads them before the
    reduction; else, when only the reduction reads its result, the group stays, writing its
    extra outputs only (module docstring)."""
    readers, producer = _readers(steps)
    out: list[Step | None] = list(steps)
    for r, s in enumerate(steps):
        if not (s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") in OPS and len(s.ins) == 1
                and s.attr("prologue") is None and op_kind(s.attr("fop")).takes_prologue(s, meta[s.ins[0]][0])):
            continue
        b = s.ins[0]
        p = producer.get(b)
        pw = None if p is None or out[p] is not steps[p] else alone.get(p, steps[p])  # (not moved already)
        if (pw is None or pw.attr("fop") != "pointwise" or meta[b][1] not in FLOAT_DTYPES
                or pw.attr("on") != s.attr("on") or (b in backward) != (s.out in backward)):
            continue
        reads = {"shape": pw.attr("shape"), "bcast": pw.attr("bcast")} if pw.attr("bcast") else {}
        values = dict(zip(pw.attr("extra_outs", ()), pw.attr("extra_values", ())))
        if b in keep or readers[b] != [r]:  # read elsewhere too: the operand is an extra output
            bcast = pw.attr("bcast") or ((),) * len(pw.ins)
            if any(meta[x] == meta[b] and not bk for x, bk in zip(pw.ins, bcast)):
                continue  # its own step may write it into that operand's memory (``codegen.alloc.in_place``)
            values[b] = (f"t{len(pw.attr('ops')) - 1}", meta[b][1])
        prologue = (pw.attr("ops"), meta[b][1])
        if all(k >= r for x in values for k in readers.get(x, ())):  # written at r: read there or after
            extra = {"extra_outs": tuple(values), "extra_values": tuple(values.values())} if values else {}
            out[r] = Step.make(s.kind, s.out, pw.ins, **dict(s.attrs), prologue=prologue, **extra, **reads)
            out[p] = None
        elif readers[b] == [r] and b not in keep:
            out[r] = Step.make(s.kind, s.out, pw.ins, **dict(s.attrs), prologue=prologue, **reads)
            out[p] = _extras_only(pw)
    return [s for s in out if s is not None]


def _extras_only(pw: Step) -> Step:
    """Fused step ``pw`` without its result: the instructions up to its last extra output's
    value, that output its ``out``, the inputs they read."""
    values = dict(zip(pw.attr("extra_outs"), pw.attr("extra_values")))
    last = max(values, key=lambda b: int(values[b][0][1:]))
    ops = pw.attr("ops")[:int(values[last][0][1:]) + 1]
    used = [k for k, _ in enumerate(pw.ins) if any(f"in{k}" in o[1:] for o in ops)
            or any(tok == f"in{k}" for tok, _ in values.values())]
    token = {f"in{k}": f"in{n}" for n, k in enumerate(used)}

    def renamed(o: tuple) -> tuple:
        return (o[0], *(token.get(a, a) if isinstance(a, str) else a for a in o[1:]))
    rest = [b for b in pw.attr("extra_outs") if b != last]
    extra = {"on": pw.attr("on")} if pw.attr("on") is not None else {}
    bcast = tuple(pw.attr("bcast") or ((),) * len(pw.ins))
    if any(bcast[k] for k in used):
        extra.update(shape=pw.attr("shape"), bcast=tuple(bcast[k] for k in used))
    if rest:
        extra.update(extra_outs=tuple(rest), extra_values=tuple((token.get(values[b][0], values[b][0]), values[b][1])
                                                                for b in rest))
    return Step.make("local", last, [pw.ins[k] for k in used], op="apply", fop="pointwise",
                     ops=tuple(renamed(o) for o in ops), dtype=values[last][1],
                     fused=tuple(m for m in pw.attr("fused") if m != pw.out), **extra)


def _fused(steps: list[Step], members: list[int], meta: Mapping[str, tuple[tuple[int, ...], str]],
           readers: Mapping[str, list[int]], keep: set[str]) -> Step:
    """The ``apply pointwise`` step of one group (members in program order, the last one's
    result its ``out``; the other members read by a step outside the group or kept are its
    ``extra_outs``)."""
    inputs: list[tuple[str, tuple]] = []  # (buffer, () or (its shape, broadcast dims))
    value: dict[str, str] = {}  # member buffer -> its operand token
    ops: list[tuple] = []

    def operand(b: str, spec: tuple = ()) -> str:
        if b in value:
            return value[b]
        if (b, spec) not in inputs:
            inputs.append((b, spec))
        return f"in{inputs.index((b, spec))}"

    for i in members:
        s = steps[i]
        fop = s.attr("fop")
        if fop == "broadcast":
            value[s.out] = operand(s.ins[0], (tuple(meta[s.ins[0]][0]), tuple(s.attr("dims"))))
            continue
        ops.append(op_kind(fop).pointwise(s, [operand(b) for b in s.ins]))
        dtype = meta[s.out][1]
        if fop != "cast" and dtype in WIDER_IN_REGISTERS and i != members[-1]:  # the last: the output rounds
            ops.append(("cast", f"t{len(ops) - 1}", dtype))
        value[s.out] = f"t{len(ops) - 1}"
    last = steps[members[-1]]
    extra = {"on": last.attr("on")} if last.attr("on") is not None else {}
    outs = [steps[i].out for i in members[:-1] if steps[i].out in keep
            or any(k not in members for k in readers.get(steps[i].out, ()))]
    if outs:
        extra.update(extra_outs=tuple(outs), extra_values=tuple((value[b], meta[b][1]) for b in outs))
    if any(spec for _, spec in inputs):
        extra.update(shape=tuple(meta[last.out][0]), bcast=tuple(spec for _, spec in inputs))
    return Step.make("local", last.out, [b for b, _ in inputs], op="apply", fop="pointwise", ops=tuple(ops),
                     dtype=meta[last.out][1], fused=tuple(steps[i].out for i in members), **extra)
