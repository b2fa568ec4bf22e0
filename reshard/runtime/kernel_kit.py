"""The kernel kit: what a GPU step (``runtime.gpu_steps``) runs its kernels through.

:class:`KernelKit` builds a kernel from a ``codegen.kernels`` builder (memoized, the vectorized
variant where every pointer is 16-byte aligned) and launches it on torch's current CUDA stream,
or, given a ``record`` list, only lists the kernels it would launch (a plan's kernels compiled
on a machine with no GPU).  Its methods are the kernels several op families share (strided
copy, pointwise, permute) and the dtype predicates of the kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..codegen import kernels as K
from ..codegen import nvrtc as N
from ..codegen.kernels import KernelSource
from ..codegen.program import Step
from ..ir.fusion import DTYPES

__all__ = ["FLOATS", "POINTWISE_VALUES", "KernelKit", "in_place_operand"]

Tensor = torch.Tensor
#: the dtypes arithmetic kernels compute on (``kernels.FLOAT_DTYPES``)
FLOATS = tuple(DTYPES[d] for d in K.FLOAT_DTYPES)
#: the dtypes pointwise kernels load and store (``kernels.POINTWISE_DTYPES``)
POINTWISE_VALUES = tuple(DTYPES[d] for d in K.POINTWISE_DTYPES)


class KernelKit:
    """Launches kernels on the GPU, or (``record`` given) only lists them.  The GPU steps
    (``runtime.gpu_steps``) run a step through it: the methods below are the shared kernels
    (strided copy, pointwise, permute) and the dtype predicates; ``rank`` is the rank the step
    runs for (a masked local scatter writes the rows its block holds)."""

    def __init__(self, record: list[KernelSource] | None = None, poison: bool = False, rank: int = 0) -> None:
        self.record, self.poison, self.rank = record, poison, rank
        self.launched: list[tuple[KernelSource, list, int]] = []

    @staticmethod
    def floats(*ts: Tensor) -> bool:
        """Every tensor has a dtype the arithmetic kernels take."""
        return all(t.dtype in FLOATS for t in ts)

    @staticmethod
    def pointwise_values(*ts: Tensor) -> bool:
        """Every tensor has a dtype the pointwise kernels load and store (floats, bool, int64, int32)."""
        return all(t.dtype in POINTWISE_VALUES for t in ts)

    @staticmethod
    def movable(*ts: Tensor) -> bool:
        """Every tensor has a dtype the data-movement kernels take."""
        return all(str(t.dtype)[len("torch."):] in K.ITEMSIZE for t in ts)

    @staticmethod
    def dt(t: Tensor) -> str:
        return K.normalize_dtype(t.dtype)

    def kernel(self, build: Callable[..., KernelSource], args: tuple, vec_ok: bool | None, *ts: Tensor,
               **options: object) -> KernelSource:
        """``build(*args, **options)``; for builders with a ``vectorize`` flag (``vec_ok`` not None),
        vectorized when allowed and every pointer in ``ts`` is 16-byte aligned.  Recording
        lists both variants where alignment decides."""
        vec = None if vec_ok is None else vec_ok and all(t.data_ptr() % 16 == 0 for t in ts)
        ks = _source(build, args, vec, options)
        if self.record is not None:
            self.record.append(ks)
            if vec_ok:
                self.record.append(_source(build, args, not vec, options))
        return ks

    def launch(self, ks: KernelSource, args: list, n: int) -> None:
        self.launched.append((ks, args, n))
        if self.record is None and n:
            N.launch(ks, args, ks.grid_for(n), ks.block, ks.shared_mem)

    def empty(self, shape: tuple[int, ...] | list[int], dtype: torch.dtype, like: Tensor) -> Tensor:
        out = torch.empty(tuple(shape), dtype=dtype, device=like.device)
        if self.poison and self.record is None:  # NaN, or all bits set for non-float dtypes
            if dtype.is_floating_point:
                out.fill_(float("nan"))
            else:
                out.reshape(-1).view(torch.uint8).fill_(0xFF)
        return out

    def copy(self, x: Tensor, shape: tuple[int, ...] | None = None, strides: tuple[int, ...] | None = None,
             offset: int = 0, out: Tensor | None = None) -> Tensor:
        """A contiguous copy of the view (shape, element strides, offset) of ``x``'s data (default: ``x``),
        written into ``out`` where given (contiguous, of that shape: a block of a larger buffer)."""
        shape = tuple(x.shape) if shape is None else shape
        strides = tuple(x.stride()) if strides is None else strides
        out = self.empty(shape, x.dtype, x) if out is None else out
        ks = self.kernel(K.strided_copy_kernel, (shape, strides, offset, self.dt(x)), True, out, x)
        self.launch(ks, [out, x], out.numel())
        return out

    def contig(self, x: Tensor) -> Tensor:
        return x if x.is_contiguous() else self.copy(x)

    def pointwise(self, ops: list[K.Instr], xs: list[Tensor], out_dtype: torch.dtype,
                  shape: tuple[int, ...] | None = None, bcast: tuple = (), out: Tensor | None = None,
                  extra: tuple = ()) -> Tensor | tuple[Tensor, ...]:
        """One pointwise kernel; ``shape``/``bcast``: inputs read through a broadcast
        (``kernels.pointwise_kernel``), the result of ``shape``; ``out``: the result's buffer
        (an operand's: element i is read before it is written, by the same thread), else a new one;
        ``extra``: (token, dtype) of extra outputs, each a new buffer, returned after the result."""
        xs = [self.contig(x) for x in xs]
        if out is None:
            out = self.empty(xs[0].shape if shape is None else shape, out_dtype, xs[0])
        outs = [out] + [self.empty(out.shape, DTYPES[d], xs[0]) for _, d in extra]
        in_dts, od, n = [self.dt(x) for x in xs], K.normalize_dtype(out_dtype), out.numel()
        vec_ok = K.pointwise_vector_ok([*in_dts, *(d for _, d in extra)], od, n, tuple(out.shape), bcast)
        args = (tuple(in_dts), od, tuple(ops)) + ((tuple(out.shape), bcast) if any(bcast) else ())
        ks = self.kernel(K.pointwise_kernel, args, vec_ok, *outs, *xs, **({"extra": tuple(extra)} if extra else {}))
        self.launch(ks, [*outs, *xs, np.int64(n)], n)
        return tuple(outs) if extra else out

    def permute(self, x: Tensor, perm: tuple[int, ...]) -> Tensor:
        """The permute kernel (tiled transpose or coalesced copy); a non-contiguous input: one strided copy."""
        if not x.is_contiguous():
            return self.copy(x, tuple(x.shape[p] for p in perm), tuple(x.stride(p) for p in perm))
        out = self.empty([x.shape[p] for p in perm], x.dtype, x)
        ks = self.kernel(K.permute_kernel, (tuple(x.shape), perm, self.dt(x)), True, out, x)
        self.launch(ks, [out, x], out.numel())
        return out


def _source(build: Callable[..., KernelSource], args: tuple, vec: bool | None, options: dict) -> KernelSource:
    """``build(*args, **options)``, with ``vectorize=vec`` unless ``vec`` is None, memoized."""
    return K.memoized(build, *args, **options) if vec is None else K.memoized(build, *args, **options, vectorize=vec)


def in_place_operand(step: Step, xs: list[Tensor]) -> Tensor | None:
    """The operand a fused chain's kernel writes its result into: the allocation plan's ``into``
    (``codegen.alloc``: that operand's memory dies with the step) when the kernel can do it in
    place: the operand contiguous, of the result's shape and dtype, not read through a broadcast,
    and no other operand its storage (a different view, or itself read through a broadcast or
    shifted) (each element is then read and written by one thread, at one index; meta tensors, which
    have no memory, are taken as distinct).  None: a new buffer (correct, only larger)."""
    i, fop = step.attr("into"), step.attr("fop")
    if i is None or fop != "pointwise" and not (fop == "unpick" and i == 2 and len(xs) == 3):
        return None  # (an unpick writes into its accumulator: ``gpu_steps.lookup``)
    x, bcast = xs[i], step.attr("bcast") or ()
    shape = tuple(step.attr("shape") or xs[0].shape) if fop == "pointwise" else tuple(step.attr("dst").local_shape)
    dtype = DTYPES[step.attr("dtype")] if fop == "pointwise" else xs[0].dtype
    if (bcast and bcast[i]) or not x.is_contiguous() or tuple(x.shape) != shape or x.dtype != dtype:
        return None
    ptr = x.untyped_storage().data_ptr()
    if not x.is_meta and any((y is not x or bcast and bcast[k]) and y.untyped_storage().data_ptr() == ptr
                             for k, y in enumerate(xs)):
        return None
    return x
