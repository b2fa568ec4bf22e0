"""A local matmul step on cuBLAS with 16-byte-aligned leading dimensions.

cuBLAS runs its tensor-core kernels only when every matrix's leading dimension (the stride of
its rows, or of its columns when it is read transposed) is a multiple of 16 bytes; otherwise it
falls back to element-aligned kernels several times slower.  GPT-2's vocabulary (50257) makes
the lm head's three GEMMs misaligned: on an H200 in bf16 they took 10.4 ms of an 18.2 ms
training step.  Inductor pads such matmuls too (``pad_mm``).

Law: ``aligned_matmul(step, xs)`` equals ``Matmul.local(step, xs)`` (``torch.matmul`` of the
step's ``ir.ops.matmul.operands``) up to the summation order cuBLAS picks: an
operand with a misaligned leading dimension is copied into a buffer whose rows (or columns) are
padded to a multiple of 16 bytes and read through a view of its own shape; a misaligned result
is computed into such a buffer (the rhs padded with zero columns, which add zero columns to the
product) and returned as a contiguous copy of its first ``n`` columns.  None when nothing is
misaligned or the dtype is not 2 bytes wide (the caller then runs the step as it is).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..codegen.program import Step
from ..ir.ops.matmul import operands

#: cuBLAS's alignment for its tensor-core kernels, in bytes
ALIGN_BYTES = 16


def _multiple(n: int, k: int) -> int:
    return -(-n // k) * k


def _leading(x: Tensor) -> int | None:
    """The leading dimension of the matrices of ``x`` as cuBLAS reads them: the row stride of a
    row-major matrix, the column stride of a column-major one (a transposed view); None for a
    layout cuBLAS copies anyway."""
    if x.dim() < 2 or x.shape[-1] == 1 or x.shape[-2] == 1:
        return None
    if x.stride(-1) == 1:
        return x.stride(-2)
    if x.stride(-2) == 1:
        return x.stride(-1)
    return None


def _misaligned(x: Tensor, per: int) -> bool:
    ld = _leading(x)
    return ld is not None and ld % per != 0


def _padded(x: Tensor, per: int) -> Tensor:
    """``x`` (same shape and values) in a fresh buffer whose leading dimension is a multiple of
    ``per`` elements, keeping ``x``'s row- or column-major order."""
    if x.stride(-1) != 1:  # column-major: pad its transpose's rows
        return _padded(x.transpose(-1, -2), per).transpose(-1, -2)
    n = x.shape[-1]
    buf = torch.empty(*x.shape[:-1], _multiple(n, per), dtype=x.dtype, device=x.device)
    view = buf[..., :n]
    view.copy_(x)
    return view


def aligned_matmul(step: Step, xs: list[Tensor]) -> Tensor | None:
    """The matmul step ``step`` on operands ``xs`` with aligned leading dimensions (module
    docstring); None when it needs no padding."""
    a, b = operands(step, xs)
    if a.dtype.itemsize != 2 or a.dim() < 2 or b.dim() < 2:
        return None
    per = ALIGN_BYTES // a.dtype.itemsize
    n = b.shape[-1]
    wide = n % per != 0 and a.shape[-2] > 1 and n > 1
    pad_a, pad_b = _misaligned(a, per), _misaligned(b, per)
    if not (wide or pad_a or pad_b):
        return None
    a = _padded(a, per) if pad_a else a
    if wide:  # the result's rows: zero columns appended to b, dropped from the product
        bp = torch.zeros(*b.shape[:-1], _multiple(n, per), dtype=b.dtype, device=b.device)
        bp[..., :n].copy_(b)
        return torch.matmul(a, bp)[..., :n].contiguous()
    return torch.matmul(a, _padded(b, per) if pad_b else b)
