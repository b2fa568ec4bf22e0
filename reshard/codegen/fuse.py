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
``masked``.  After every member but the last whose result is an int32
(``kernels.WRAPS_IN_REGISTERS``) a ``cast`` to it follows (a bool is exact: 0 or 1; an int64 is
its 64-bit register) (the last one's result is converted to the step's ``dtype``), so that a
kernel computing in 64-bit ints wraps where the unfused ops did.  A 16-bit float member is not
rounded: the group computes in float32 and rounds once, where a value is stored (its result and
extra outputs), as Inductor computes such a chain; the result equals the members evaluated in
float32 from the inputs (16-bit inputs widened exactly) and rounded at the end, within one
rounding of each stored value of the unfused steps' (which round after every op), and
``local_ops.pointwise_local`` evaluates it so, bit for bit as the kernel.  (An explicit ``cast``
member still rounds.)  Its ``fused`` attribute names the members' buffers (for
``plan.explain()``).

A ``broadcast`` step (float or bool dtypes) read only by members joins the group as a leaf:
its input becomes a group input read through the broadcast's index map (attributes ``shape``,
the local result shape, and ``bcast``, per input ``()`` or ``(input shape, dims)``), so the
expanded copy is never written.  A ``permute`` step keeping the last dim (float or bool
dtypes; the heads' ``[b, s, h, d] -> [b, h, s, d]``) read only by members joins likewise: its
input is read through the inverse permutation (a ``bcast`` entry whose dims are not increasing,
``(input shape, dims)`` with input dim i at result dim ``dims[i]``), composed with the member's
own read of it (shifted: rotary embedding's halves), so the permuted copy is never written.

A pointwise step (a group, or one elementwise step) whose result a reduction reads (on the
same mesh and phase, a float dtype) moves into that step (its broadcast reads too: ``shape``,
``bcast``): the reduction
(``pointwise_ops.takes_prologue``: a ``reduce`` over adjacent dims) reads the group's inputs and
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

*Moved reads* (``moved_reads``, first): a ``cat`` (``pad``) along dim d whose every piece is,
through a chain of one-operand elementwise steps (each read by the next alone, not kept, in
the cat's mesh and phase), a slice along d of a buffer x of the result's shape, or else a
buffer x of the result's shape but along d, is one ``apply pointwise`` step writing the cat's
buffer: element c of piece p (at [lo_p, lo_p + n_p) along d) is the chain on x at ``(c +
start_p - lo_p) mod extent`` (start_p: the slice's, else 0), so x is read shifted (a
``bcast`` entry's third element, ``((d, shift),)``; a plain read when the shift is 0 and x
is whole; a narrower x is read clamped in bounds, ``kernels._bcast_rolls``), and the pieces
are chosen by coordinate (``("in_range", d, lo, hi, a, b)``: a where lo <= c_d < hi, else b,
or 0 for a pad's zeros).  Rotary embedding's ``cat(-x[..., h:], x[..., :h])`` reads x
shifted by h; its transpose ``pad(-s[..., :h], lo=h) + pad(s[..., h:], hi=h)`` reads s
shifted by h: neither half is copied; GPT-2's qkv gradient ``pad(dq) + pad(dk) + pad(dv)``
is one kernel.  The pointwise step then joins its readers' group like an elementwise member
(its instructions taken in; what it reads plainly, element i at element i, may be computed by
the group, what it reads through an index map stays an input); its shifted reads never take part in an
in-place write of the memory they read (``codegen.alloc``), and it does not move into a
reduction (a prologue reads element i only).

*Permuted results* (``_permuted_results``, last): a permute keeping the last dim of a
pointwise step's result that only it reads (no extra outputs) is that step computing its
result in the permuted shape: every input read through the permutation composed with its own
read (its ``bcast`` dims and shifts mapped to the permuted dims, an ``in_range`` dim too), so the
permuted copy is never made (the gradient of q after rotary embedding, moved back to
``[b, s, h, d]``).

*Casts spread into their readers* (``spread_casts``, a lowering pass before this one): a
``cast`` a reshape alone reads is the cast of the reshaped operand (a view); a cast read by
several steps that can each compute it (an elementwise kernel op of its shape, which fuses
with its own copy; a reduction taking a prologue; a ``pick`` of the cast table, which becomes
the pick of the operand, cast) is computed by each, so cross entropy over bf16 logits never
writes their float32 copy: the max and ``sum(exp(x - max))`` read the bf16 logits (the
latter writing ``exp(x - max)`` as its extra output), the target pick casts the picked values.

Which steps fuse is a layout-free codegen decision (every member already has its
sharding, chosen by the e-graph); it saves one kernel launch and one round trip of the
intermediate through device memory per fused member (an extra output is written once and
not read back by the group).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from ..ir.ops import OPS
from ..ir.ops.views import inverse_permutation, keeps_last_dim
from .kernels import COORD_OPS, FLOAT_DTYPES, POINTWISE_DTYPES, POINTWISE_OPS, WRAPS_IN_REGISTERS
from .pointwise_ops import INSTRUCTIONS, instruction, takes_prologue
from .program import Step

__all__ = ["ELEMENTWISE", "fuse_pointwise", "kernel_member", "moved_reads", "spread_casts"]

#: ``apply`` kinds that fuse (those with a pointwise-kernel instruction, ``pointwise_ops``).
ELEMENTWISE = frozenset(INSTRUCTIONS)


def _readers(steps: list[Step]) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Each buffer's reading steps (indices, in order) and each step result's step."""
    readers: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for b in set(s.ins):
            readers.setdefault(b, []).append(i)
    return readers, {s.out: i for i, s in enumerate(steps)}


def _elementwise(s: Step) -> bool:
    return s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") in ELEMENTWISE


def _pointwise_member(s: Step) -> bool:
    """A pointwise step of one output (no extra outputs, no memory of an operand's): a group may
    take in its instructions (``moved_reads``' steps)."""
    return (s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == "pointwise"
            and not s.attr("extra_outs") and s.attr("into") is None)


def kernel_member(s: Step, meta: Mapping[str, tuple[tuple[int, ...], str]]) -> bool:
    """Elementwise, and a generated kernel computes it (float32/bf16/fp16/bool throughout);
    or a pointwise step of one output (``moved_reads``', ``unpick_chains``'), which joins a
    group as its instructions."""
    if _pointwise_member(s):
        return all(meta[b][1] in POINTWISE_DTYPES for b in (*s.ins, s.out))
    return (_elementwise(s) and instruction(s, list(s.ins))[0] in POINTWISE_OPS
            and all(meta[b][1] in POINTWISE_DTYPES for b in (*s.ins, s.out)))


def _read_elsewhere(s: Step) -> set[str]:
    """The inputs pointwise step ``s`` reads through an index map (broadcast, shifted): they
    must stay inputs of a group it joins, never values the group computes at its own element."""
    if s.attr("fop") != "pointwise":
        return set()
    return {b for b, spec in zip(s.ins, s.attr("bcast") or ()) if spec}


def _moves_reads(pw: Step) -> bool:
    """Does pointwise step ``pw`` read an input at another element than its own (shifted) or
    select by coordinate (``in_range``)?  A reduction's prologue does neither."""
    return (any(len(b) > 2 and b[2] for b in pw.attr("bcast") or ())
            or any(o[0] in COORD_OPS for o in pw.attr("ops")))


def fuse_pointwise(steps: list[Step], keep: set[str], meta: Mapping[str, tuple[tuple[int, ...], str]],
                   backward: Set[str] = frozenset()) -> list[Step]:
    """``steps`` with every fusable group of two or more elementwise steps replaced by one
    ``apply pointwise`` step at the group's last member, then pointwise steps moved into the
    reductions that read them (module docstring).  ``keep``: buffers that must stay (program
    outputs and inputs); ``meta``: local (shape, dtype) of every buffer; ``backward``: the
    buffers backward-phase steps write (an extra output never crosses phases)."""
    steps = moved_reads(steps, keep, meta, backward)
    readers, producer = _readers(steps)

    def read_broadcast(s: Step) -> bool:
        """A ``broadcast`` step of a float or bool buffer (its reads can move into a kernel)."""
        return (s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == "broadcast"
                and all(meta[b][1] in POINTWISE_DTYPES for b in (*s.ins, s.out)))

    def read_permute(s: Step) -> bool:
        """A ``permute`` step keeping the last dim, of a float or bool buffer (its reads can move
        into a kernel, row by row)."""
        return (s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == "permute"
                and keeps_last_dim(s.attr("perm"))
                and all(meta[b][1] in POINTWISE_DTYPES for b in (*s.ins, s.out)))

    def joins(i: int, members: set[int], j: int) -> bool:
        """Step i joins the group ending at step j: elementwise (or a broadcast leaf) on the
        group's shape and mesh, its result read only by members, or (an extra output, not of a
        broadcast) also by steps after j or the program's outputs, in j's phase."""
        p, sink = steps[i], steps[j]
        if meta[p.out][0] != meta[sink.out][0] or p.attr("on") != sink.attr("on"):
            return False
        if read_permute(p):  # a leaf: each member's read of it (shifted too) composed with it
            return not [k for k in readers.get(p.out, ()) if k not in members] and p.out not in keep
        if any(producer.get(b) in members for b in _read_elsewhere(p)) \
                or any(p.out in _read_elsewhere(steps[k]) for k in members):
            return False  # a value a pointwise member reads at other elements stays a group input
        outside = [k for k in readers.get(p.out, ()) if k not in members]
        if read_broadcast(p):
            return not outside and p.out not in keep
        if not kernel_member(p, meta):
            return False
        return (not outside and p.out not in keep
                or all(k > j for k in outside) and (p.out in backward) == (sink.out in backward))

    taken: set[int] = set()
    groups: dict[int, list[int]] = {}  # last member -> members in program order
    for j in reversed(range(len(steps))):
        if j in taken or not kernel_member(steps[j], meta):
            continue
        members = {j}
        grown = True
        while grown:  # until no producer of a member joins (a join may let another one join)
            grown = False
            for c in sorted(members):
                if steps[c].attr("fop") == "broadcast" or not (_elementwise(steps[c]) or _pointwise_member(steps[c])):
                    continue  # a broadcast is a leaf (its input read through it)
                elsewhere = _read_elsewhere(steps[c])  # (a pointwise member: what it reads plainly joins)
                for b in (b for b in steps[c].ins if b not in elsewhere):
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
            if kernel_member(s, meta) and not _pointwise_member(s):
                alone[len(out)] = _fused(steps, [j], meta, readers, keep)
            out.append(s)
    return _permuted_results(_into_reductions(out, alone, keep, meta, backward), keep, meta, backward)


def _permuted_results(steps: list[Step], keep: set[str], meta: Mapping[str, tuple[tuple[int, ...], str]],
                      backward: Set[str]) -> list[Step]:
    """``steps`` with each permute keeping the last dim whose operand is a pointwise step's
    result (no extra outputs) that only it reads, in its phase and mesh, computed by that
    step in the permuted shape (module docstring: *permuted results*); the permute dropped."""
    readers, producer = _readers(steps)
    out: list[Step | None] = list(steps)
    for j, pm in enumerate(steps):
        if not (pm.kind == "local" and pm.attr("op") == "apply" and pm.attr("fop") == "permute"):
            continue
        n = len(meta[pm.out][0])
        perm = tuple(d % n for d in pm.attr("perm"))
        i = producer.get(pm.ins[0])
        g = None if i is None else steps[i]
        if (g is None or out[i] is not g or not keeps_last_dim(perm) or not _pointwise_member(g) or g.out in keep
                or readers.get(g.out) != [j] or g.attr("on") != pm.attr("on")
                or (g.out in backward) != (pm.out in backward) or meta[g.out][1] != meta[pm.out][1]):
            continue
        inv = inverse_permutation(perm)
        specs = []
        for b, spec in zip(g.ins, g.attr("bcast") or ((),) * len(g.ins)):
            if not spec:
                spec = (tuple(meta[b][0]), tuple(range(n)))
            specs.append((tuple(spec[0]), tuple(inv[d] for d in spec[1]),
                          *((tuple((inv[d], sh) for d, sh in spec[2]),) if len(spec) > 2 else ())))
        ops = tuple((o[0], inv[o[1]], *o[2:]) if o[0] in COORD_OPS else o for o in g.attr("ops"))
        attrs = {k: v for k, v in g.attrs if k not in ("bcast", "shape", "ops", "fused")}
        out[j] = Step.make(g.kind, pm.out, g.ins, **attrs, ops=ops, shape=tuple(meta[pm.out][0]), bcast=tuple(specs),
                           fused=(*g.attr("fused"), pm.out))
        out[i] = None
    return [s for s in out if s is not None]


def moved_reads(steps: list[Step], keep: set[str], meta: Mapping[str, tuple[tuple[int, ...], str]],
                backward: Set[str] = frozenset()) -> list[Step]:
    """``steps`` with each ``cat`` or ``pad`` of pieces that are slices of a buffer of the
    result's shape, or buffers of its shape but along the dim, each through a chain of
    one-operand elementwise steps, computed by one ``apply pointwise`` step writing the cat's
    (pad's) buffer (module docstring: *moved reads*); the slices and chains (read by nothing
    else) dropped.  Only where that saves a step: a slice or chain is taken in, or every
    reader of the result is an elementwise step of its shape (whose group it joins)."""
    readers, producer = _readers(steps)
    drop: set[int] = set()
    new: dict[int, Step] = {}
    for j, t in enumerate(steps):
        if not (t.kind == "local" and t.attr("op") == "apply" and t.attr("fop") in ("cat", "pad")):
            continue
        shape, dtype = meta[t.out]
        nd = len(shape)
        if dtype not in POINTWISE_DTYPES or not nd:
            continue
        d = t.attr("dim") % nd
        los, at = [], 0
        for b in t.ins:
            los.append(t.attr("lo") if t.attr("fop") == "pad" else at)
            at += meta[b][0][d]
        pieces = [_piece(steps, readers, producer, keep, meta, backward, b, j, d, shape, t) for b in t.ins]
        if any(p is None for p in pieces) or (t.attr("fop") == "cat" and len(pieces) < 2):
            continue
        fuses = t.out not in keep and bool(readers.get(t.out)) and all(
            _elementwise(steps[k]) and steps[k].attr("fop") != "broadcast" and meta[steps[k].out][0] == meta[t.out][0]
            and steps[k].attr("on") == t.attr("on") for k in readers[t.out])
        if not fuses and not any(p[3] for p in pieces):
            continue  # no slice or chain taken in, no reader to join: the cat / pad kernel as it is
        inputs: list[tuple[str, tuple]] = []
        ops: list[tuple] = []
        vals = []
        for (x, start, chain, members), lo in zip(pieces, los):
            shift = (start - lo) % shape[d]
            whole = tuple(meta[x][0]) == tuple(shape)
            spec = (tuple(meta[x][0]), tuple(range(nd)), ((d, shift),)) if shift or not whole else ()
            if (x, spec) not in inputs:
                inputs.append((x, spec))
            tok = f"in{inputs.index((x, spec))}"
            for c in chain:
                ops.append(instruction(c, [tok]))
                tok = f"t{len(ops) - 1}"
                if c.attr("fop") != "cast" and meta[c.out][1] in WRAPS_IN_REGISTERS:
                    ops.append(("cast", tok, meta[c.out][1]))
                    tok = f"t{len(ops) - 1}"
            vals.append(tok)
            drop.update(members)
        if t.attr("fop") == "pad":
            ops.append(("in_range", d, los[0], los[0] + meta[t.ins[0]][0][d], vals[0], 0))
        else:
            v = vals[-1]
            for k in reversed(range(len(vals) - 1)):
                ops.append(("in_range", d, los[k], los[k] + meta[t.ins[k]][0][d], vals[k], v))
                v = f"t{len(ops) - 1}"
        extra = {"on": t.attr("on")} if t.attr("on") is not None else {}
        if any(spec for _, spec in inputs):
            extra["bcast"] = tuple(spec for _, spec in inputs)
        new[j] = Step.make("local", t.out, [b for b, _ in inputs], op="apply", fop="pointwise", ops=tuple(ops),
                           dtype=dtype, shape=tuple(shape), fused=tuple(steps[i].out for i in sorted(
                               i for p in pieces for i in p[3])) + (t.out,), **extra)
    return [new.get(j, s) for j, s in enumerate(steps) if j not in drop]


def _piece(steps: list[Step], readers: Mapping[str, list[int]], producer: Mapping[str, int], keep: set[str],
           meta: Mapping[str, tuple[tuple[int, ...], str]], backward: Set[str], b: str, j: int, d: int,
           shape: tuple[int, ...], t: Step) -> tuple[str, int, list[Step], list[int]] | None:
    """Operand ``b`` of the cat / pad step ``t`` (at ``j``, along dim ``d``, result ``shape``) as
    (x, the start x is read from, the chain of one-operand elementwise steps from x to b, the
    indices of those steps and of the slice they start at): a slice of a buffer x of the
    result's shape (start: the slice's), or else a buffer x of the result's shape but along d
    (start 0), through such a chain, each step read only by the next (the last by t alone) and
    not kept, in t's mesh and phase, of pointwise-kernel dtypes; None: neither."""
    chain: list[Step] = []
    members: list[int] = []
    cur, reader = b, j
    while True:
        i = producer.get(cur)
        s = steps[i] if i is not None else None
        mine = (s is not None and readers.get(cur) == [reader] and cur not in keep and s.kind == "local"
                and s.attr("op") == "apply" and s.attr("on") == t.attr("on")
                and (s.out in backward) == (t.out in backward) and meta[s.out][1] in POINTWISE_DTYPES)
        if mine and s.attr("fop") == "slice" and s.attr("dim") % len(meta[s.ins[0]][0]) == d \
                and tuple(meta[s.ins[0]][0]) == tuple(shape) and meta[s.ins[0]][1] in POINTWISE_DTYPES:
            return s.ins[0], s.attr("start"), chain[::-1], members + [i]
        if mine and _elementwise(s) and s.attr("fop") != "broadcast" and len(s.ins) == 1 \
                and instruction(s, ["in0"])[0] in POINTWISE_OPS:
            chain.append(s)
            members.append(i)
            cur, reader = s.ins[0], i
            continue
        cs, dt = meta[cur]  # the source itself, read shifted (narrower than the result along d)
        if (len(cs) == len(shape) and 0 < cs[d] <= shape[d] and dt in POINTWISE_DTYPES
                and all(a == e for k, (a, e) in enumerate(zip(cs, shape)) if k != d)):
            return cur, 0, chain[::-1], members
        return None


def _cast_kernel_op(s: Step, meta: Mapping[str, tuple[tuple[int, ...], str]]) -> bool:
    """A ``cast`` step a pointwise kernel computes."""
    return (_elementwise(s) and s.attr("fop") == "cast"
            and all(meta[b][1] in POINTWISE_DTYPES for b in (*s.ins, s.out)))


def spread_casts(steps: list[Step], keep: set[str], meta: dict[str, tuple[tuple[int, ...], str]],
                  backward: set[str]) -> list[Step]:
    """``steps`` with each cast read by several steps that can each compute it themselves
    computed by each of them (module docstring: *casts spread into their readers*); ``meta``
    and ``backward`` get the new buffers."""
    steps = _casts_after_reshapes(steps, keep, meta, backward)
    readers, _ = _readers(steps)
    spread: dict[int, Step] = {}  # cast index -> the cast
    for i, c in enumerate(steps):
        if not _cast_kernel_op(c, meta) or c.out in keep:
            continue
        rs = readers.get(c.out, [])
        if not rs or (len(rs) < 2 and steps[rs[0]].attr("fop") != "pick"):
            continue
        if all(_absorbs(steps[r], c, meta, backward) for r in rs):
            spread[i] = c
    if not spread:
        return steps
    by_out = {c.out: c for c in spread.values()}
    out: list[Step] = []
    for i, s in enumerate(steps):
        if i in spread:
            continue
        casts = [b for b in dict.fromkeys(s.ins) if b in by_out]
        if not casts:
            out.append(s)
            continue
        if s.attr("fop") == "pick":  # pick(cast(x), i) = cast(pick(x, i)): the few picked elements cast
            (c,) = casts
            raw = f"{s.out}.raw"
            meta[raw] = (meta[s.out][0], meta[by_out[c].ins[0]][1])
            if s.out in backward:
                backward.add(raw)
            out.append(Step(s.kind, raw, (by_out[c].ins[0], *s.ins[1:]), s.attrs))
            out.append(Step(by_out[c].kind, s.out, (raw,), by_out[c].attrs))
            continue
        names = {}
        for c in casts:  # this reader's own copy, read by it alone
            names[c] = f"{c}.{s.out}"
            meta[names[c]] = meta[c]
            if c in backward:
                backward.add(names[c])
            out.append(Step(by_out[c].kind, names[c], by_out[c].ins, by_out[c].attrs))
        out.append(Step(s.kind, s.out, tuple(names.get(b, b) for b in s.ins), s.attrs))
    return out


def _absorbs(r: Step, c: Step, meta: Mapping[str, tuple[tuple[int, ...], str]], backward: Set[str]) -> bool:
    """Does step ``r`` compute cast ``c``'s value itself once given its own copy (or, a pick,
    the cast of what it picks): an elementwise kernel op of the cast's shape (fused with its
    copy), a reduction taking a prologue (the copy its prologue), a pick of the cast table (in
    the cast's mesh and phase)."""
    if r.kind != "local" or r.attr("op") != "apply" or r.attr("on") != c.attr("on") \
            or (r.out in backward) != (c.out in backward):
        return False
    fop = r.attr("fop")
    if fop == "pick":
        return r.ins[0] == c.out and c.out not in r.ins[1:]
    if fop in ELEMENTWISE and fop != "broadcast":
        return (meta[r.out][0] == meta[c.out][0] and instruction(r, list(r.ins))[0] in POINTWISE_OPS
                and all(meta[b][1] in POINTWISE_DTYPES for b in (*r.ins, r.out)))
    return (fop in OPS and r.ins == (c.out,) and r.attr("prologue") is None and meta[c.out][1] in FLOAT_DTYPES
            and takes_prologue(r, meta[c.out][0]))


def _casts_after_reshapes(steps: list[Step], keep: set[str], meta: dict[str, tuple[tuple[int, ...], str]],
                          backward: set[str]) -> list[Step]:
    """``reshape(cast(x)) = cast(reshape(x))``: a cast read only by a reshape reads the reshape
    of its operand (a view) instead, so the cast's readers read it directly."""
    readers, _ = _readers(steps)
    made = {s.out: s for s in steps}
    swap: dict[str, Step] = {}  # reshape's result -> the cast
    for i, s in enumerate(steps):
        c = made.get(s.ins[0]) if s.ins else None
        if (s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == "reshape" and c is not None
                and _cast_kernel_op(c, meta) and readers[c.out] == [i] and c.out not in keep
                and c.attr("on") == s.attr("on") and (c.out in backward) == (s.out in backward)):
            swap[s.out] = c
    if not swap:
        return steps
    casts = {c.out for c in swap.values()}
    out: list[Step] = []
    for s in steps:
        if s.out in casts:
            continue
        if s.out in swap:
            c = swap[s.out]
            view = f"{s.out}.view"
            meta[view] = (meta[s.out][0], meta[c.ins[0]][1])
            if s.out in backward:
                backward.add(view)
            out.append(Step(s.kind, view, c.ins, s.attrs))
            out.append(Step(c.kind, s.out, (view,), c.attrs))
            continue
        out.append(s)
    return out


def _into_reductions(steps: list[Step], alone: Mapping[int, Step], keep: set[str],
                     meta: Mapping[str, tuple[tuple[int, ...], str]], backward: Set[str]) -> list[Step]:
    """``steps`` with each pointwise step (a fused one, or ``alone``'s form of an elementwise
    one) whose result a reduction reads (``pointwise_ops.takes_prologue``) moved into that step as its
    ``prologue``, its extra outputs (and its result, read elsewhere too, unless an operand of
    its shape and dtype could hold it) the reduction's, when nothing reads them before the
    reduction; else, when only the reduction reads its result, the group stays, writing its
    extra outputs only (module docstring)."""
    readers, producer = _readers(steps)
    out: list[Step | None] = list(steps)
    for r, s in enumerate(steps):
        if not (s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") in OPS and len(s.ins) == 1
                and s.attr("prologue") is None and takes_prologue(s, meta[s.ins[0]][0])):
            continue
        b = s.ins[0]
        p = producer.get(b)
        pw = None if p is None or out[p] is not steps[p] else alone.get(p, steps[p])  # (not moved already)
        if (pw is None or pw.attr("fop") != "pointwise" or _moves_reads(pw) or meta[b][1] not in FLOAT_DTYPES
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
            out[r] = s.with_attrs(ins=pw.ins, prologue=prologue, **extra, **reads)
            out[p] = None
        elif readers[b] == [r] and b not in keep:
            out[r] = s.with_attrs(ins=pw.ins, prologue=prologue, **reads)
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
    permuted: dict[str, tuple[str, tuple[int, ...]]] = {}  # a permute leaf's buffer -> (its input, inverse)
    ops: list[tuple] = []

    def operand(b: str, spec: tuple = ()) -> str:
        if b in permuted:  # the leaf's input, its dim k at the leaf's dim inv[k], read as the member reads the leaf
            b, inv = permuted[b]
            dims = tuple(spec[1]) if spec else tuple(range(len(inv)))
            spec = (tuple(meta[b][0]), tuple(dims[inv[k]] for k in range(len(inv))), *spec[2:])
        elif b in value:
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
        if fop == "permute":
            n = len(meta[s.out][0])
            permuted[s.out] = (s.ins[0], inverse_permutation([d % n for d in s.attr("perm")]))
            continue
        if fop == "pointwise":  # (``moved_reads``') its instructions, on the group's tokens
            specs = s.attr("bcast") or ((),) * len(s.ins)
            token = {f"in{k}": operand(b, tuple(spec)) for k, (b, spec) in enumerate(zip(s.ins, specs))}
            base = len(ops)
            token.update({f"t{k}": f"t{base + k}" for k in range(len(s.attr("ops")))})
            ops.extend((o[0], *(token.get(a, a) if isinstance(a, str) else a for a in o[1:])) for o in s.attr("ops"))
            if not s.attr("ops"):
                ops.append(("cast", token["in0"], meta[s.out][1]))
        else:
            ops.append(instruction(s, [operand(b) for b in s.ins]))
        dtype = meta[s.out][1]
        if fop != "cast" and dtype in WRAPS_IN_REGISTERS and i != members[-1]:  # the last: the output rounds
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
