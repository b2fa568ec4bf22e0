"""GPU steps of slice, pad and cat (``ir.ops.slicing``): a slice as one strided copy reading
the input's own strides, pad and cat as their kernels (``kernels.pad_kernel``,
``kernels.cat_kernel``)."""

from __future__ import annotations

import torch

from ...codegen import kernels as K
from ...codegen.program import Step
from ..kernel_kit import KernelKit
from .registry import GpuStep, gpu_step

Tensor = torch.Tensor


class _AlongDim(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        return KernelKit.movable(xs[0]) and xs[0].dim() >= 1


@gpu_step("slice")
class Slice(_AlongDim):
    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        """One strided copy reading the input's own strides from the slice's first element; of
        a contiguous input's last dim, the row pad kernel cropping each row (its rows' extents
        need not be multiples of the vector width: a [4096, 50264] bf16 matmul result cut to
        GPT-2's vocabulary, ``codegen.aligned_matmuls``)."""
        x = xs[0]
        d, a, b = step.attr("dim") % x.dim(), step.attr("start"), step.attr("stop")
        shape = list(x.shape)
        shape[d] = b - a
        if d == x.dim() - 1 and x.is_contiguous():
            return _padded(kit, x, d, -a, b - x.shape[d])
        return kit.copy(x, tuple(shape), tuple(x.stride()), a * x.stride(d))


@gpu_step("pad")
class Pad(_AlongDim):
    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        x = kit.contig(xs[0])
        return _padded(kit, x, step.attr("dim") % x.dim(), step.attr("lo"), step.attr("hi"))


def _padded(kit: KernelKit, x: Tensor, d: int, lo: int, hi: int) -> Tensor:
    """Contiguous ``x`` padded with zeros (cropped where negative) by ``lo`` / ``hi`` along dim
    ``d``: the pad kernel, or, padding a dim that only extent-1 dims precede (the operand is
    one block of the result: a matmul operand's rows, ``codegen.aligned_matmuls``), the strided
    copy kernel writing that block and zero fills either side (a copy at copy speed where the
    pad kernel decomposes each element's coordinates)."""
    pads = [(0, 0)] * x.dim()
    pads[d] = (lo, hi)
    out = kit.empty([s + a + b for s, (a, b) in zip(x.shape, pads)], x.dtype, x)
    if lo >= 0 and hi >= 0 and all(s == 1 for s in x.shape[:d]):
        kit.copy(x, out=out.narrow(d, lo, x.shape[d]))
        out.narrow(d, 0, lo).zero_()
        out.narrow(d, lo + x.shape[d], hi).zero_()
        return out
    ks = kit.kernel(K.pad_kernel, (tuple(x.shape), tuple(pads), kit.dt(x), 0.0), None)
    kit.launch(ks, [out, x], out.numel())
    return out


@gpu_step("cat")
class Cat(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        return (KernelKit.movable(*xs) and len({x.dtype for x in xs}) == 1
                and xs[0].dim() >= 1 and len({x.dim() for x in xs}) == 1)

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        xs = [kit.contig(x) for x in xs]
        dim = step.attr("dim") % xs[0].dim()
        shape = list(xs[0].shape)
        shape[dim] = sum(x.shape[dim] for x in xs)
        out = kit.empty(shape, xs[0].dtype, xs[0])
        ks = kit.kernel(K.cat_kernel, (tuple(tuple(x.shape) for x in xs), dim, kit.dt(xs[0])), None)
        kit.launch(ks, [out, *xs], out.numel())
        return out
