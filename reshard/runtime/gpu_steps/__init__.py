"""GPU steps: each op kind's ``apply`` step through reshard's generated NVRTC kernels, one
module per op family (the families of ``reshard.ir.ops``), registered by op kind in
``registry.GPU_STEPS``; ``runtime.gpu_local`` looks them up.

Imports ``ir`` (what an op means), ``codegen`` (the kernel builders) and the runtime's kernel
kit (``runtime.kernel_kit``).
"""

from . import attention, elementwise, gradient, lookup, reductions, slicing, views  # noqa: F401  (registers)
from .registry import GPU_STEPS, GpuStep, gpu_step

__all__ = ["GPU_STEPS", "GpuStep", "gpu_step"]
