"""CPU step of ``matmul`` (``ir.ops.matmul``): ``torch.matmul`` (cuBLAS on CUDA tensors) of
the operands as the step reads them (``operands``: one marked ``transposed`` read as a
transposed view, no copy)."""

from __future__ import annotations

import torch

from ...ir.ops.matmul import operands
from ...ir.ops.registry import StepLike
from .registry import CpuStep, cpu_step

Tensor = torch.Tensor


@cpu_step("matmul")
class Matmul(CpuStep):
    def run(self, step: StepLike, xs: list[Tensor]) -> Tensor:
        """``torch.matmul`` of ``operands``."""
        return torch.matmul(*operands(step, xs))
