"""CPU steps of the elementwise ops that read a step attribute (``ir.ops.select``'s
``masked``, ``ir.ops.complex_pairs``' ``complex_mul``): the op's function on it."""

from __future__ import annotations

import torch

from ...ir.ops.complex_pairs import product
from ...ir.ops.registry import StepLike
from ...ir.ops.select import masked_values
from .registry import CpuStep, cpu_step

Tensor = torch.Tensor


@cpu_step("masked")
class Masked(CpuStep):
    def run(self, step: StepLike, xs: list[Tensor]) -> Tensor:
        return masked_values(xs[0], xs[1], step.attr("keep"))


@cpu_step("complex_mul")
class ComplexMul(CpuStep):
    def run(self, step: StepLike, xs: list[Tensor]) -> Tensor:
        return product(xs[0], xs[1], step.attr("conj"))
