"""Fusion of elementwise chains in the host program: one ``pointwise`` step per chain.

Law: a chain of elementwise ``apply`` steps (``unary``, ``binary``, ``scale``, ``cast``,
``masked``) whose intermediate buffers are each read by exactly one step of the chain, are
not program outputs and all have the chain's local shape, computes the same local tensor as
one step ``apply pointwise`` whose instruction list evaluates the members in program order.
Only steps a generated kernel computes join a chain (ops of ``kernels.POINTWISE_OPS`` on
float32/bf16/fp16/bool/int64/int32 buffers, ``kernels.POINTWISE_DTYPES``), so that a float64
cast, say, does not pull its neighbours off the kernel path.  So a comparison, a logical op
and a ``masked`` fuse with their float neighbours: relu's backward ``masked(g, y > -y, True)``
is one kernel; cross entropy's ``where(labels != ignore, labels, 0)`` on int64 labels is too.

The instruction list (``ops``) is ``kernels.pointwise_kernel``'s language: operands
``inK`` (the step's K-th input buffer) and ``tK`` (instruction K's value); ``unary``/``binary``
become their function name, ``scale`` ``mul_scalar``, ``cast`` ``cast``, ``masked``
``masked``.  After every member but the last whose result is a 16-bit float or an int32
(``kernels.WIDER_IN_REGISTERS``) a ``cast`` to its dtype follows (a bool is exact: 0 or 1; an
int64 is its 64-bit register) (the last one's result is converted to the step's ``dtype``), so
that a kernel computing in float32 (64-bit ints) rounds (wraps) where the unfused ops did;
evaluated with torch ops
(``local_ops.pointwise_local``) those casts change nothing and the result is bit-identical
to the unfused steps.  The fused step sits where the chain's last member was: every input
of the chain is ready there, and nothing else reads the intermediates.  Its ``fused``
attribute names the members' buffers (for ``plan.explain()``).

A ``broadcast`` step (float or bool dtypes) read only by a chain member joins the chain as a leaf:
its input becomes a chain input read through the broadcast's index map (attributes ``shape``,
the local result shape, and ``bcast``, per input ``()`` or ``(input shape, dims)``), so the
expanded copy is never written.

Which steps fuse is a layout-free codegen decision (every member already has its
sharding, chosen by the e-graph); it saves one kernel launch and one round trip of the
intermediate through device memory per fused member.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir.ops import OPS, op_kind
from .kernels import POINTWISE_DTYPES, POINTWISE_OPS, WIDER_IN_REGISTERS
from .program import Step

__all__ = ["ELEMENTWISE", "fuse_pointwise"]

#: ``apply`` kinds that fuse (the op registry's elementwise kinds).
ELEMENTWISE = frozenset(k for k, spec in OPS.items() if spec.elementwise)


def _elementwise(s: Step) -> bool:
    return s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") in ELEMENTWISE


def fuse_pointwise(steps: list[Step], keep: set[str], meta: Mapping[str, tuple[tuple[int, ...], str]]
                   ) -> list[Step]:
    """``steps`` with every fusable chain of two or more elementwise steps replaced by one
    ``apply pointwise`` step (module docstring).  ``keep``: buffers that must stay (program
    outputs and inputs); ``meta``: local (shape, dtype) of every buffer."""
    readers: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for b in set(s.ins):
            readers.setdefault(b, []).append(i)
    producer = {s.out: i for i, s in enumerate(steps)}

    def kernel_op(s: Step) -> bool:
        """Elementwise, and a generated kernel computes it (float32/bf16/fp16/bool throughout)."""
        return (_elementwise(s) and op_kind(s.attr("fop")).pointwise(s, list(s.ins))[0] in POINTWISE_OPS
                and all(meta[b][1] in POINTWISE_DTYPES for b in (*s.ins, s.out)))

    def read_broadcast(s: Step) -> bool:
        """A ``broadcast`` step of a float or bool buffer (its reads can move into a kernel)."""
        return (s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == "broadcast"
                and all(meta[b][1] in POINTWISE_DTYPES for b in (*s.ins, s.out)))

    def fuses_into(i: int, j: int) -> bool:
        """Step i's result is an intermediate of a chain ending at (or passing) step j."""
        p, c = steps[i], steps[j]
        return ((kernel_op(p) or read_broadcast(p)) and kernel_op(c) and p.out not in keep
                and readers.get(p.out) == [j] and meta[p.out][0] == meta[c.out][0] and p.attr("on") == c.attr("on"))

    absorbed: set[int] = set()
    groups: dict[int, list[int]] = {}  # last member -> members in program order
    for j in range(len(steps)):
        if not _elementwise(steps[j]):
            continue
        members = {j}
        frontier = [j]
        while frontier:
            c = frontier.pop()
            for b in steps[c].ins:
                i = producer.get(b)
                if i is not None and i not in members and fuses_into(i, c):
                    members.add(i)
                    if _elementwise(steps[i]):  # a broadcast is a leaf: its input is read through it
                        frontier.append(i)
        if len(members) > 1:
            # a member that was a chain's last step until now joins this longer chain
            for i in members - {j}:
                groups.pop(i, None)
            absorbed |= members - {j}
            groups[j] = sorted(members)
    out: list[Step] = []
    for j, s in enumerate(steps):
        if j in absorbed:
            continue
        out.append(_fused(steps, groups[j], meta) if j in groups else s)
    return out


def _fused(steps: list[Step], members: list[int], meta: Mapping[str, tuple[tuple[int, ...], str]]) -> Step:
    """The ``apply pointwise`` step of one chain (members in program order)."""
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
    if any(spec for _, spec in inputs):
        extra.update(shape=tuple(meta[last.out][0]), bcast=tuple(spec for _, spec in inputs))
    return Step.make("local", last.out, [b for b, _ in inputs], op="apply", fop="pointwise", ops=tuple(ops),
                     dtype=meta[last.out][1], fused=tuple(steps[i].out for i in members), **extra)
