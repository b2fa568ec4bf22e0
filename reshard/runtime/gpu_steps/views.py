"""GPU steps of the views (``ir.ops.views``): ``permute`` (and ``movedim``, a permute) as the
permute kernel, ``broadcast`` as one strided copy.  (``reshape`` is a view: no kernel.)"""

from __future__ import annotations

import torch

from ...codegen.program import Step
from ..kernel_kit import KernelKit
from .registry import GpuStep, gpu_step

Tensor = torch.Tensor


@gpu_step("permute", "movedim")
class Permute(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        return KernelKit.movable(xs[0])

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        return kit.permute(xs[0], tuple(p % xs[0].dim() for p in step.attr("perm")))


@gpu_step("broadcast")
class Broadcast(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        shape, dims, x = tuple(step.attr("shape")), tuple(step.attr("dims")), xs[0]
        return (KernelKit.movable(x) and len(dims) == x.dim()
                and all(x.shape[i] in (shape[d], 1) for i, d in enumerate(dims)) and all(s >= 0 for s in x.stride()))

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        """One strided copy: result dim ``dims[i]`` reads operand dim i with its stride (0 when
        expanded from extent 1); the new dims read with stride 0."""
        x, shape = xs[0], tuple(step.attr("shape"))
        strides = [0] * len(shape)
        for i, d in enumerate(step.attr("dims")):
            if x.shape[i] != 1:
                strides[d] = x.stride(i)
        return kit.copy(x, shape, tuple(strides))
