"""A local matmul step on cuBLAS with 16-byte-aligned matrices.

cuBLAS runs its tensor-core kernels only when, for every matrix, the extent it reads contiguously
(a row-major matrix's columns, a column-major one's rows) and its leading dimension (the stride
between those runs) are multiples of 16 bytes; otherwise it falls back to element-aligned
kernels several times slower.  GPT-2's vocabulary (50257) makes the lm head's three GEMMs
misaligned: on an H200 in bf16 the input gradient ``dlogits @ W`` (the vocabulary contracted,
contiguous in ``dlogits``) took 3.3 ms where an aligned one takes 0.6.  Inductor pads such
matmuls too (``pad_mm``).

Law: ``aligned_matmul(step, xs)`` equals matmul's CPU step (``runtime.cpu_steps.matmul``:
``torch.matmul`` of the step's ``ir.ops.matmul.operands``) up to the summation order cuBLAS
picks.  Each of M, K and N
that some matrix reads contiguously (the lhs's K, or its M when it is read transposed; the
rhs's N, or its K when read transposed; the result's N) and is no multiple of 16 bytes is
padded with zeros: zero rows or columns of K add nothing to the product, zero rows of M or
columns of N give rows or columns of the result that are dropped.  A padded operand is copied
into a fresh buffer of the padded extents, keeping its row- or column-major order; an operand
whose extents are aligned but whose leading dimension is not is copied compactly.  The result
is contiguous.  On the GPU, a padded or cut last dim is moved by reshard's row pad kernel
(``_last_dim_to``).  None when nothing is misaligned or the dtype is not 2 bytes wide (the caller
then runs the step as it is).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..codegen.nvrtc import run_pad
from ..codegen.program import Step
from ..ir.ops.matmul import operands

#: cuBLAS's alignment for its tensor-core kernels, in bytes
ALIGN_BYTES = 16


def _multiple(n: int, k: int) -> int:
    return -(-n // k) * k


def _column_major(x: Tensor) -> bool:
    """Does cuBLAS read ``x``'s matrices column by column (a transposed view)?"""
    return x.stride(-1) != 1 and x.stride(-2) == 1


def _leading(x: Tensor) -> int:
    """The stride between the contiguous runs of ``x``'s matrices (``_column_major``)."""
    return x.stride(-1) if _column_major(x) else x.stride(-2)


def _padded(x: Tensor, rows: int, cols: int) -> Tensor:
    """``x``'s matrices in a fresh buffer of ``rows`` x ``cols`` (at least ``x``'s), zeros
    beyond ``x``, in ``x``'s row- or column-major order."""
    if _column_major(x):
        return _padded(x.transpose(-1, -2), cols, rows).transpose(-1, -2)
    r, c = x.shape[-2], x.shape[-1]
    if cols != c and x.is_cuda and x.is_contiguous():
        x = _last_dim_to(x, cols)  # (the rows, if any, below: a contiguous block)
        if rows == r:
            return x
        c = cols
    buf = torch.empty(*x.shape[:-2], rows, cols, dtype=x.dtype, device=x.device)
    buf[..., :r, :c].copy_(x)
    buf[..., :r, c:].zero_()
    buf[..., r:, :].zero_()
    return buf


def _last_dim_to(x: Tensor, n: int) -> Tensor:
    """Contiguous ``x`` with its last dim padded with zeros or cut to ``n``: reshard's row pad
    kernel (``kernels.pad_kernel``), at copy speed, where torch's copy into (or out of) a
    strided view of a [4096, 50257] bfloat16 matrix took 2.4x a plain copy's time."""
    return run_pad(x, [(0, 0)] * (x.dim() - 1) + [(0, n - x.shape[-1])])


def aligned_matmul(step: Step, xs: list[Tensor]) -> Tensor | None:
    """The matmul step ``step`` on operands ``xs`` with aligned matrices (module docstring);
    None when it needs no padding."""
    a, b = operands(step, xs)
    if a.dtype.itemsize != 2 or a.dim() < 2 or b.dim() < 2:
        return None
    per = ALIGN_BYTES // a.dtype.itemsize
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if min(m, k, n) <= 1:  # (matrix-vector products: no tensor-core kernels)
        return None
    col_a, col_b = _column_major(a), _column_major(b)
    mp = _multiple(m, per) if col_a else m
    kp = _multiple(k, per) if not col_a or col_b else k
    np_ = _multiple(n, per)
    fix_a = (mp, kp) != (m, k) or _leading(a) % per != 0
    fix_b = (kp, np_) != (k, n) or _leading(b) % per != 0
    if not (fix_a or fix_b):  # (a padded N pads the rhs)
        return None
    out = torch.matmul(_padded(a, mp, kp) if fix_a else a, _padded(b, kp, np_) if fix_b else b)
    if n != np_ and out.is_cuda:
        out = _last_dim_to(out, n)
    out = out[..., :m, :n]
    return out if out.is_contiguous() else out.contiguous()
