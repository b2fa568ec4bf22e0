"""Matmuls and fused attention ops read through permuted copies instead of making them (a
lowering pass).

Laws: ``permute_T(permute_T(x)) = x`` (a permute swapping the last two dims, twice), and a
step whose result is its operand's buffer at the same shape and dtype (``saved``,
``detach``: ``OpKind.shares_operand``) is that buffer.  A matmul step reads each operand as
it is or transposed (its ``transposed`` flags, the last two dims, ``rules.alias``).
When an operand's buffer was made by a transposing permute step of buffer ``x``, possibly
through identity steps, the matmul reads ``x`` with that operand's flag flipped: the same
values, with no copy.  The steps nothing reads any more (the permute, the identities) are
then dropped.

Law: ``permute_T(op_a(A) @ op_b(B)) = op_b(B)^T @ op_a(A)^T``.  A transposing permute whose
operand is a matmul's result that nothing else reads (not kept) is that matmul with its
operands swapped and both flags flipped, writing the permute's buffer: cuBLAS reads the
operands through its transpose flags, and the matmul's untransposed result is never written
and copied.  So the weight gradient ``g2^T @ a2`` of ``x @ W.T`` (computed as ``(a2^T @
g2)^T``: one ``[in, out]`` matmul and a permute copy to ``[out, in]``) is one matmul.  Both
operands of the same rank (two 2-D operands, or batched ones): a 2-D operand broadcast over
the other's batch would move to the other side.

Laws: ``permute_p(x)`` is a view of x, and SDPA reads any layout whose last dim is contiguous.
A fused attention step (``ir.ops.attention.FUSED_KINDS``) whose q, k, v (or g) buffer was made
by permute steps keeping the last dim in place (``[b, s, h, d] -> [b, h, s, d]``), possibly
through identity steps, reads the permutes' operand and applies the composed permute as a view
(its ``views`` attribute, one permutation or ``()`` per operand: the CPU step's ``viewed``,
``runtime.cpu_steps.attention``); and a permute keeping the last dim of such a step's result
that nothing else reads (not kept) is that step writing its result permuted (``out_perm``: the
permute of SDPA's result, whose memory is ``[b, s, h, d]`` on a GPU, made contiguous: no copy
there).  The permute copies are then not made.

Nothing is chosen here: the plan's shardings, collectives and kept values are extraction's,
and only a local copy that the matmul can read through is not made.  The backward pass of
``x @ W.T`` reads ``saved(W.T)`` transposed, which is ``W``: no transposed copy of the
parameter is made in the forward pass and kept for the backward one (the tied ``lm_head``
of a language model: a ``[vocab, hidden]`` copy).
"""

from __future__ import annotations

from ..ir.ops import op_kind
from ..ir.ops.attention import FUSED_KINDS
from ..ir.ops.views import Permute, is_transpose_view, keeps_last_dim
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
        elif not _identity(s, meta):
            break
        b = s.ins[0]
    return b, flipped


def _identity(s: Step, meta: Meta) -> bool:
    """Is ``s`` a step whose result is its operand's buffer at the same shape and dtype
    (``saved``, ``detach``, ``alternative``: ``OpKind.shares_operand``)?"""
    return (s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") != "pointwise"
            and op_kind(s.attr("fop")).shares_operand(s, [meta[x] for x in s.ins]) == 0
            and meta[s.ins[0]] == meta[s.out])


def _permuted_source(steps: dict[str, Step], meta: Meta, b: str) -> tuple[str, tuple[int, ...]]:
    """(the buffer ``b``'s values are read from, the permutation of its dims that gives them):
    through identity steps and permutes keeping the last dim (module docstring)."""
    n = len(meta[b][0])
    perm = tuple(range(n))
    while b in steps:
        s = steps[b]
        if s.kind != "local" or s.attr("op") != "apply" or s.attr("fop") == "pointwise":
            break
        kind = op_kind(s.attr("fop"))
        if isinstance(kind, Permute) and keeps_last_dim(s.attr("perm")):
            step_perm = tuple(d % n for d in s.attr("perm"))
            perm = tuple(step_perm[d] for d in perm)  # result dim j = operand dim step_perm[perm[j]]
        elif not _identity(s, meta):
            break
        b = s.ins[0]
    return b, perm


def _attention_views(s: Step, made: dict[str, Step], meta: Meta) -> Step:
    """Fused attention step ``s`` reading its q, k, v (g) through permutes (module docstring)."""
    arity = 3 if s.attr("fop") == "attention" else 4
    ins, views = list(s.ins), []
    for slot in range(arity):
        src, perm = _permuted_source(made, meta, s.ins[slot])
        moved = perm != tuple(range(len(perm)))
        ins[slot] = src if moved else s.ins[slot]
        views.append(perm if moved else ())
    if not any(views):
        return s
    return s.with_attrs(ins=ins, views=tuple(views))


def read_through(steps: list[Step], meta: Meta, keep: set[str]) -> list[Step]:
    """``steps`` with every matmul and fused attention step reading its operands' sources
    (module docstring), and the steps whose results nothing reads any more (and that are not in
    ``keep``) dropped."""
    made = {s.out: s for s in steps}
    out: list[Step] = []
    for s in steps:
        if s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") in FUSED_KINDS:
            s = _attention_views(s, made, meta)
        elif s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == "matmul":
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
    return _permuted_attention(_transposed_results(_live(out, keep), meta, keep), meta, keep)


def _producers_and_readers(steps: list[Step]) -> tuple[dict[str, int], dict[str, int]]:
    """Per buffer, the index of the step writing it, and how many steps read it."""
    made = {s.out: i for i, s in enumerate(steps)}
    readers: dict[str, int] = {}
    for s in steps:
        for b in set(s.ins):
            readers[b] = readers.get(b, 0) + 1
    return made, readers


def _transposed_results(steps: list[Step], meta: Meta, keep: set[str]) -> list[Step]:
    """``steps`` with each transposing permute of a matmul's result read only by it computed
    by that matmul, operands swapped and flags flipped (module docstring); the matmul dropped."""
    made, readers = _producers_and_readers(steps)
    out: list[Step | None] = list(steps)
    for j, p in enumerate(steps):
        if not (p.kind == "local" and p.attr("op") == "apply" and p.attr("fop") == "permute"
                and is_transpose_view(p.attr("perm"))):
            continue
        i = made.get(p.ins[0])
        m = None if i is None else steps[i]
        if (m is None or out[i] is not m or m.kind != "local" or m.attr("op") != "apply" or m.attr("fop") != "matmul"
                or readers.get(m.out) != 1 or m.out in keep or m.attr("on") != p.attr("on")
                or len(meta[m.ins[0]][0]) != len(meta[m.ins[1]][0])):
            continue
        ta, tb = m.attr("transposed", (False, False))
        attrs = {k: v for k, v in m.attrs if k != "transposed"}
        if not (ta and tb):  # flipped: (not tb, not ta); both False is no attribute, as lowering writes it
            attrs["transposed"] = (not tb, not ta)
        out[j] = Step.make(m.kind, p.out, (m.ins[1], m.ins[0]), **attrs)
        out[i] = None
    return [s for s in out if s is not None]


def _permuted_attention(steps: list[Step], meta: Meta, keep: set[str]) -> list[Step]:
    """``steps`` with each permute keeping the last dim of a fused ``attention`` step's result
    read only by it (through identity steps each read only by the next) computed by that step
    (``out_perm``, module docstring); the step's own result and the identities dropped."""
    made, readers = _producers_and_readers(steps)
    out: list[Step | None] = list(steps)
    for j, p in enumerate(steps):
        if not (p.kind == "local" and p.attr("op") == "apply" and p.attr("fop") == "permute"
                and keeps_last_dim(p.attr("perm"))):
            continue
        n = len(meta[p.out][0])
        i = made.get(p.ins[0])
        chain: list[int] = []
        while i is not None and _identity(steps[i], meta) and readers.get(steps[i].out) == 1 \
                and steps[i].out not in keep:
            chain.append(i)
            i = made.get(steps[i].ins[0])
        a = None if i is None else steps[i]
        if (a is None or out[i] is not a or a.kind != "local" or a.attr("op") != "apply"
                or a.attr("fop") != "attention" or a.attr("into") is not None or a.attr("out_perm") is not None
                or readers.get(a.out) != 1 or a.out in keep or a.attr("on") != p.attr("on")):
            continue
        out[j] = a.with_attrs(out=p.out, out_perm=tuple(d % n for d in p.attr("perm")))
        for k in (i, *chain):
            out[k] = None
    return [s for s in out if s is not None]


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
