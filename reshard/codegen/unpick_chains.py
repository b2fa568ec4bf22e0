"""An ``unpick`` added into its accumulator as a pointwise step, so it fuses with its neighbours.

Law: on a block that holds every value of the indexed (last) dim, the accumulating scatter
``unpick(g, i, a)`` (``codegen.scatter_add``: ``a`` with ``g[r]`` added at ``[r, i[r]]``) is,
element by element, ``at_index(last, i[r], a + g[r], a)``: ``a + g`` (in ``a``'s dtype, rounded
to it as the scatter's add is) where the element's last coordinate is the row's index value,
``a`` elsewhere (a ``-0.0`` stays ``-0.0``, as in the scatter, which adds nothing there), with
``g`` and ``i`` read broadcast along the last dim (``kernels.pointwise_kernel``'s ``at_index``).
So ``unpicks_as_pointwise`` writes it as one ``apply pointwise`` step, which ``codegen.fuse``
then fuses with the step computing ``a``: cross entropy's gradient ``softmax * dlse`` with the
target column added in is one pass over the ``[tokens, vocab]`` block, not a pass and a
scatter.  Only where ``a`` is computed by such a step that only the scatter reads (else the
scatter's kernel, which writes ``g``'s elements only, is cheaper than a pass over the block);
a block split along the indexed dim (a masked local scatter, each rank's rows found through a
table) keeps the scatter's kernel.

And ``cast(reshape(x)) = reshape(cast(x))``: a cast of a reshaped buffer (a view) that nothing
but the cast reads, whose operand a fusable step computes and only the reshape reads, while no
reader of the cast is itself fusable, casts the operand and reshapes the result
(``casts_before_reshapes``), so the cast fuses with the step before the view: the vocab
gradient's float32 block rounded to bf16 in the same pass.  (``fuse.spread_casts`` swaps the
other way where the cast's readers are the fusable ones.)

Both are lowering rewrites, exact and layout-free: the steps keep the shardings the e-graph
chose, and each saves a pass over a buffer.
"""

from __future__ import annotations

from ..ir.sharding import TensorSharding
from .fuse import _cast_kernel_op, _readers, kernel_member
from .kernels import FLOAT_DTYPES, WRAPS_IN_REGISTERS
from .program import Step

__all__ = ["unpicks_as_pointwise", "casts_before_reshapes"]

Meta = dict[str, tuple[tuple[int, ...], str]]


def _apply(s: Step, fop: str) -> bool:
    return s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == fop


def _alongside(a: Step, b: Step, backward: set[str]) -> bool:
    """Same mesh and same phase."""
    return a.attr("on") == b.attr("on") and (a.out in backward) == (b.out in backward)


def _whole_rows(s: Step) -> bool:
    """Does the scatter's block hold every value of the indexed dim (no masked local scatter)?"""
    ts = s.attr("dst")
    return isinstance(ts, TensorSharding) and ts.local_shape[-1] == ts.shape[-1]


def unpicks_as_pointwise(steps: list[Step], keep: set[str], meta: Meta, backward: set[str]) -> list[Step]:
    """``steps`` with each accumulating ``unpick(g, i, a)`` on whole rows, whose ``a`` a fusable
    step computes that only the unpick reads, written as one ``apply pointwise`` step (module
    docstring)."""
    readers, producer = _readers(steps)
    out = list(steps)
    for j, s in enumerate(steps):
        if not (_apply(s, "unpick") and len(s.ins) == 3 and _whole_rows(s)):
            continue
        g, i, a = s.ins
        (shape, dtype), (gshape, gdtype) = meta[a], meta[g]
        p = producer.get(a)
        if (meta[s.out] != meta[a] or dtype not in FLOAT_DTYPES or gdtype != dtype or meta[i] != (gshape, "int64")
                or tuple(shape[:-1]) != tuple(gshape) or a in keep or p is None or readers.get(a) != [j]
                or not kernel_member(steps[p], meta) or not _alongside(steps[p], s, backward)):
            continue
        rows = (tuple(gshape), tuple(range(len(gshape))))  # g and i read along every dim but the last
        ops: list[tuple] = [("add", "in2", "in0")]
        if dtype in WRAPS_IN_REGISTERS:
            ops.append(("cast", "t0", dtype))
        ops.append(("at_index", len(shape) - 1, "in1", f"t{len(ops) - 1}", "in2"))
        extra = {"on": s.attr("on")} if s.attr("on") is not None else {}
        out[j] = Step.make("local", s.out, [g, i, a], op="apply", fop="pointwise", ops=tuple(ops), dtype=dtype,
                           shape=tuple(shape), bcast=(rows, rows, ()), fused=(s.out,), **extra)
    return out


def casts_before_reshapes(steps: list[Step], keep: set[str], meta: Meta, backward: set[str]) -> list[Step]:
    """``steps`` with each ``cast(reshape(x))`` made ``reshape(cast(x))`` where the cast then fuses
    with x's producer (module docstring); ``meta`` and ``backward`` get the cast's new buffer."""
    readers, producer = _readers(steps)
    swapped: dict[int, tuple[Step, Step]] = {}  # cast index -> (the cast of x, the reshape of it)
    gone: set[int] = set()
    for j, c in enumerate(steps):
        if not _cast_kernel_op(c, meta) or c.out in keep:
            continue
        r_at = producer.get(c.ins[0])
        r = steps[r_at] if r_at is not None else None
        if r is None or not _apply(r, "reshape") or r.out in keep or readers.get(r.out) != [j]:
            continue
        x = r.ins[0]
        p = producer.get(x)
        if (p is None or x in keep or readers.get(x) != [r_at] or not kernel_member(steps[p], meta)
                or not _alongside(steps[p], c, backward) or not _alongside(r, c, backward)
                or any(kernel_member(steps[k], meta) for k in readers.get(c.out, ()))):
            continue
        wide = f"{c.out}.cast"
        meta[wide] = (meta[x][0], meta[c.out][1])
        if c.out in backward:
            backward.add(wide)
        swapped[j] = (Step(c.kind, wide, (x,), c.attrs), Step(r.kind, c.out, (wide,), r.attrs))
        gone.add(r_at)
    out: list[Step] = []
    for j, s in enumerate(steps):
        if j in swapped:
            out.extend(swapped[j])
        elif j not in gone:
            out.append(s)
    return out
