"""A pad of a pointwise step's result is that step writing the padded buffer (a lowering pass,
after ``codegen.fuse``).

``codegen.aligned_matmuls`` pads a 16-bit matmul's misaligned operand with a ``pad`` step: GPT-2's
vocabulary gradient ``dlogits`` (``[tokens, 50257]``) is written by cross entropy's backward
kernel, then copied into a ``[tokens, 50264]`` buffer for the lm head's two gradients: a second
pass over the largest tensor of the step.

Law: for a ``pointwise`` step g (``codegen.fuse``; no extra outputs) of result shape
``[..., n]``, ``pad(reshape*(g), last dim, lo=0, hi)`` (reshapes that keep the last dim, each
read only by the next, the pad alone reading the last) equals ``reshape*(g')``, g' the same
instructions over the padded shape ``[..., n + hi]`` with the result selected by coordinate,
``("in_range", last, 0, n, t, 0)`` (zeros past n), every input read through its index map over
the padded shape: one that is n wide along the last dim read clamped there (a ``bcast`` entry's
roll ``(last, 0)``, ``kernels._bcast_rolls``; the clamped lanes past n are not selected), a
broadcast one (extent 1 there, or no such dim) as before.  (``aligned_matmuls``' law
``pad_last(reshape(y)) = reshape(pad_last(y))`` moves the pad before the reshapes; with lo = 0
the coordinates of g's own ``in_range`` / ``at_index`` instructions are unchanged.)  Likewise a
pointwise step P that reads g's result so (clamped, unshifted, over g's shape padded along the
last dim: what ``fuse.moved_reads`` makes of a pad of an elementwise chain) computes g itself:
g's instructions first, on g's inputs read through their padded index maps, g's value rounded
to g's dtype (as its buffer held it), then P's on it.  Where g's result is kept (a program
output) or read elsewhere, an input of g is already read rolled along the last dim, or g and
its reader lie in different phases or meshes, the pad stays.  On the GPU the padded copy is
never made: the kernel writes the pad's zeros itself (its vector path reads a clamped input
lane by lane only in a row's last vector, ``kernels._cut_at``).
"""

from __future__ import annotations

from collections.abc import Set

from .fuse import _readers
from .program import Step
from .unpick_chains import _apply

Meta = dict[str, tuple[tuple[int, ...], str]]


def _clamped(shape: tuple[int, ...]) -> tuple:
    """The ``bcast`` entry reading a buffer of ``shape`` clamped along its last dim."""
    return (tuple(shape), tuple(range(len(shape))), ((len(shape) - 1, 0),))


def _padded_spec(spec: tuple, shape: tuple[int, ...]) -> tuple | None:
    """Input ``spec`` (a ``bcast`` entry over ``shape``) over the shape padded along its last
    dim: n wide there, read clamped (a roll ``(last, 0)``); None: already rolled there."""
    last = len(shape) - 1
    if not spec:
        return _clamped(shape)
    in_shape, dims, *rest = spec
    rolls = tuple(rest[0]) if rest else ()
    if any(d == last for d, _ in rolls):
        return None
    if last not in dims or in_shape[list(dims).index(last)] == 1:
        return tuple(spec)  # broadcast along the last dim: read as before
    return (tuple(in_shape), tuple(dims), (*rolls, (last, 0)))


def _token(tok: object, ins: dict[int, str], ts: int) -> object:
    """Operand ``tok`` of a step's instruction renamed: ``inK`` to ``ins[K]``, ``tK`` shifted by ``ts``."""
    if isinstance(tok, str) and tok[:2] == "in" and tok[2:].isdigit():
        return ins[int(tok[2:])]
    if isinstance(tok, str) and tok[:1] == "t" and tok[1:].isdigit():
        return f"t{int(tok[1:]) + ts}"
    return tok


def _merged(g: Step, meta: Meta, reader: Step, k: int, shape: tuple[int, ...]) -> Step | None:
    """``reader`` (a pointwise step of result ``shape``, its input ``k`` g's result read
    clamped) computing g itself (module docstring); None: an input of g is read rolled along
    the last dim."""
    gshape, dtype = tuple(meta[g.out][0]), meta[g.out][1]
    gspecs = [_padded_spec(spec, gshape) for spec in (g.attr("bcast") or ((),) * len(g.ins))]
    if any(spec is None for spec in gspecs):
        return None
    rspecs = list(reader.attr("bcast") or ((),) * len(reader.ins))
    inputs: list[tuple[str, tuple]] = []

    def slot(b: str, spec: tuple) -> str:
        if (b, spec) not in inputs:
            inputs.append((b, spec))
        return f"in{inputs.index((b, spec))}"

    gins = {i: slot(b, spec) for i, (b, spec) in enumerate(zip(g.ins, gspecs))}
    ops = [tuple(_token(a, gins, 0) for a in o) for o in (g.attr("ops") or (("cast", "in0", dtype),))]
    if dtype != "float32" and ops[-1][0::2] != ("cast", dtype):  # the value as g's buffer held it
        ops.append(("cast", f"t{len(ops) - 1}", dtype))
    rins = {i: (f"t{len(ops) - 1}" if i == k else slot(b, spec)) for i, (b, spec) in enumerate(zip(reader.ins, rspecs))}
    base = len(ops)
    ops += [tuple(_token(a, rins, base) for a in o) for o in (reader.attr("ops") or (("cast", "in0", dtype),))]
    extra = {}
    if reader.attr("extra_values"):
        extra["extra_values"] = tuple((_token(tok, rins, base), d) for tok, d in reader.attr("extra_values"))
    attrs = {a: v for a, v in reader.attrs if a not in ("bcast", "shape", "ops", "fused", "extra_values")}
    specs = tuple(spec for _, spec in inputs)
    return Step.make("local", reader.out, [b for b, _ in inputs], **attrs, **extra, ops=tuple(ops), shape=tuple(shape),
                     bcast=specs, fused=(*(g.attr("fused") or (g.out,)), *(reader.attr("fused") or (reader.out,))))


def pads_into_producers(steps: list[Step], keep: Set[str], meta: Meta, backward: set[str]) -> list[Step]:
    """``steps`` with each pad of a pointwise step's result (through reshapes keeping the last
    dim), and each pointwise step reading one clamped, computing it over the padded shape
    (module docstring), the pad dropped; ``meta`` and ``backward`` get new buffers."""
    readers, producer = _readers(steps)
    out: dict[int, list[Step]] = {}

    def producer_of(b: str, reader: int, like: Step) -> tuple[int, Step] | None:
        """The pointwise step whose result ``b`` is, read by ``reader`` alone, in ``like``'s phase
        and mesh, not kept nor taken already."""
        i = producer.get(b)
        g = steps[i] if i is not None else None
        if (g is None or i in out or not _apply(g, "pointwise") or g.attr("extra_outs") or b in keep
                or readers.get(b) != [reader] or g.attr("on") != like.attr("on")
                or (g.out in backward) != (like.out in backward) or not meta[b][0]):
            return None
        return i, g

    for j, s in enumerate(steps):
        if j in out:
            continue
        if _apply(s, "pointwise") and s.attr("shape"):
            shape = tuple(s.attr("shape"))
            for k, (b, spec) in enumerate(zip(s.ins, s.attr("bcast") or ())):
                got = producer_of(b, j, s)
                if (got is None or s.ins.count(b) != 1 or spec != _clamped((*shape[:-1], meta[b][0][-1]))
                        or meta[b][0][:-1] != shape[:-1]):
                    continue
                step = _merged(got[1], meta, s, k, shape)
                if step is not None:
                    out[got[0]], out[j] = [], [step]
                    break
            continue
        if not (_apply(s, "pad") and s.attr("lo") == 0 and meta[s.out][0]
                and s.attr("dim") % len(meta[s.out][0]) == len(meta[s.out][0]) - 1):
            continue
        shape, dtype = meta[s.out]
        chain: list[int] = []  # the reshapes between g and the pad, last first
        cur, reader = s.ins[0], j
        while (i := producer.get(cur)) is not None and i not in out and readers.get(cur) == [reader] \
                and cur not in keep and _apply(steps[i], "reshape") and meta[steps[i].ins[0]][0][-1:] == meta[cur][0][-1:]:
            chain.append(i)
            cur, reader = steps[i].ins[0], i
        got = producer_of(cur, reader, s)
        if got is None or meta[cur][1] != dtype:
            continue
        i, g = got
        gshape = tuple(meta[g.out][0])
        padded = (*gshape[:-1], shape[-1])
        reshapes = chain[::-1]  # in program order, from g
        names = [f"{b}.padded" for b in [g.out, *(steps[r].out for r in reshapes[:-1])]] + [s.out] \
            if reshapes else [s.out]
        select = Step.make("local", names[0], [g.out], op="apply", fop="pointwise", dtype=dtype,
                           ops=(("in_range", len(gshape) - 1, 0, gshape[-1], "in0", 0),), fused=(s.out,),
                           **({"on": s.attr("on")} if s.attr("on") is not None else {}))
        step = _merged(g, meta, select, 0, padded)
        if step is None:
            continue
        made = [step]
        meta[names[0]] = (padded, dtype)
        for r, name in zip(reshapes, names[1:]):
            rshape = (*meta[steps[r].out][0][:-1], shape[-1])
            on = steps[r].attr("on")
            made.append(Step.make("local", name, [made[-1].out], op="apply", fop="reshape", shape=rshape,
                                  **({"on": on} if on is not None else {})))
            meta[name] = (rshape, dtype)
        if s.out in backward:
            backward.update(names)
        out[i] = made  # where g was: its inputs are ready there, and nothing reads the pad before it
        out.update({r: [] for r in [*chain, j]})
    return [t for k, s in enumerate(steps) for t in out.get(k, [s])]


__all__ = ["pads_into_producers"]
