"""16-bit matmuls read operands cuBLAS can read aligned (a lowering pass).

cuBLAS runs its tensor-core kernels only when, for every matrix, the extent it reads contiguously
(a row-major matrix's columns, a column-major one's rows) and its leading dimension are
multiples of 16 bytes; otherwise it falls back to element-aligned kernels several times slower.
GPT-2's vocabulary (50257) makes the lm head's three GEMMs misaligned: on an H200 in bf16 the
input gradient ``dlogits @ W`` took 3.3 ms where an aligned one takes 0.6.  Inductor pads such
matmuls too (``pad_mm``).

Law: a matmul ``op_a(A) @ op_b(B)`` (``transposed`` flags, ``ir.ops.matmul.operands``) of
16-bit floats whose M, K or N is read contiguously by some matrix (the lhs's K, or its M when
read transposed; the rhs's N, or its K when read transposed; the result's N) and is no multiple
of 8 elements equals the matmul of its operands zero-padded there (``pad`` steps, last two dims):
zero rows or columns of K add nothing to the product; zero rows of M or columns of N give rows
or columns of the result that ``slice`` steps drop (an outer slice of rows is a view).  Law:
``pad_last(reshape(y)) = reshape(pad_last(y))`` when the reshape keeps the last dim: an operand
made by reshapes of ``y`` that keep its last dim, padded only there, is the padded ``y``
reshaped, and every matmul of one phase (forward, backward) reading ``y`` padded alike reads
one pad step's buffer.  So GPT-2's ``dlogits``, read by the input gradient (``[b, s, V]``) and
by the weight gradient (``[b s, V]``, transposed), is padded once; the reshapes that only fed
those matmuls are dropped.  A pad is made once per phase: a buffer padded in the forward pass
is not kept for the backward one (the tied lm head weight is padded again there, as autograd
would read it again).  The padded buffers are the plan's own (liveness, reuse and peak memory
count them); on the GPU a pad along the last dim is one row pad kernel at copy speed.
"""

from __future__ import annotations

from collections.abc import Set

from .alloc import Meta
from .program import Step

#: cuBLAS's alignment for its tensor-core kernels, in bytes
ALIGN_BYTES = 16
#: element sizes of the dtypes whose matmuls are padded
_SIXTEEN_BIT = {"bfloat16": 2, "float16": 2}


def _multiple(n: int, k: int) -> int:
    return -(-n // k) * k


def padded_extents(a: tuple[int, ...], b: tuple[int, ...], ta: bool, tb: bool, per: int
                   ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]] | None:
    """For a matmul of buffers shaped ``a`` and ``b`` (contiguous, read transposed where ``ta``
    / ``tb``): the two buffers' last two extents zero-padded to ``per``-element alignment, and the
    result's (m, n) before and after its padding; None when nothing is misaligned, or for a
    matrix-vector product (an extent of 1: no tensor-core kernels) (module docstring)."""
    m, k = (a[-1], a[-2]) if ta else (a[-2], a[-1])
    n = b[-2] if tb else b[-1]
    mp = _multiple(m, per) if ta else m
    kp = _multiple(k, per) if not ta or tb else k
    np_ = _multiple(n, per)
    if (mp, kp, np_) == (m, k, n) or min(m, k, n) <= 1:
        return None
    return (kp, mp) if ta else (mp, kp), (np_, kp) if tb else (kp, np_), (m, n), (mp, np_)


class _Aligner:
    """The new steps and the pads made so far, per phase (module docstring)."""

    def __init__(self, steps: list[Step], meta: Meta, backward_outs: set[str]) -> None:
        self.made = {s.out: s for s in steps}
        self.meta, self.backward_outs = meta, backward_outs
        self.out: list[Step] = []
        self.pads: dict[tuple[str, tuple[int, ...], bool], str] = {}

    def emit(self, step: Step, backward: bool) -> None:
        self.out.append(step)
        if backward:
            self.backward_outs.add(step.out)

    def _source(self, x: str, last_only: bool) -> str:
        """The buffer ``x`` is a reshape of keeping its last dim (``x`` itself if none, or when
        the pad is not along the last dim only)."""
        while last_only:
            s = self.made.get(x)
            if s is None or s.kind != "local" or s.attr("op") != "apply" or s.attr("fop") != "reshape":
                break
            y = s.ins[0]
            if len(self.meta[y][0]) < 2 or self.meta[y][0][-1] != self.meta[x][0][-1]:
                break
            x = y
        return x

    def padded(self, x: str, rows: int, cols: int, backward: bool, on: dict) -> str:
        """Buffer ``x`` with its last two extents zero-padded to ``rows`` x ``cols`` (``on``: the
        mesh of a multi-mesh program the steps run on, as the matmul's)."""
        shape, dtype = self.meta[x]
        if (rows, cols) == shape[-2:]:
            return x
        y = self._source(x, rows == shape[-2])
        y_shape = self.meta[y][0]
        target = y_shape[:-2] + (rows, cols) if y == x else y_shape[:-1] + (cols,)
        key = (y, target, backward)
        if key not in self.pads:
            b, cur = y, y_shape
            for d in (len(cur) - 2, len(cur) - 1):
                if cur[d] != target[d]:
                    name = f"{y}.pad{d}{'b' if backward else ''}"
                    self.emit(Step.make("local", name, [b], op="apply", fop="pad", dim=d, lo=0, hi=target[d] - cur[d],
                                        **on), backward)
                    cur = cur[:d] + (target[d],) + cur[d + 1:]
                    self.meta[name] = (cur, dtype)
                    b = name
            self.pads[key] = b
        b = self.pads[key]
        if y == x:
            return b
        want = shape[:-1] + (cols,)
        name = f"{x}.padv{'b' if backward else ''}"
        if name not in self.meta:
            self.emit(Step.make("local", name, [b], op="apply", fop="reshape", shape=want, **on), backward)
            self.meta[name] = (want, dtype)
        return name

    def matmul(self, s: Step, backward: bool) -> bool:
        """Emit ``s`` reading aligned operands (and the slices of its result); False where it
        needs no padding (not emitted)."""
        (a, dt), (b, _) = self.meta[s.ins[0]], self.meta[s.ins[1]]
        if dt not in _SIXTEEN_BIT or len(a) < 2 or len(b) < 2:
            return False
        ta, tb = s.attr("transposed", (False, False))
        got = padded_extents(a, b, ta, tb, ALIGN_BYTES // _SIXTEEN_BIT[dt])
        if got is None:
            return False
        out_shape = self.meta[s.out][0]
        (ra, ca), (rb, cb), (m, n), padded_mn = got
        on = {} if s.attr("on") is None else {"on": s.attr("on")}
        ins = (self.padded(s.ins[0], ra, ca, backward, on), self.padded(s.ins[1], rb, cb, backward, on))
        res = out_shape[:-2] + padded_mn
        name = s.out if res == out_shape else f"{s.out}.padr"
        self.emit(s.with_attrs(out=name, ins=ins), backward)
        self.meta[name] = (res, dt)
        for d, keep in ((len(res) - 1, n), (len(res) - 2, m)):
            if res[d] != keep:
                res = res[:d] + (keep,) + res[d + 1:]
                cut = s.out if res == out_shape else f"{name}.{d}"
                self.emit(Step.make("local", cut, [name], op="apply", fop="slice", dim=d, start=0, stop=keep, **on),
                          backward)
                self.meta[cut] = (res, dt)
                name = cut
        return True


def align_matmuls(steps: list[Step], keep: Set[str], meta: Meta, backward_outs: set[str]) -> list[Step]:
    """The steps with every misaligned 16-bit matmul reading padded operands (module docstring);
    ``meta`` and ``backward_outs`` get the new buffers."""
    al = _Aligner(steps, meta, backward_outs)
    for s in steps:
        backward = s.out in backward_outs
        if not (s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == "matmul" and al.matmul(s, backward)):
            al.out.append(s)
    return _without_unread_reshapes(al.out, keep)


def _without_unread_reshapes(steps: list[Step], keep: Set[str]) -> list[Step]:
    """``steps`` less the reshape steps whose buffer nothing reads (the operands the matmuls
    read padded now), repeatedly."""
    while True:
        read = {b for s in steps for b in s.ins} | set(keep)
        dead = [s for s in steps if s.out not in read and s.kind == "local" and s.attr("op") == "apply"
                and s.attr("fop") == "reshape"]
        if not dead:
            return steps
        gone = {id(s) for s in dead}
        steps = [s for s in steps if id(s) not in gone]
