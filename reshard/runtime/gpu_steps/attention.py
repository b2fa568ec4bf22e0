"""GPU step of ``attention_grad`` (``ir.ops.attention``): torch's fused SDPA backward gives dq,
dk and dv (the CPU step's ``grad_parts``), and the strided copy kernel writes each into its
slice of the stacked result, reading it at its own strides.  cuDNN's gradients keep q, k and v's
layouts (``[b, s, h, d]`` memory under the ``[b, h, s, d]`` views the op reads): ``torch.stack``
copied them element by element (``CatArrayBatchedCopy``, about 1 TB/s: 0.39 ms of a GPT-2 bf16
hidden-2048 step on an H200), the copy kernel moves 16-byte runs of the head dim.  A q-sequence
block's gradient (a split L, which depends on the rank) stays the CPU step's."""

from __future__ import annotations

import torch

from ...codegen.program import Step
from ...ir.ops.attention import grad_parts, stack_pieces
from ..cpu_steps.attention import sdpa, viewed
from ..kernel_kit import KernelKit
from .registry import GpuStep, gpu_step

Tensor = torch.Tensor


@gpu_step("attention_grad")
class AttentionGrad(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        q, k = viewed(step, xs)[:2]
        return KernelKit.movable(*xs) and q.shape[-2] == k.shape[-2]

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        """The CPU step's gradients (whole sequences), stacked by one strided copy per piece."""
        xs = viewed(step, xs)
        parts = grad_parts(lambda q, k, v, m: sdpa(step, q, k, v, m), *xs[:4], xs[4] if len(xs) > 4 else None)
        pieces = stack_pieces(*parts)
        out = kit.empty((len(pieces),) + tuple(pieces[0].shape), pieces[0].dtype, pieces[0])
        for i, p in enumerate(pieces):
            kit.copy(p, out=out[i])
        return out
