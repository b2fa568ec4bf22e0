"""``from_torch(..., train=True)``: the training program of a module whose forward returns
its loss.

The module is exported in training mode (``training_mode``); the converter (``Converter.train``)
detaches what has no gradient (the max that softmax subtracts, ``aten.detach``) and rejects
dropout with p > 0 (a plan has no random ops).  ``gradient_program`` then differentiates the
loss (the module's first output) with respect to every trained parameter
(``passes.autodiff.joint``): the Fusion's outputs are the loss, then ``"grad.<FQN>"`` for each
parameter, at that parameter's placements.  A tied parameter (GPT-2's ``lm_head.weight`` is
``transformer.wte.weight``) is one Fusion input, so it gets one gradient, the sum over its uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ..ir.dtypes import dtype_kind
from ..ir.errors import ReshardError
from ..ir.fusion import Fusion
from .converter import where

__all__ = ["gradient_program", "trainable_names", "training_mode"]


@contextmanager
def training_mode(module: torch.nn.Module, train: bool) -> Iterator[None]:
    """With ``train``: ``module.train()`` inside the block, each submodule's own mode restored
    after it; without: nothing changes."""
    if not train:
        yield
        return
    modes = [(m, m.training) for m in module.modules()]
    module.train()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def trainable_names(module: torch.nn.Module) -> set[str]:
    """Every name (tied aliases included) of the module's parameters that require grad."""
    return {n for n, p in module.named_parameters(remove_duplicate=False) if p.requires_grad}


def gradient_program(forward: Fusion, params: Sequence[str], origin: Mapping[int, Any]) -> tuple[Fusion, dict[str, str]]:
    """The joint Fusion of ``forward`` (whose one output is the loss) and the gradients of the
    inputs ``params``, and ``{param: gradient output name}`` in output order.  ``origin``: Fusion
    tensor id -> the graph node it was converted from, to name the source line of an op that
    has no backward."""
    from ..passes.autodiff import joint

    (loss_id, _), = forward.outputs
    loss = forward.tensors[loss_id]
    if dtype_kind(loss.dtype) != "float" or loss.numel != 1:
        raise ReshardError(f"from_torch(train=True): the module's first output must be its loss, a float scalar; "
                           f"got {loss!r} (call a Hugging Face model with labels=..., or return the loss first)")
    inputs = {forward.tensors[i].name: forward.tensors[i] for i in forward.inputs}
    open_ = [n for n in params if inputs[n].sharding is None]
    if open_:
        raise ReshardError(f"from_torch(train=True): parameters {open_} have no placement (None); a parameter and "
                           "its gradient need one (param_placements)")
    try:
        j = joint(forward, loss, list(params))
    except ReshardError as e:
        node = _node_named_in(str(e), forward, origin)
        if node is None:
            raise
        raise ReshardError(f"{e} ({where(node)})") from e
    return j.fusion, dict(j.grads)


def _node_named_in(message: str, f: Fusion, origin: Mapping[int, Any]) -> Any:
    """The graph node of the Fusion tensor that ``message`` names as ``joint`` does (its repr,
    ``%name[shape]``); None when it names none."""
    named = [t for t in f.tensors if t.id in origin and f"%{t.name}[" in message]
    return origin[named[0].id] if named else None
