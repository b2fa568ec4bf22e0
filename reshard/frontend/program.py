"""What ``from_torch`` returns (``TorchProgram``) and how it reads placement specs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ir.errors import ReshardError
from ..ir.fusion import Fusion
from ..ir.interpreter import run_reference
from ..ir.mesh import DeviceMesh
from ..ir.sharding import TensorSharding, is_placement
from .pairs import as_pairs

__all__ = ["TorchProgram", "to_reshard_placements"]


def to_reshard_placements(spec: Any, shape: Sequence[int], mesh: DeviceMesh, where: str = "tensor"
                          ) -> TensorSharding | None:
    """A placement spec -> ``TensorSharding`` on ``mesh`` (None stays None: open).

    ``spec``: a ``TensorSharding``; a sequence of placements, one per mesh axis, each a
    reshard placement or a ``torch.distributed.tensor`` one; or, on a 1-D mesh, a single
    placement (``TensorSharding.of``, which converts placements by ``as_placement``)."""
    return None if spec is None else TensorSharding.of(spec, tuple(shape), mesh, where)


def per_item(specs: Any, names: Sequence[str], what: str, noun: str) -> dict[str, Any]:
    """``specs`` (None, a sequence with one spec per name, a single spec when there is one
    name, or a mapping) -> {name: spec}."""
    if specs is None:
        return {}
    if isinstance(specs, Mapping):
        return dict(specs)
    if isinstance(specs, TensorSharding) or is_placement(specs):
        specs = [specs]
    if not isinstance(specs, Sequence) or isinstance(specs, (str, bytes)):
        raise ReshardError(f"from_torch: {what} must be a sequence (one spec per {noun}), "
                           f"a mapping name -> spec, or None; got {specs!r}")
    specs = list(specs)
    if len(names) == 1 and specs and all(is_placement(p) for p in specs) and len(specs) != 1:
        specs = [specs]  # the single item's own placement list
    if len(specs) != len(names):
        raise ReshardError(f"from_torch: {what} has {len(specs)} entries for {len(names)} "
                           f"{noun}s {list(names)}")
    return dict(zip(names, specs))



def planned_shape(x: torch.Tensor) -> torch.Tensor:
    """A tensor as the Fusion input that stands for it: a complex one as its pairs (``pairs``); any
    other as it is."""
    return as_pairs(x)

@dataclass
class TorchProgram:
    """A traced torch program as a reshard ``Fusion``.

    ``input_names``: the Fusion's inputs: user inputs in call order, then parameters and
    persistent buffers (FQNs), then constants (lifted and folded ones, ``folding``).
    ``inputs(*args)`` builds the dict that ``Plan.simulate`` / ``reshard.run_reference``
    take, from the call's arguments and the module's state (captured at export, or
    ``state=`` a module / state dict; constants, those folded from non-persistent buffers
    included, are the traced module's).  A 0-dim argument, parameter or result (a loss) is a
    0-dim Fusion value (shape ``()``); a complex argument (a ``freqs_cis`` buffer) is given
    complex and fed as its pairs (``pairs``).  A
    program traced on the meta device plans (``reshard.optimize(tp.fusion)``) but has no
    values: ``inputs`` raises.

    >>> tp = reshard.from_torch(block, (x,), [Shard(0)], [Shard(0)], mesh)
    >>> plan = reshard.optimize(tp.fusion)
    >>> (y,) = plan.simulate(tp.inputs(x))
    """

    fusion: Fusion
    user_inputs: tuple[str, ...]
    state_inputs: tuple[str, ...]
    constant_inputs: tuple[str, ...]
    values: dict[str, torch.Tensor] = field(repr=False)
    exported: Any = field(default=None, repr=False)
    #: ``from_torch(train=True)``: trained parameter FQN -> its gradient output's name, in
    #: output order (the Fusion's outputs: the loss, then these gradients); else empty
    grads: dict[str, str] = field(default_factory=dict)

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.user_inputs + self.state_inputs + self.constant_inputs

    def inputs(self, *args: torch.Tensor, state: Mapping[str, torch.Tensor] | torch.nn.Module | None = None
               ) -> dict[str, torch.Tensor]:
        """Global input tensors by Fusion input name for a call with ``args``."""
        if len(args) != len(self.user_inputs):
            raise ReshardError(f"TorchProgram.inputs: {len(args)} arguments given, the program takes "
                               f"{len(self.user_inputs)} ({list(self.user_inputs)})")
        if isinstance(state, torch.nn.Module):
            state = {**dict(state.named_parameters()), **dict(state.named_buffers())}
        state = state or {}
        shapes = {self.fusion.tensors[i].name: self.fusion.tensors[i].shape for i in self.fusion.inputs}
        out: dict[str, torch.Tensor] = {}
        for name, a in zip(self.user_inputs, args):
            if not isinstance(a, torch.Tensor):
                raise ReshardError(f"TorchProgram.inputs: argument {name!r} is a {type(a).__name__}, not a tensor")
            out[name] = a.detach()
        for name in self.state_inputs:
            out[name] = (state[name] if name in state else self.values[name]).detach()
        for name in self.constant_inputs:
            out[name] = self.values[name]
        out = {k: as_pairs(v) for k, v in out.items()}  # a complex value: its pairs
        for name, v in out.items():
            want = shapes.get(name)
            if name in shapes and v.is_meta:
                raise ReshardError(f"TorchProgram.inputs: {name!r} is a meta tensor: the program was traced on the "
                                   "meta device (shapes only), so it plans but has no values to run; trace the "
                                   "module with real weights to run it")
            if name in shapes and tuple(v.shape) != want:
                raise ReshardError(f"TorchProgram.inputs: {name!r} has shape {tuple(v.shape)}, the program was "
                                   f"traced with {want}")
        return {k: v for k, v in out.items() if k in shapes}

    def reference(self, *args: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, ...]:
        """``reshard.run_reference`` of the Fusion on this call (global tensors)."""
        return run_reference(self.fusion, self.inputs(*args, state=state))

