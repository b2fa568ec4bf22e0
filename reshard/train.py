"""Training through reshard in the user's own loop, in PyTorch's conventions.

>>> model = reshard.parallelize(module, mesh, example_inputs=(ids, labels),
...                             param_placements={"mlp.fc1.weight": [Shard(0)], ...})
>>> opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
>>> for ids, labels in batches:
...     loss = model(ids, labels)     # forward and backward: one plan (the joint program)
...     loss.backward()               # each parameter's .grad: this rank's shard of its gradient
...     opt.step(); opt.zero_grad()   # torch.optim on the local shards

``plan_training`` exports the module with ``from_torch(..., train=True)`` (its forward returns
the loss first: a Hugging Face model called with ``labels=``) and optimizes the joint program:
the loss and every trained parameter's gradient at the parameter's placements, forward and
backward in one e-graph (``ir.autodiff``).  ``parallelize`` wraps the module: a
``ParallelModule`` whose call runs that plan once, with the seed d loss / d loss = 1, through a
``torch.autograd.Function`` whose backward returns the stored gradients times ``grad_output``
(``loss * k`` and gradient accumulation behave as in eager PyTorch).

Where it runs:

* one process per rank (``reshard.launch`` or torchrun + ``reshard.init_from_env``): the
  module's parameters and persistent buffers become this rank's shards (DTensor's local
  tensors, ``torch.chunk`` pieces on uneven dims); parameters that are ``DTensor``s stay
  DTensors (their placements are the plan's; ``.grad`` is a DTensor) and the loss is then a
  replicated DTensor.  Each call takes the global batch (every rank the same tensors) or this
  rank's shard of each input (as ``DTensor.from_local`` takes), or DTensors.  Rank 0 plans and
  sends the plan to the others, unless ``plan=`` is given (the same ``TrainingPlan`` on every
  rank; the runtime checks that the programs agree).
* ``simulate=True``: every rank simulated in this process (``Plan.simulate``); parameters
  and inputs stay global tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from .ir.errors import ReshardError
from .ir.mesh import DeviceMesh
from .ir.sharding import TensorSharding, shard
from .plan import Plan, optimize

__all__ = ["ParallelModule", "TrainingPlan", "parallelize", "plan_training"]


@dataclass
class TrainingPlan:
    """A module's optimized training program (picklable: sent to the ranks).

    ``plan``: the joint plan, its outputs the loss, then the gradients of ``grads``' keys in
    order; ``user_inputs``, ``state_inputs``, ``constants``: its inputs as in ``TorchProgram``
    (the constants' global values); ``grads``: trained parameter FQN -> gradient output name.
    """

    plan: Plan
    user_inputs: tuple[str, ...]
    state_inputs: tuple[str, ...]
    constants: dict[str, torch.Tensor]
    grads: dict[str, str]

    @property
    def mesh(self) -> DeviceMesh:
        return self.plan.source.tensors[self.plan.source.inputs[0]].mesh

    def global_shape(self, name: str) -> tuple[int, ...]:
        f = self.plan.source
        return next(f.tensors[i].shape for i in f.inputs if f.tensors[i].name == name)

    def user_shardings(self, name: str) -> list[tuple[str, TensorSharding]]:
        """(program buffer, the user's sharding) of each way input ``name`` is fed (one, unless
        its placement was left to the optimizer)."""
        plan = self.plan
        return [(buf, plan.padding.user_sharding(n, ts) if plan.padding is not None else ts)
                for buf, n, ts in plan.lowered.inputs if n == name]

    def sharding(self, name: str) -> TensorSharding:
        """The user's sharding of a parameter, buffer or constant input (one way to feed it)."""
        (_, ts), = self.user_shardings(name)
        return ts


def plan_training(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor], mesh: Any, *,
                  input_placements: Any = None, param_placements: Mapping[str, Any] | None = None,
                  memory_budget: int | None = None, **optimize_kwargs: Any) -> TrainingPlan:
    """Export ``module(*example_inputs)`` for training (``from_torch(..., train=True)``: the
    forward returns the loss first) and optimize the joint program on ``mesh``.
    ``input_placements``: as ``from_torch``'s ``in_placements``; ``param_placements``: FQN ->
    placements (default Replicate); ``memory_budget``: bytes per rank of saved activations
    (``optimize``); ``optimize_kwargs``: ``cost_profile``, ``limits``, ``extractor``, ``comm_budget``."""
    from .frontend.torch_export import from_torch

    tp = from_torch(module, tuple(example_inputs), input_placements, None, mesh,
                    param_placements=param_placements, train=True)
    plan = optimize(tp.fusion, memory_budget=memory_budget, **optimize_kwargs)
    return TrainingPlan(plan, tp.user_inputs, tp.state_inputs, {n: tp.values[n] for n in tp.constant_inputs},
                        dict(tp.grads))


class _JointStep(torch.autograd.Function):
    """loss = run(state); backward: each stored gradient times ``grad_output``."""

    @staticmethod
    def forward(ctx: Any, run: Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, list[torch.Tensor | None]]],
                *state: torch.Tensor) -> torch.Tensor:
        loss, grads = run([s.detach() for s in state])
        ctx.grads = grads
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads, ctx.grads = ctx.grads, None
        return (None, *(None if g is None else g * grad_output for g in grads))


class ParallelModule(torch.nn.Module):
    """``module`` trained through ``training_plan`` on rank ``rank`` (None: every rank simulated
    in this process).  ``module``'s state is the rank's shards (``parallelize`` made them);
    calling it returns the loss (module docstring)."""

    def __init__(self, module: torch.nn.Module, training_plan: TrainingPlan, rank: int | None) -> None:
        super().__init__()
        self.module = module
        self.training_plan = training_plan
        self.rank = rank
        self._runtime: Any = None

    def forward(self, *args: Any) -> torch.Tensor:
        tp = self.training_plan
        if len(args) != len(tp.user_inputs):
            raise ReshardError(f"ParallelModule: {len(args)} arguments given, the program takes "
                               f"{len(tp.user_inputs)} ({list(tp.user_inputs)})")
        state = [_state_of(self.module, n) for n in tp.state_inputs]
        dtensor = next((x for x in (*args, *state) if _is_dtensor(x)), None)
        local = [s.to_local() if _is_dtensor(s) else s for s in state]  # differentiable: DTensor grads
        loss = _JointStep.apply(lambda ts: self._run(args, ts), *local)
        if dtensor is None:
            return loss
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import Replicate as TorchReplicate
        mesh = dtensor.device_mesh
        return DTensor.from_local(loss, mesh, [TorchReplicate()] * mesh.ndim, run_check=False)

    def _run(self, args: Sequence[Any], state: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """(the loss, 0-dim; each state input's gradient or None): global tensors when
        simulated, else this rank's."""
        tp = self.training_plan
        values = dict(zip(tp.state_inputs, state))
        if self.rank is None:
            outs = tp.plan.simulate({**dict(zip(tp.user_inputs, args)), **values, **tp.constants})
        else:
            outs = tp.plan.run(self._local_inputs(args, values), runtime=self._dist_runtime())
        grads = dict(zip(tp.grads, outs[1:]))
        return outs[0].reshape(()), [grads.get(n) for n in tp.state_inputs]

    def _local_inputs(self, args: Sequence[Any], state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's program inputs by buffer: the state's local shards as they are, each
        argument's shard (of a global tensor, a DTensor, or a local tensor as given)."""
        tp, rank = self.training_plan, self.rank
        out: dict[str, torch.Tensor] = {}
        for name, value in state.items():
            (buf, _), = tp.user_shardings(name)
            out[buf] = value
        for name, value in tp.constants.items():
            for buf, ts in tp.user_shardings(name):
                out[buf] = shard(value, ts)[rank]
        for name, x in zip(tp.user_inputs, args):
            feeds = tp.user_shardings(name)
            if _is_dtensor(x):
                _check_dtensor(x, feeds[0][1], f"argument {name!r}")
                x = x.to_local()
                feeds = feeds[:1]
            elif not isinstance(x, torch.Tensor):
                raise ReshardError(f"ParallelModule: argument {name!r} is a {type(x).__name__}, not a tensor")
            elif tuple(x.shape) == tp.global_shape(name):
                out.update((buf, shard(x.detach(), ts)[rank]) for buf, ts in feeds)
                continue
            if len(feeds) != 1:
                raise ReshardError(f"ParallelModule: argument {name!r} of shape {tuple(x.shape)} is not the global "
                                   f"{tp.global_shape(name)}, and the plan reads it at {len(feeds)} shardings: pass "
                                   "the global tensor")
            out[feeds[0][0]] = x.detach()
        return out

    def _dist_runtime(self) -> Any:
        """The rank's ``DistRuntime`` for the plan, built on the first call (every rank calls)."""
        if self._runtime is None:
            from .runtime.distributed import DistRuntime
            self._runtime = DistRuntime.from_plan(self.training_plan.plan)
        return self._runtime

    def close(self) -> None:
        """Release the process groups of the runtime (every rank calls it, or none)."""
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None


def parallelize(module: torch.nn.Module, mesh: Any = None, *, example_inputs: Sequence[Any] | None = None,
                input_placements: Any = None, param_placements: Mapping[str, Any] | None = None,
                memory_budget: int | None = None, plan: TrainingPlan | None = None, simulate: bool = False,
                **optimize_kwargs: Any) -> ParallelModule:
    """``module`` (its forward returns the loss first) trained through reshard's plan: returns a
    ``ParallelModule`` whose call returns the loss and whose ``backward`` fills each
    parameter's ``.grad`` (module docstring).

    ``mesh``: a ``reshard.DeviceMesh`` or a torch ``DeviceMesh`` (default: that of the module's
    DTensor parameters).  ``example_inputs``: global tensors (or DTensors) to export and plan
    with; ``input_placements``: per input (default: the DTensors' placements, else Replicate);
    ``param_placements``: FQN -> placements (default: a DTensor parameter's own, else
    Replicate); ``memory_budget``, ``optimize_kwargs``: as ``plan_training``.  ``plan``: a
    ``TrainingPlan`` made before (by ``plan_training``) instead of planning here.
    ``simulate``: run every rank in this process; else this process is one rank of an
    initialized process group (``reshard.launch``, torchrun + ``reshard.init_from_env``).
    The module's parameters and buffers are replaced by this rank's shards, in place.
    """
    import torch.distributed as dist

    distributed = not simulate
    if distributed and not (dist.is_available() and dist.is_initialized()):
        raise ReshardError("parallelize: torch.distributed is not initialized: run under reshard.launch or torchrun "
                           "(reshard.init_from_env()), or pass simulate=True to simulate every rank in this process")
    if plan is None:
        plan = _plan_once(module, mesh, example_inputs, input_placements, param_placements, memory_budget,
                          optimize_kwargs, distributed)
    rank = dist.get_rank() if distributed else None
    if rank is not None and rank not in plan.mesh:
        raise ReshardError(f"parallelize: rank {rank} is not on the plan's mesh {plan.mesh!r}")
    if rank is not None:
        _shard_state(module, plan, rank)
    return ParallelModule(module, plan, rank)


def _plan_once(module: torch.nn.Module, mesh: Any, example_inputs: Sequence[Any] | None, input_placements: Any,
               param_placements: Mapping[str, Any] | None, memory_budget: int | None,
               optimize_kwargs: dict[str, Any], distributed: bool) -> TrainingPlan:
    """The training plan, made by rank 0 and sent to the others when ``distributed``.  DTensor
    parameters and example inputs give their mesh and placements (explicit ones win)."""
    import torch.distributed as dist

    if example_inputs is None:
        raise ReshardError("parallelize: example_inputs (global tensors or DTensors) are needed to plan, or a "
                           "plan= made by reshard.plan_training")
    dtensors = {n: p for n, p in _named_state(module) if _is_dtensor(p)}
    args = tuple(example_inputs)
    if mesh is None:
        first = next((x for x in (*dtensors.values(), *args) if _is_dtensor(x)), None)
        if first is None:
            raise ReshardError("parallelize: a mesh is needed (a reshard.DeviceMesh or a torch DeviceMesh), or "
                               "DTensor parameters that carry one")
        mesh = first.device_mesh
    params = {**{n: list(p.placements) for n, p in dtensors.items()}, **(param_placements or {})}
    if input_placements is None and any(_is_dtensor(x) for x in args):
        input_placements = [list(x.placements) if _is_dtensor(x) else None for x in args]
    args = tuple(x.full_tensor() if _is_dtensor(x) else x for x in args)  # collective: every rank
    made: list[Any] = [None]
    if not distributed or dist.get_rank() == 0:
        with _global_stand_ins(module, dtensors):
            made[0] = plan_training(module, args, mesh, input_placements=input_placements,
                                    param_placements=params, memory_budget=memory_budget, **optimize_kwargs)
    if distributed:
        dist.broadcast_object_list(made, src=0)
    return made[0]


@contextmanager
def _global_stand_ins(module: torch.nn.Module, dtensors: Mapping[str, Any]) -> Iterator[None]:
    """Each DTensor parameter or buffer replaced, inside the block, by an uninitialized plain
    tensor of its global shape (export traces plain tensors; the values are not read)."""
    for n, p in dtensors.items():
        stand_in = torch.empty(tuple(p.shape), dtype=p.dtype)
        _set_state(module, n, torch.nn.Parameter(stand_in, p.requires_grad) if isinstance(p, torch.nn.Parameter)
                   else stand_in)
    try:
        yield
    finally:
        for n, p in dtensors.items():
            _set_state(module, n, p)


def _shard_state(module: torch.nn.Module, plan: TrainingPlan, rank: int) -> None:
    """Replace each parameter and buffer the plan reads by this rank's shard (DTensors are
    checked against the plan and kept); tied names share the new parameter."""
    from .frontend.torch_export import state_aliases

    aliases = state_aliases(module)
    for name in plan.state_inputs:
        value = _state_of(module, name)
        ts = plan.sharding(name)
        if _is_dtensor(value):
            _check_dtensor(value, ts, f"parameter {name!r}")
            continue
        local = shard(value.detach(), ts)[rank].clone()
        new = torch.nn.Parameter(local, value.requires_grad) if isinstance(value, torch.nn.Parameter) else local
        for alias in aliases[id(value)]:
            _set_state(module, alias, new)


def _named_state(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from module.named_parameters()
    yield from module.named_buffers()


def _state_of(module: torch.nn.Module, name: str) -> torch.Tensor:
    prefix, _, leaf = name.rpartition(".")
    owner = module.get_submodule(prefix)
    value = owner._parameters.get(leaf)
    return value if value is not None else owner._buffers[leaf]


def _set_state(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    prefix, _, leaf = name.rpartition(".")
    owner = module.get_submodule(prefix)
    if leaf in owner._parameters:
        owner._parameters[leaf] = value
    else:
        owner._buffers[leaf] = value


def _is_dtensor(x: Any) -> bool:
    return type(x).__name__ == "DTensor" and hasattr(x, "to_local")


def _check_dtensor(x: Any, ts: TensorSharding, what: str) -> None:
    """A DTensor must be laid out as the plan reads it (same mesh ranks and placements)."""
    from .frontend.torch_export import mesh_of

    mesh = mesh_of(x.device_mesh)  # its axis names may differ from the plan's
    if (mesh.shape, mesh.ranks) != (ts.mesh.shape, ts.mesh.ranks) or \
            TensorSharding.of(list(x.placements), tuple(x.shape), ts.mesh, what) != ts:
        raise ReshardError(f"ParallelModule: {what} is a DTensor on {mesh!r} with placements {list(x.placements)}, "
                           f"the plan reads it at {ts} on {ts.mesh!r}; redistribute it first")
