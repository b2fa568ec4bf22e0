"""CPU step of ``reduce`` (``ir.ops.reductions``): the reference on the step's function and
dims; a mean as the local sum over the global count (its reduced dims may be sharded)."""

from __future__ import annotations

import torch

from ...ir.ops import op_kind
from ...ir.ops.registry import StepLike
from .registry import CpuStep, cpu_step

Tensor = torch.Tensor


@cpu_step("reduce")
class Reduce(CpuStep):
    def run(self, step: StepLike, xs: list[Tensor]) -> Tensor:
        fn, dims = step.attr("fn"), step.attr("dims")
        if fn == "mean":  # the local sum over the global count (the reduced dims may be sharded)
            return xs[0].sum(dims) / step.attr("count")
        return op_kind("reduce").reference({"fn": fn, "dims": dims}, xs, "")

