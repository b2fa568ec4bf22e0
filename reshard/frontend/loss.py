"""A module and a loss function as one module whose forward returns the loss, to export for
training (``reshard.plan_training(..., loss_fn=...)``), in PyTorch's criterion convention:

    LossOf(module, loss_fn, n_inputs, n_targets)(*inputs, *targets)
        == loss_fn(module(*inputs), *targets)

The wrapper holds ``module``'s parameters, buffers and submodules under their own names (the
same dictionaries: no prefix), so the exported program's state names are ``module``'s FQNs, and
its forward's arguments are named as ``module.forward``'s, then ``target`` (``target_0``,
``target_1``, ... for several), so the program's inputs are named as the user calls them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..ir.errors import ReshardError

__all__ = ["LossOf"]


class LossOf(torch.nn.Module):
    """``loss_fn(module(*inputs), *targets)``: ``module``'s state under its own names (module
    docstring); the loss must be a float tensor of one element."""

    def __init__(self, module: torch.nn.Module, loss_fn: Callable[..., Any], n_inputs: int, n_targets: int) -> None:
        super().__init__()
        for slot in ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules"):
            self.__dict__[slot] = module.__dict__[slot]  # shared: the wrapper adds no name
        self.__dict__["inner"], self.__dict__["loss_fn"] = module, loss_fn
        self.n_inputs = n_inputs
        self.__dict__["forward"] = _named(self._loss, _arg_names(module, n_inputs, n_targets))

    def train(self, mode: bool = True) -> LossOf:
        self.inner.train(mode)
        self.training = mode
        return self

    def _loss(self, *args: Any) -> torch.Tensor:
        loss = self.loss_fn(self.inner(*args[:self.n_inputs]), *args[self.n_inputs:])
        if not (isinstance(loss, torch.Tensor) and loss.is_floating_point() and loss.numel() == 1):
            got = (f"a {loss.dtype} tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
                   else f"a {type(loss).__name__}")
            raise ReshardError(f"loss_fn {getattr(self.loss_fn, '__name__', self.loss_fn)!r} returned {got}; it must "
                               "return the loss, a float scalar (a mean or sum over the batch: reduction='none' "
                               "gives one loss per element)")
        return loss


def _arg_names(module: torch.nn.Module, n_inputs: int, n_targets: int) -> list[str]:
    """``module.forward``'s first ``n_inputs`` positional parameter names (``input_<i>`` where
    it has fewer or takes ``*args``), then the targets' names; all distinct."""
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    inputs = params[:n_inputs] if len(params) >= n_inputs else [f"input_{i}" for i in range(n_inputs)]
    targets = ["target"] if n_targets == 1 else [f"target_{i}" for i in range(n_targets)]
    names = inputs + targets
    return names if len(set(names)) == len(names) else [f"arg_{i}" for i in range(len(names))]


def _named(fn: Callable[..., Any], names: list[str]) -> Callable[..., Any]:
    """``fn(*args)`` with the signature ``(names...)`` (torch.export names the program's inputs
    after the signature of the forward it traces)."""
    def forward(*args: Any) -> Any:
        return fn(*args)

    p = inspect.Parameter
    forward.__signature__ = inspect.Signature([p(n, p.POSITIONAL_OR_KEYWORD) for n in names])  # type: ignore[attr-defined]
    return forward
