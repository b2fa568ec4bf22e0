"""The GPU steps' registry: an op kind's step through reshard's generated kernels, by op kind.

The op registry (``reshard.ir.ops``) says what an op means; its implementation on a GPU lives
here, in the runtime, as a lowering is registered per platform: a :class:`GpuStep` subclass
registered with ``@gpu_step("kind", ...)`` in the module of its op family.  An op kind with
none runs its step with torch (``runtime.local_ops``) on a GPU as on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...codegen.program import Step
from ...ir.ops.registry import enter_by_kind
from ..kernel_kit import KernelKit

Tensor = torch.Tensor


class GpuStep:
    """An ``apply`` step of an op kind on CUDA tensors through generated kernels."""

    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        """Do the kernels take this step on these inputs (dtypes, shapes)?  Where not, the step
        runs with torch (``runtime.local_ops``)."""
        raise NotImplementedError

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor | tuple[Tensor, ...]:
        """The step through ``kit``'s kernels (``supported`` said yes)."""
        raise NotImplementedError


#: op kind -> its GPU step
GPU_STEPS: dict[str, GpuStep] = {}


def gpu_step(*kinds: str) -> Callable[[type[GpuStep]], type[GpuStep]]:
    """Class decorator: an instance of the class is the GPU step of each op kind in ``kinds``."""
    def deco(cls: type[GpuStep]) -> type[GpuStep]:
        enter_by_kind(GPU_STEPS, kinds, cls(), "GPU step")
        return cls
    return deco
