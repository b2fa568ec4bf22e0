"""The CPU steps' registry: an op kind's ``apply`` step on local torch tensors, by op kind.

The op registry (``reshard.ir.ops``) says what an op means; its step with torch ops (on the
CPU, or on CUDA tensors where it has no GPU step, ``runtime.gpu_steps``) lives here, in the
runtime: a :class:`CpuStep` subclass registered with ``@cpu_step("kind", ...)`` in the module
of its op family.  An op kind with none runs its reference on the step's attributes
(``run_cpu_step``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...ir.ops import op_kind
from ...ir.ops.registry import StepLike, enter_by_kind

Tensor = torch.Tensor


class CpuStep:
    """An ``apply`` step of an op kind on local torch tensors."""

    def run(self, step: StepLike, xs: list[Tensor]) -> Tensor:
        """The step on operands ``xs``, the same on every rank."""
        raise NotImplementedError

    def run_on(self, step: StepLike, xs: list[Tensor], rank: int) -> Tensor:
        """The step on ``rank`` (default: ``run``; a step that reads the sharding it carries
        uses the rank to find the elements it holds)."""
        return self.run(step, xs)


#: op kind -> its CPU step
CPU_STEPS: dict[str, CpuStep] = {}


def cpu_step(*kinds: str) -> Callable[[type[CpuStep]], type[CpuStep]]:
    """Class decorator: an instance of the class is the CPU step of each op kind in ``kinds``."""
    def deco(cls: type[CpuStep]) -> type[CpuStep]:
        enter_by_kind(CPU_STEPS, kinds, cls(), "CPU step")
        return cls
    return deco


def run_cpu_step(step: StepLike, xs: list[Tensor], rank: int) -> Tensor:
    """The ``apply`` step of op kind ``fop`` on ``rank``'s local tensors ``xs``: its registered
    CPU step, else its reference on the step's attributes."""
    kind = step.attr("fop")
    impl = CPU_STEPS.get(kind)
    if impl is None:
        return op_kind(kind).reference(dict(step.attrs), xs, step.attr("dtype"))
    return impl.run_on(step, xs, rank)
