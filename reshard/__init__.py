"""reshard: communication-aware resharding of distributed tensor programs by equality
saturation (egglog), with NVRTC kernels and NCCL/gloo collectives.

The public names below are imported on first use (module ``__getattr__``), so that
``import reshard`` and the ``reshard`` command's ``--help`` do not pay for torch and egglog.

Rooms, each importing only those before it (``tests/test_imports.py``, docs/design.md): ``ir``
-> ``passes`` -> ``rules`` -> ``search`` -> ``extract`` -> ``codegen`` -> ``runtime`` and the
explanations -> ``plan`` -> ``train`` / ``cli``; ``frontend`` beside ``rules``.  This module
may import every one of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from . import ir
    from .rules.cost_profile import CostProfile
    from .search.saturate import Limits
    from .frontend.torch_export import TorchProgram, from_torch
    from .ir import DeviceMesh, FusedShard, Partial, ReshardError, Replicate, Shard, TensorSharding
    from .ir.fusion import Fusion
    from .ir.interpreter import run_reference
    from .ir.symbolic import SymbolicMesh
    from .plan import Plan, optimize
    from .plan_symbolic import SymbolicPlan, optimize_symbolic
    from .runtime.distributed import init_from_env, launch
    from .train import ParallelModule, TrainingPlan, parallelize, plan_training

#: public name -> the module that defines it
_WHERE = {
    "optimize": ".plan", "Plan": ".plan", "Fusion": ".ir.fusion", "DeviceMesh": ".ir", "Shard": ".ir",
    "FusedShard": ".ir", "Replicate": ".ir", "Partial": ".ir", "TensorSharding": ".ir", "ReshardError": ".ir",
    "CostProfile": ".rules.cost_profile", "Limits": ".search.saturate", "run_reference": ".ir.interpreter",
    "launch": ".runtime.distributed", "init_from_env": ".runtime.distributed",
    "from_torch": ".frontend.torch_export", "TorchProgram": ".frontend.torch_export",
    "optimize_symbolic": ".plan_symbolic", "SymbolicPlan": ".plan_symbolic", "SymbolicMesh": ".ir.symbolic",
    "parallelize": ".train", "plan_training": ".train", "TrainingPlan": ".train", "ParallelModule": ".train",
}

__all__ = ["ir", "optimize", "Plan", "Fusion", "DeviceMesh", "Shard", "FusedShard", "Replicate", "Partial",
           "TensorSharding", "ReshardError", "CostProfile", "Limits", "run_reference", "launch", "init_from_env",
           "from_torch", "TorchProgram", "optimize_symbolic", "SymbolicPlan", "SymbolicMesh", "parallelize",
           "plan_training", "TrainingPlan", "ParallelModule"]


def __getattr__(name: str) -> Any:
    """Import a public name on first use and cache it in the package namespace."""
    if name == "ir":
        return importlib.import_module(".ir", __name__)
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
