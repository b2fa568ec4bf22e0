"""GPU step of ``grad_seed`` (``ir.ops.gradient``): a fill kernel writing 1.  (``detach`` and
``saved`` are the identity: views, no kernel.)"""

from __future__ import annotations

import torch

from ...codegen import kernels as K
from ...codegen.program import Step
from ..kernel_kit import KernelKit
from .registry import GpuStep, gpu_step

Tensor = torch.Tensor


@gpu_step("grad_seed")
class GradSeed(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        return KernelKit.movable(xs[0])

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        """``kernels.fill_kernel`` writing 1 into a fresh tensor like the loss."""
        out = kit.empty(xs[0].shape, xs[0].dtype, xs[0])
        kit.launch(kit.kernel(K.fill_kernel, (out.numel(), kit.dt(out), 1.0), None), [out], out.numel())
        return out
