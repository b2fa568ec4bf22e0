"""reshard: communication-aware resharding of distributed tensor programs by equality
saturation (egglog), with NVRTC kernels and NCCL/gloo collectives."""

from . import ir
from .egraph_rules.cost import CostProfile
from .egraph_rules.saturate import Limits
from .ir import DeviceMesh, Partial, ReshardError, Replicate, Shard, TensorSharding
from .ir.fusion import Fusion
from .ir.interpreter import run_reference
from .plan import Plan, optimize
from .runtime.distributed import init_from_env, launch
from .frontend.torch_export import TorchProgram, from_torch

__all__ = ["ir", "optimize", "Plan", "Fusion", "DeviceMesh", "Shard", "Replicate", "Partial", "TensorSharding",
           "ReshardError", "CostProfile", "Limits", "run_reference", "launch", "init_from_env",
           "from_torch", "TorchProgram"]
