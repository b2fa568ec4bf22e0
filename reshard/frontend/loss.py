"""A module and a loss function as one module whose forward returns the loss, to export for
training (``reshard.plan_training``), in PyTorch's criterion convention:

    LossOf(module, loss_fn, n_inputs, n_targets)(*inputs, *targets)
        == loss_fn(module(*inputs), *targets)
    LossOf(module, n_inputs=0, keywords=("input_ids", "labels"))(ids, labels)
        == module(input_ids=ids, labels=labels, use_cache=False).loss     # Hugging Face

The wrapper holds ``module``'s parameters, buffers and submodules under their own names (the
same dictionaries: no prefix), so the exported program's state names are ``module``'s FQNs, and
its forward's arguments are named as ``module.forward``'s, then ``target`` (``target_0``,
``target_1``, ... for several), so the program's inputs are named as the user calls them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..ir.errors import ReshardError

__all__ = ["LossOf"]

_P = inspect.Parameter


class LossOf(torch.nn.Module):
    """The loss of ``module`` as a module whose forward returns it (module docstring): called
    with ``module``'s positional inputs, then its keyword inputs (``keywords``: their names, in
    order), then the targets.  The loss is ``loss_fn(prediction, *targets)``, the prediction
    being the module's output (a Hugging Face ``ModelOutput``'s ``logits``), or without
    ``loss_fn`` the module's own loss (its output tensor, a ``ModelOutput``'s or a mapping's
    ``loss``, a tuple's first item).  A module whose forward takes ``use_cache`` (Hugging Face)
    is called with ``use_cache=False``: a training step keeps no KV cache.  The loss must be a
    float tensor of one element; ``module``'s state is shared under its own names."""

    def __init__(self, module: torch.nn.Module, loss_fn: Callable[..., Any] | None = None, n_inputs: int = 1,
                 n_targets: int = 0, *, keywords: Sequence[str] = ()) -> None:
        super().__init__()
        for slot in ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules"):
            self.__dict__[slot] = module.__dict__[slot]  # shared: the wrapper adds no name
        self.__dict__["inner"], self.__dict__["loss_fn"] = module, loss_fn
        self.n_inputs, self.keywords = n_inputs, tuple(keywords)
        params = _parameters(module)
        self.fixed = {"use_cache": False} if "use_cache" in params and "use_cache" not in self.keywords else {}
        positional = [n for n, kind in params.items() if kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
        self.bound = positional[:n_inputs] if len(positional) >= n_inputs else []  # the positional inputs' names
        self.__dict__["forward"] = _named(self._loss, _arg_names(positional, n_inputs, self.keywords, n_targets))

    def train(self, mode: bool = True) -> LossOf:
        self.inner.train(mode)
        self.training = mode
        return self

    def _loss(self, *args: Any) -> torch.Tensor:
        n, k = self.n_inputs, len(self.keywords)
        out = self.inner(*args[:n], **dict(zip(self.keywords, args[n:n + k])), **self.fixed)
        if self.loss_fn is None:
            loss, what = _loss_of(out), "the module"
        else:
            loss, what = self.loss_fn(_logits_of(out), *args[n + k:]), f"loss_fn {_name(self.loss_fn)!r}"
        if not (isinstance(loss, torch.Tensor) and loss.is_floating_point() and loss.numel() == 1):
            got = (f"a {loss.dtype} tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
                   else "no loss" if loss is None else f"a {type(loss).__name__}")
            hint = ("a mean or sum over the batch: reduction='none' gives one loss per element" if self.loss_fn
                    else "a Hugging Face model computes it when called with labels=...; else pass a loss_fn")
            if self.loss_fn is None and self.bound:
                hint += (f"; the positional inputs went to the forward's parameters {self.bound}: pass inputs by "
                         "keyword (example_kwargs={'input_ids': ids, 'labels': labels}) to bind them by name")
            raise ReshardError(f"{what} returned {got}; it must return the loss, a float scalar ({hint})")
        return loss


def _loss_of(out: Any) -> Any:
    """A module's loss: the ``loss`` of a mapping (a Hugging Face ``ModelOutput`` is one; None
    where it has none), the first item of a tuple or list, else ``out`` itself."""
    if isinstance(out, Mapping):
        return out.get("loss")
    return out[0] if isinstance(out, (tuple, list)) and out else out


def _logits_of(out: Any) -> Any:
    """What a ``loss_fn`` reads of a module's output: the ``logits`` of a mapping that has them
    (a Hugging Face ``ModelOutput``), else the output as it is."""
    return out["logits"] if isinstance(out, Mapping) and "logits" in out else out


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


def _parameters(module: torch.nn.Module) -> dict[str, Any]:
    """``module.forward``'s parameters: name -> kind (none where it has no signature)."""
    try:
        return {n: p.kind for n, p in inspect.signature(module.forward).parameters.items()}
    except (TypeError, ValueError):
        return {}


def _arg_names(params: Sequence[str], n_inputs: int, keywords: Sequence[str], n_targets: int) -> list[str]:
    """The first ``n_inputs`` of ``params`` (``input_<i>`` where there are fewer), the keywords,
    then the targets' names; all distinct."""
    inputs = list(params[:n_inputs]) if len(params) >= n_inputs else [f"input_{i}" for i in range(n_inputs)]
    targets = ["target"] if n_targets == 1 else [f"target_{i}" for i in range(n_targets)]
    names = inputs + list(keywords) + targets
    return names if len(set(names)) == len(names) else [f"arg_{i}" for i in range(len(names))]


def _named(fn: Callable[..., Any], names: list[str]) -> Callable[..., Any]:
    """``fn(*args)`` with the signature ``(names...)`` (torch.export names the program's inputs
    after the signature of the forward it traces)."""
    def forward(*args: Any) -> Any:
        return fn(*args)

    p = inspect.Parameter
    forward.__signature__ = inspect.Signature([p(n, p.POSITIONAL_OR_KEYWORD) for n in names])  # type: ignore[attr-defined]
    return forward
