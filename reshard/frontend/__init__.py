"""Frontends: build reshard Fusions from other program representations."""

from .torch_export import TorchProgram, from_torch, to_reshard_placements

__all__ = ["TorchProgram", "from_torch", "to_reshard_placements"]
