"""CPU steps: each op kind's ``apply`` step on local torch tensors (on the CPU, or on CUDA
tensors where the op kind has no GPU step), one module per op family of ``reshard.ir.ops``
(the small ones joined), registered by op kind in ``registry.CPU_STEPS``;
``runtime.local_ops`` runs them through ``run_cpu_step`` (an op kind with none: its reference
on the step's attributes).

==================  ==============================================================
module              op kinds
==================  ==============================================================
``reductions``      reduce (a mean over the global count)
``matmul``          matmul
``lookup``          embedding, pick (masked local lookup); embedding_grad, unpick
                    (masked local scatter): per rank (``run_on``)
``attention``       attention; attention_grad (a q-sequence block's per rank)
``linear_loss``     linear_max, linear_sumexp, linear_sumexp_grad (chunked)
==================  ==============================================================

Imports ``ir`` (what an op means) only.
"""

from . import attention, linear_loss, lookup, matmul, reductions  # noqa: F401  (registers)
from .registry import CPU_STEPS, CpuStep, cpu_step, run_cpu_step

__all__ = ["CPU_STEPS", "CpuStep", "cpu_step", "run_cpu_step"]
