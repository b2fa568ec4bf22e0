"""Matmuls read through transposed copies instead of making them (a lowering pass).

Laws: ``permute_T(permute_T(x)) = x`` (a permute swapping the last two dims, twice), and a
step whose result is its operand's buffer at the same shape and dtype (``saved``,
``detach``: ``OpKind.shares_operand``) is that buffer.  A matmul step reads each operand as
it is or transposed (its ``transposed`` flags, the last two dims, ``rules.alias``).
When an operand's buffer was made by a transposing permute step of buffer ``x``, possibly
through identity steps, the matmul reads ``x`` with that operand's flag flipped: the same
values, with no copy.  The steps nothing reads any more (the permute, the identities) are
then dropped.

Nothing is chosen here: the plan's shardings, collectives and kept values are extraction's,
and only a local copy that the matmul can read through is not made.  The backward pass of
``x @ W.T`` reads ``saved(W.T)`` transposed, which is ``W``: no transposed copy of the
parameter is made in the forward pass and kept for the backward one (the tied ``lm_head``
of a language model: a ``[vocab, hidden]`` copy).
"""

from __future__ import annotations

from ..ir.ops import op_kind
from ..ir.ops.views import Permute, is_transpose_view
from .alloc import Meta
from .program import Step


def _source(steps: dict[str, Step], meta: Meta, b: str) -> tuple[str, bool]:
    """(the buffer ``b``'s values are read from, transposed?): through identity steps and
    pairs of transposing permutes (module docstring)."""
    flipped = False
    while b in steps:
        s = steps[b]
        if s.kind != "local" or s.attr("op") != "apply" or s.attr("fop") == "pointwise":
            break
        kind = op_kind(s.attr("fop"))
        if isinstance(kind, Permute) and is_transpose_view(s.attr("perm")):
            flipped = not flipped
        elif not (kind.shares_operand(s, [meta[x] for x in s.ins]) == 0 and meta[s.ins[0]] == meta[b]):
            break
        b = s.ins[0]
    return b, flipped


def read_through(steps: list[Step], meta: Meta, keep: set[str]) -> list[Step]:
    """``steps`` with every matmul reading its operands' sources (module docstring), and the
    steps whose results nothing reads any more (and that are not in ``keep``) dropped."""
    made = {s.out: s for s in steps}
    out: list[Step] = []
    for s in steps:
        if s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == "matmul":
            ins, flags = [], []
            for b, t in zip(s.ins, s.attr("transposed", (False, False))):
                src, flipped = _source(made, meta, b)
                ins.append(src)
                flags.append(t != flipped)
            if tuple(ins) != s.ins:
                attrs = dict(s.attrs)
                attrs["transposed"] = tuple(flags)
                s = Step.make(s.kind, s.out, ins, **attrs)
        out.append(s)
    return _live(out, keep)


def _live(steps: list[Step], keep: set[str]) -> list[Step]:
    """The steps whose results a later step or ``keep`` reads (back to front, so a chain that
    only fed a dropped step goes too)."""
    read = set(keep)
    live: list[Step] = []
    for s in reversed(steps):
        if s.out in read:
            live.append(s)
            read.update(s.ins)
    return live[::-1]
