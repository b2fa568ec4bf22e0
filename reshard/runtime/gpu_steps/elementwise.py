"""GPU steps of the elementwise ops (``ir.ops.elementwise``, and ``masked`` of ``ir.ops.select``):
one pointwise kernel computing the op's instruction (``codegen.pointwise_ops``), a cast as the
kernel's store, ``set`` as one strided copy."""

from __future__ import annotations

import torch

from ...codegen import kernels as K
from ...codegen.pointwise_ops import instruction
from ...codegen.program import Step
from ...ir.fusion import DTYPES
from ...ir.ops import op_kind
from ..kernel_kit import POINTWISE_VALUES, KernelKit
from .registry import GpuStep, gpu_step

Tensor = torch.Tensor


def _instr(step: Step, xs: list[Tensor]) -> tuple:
    """The step's pointwise-kernel instruction over its inputs' tokens."""
    return instruction(step, [f"in{i}" for i in range(len(xs))])


def _out_dtype(step: Step, xs: list[Tensor]) -> torch.dtype:
    return op_kind(step.attr("fop")).out_dtype(step, xs)


@gpu_step("unary", "masked")
class Pointwise(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        """Operands and result of ``POINTWISE_VALUES`` (the kernels compute in float32, a bool
        as 0 or 1, an int64 / int32 in 64-bit ints; float64 steps run with torch)."""
        return (_instr(step, xs)[0] in K.POINTWISE_OPS and KernelKit.pointwise_values(*xs)
                and _out_dtype(step, xs) in POINTWISE_VALUES)

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        return kit.pointwise([_instr(step, xs)], xs, _out_dtype(step, xs))


@gpu_step("binary")
class Binary(Pointwise):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        return super().supported(step, xs) and xs[0].shape == xs[1].shape


@gpu_step("scale")
class Scale(Pointwise):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        factor = step.attr("factor")
        return KernelKit.floats(xs[0]) and isinstance(factor, (int, float)) and not isinstance(factor, bool)


@gpu_step("cast")
class Cast(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        return KernelKit.pointwise_values(xs[0]) and DTYPES.get(step.attr("dtype")) in POINTWISE_VALUES

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        return kit.pointwise([], xs, _out_dtype(step, xs))  # the conversion is the kernel's store


@gpu_step("set")
class Set(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        return KernelKit.movable(xs[0])

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        return kit.copy(xs[0])
