"""Training through reshard in the user's own loop, in PyTorch's conventions.

>>> model = reshard.parallelize(module, mesh, example_inputs=(ids, labels),
...                             param_placements={"mlp.fc1.weight": [Shard(0)], ...})
>>> opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
>>> for ids, labels in batches:
...     loss = model(ids, labels)     # forward and backward: one plan (the joint program)
...     loss.backward()               # each parameter's .grad: this rank's shard of its gradient
...     opt.step(); opt.zero_grad()   # torch.optim on the local shards

Inputs may be given by keyword, as the module takes them (``example_kwargs``; each call then
passes the same keywords).  A Hugging Face model trains as it is written: its ``ModelOutput``'s
``loss`` is the loss (``logits`` are what a ``loss_fn`` reads), and the KV cache is off
(``use_cache=False``: a training step keeps none):

>>> model = reshard.parallelize(llama, mesh, example_kwargs={"input_ids": ids, "labels": labels},
...                             param_placements=...)
>>> loss = model(input_ids=ids, labels=labels)   # the loss tensor, not the ModelOutput

A module that returns its predictions (logits) rather than its loss takes a ``loss_fn``, in
PyTorch's criterion convention (torchtitan's too): ``loss = loss_fn(module(*inputs), *targets)``.
The targets are given apart from the module's inputs, by keyword, when planning and in each call:

>>> model = reshard.parallelize(module, mesh, example_inputs=(ids,), loss_fn=F.cross_entropy,
...                             example_targets=(labels,), param_placements=...)
>>> loss = model(ids, targets=labels)   # a tuple for several targets: loss_fn(out, *targets)

``plan_training`` exports ``frontend.loss.LossOf`` of the module (and ``loss_fn``) with
``from_torch(..., train=True)`` (the program's inputs: the positional inputs, the keyword
inputs, then the targets) and
optimizes the joint program: the loss and every trained parameter's gradient at the
parameter's placements, forward and backward in one e-graph (``passes.autodiff``).  ``parallelize``
wraps the module: a ``ParallelModule`` whose call runs that plan once, with the seed
d loss / d loss = 1, through a ``torch.autograd.Function`` whose backward returns the stored
gradients times ``grad_output`` (``loss * k`` and gradient accumulation behave as in eager
PyTorch).

Evaluation: a call under ``torch.no_grad()`` (or ``torch.inference_mode()``) runs the loss
alone, no backward pass, and leaves every ``.grad`` as it was:

>>> with torch.no_grad():
...     val_loss = model(ids, labels)  # the forward-only plan, made on the first such call

Input shapes: a plan is made for the shapes (and dtypes) of the inputs it was planned with; a
call with other shapes (an epoch's last, smaller batch; evaluation batches) plans once for
them, rank 0 planning and sending the plan as at first, and keeps that plan for every later
call of those shapes, training and evaluation plans alike (``train_plans``; ``model.plans``).
A batch of new shapes is given as global tensors or DTensors (this rank's shards of it would
read as a smaller global batch); this rank's shards are accepted for shapes already planned.

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
  and inputs stay global tensors.  With the module on a GPU the ranks are simulated there and
  each plan's step is captured as a CUDA graph on its first call and replayed after
  (``Plan.graphed``; ``cuda_graph=False`` walks the program instead): the loss and gradients
  are GPU tensors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from .collector import rarely_collected
from .ir.errors import ReshardError
from .ir.fusion import Fusion
from .ir.mesh import DeviceMesh
from .ir.sharding import TensorSharding, shard
from .ir.symbolic import SymbolicMesh
from .plan import Plan, optimize
from .plan_symbolic import SymbolicPlan, optimize_symbolic

__all__ = ["GraphedTraining", "ParallelModule", "SymbolicTrainingPlan", "TrainingPlan", "parallelize", "plan_training"]


@dataclass
class TrainingPlan:
    """A module's optimized training program (picklable: sent to the ranks).

    ``plan``: the joint plan, its outputs the loss, then the gradients of ``grads``' keys in
    order; ``user_inputs``, ``state_inputs``, ``constants``: its inputs as in ``TorchProgram``
    (the constants' global values); ``grads``: trained parameter FQN -> gradient output name;
    ``targets``: the last of ``user_inputs`` when the loss is a ``loss_fn``'s: its targets,
    passed to a call by the keyword ``targets``; ``keywords``: the module's inputs given by
    keyword, in the order of ``user_inputs`` (after the positional ones, before the targets).
    """

    plan: Plan
    user_inputs: tuple[str, ...]
    state_inputs: tuple[str, ...]
    constants: dict[str, torch.Tensor]
    grads: dict[str, str]
    targets: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()

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

    def explain(self, full: bool | None = None) -> str:
        """The joint plan explained (``Plan.explain``): in brief by default for a plan of more
        than a few dozen steps (the forward and backward passes with their totals, a line per
        layer or module with repeated layers folded, the collectives, the placements the plan
        changed and why); ``full=True``: every step, with the rejected alternatives priced;
        ``full=False``: the brief form whatever the size."""
        return self.plan.explain(full=full)

    def draw(self, path: str | Path, full: bool | None = None) -> Path:
        """The joint plan drawn to ``path`` (``Plan.draw``: ``.png`` or ``.svg``, the forward
        and backward passes as two clusters, a box per layer or module for a large plan unless
        ``full=True``, a PNG at most 4000 pixels a side); returns the path."""
        return self.plan.draw(path, full=full)

    def call_inputs(self, args: Sequence[Any], kwargs: Mapping[str, Any], targets: Any, where: str
                    ) -> dict[str, Any]:
        """A call's inputs by ``user_inputs`` name: the positional ``args``, then ``kwargs`` (the
        ``keywords`` planned with), then ``targets`` (a loss_fn's); a count, keyword or type that
        does not fit is a ``ReshardError`` (``where`` names the caller)."""
        given = _as_tuple(targets)
        if len(given) != len(self.targets):
            raise ReshardError(f"{where}: {len(given)} targets given (targets=), the loss_fn takes "
                               f"{len(self.targets)} ({list(self.targets)})" if self.targets else
                               f"{where}: targets= are the targets of a loss_fn; the module was planned without one "
                               "(its forward returns the loss)")
        if set(kwargs) != set(self.keywords):
            raise ReshardError(f"{where}: keyword inputs {sorted(kwargs)} given, the module was planned with "
                               f"{list(self.keywords)} (example_kwargs): pass the same keywords in every call")
        values = (*args, *(kwargs[k] for k in self.keywords), *given)
        if len(values) != len(self.user_inputs):
            inputs = list(self.user_inputs[:len(self.user_inputs) - len(self.targets) - len(self.keywords)])
            raise ReshardError(f"{where}: {len(values) - len(given) - len(kwargs)} arguments given, the "
                               f"program takes {len(inputs)} ({inputs})")
        for name, x in zip(self.user_inputs, values):
            if not isinstance(x, torch.Tensor):
                raise ReshardError(f"{where}: argument {name!r} is a {type(x).__name__}, not a tensor")
        return dict(zip(self.user_inputs, values))

    def graphed(self, module: torch.nn.Module, *args: Any, targets: Any = None, clone: bool = False,
                **kwargs: Any) -> GraphedTraining:
        """The training step on one GPU captured once as a CUDA graph (``Plan.graphed``: every
        rank simulated on the GPU of ``module``'s state, reshard's kernels; the example batch
        ``args`` / ``kwargs`` / ``targets`` as a ``ParallelModule`` call takes them, global
        tensors).  The result's call ``(*args, targets=, **kwargs)`` replays it for a batch of
        the same shapes and returns ``(loss, {parameter FQN: gradient})``, the graph's own
        tensors (overwritten by the next call) unless ``clone``.  ``module``'s state is read
        where it is when every rank holds it whole (a 1-rank plan: all of it), so an
        optimizer's in-place updates need no copy; sharded state is sharded again in every
        call.  What cannot be captured is a ``ReshardError`` (``runtime.cuda_graph``)."""
        state = {n: _planned_shape(_state_of(module, n)) for n in self.state_inputs}
        device = next((t.device for t in state.values() if t.is_cuda), None)
        if device is None:
            raise ReshardError("TrainingPlan.graphed: the module's state is not on a CUDA device: move the module to "
                               "the GPU first (module.cuda())")
        batch = {n: _planned_shape(x) for n, x in self.call_inputs(args, kwargs, targets, "TrainingPlan.graphed").items()}
        constants = {n: c.to(device) for n, c in self.constants.items()}
        with torch.no_grad():
            step = self.plan.graphed({**batch, **state, **constants}, device=device, clone=clone)
        return GraphedTraining(self, step, state)

    def forward_only(self) -> TrainingPlan:
        """The plan of the loss alone (evaluation): the joint program with its one output the
        loss, whose backward pass nothing then reads, optimized under the same cost profile;
        the same inputs at the same placements, no gradients."""
        return replace(self, plan=optimize(_loss_alone(self.plan.source), cost_profile=self.plan.profile), grads={})


class GraphedTraining:
    """``TrainingPlan.graphed``'s step: a call feeds a batch (and the module's state, read in
    place or sharded again) to the captured graph and returns ``(loss, {parameter FQN:
    gradient})``."""

    def __init__(self, plan: TrainingPlan, step: Any, state: Mapping[str, torch.Tensor]) -> None:
        self.plan, self.step = plan, step
        #: the state fed to each call: what is sharded again (state read in place is the graph's own)
        self.state = {n: t for n, t in state.items() if n not in step.read_in_place}

    def __call__(self, *args: Any, targets: Any = None, clone: bool | None = None,
                 **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch = {n: _planned_shape(x) for n, x in
                 self.plan.call_inputs(args, kwargs, targets, "TrainingPlan.graphed").items()}
        with torch.no_grad():
            outs = self.step({**batch, **self.state}, clone=clone)
        return outs[0], dict(zip(self.plan.grads, outs[1:]))


def plan_training(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor] | None = None, mesh: Any = None,
                  *, example_kwargs: Mapping[str, torch.Tensor] | None = None,
                  loss_fn: Callable[..., torch.Tensor] | None = None, example_targets: Any = None,
                  input_placements: Any = None, param_placements: Mapping[str, Any] | None = None,
                  memory_budget: int | None = None, forward_only: bool = False,
                  **optimize_kwargs: Any) -> "TrainingPlan | SymbolicTrainingPlan":
    """Export ``module(*example_inputs, **example_kwargs)`` for training: its loss (the output
    tensor, a Hugging Face ``ModelOutput``'s ``loss``, a tuple's first item), or
    ``loss_fn(prediction, *example_targets)`` when ``loss_fn`` is given (the prediction: the
    output, a ``ModelOutput``'s ``logits``; ``example_targets``: a tensor or a sequence of
    them); a forward that takes ``use_cache`` gets ``use_cache=False`` (``frontend.loss.LossOf``).
    Then optimize the joint program on ``mesh``.  ``input_placements``: as ``from_torch``'s
    ``in_placements`` (a sequence: the positional inputs, the keyword inputs, then the targets;
    or a mapping by name); ``param_placements``: FQN -> placements (default Replicate);
    ``memory_budget``: bytes per rank of saved activations (``optimize``); ``optimize_kwargs``:
    ``cost_profile``, ``limits``, ``extractor``, ``comm_budget``, ``cache`` (the plan cache:
    planning the same program again is instant); ``forward_only``: optimize the loss alone
    (evaluation: ``TrainingPlan.forward_only`` of the training plan, without planning the
    backward pass; ``memory_budget`` is then moot).  ``ReshardError`` when an input is not a
    tensor or the loss is not a float scalar.  On a ``SymbolicMesh`` (``ir.symbolic``): the
    module is exported at the mesh's first sizes and planned for every size
    (``plan_symbolic.optimize_symbolic``), a ``SymbolicTrainingPlan``."""
    from .frontend.loss import LossOf
    from .frontend.torch_export import from_torch

    if mesh is None:
        raise ReshardError("plan_training: a mesh is required (reshard.DeviceMesh([0, 1], ('tp',)), ...)")
    symbolic = mesh if isinstance(mesh, SymbolicMesh) else None
    if symbolic is not None:  # exported at its first sizes, read at each size by its placements
        if memory_budget is not None or set(optimize_kwargs) - {"cost_profile", "limits", "extractor"}:
            raise ReshardError("plan_training on a symbolic mesh takes cost_profile, limits and extractor; a "
                               "memory budget, a communication budget or the plan cache need a concrete mesh")
        mesh = symbolic.at(**symbolic.points()[0])
    inputs, kwargs, targets = tuple(example_inputs or ()), dict(example_kwargs or {}), _as_tuple(example_targets)
    if not inputs and not kwargs:
        raise ReshardError("plan_training: no example inputs: pass example_inputs=(...) (positional) or "
                           "example_kwargs={name: tensor} (by keyword, e.g. a Hugging Face model's input_ids and labels)")
    for k, v in kwargs.items():
        if not isinstance(v, torch.Tensor):
            raise ReshardError(f"plan_training: example_kwargs[{k!r}] is a {type(v).__name__}; only tensor inputs "
                               "are traced (a non-tensor option belongs in the module or its config)")
    if loss_fn is None and targets:
        raise ReshardError("plan_training: example_targets are the targets of a loss_fn; none was given (the "
                           "module's forward returns its loss: pass the labels in example_inputs or example_kwargs)")
    exported = LossOf(module, loss_fn, len(inputs), len(targets), keywords=tuple(kwargs))
    try:
        with rarely_collected():
            tp = from_torch(exported, inputs + tuple(kwargs.values()) + targets, input_placements, None, mesh,
                            param_placements=param_placements, train=True)
    except ReshardError as e:
        if isinstance(e.__cause__, ReshardError):  # LossOf's, raised inside torch.export
            raise e.__cause__ from None
        raise
    program, grads = (_loss_alone(tp.fusion), {}) if forward_only else (tp.fusion, dict(tp.grads))
    meta = (tp.user_inputs, tp.state_inputs, {n: tp.values[n] for n in tp.constant_inputs}, grads,
            tp.user_inputs[len(inputs) + len(kwargs):], tuple(kwargs))
    if symbolic is not None:
        return SymbolicTrainingPlan(optimize_symbolic(program, symbolic, **optimize_kwargs), meta)
    budget = {} if forward_only else {"memory_budget": memory_budget}
    return TrainingPlan(optimize(program, **budget, **optimize_kwargs), *meta)


@dataclass
class SymbolicTrainingPlan:
    """A module's training plans for every size of a symbolic mesh (``plan_training`` with a
    ``SymbolicMesh``): ``plans`` (``plan_symbolic.SymbolicPlan``: its decision table, ``explain``,
    ``smallest``) and ``fields``, ``TrainingPlan``'s fields after its plan (the program's inputs
    and gradients), the same at every size."""

    plans: SymbolicPlan
    fields: tuple[Any, ...]

    def specialize(self, **sizes: int) -> TrainingPlan:
        """The ``TrainingPlan`` at ``sizes`` (``SymbolicPlan.specialize``: no planning again)."""
        return TrainingPlan(self.plans.specialize(**sizes), *self.fields)

    def explain(self) -> str:
        """The decision table (``SymbolicPlan.explain``)."""
        return self.plans.explain()


def _loss_alone(joint: Fusion) -> Fusion:
    """The joint program with its one output the loss: its backward pass is then read by
    nothing (the same inputs at the same placements)."""
    f = joint.copy()
    f.outputs = f.outputs[:1]
    return f


def _as_tuple(targets: Any) -> tuple[Any, ...]:
    """Targets as given (None, one tensor or DTensor, or a sequence) as a tuple."""
    if targets is None:
        return ()
    return (targets,) if isinstance(targets, torch.Tensor) or _is_dtensor(targets) else tuple(targets)


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
    calling it returns the loss (module docstring).

    Plans by input shapes (``train_plans.ShapePlans``, ``plans``): ``training_plan`` is that of
    the example inputs' shapes; a call with inputs of other shapes (the last, smaller batch)
    plans once for those shapes (``replan``, by rank 0 when distributed: every rank calls
    with the same global shapes) and keeps the plan for the next call of those shapes.  A call
    without gradient recording (``torch.no_grad()``, ``torch.inference_mode()``) runs the
    forward-only plan of its shapes: the loss alone, no backward pass
    (``TrainingPlan.forward_only`` of the training plan of those shapes when there is one),
    likewise made on the first such call and kept.  ``replan(args, train)``: the plan for
    the shapes of ``args`` (``parallelize`` gives it; None: other shapes than the plan's are a
    ``ReshardError``).  Every re-plan keeps each parameter's sharding (the state is already
    sharded), else ``ReshardError``.  ``cuda_graph``: as ``parallelize``'s (simulated ranks
    with the state on a GPU); ``runs_on``: how the last call ran, in words."""

    def __init__(self, module: torch.nn.Module, training_plan: TrainingPlan, rank: int | None,
                 replan: Callable[[Sequence[Any], bool], TrainingPlan] | None = None,
                 cuda_graph: bool | None = None) -> None:
        from .train_plans import ShapePlans

        super().__init__()
        self.module = module
        self.training_plan = training_plan
        self.rank = rank
        checked = None if replan is None else (lambda args, train: _same_state(training_plan, replan(args, train)))
        self._plans = ShapePlans(training_plan, checked, self._forward_only, rank)
        self._runtimes: dict[int, Any] = {}  # id(TrainingPlan) -> its DistRuntime (made on its first call)
        #: id(TrainingPlan) -> how it runs simulated (``_simulated``); how each runs, in words (``runs_on``)
        self._steps: dict[int, Callable[[Mapping[str, torch.Tensor]], Sequence[torch.Tensor]]] = {}
        self._how: dict[int, str] = {}
        self.cuda_graph = cuda_graph
        self.runs_on = "not run yet"

    @property
    def plans(self) -> dict[tuple[bool, Any], TrainingPlan]:
        """The plans made so far by (train, each argument's (shape, dtype)): ``train_plans``."""
        return self._plans.plans

    @property
    def eval_plan(self) -> TrainingPlan | None:
        """The forward-only plan of the example inputs' shapes, once a call made it."""
        from .train_plans import planned_shapes

        return self._plans.plans.get((False, planned_shapes(self.training_plan)))

    def forward(self, *args: Any, targets: Any = None, **kwargs: Any) -> torch.Tensor:
        """The loss of this batch: ``args`` and ``kwargs`` as the module was planned with
        (``example_inputs``, ``example_kwargs``; any shapes: class docstring), ``targets``
        those of a ``loss_fn``."""
        tp = self.training_plan
        args = tuple(tp.call_inputs(args, kwargs, targets, "ParallelModule").values())
        state = [_state_of(self.module, n) for n in tp.state_inputs]
        dtensor = next((x for x in (*args, *state) if _is_dtensor(x)), None)
        local = [s.to_local() if _is_dtensor(s) else s for s in state]  # differentiable: DTensor grads
        if torch.is_grad_enabled():
            planned = self._plans.get(args, train=True)
            loss = _JointStep.apply(lambda ts: self._run(planned, args, ts), *local)
        else:
            loss, _ = self._run(self._plans.get(args, train=False), args, [s.detach() for s in local])
        if dtensor is None:
            return loss
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import Replicate as TorchReplicate
        mesh = dtensor.device_mesh
        return DTensor.from_local(loss, mesh, [TorchReplicate()] * mesh.ndim, run_check=False)

    def _forward_only(self, tp: TrainingPlan) -> TrainingPlan:
        """``tp.forward_only()``, by rank 0 when distributed (every rank calls)."""
        return _made_once(tp.forward_only, "ParallelModule (evaluation)", distributed=self.rank is not None)

    def _run(self, tp: TrainingPlan, args: Sequence[Any],
             state: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """``tp`` run: (the loss, 0-dim; each state input's gradient or None): global tensors
        when simulated, else this rank's.  A complex argument or state is fed as its pairs
        (``frontend.program.planned_shape``)."""
        args = [_planned_shape(x) for x in args]
        values = {n: _planned_shape(s) for n, s in zip(tp.state_inputs, state)}
        if self.rank is not None:
            outs = tp.plan.run(self._local_inputs(tp, args, values), runtime=self._dist_runtime(tp))
        else:
            outs = self._simulated(tp)({**dict(zip(tp.user_inputs, args)), **values, **tp.constants})
        self.runs_on = self._how[id(tp)]
        grads = dict(zip(tp.grads, outs[1:]))
        return outs[0], [grads.get(n) for n in tp.state_inputs]

    def _simulated(self, tp: TrainingPlan) -> Callable[[Mapping[str, torch.Tensor]], Sequence[torch.Tensor]]:
        """How ``tp`` runs with every rank simulated here (``runs_on``), made on its first call:
        on the CPU ``Plan.simulate``; with the module's state on a GPU, the step captured as a
        CUDA graph (``Plan.graphed``, outputs cloned: a loss or gradient kept past the next call
        stays as it was) unless ``cuda_graph`` is False or the plan pads uneven shards (then
        ``Plan.simulate(device=...)``, its outputs moved to that GPU)."""
        if id(tp) in self._steps:
            return self._steps[id(tp)]
        device = next((t.device for t in (_state_of(self.module, n) for n in tp.state_inputs) if t.is_cuda), None)
        if device is None:
            run, how = tp.plan.simulate, "every rank simulated on the CPU"
        elif self.cuda_graph is not False and (self.cuda_graph or tp.plan.padding is None):
            run = _CapturedOnFirstCall(tp.plan, device)
            how = f"every rank simulated on {device}, replayed as a CUDA graph"
        else:
            def run(inputs: Mapping[str, torch.Tensor]) -> Sequence[torch.Tensor]:
                return [y.to(device) for y in tp.plan.simulate(inputs, device=device)]
            how = f"every rank simulated on {device}, reshard's kernels" + \
                (" (a plan of padded uneven shards is not captured)" if tp.plan.padding is not None else "")
        self._steps[id(tp)], self._how[id(tp)] = run, how
        return run

    def _local_inputs(self, tp: TrainingPlan, args: Sequence[Any],
                      state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's inputs of ``tp`` by buffer: the state's local shards as they are, each
        argument's shard (of a global tensor, a DTensor, or a local tensor as given)."""
        rank = self.rank
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
            elif tuple(x.shape) == tp.global_shape(name):
                out.update((buf, shard(x.detach(), ts)[rank]) for buf, ts in feeds)
                continue
            if len(feeds) != 1:
                raise ReshardError(f"ParallelModule: argument {name!r} of shape {tuple(x.shape)} is not the global "
                                   f"{tp.global_shape(name)}, and the plan reads it at {len(feeds)} shardings: pass "
                                   "the global tensor")
            out[feeds[0][0]] = x.detach()
        return out

    def _dist_runtime(self, tp: TrainingPlan) -> Any:
        """The rank's ``DistRuntime`` for ``tp`` (one of ``plans``), built on its first call
        (every rank calls)."""
        if id(tp) not in self._runtimes:
            from .runtime.distributed import DistRuntime
            runtime = self._runtimes[id(tp)] = DistRuntime.from_plan(tp.plan)
            self._how[id(tp)] = (f"rank {self.rank} of the {runtime.backend} process group, local steps on "
                                 f"{runtime.device}" + (" through reshard's kernels" if runtime.device.type == "cuda"
                                                        else ""))
        return self._runtimes[id(tp)]

    def close(self) -> None:
        """Release the process groups of the runtimes (every rank calls it, or none)."""
        while self._runtimes:
            self._runtimes.pop(next(iter(self._runtimes))).close()


class _CapturedOnFirstCall:
    """``plan``'s step as a CUDA graph on ``device``, captured on the first call with that
    call's inputs (``Plan.graphed``), replayed on every later call; outputs cloned."""

    def __init__(self, plan: Plan, device: torch.device) -> None:
        self.plan, self.device, self.graph = plan, device, None

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> Sequence[torch.Tensor]:
        if self.graph is None:
            self.graph = self.plan.graphed({n: x.to(self.device) for n, x in inputs.items()}, device=self.device,
                                           clone=True)
        return self.graph(inputs)


def parallelize(module: torch.nn.Module, mesh: Any = None, *, example_inputs: Sequence[Any] | None = None,
                example_kwargs: Mapping[str, Any] | None = None,
                loss_fn: Callable[..., torch.Tensor] | None = None, example_targets: Any = None,
                input_placements: Any = None, param_placements: Mapping[str, Any] | None = None,
                memory_budget: int | None = None, plan: TrainingPlan | None = None, simulate: bool = False,
                cuda_graph: bool | None = None,
                **optimize_kwargs: Any) -> ParallelModule:
    """``module`` (its forward returns the loss first, or ``loss_fn(module(*inputs), *targets)``
    is the loss) trained through reshard's plan: returns a ``ParallelModule`` whose call
    returns the loss and whose ``backward`` fills each parameter's ``.grad`` (module docstring).

    ``mesh``: a ``reshard.DeviceMesh`` or a torch ``DeviceMesh`` (default: that of the module's
    DTensor parameters).  ``example_inputs``, ``example_kwargs``: global tensors (or DTensors)
    to export and plan with, positional and by keyword (a Hugging Face model's
    ``{"input_ids": ids, "labels": labels}``); each call then passes the same; ``loss_fn``,
    ``example_targets`` (tensors or DTensors): as ``plan_training``, each call then takes the
    targets by the keyword ``targets``; ``input_placements``: per positional input, keyword
    input, then target, or by name (default: the DTensors' placements, else Replicate); ``param_placements``:
    FQN -> placements (default: a DTensor parameter's own, else Replicate); ``memory_budget``,
    ``optimize_kwargs``: as ``plan_training``.  ``plan``: a
    ``TrainingPlan`` made before (by ``plan_training``) instead of planning here.
    ``simulate``: run every rank in this process; else this process is one rank of an
    initialized process group (``reshard.launch``, torchrun + ``reshard.init_from_env``).
    ``cuda_graph`` (simulated, the module on a GPU): None replays each plan as a CUDA graph
    where it can be captured (not a plan of padded uneven shards), True always (else
    ``ReshardError``), False walks the program each call; ``ParallelModule.runs_on`` says how
    the last call ran.
    The module's parameters and buffers are replaced by this rank's shards, in place.
    """
    import torch.distributed as dist

    distributed = not simulate
    if distributed and not (dist.is_available() and dist.is_initialized()):
        raise ReshardError("parallelize: torch.distributed is not initialized: run under reshard.launch or torchrun "
                           "(reshard.init_from_env()), or pass simulate=True to simulate every rank in this process")
    replan = None
    if plan is None:
        recipe = _recipe(module, mesh, example_inputs, example_kwargs, input_placements, param_placements,
                         {"loss_fn": loss_fn, "memory_budget": memory_budget, **optimize_kwargs})
        args = (*(example_inputs or ()), *(example_kwargs or {}).values(), *_as_tuple(example_targets))
        plan = recipe.plan(module, args, True, distributed=distributed)
        # the state's global shapes, exported in a re-plan (this rank's shards by then, when distributed)
        state = {n: (tuple(_state_of(module, n).shape), _state_of(module, n).dtype) for n in plan.state_inputs}
        replan = functools.partial(recipe.plan, module, distributed=distributed, stand_ins=state)
    rank = dist.get_rank() if distributed else None
    if rank is not None and rank not in plan.mesh:
        raise ReshardError(f"parallelize: rank {rank} is not on the plan's mesh {plan.mesh!r}")
    if rank is not None:
        _shard_state(module, plan, rank)
    return ParallelModule(module, plan, rank, replan, cuda_graph=cuda_graph)


@dataclass
class _Recipe:
    """How ``parallelize`` plans a module, kept to plan it again for other input shapes: the
    same mesh, placements and options, only the example tensors differ.  ``input_placements``
    as the user gave them (None: those of DTensor arguments, else Replicate);
    ``param_placements``: every parameter's (DTensor ones' included); ``plan_kwargs``:
    ``plan_training``'s ``loss_fn``, ``memory_budget`` and optimize options."""

    mesh: Any
    keywords: tuple[str, ...]
    n_inputs: int
    input_placements: Any
    param_placements: dict[str, Any]
    plan_kwargs: dict[str, Any]

    def plan(self, module: torch.nn.Module, args: Sequence[Any], train: bool, *, distributed: bool,
             stand_ins: Mapping[str, tuple[tuple[int, ...], torch.dtype]] | None = None) -> TrainingPlan:
        """The plan for ``args`` (positional inputs, keyword inputs, targets: global tensors or
        DTensors), made by rank 0 and sent to the others when ``distributed`` (every rank
        calls); ``train``: the joint plan, else the loss alone.  ``stand_ins``: state name ->
        global (shape, dtype), each such parameter or buffer exported as an uninitialized
        tensor of that shape (default: the DTensor ones, at their global shapes)."""
        placements = self.input_placements
        if placements is None and any(_is_dtensor(x) for x in args):
            placements = [list(x.placements) if _is_dtensor(x) else None for x in args]
        args = tuple(x.full_tensor() if _is_dtensor(x) else x for x in args)  # collective: every rank
        if stand_ins is None:
            stand_ins = {n: (tuple(p.shape), p.dtype) for n, p in _named_state(module) if _is_dtensor(p)}
        n, k = self.n_inputs, len(self.keywords)

        def make() -> TrainingPlan:
            with _global_stand_ins(module, stand_ins):
                return plan_training(module, args[:n], self.mesh, example_kwargs=dict(zip(self.keywords, args[n:n + k])),
                                     example_targets=args[n + k:], input_placements=placements,
                                     param_placements=self.param_placements, forward_only=not train,
                                     **self.plan_kwargs)

        return _made_once(make, "parallelize" if train else "ParallelModule (evaluation)", distributed)


def _recipe(module: torch.nn.Module, mesh: Any, example_inputs: Sequence[Any] | None,
            example_kwargs: Mapping[str, Any] | None, input_placements: Any,
            param_placements: Mapping[str, Any] | None, plan_kwargs: dict[str, Any]) -> _Recipe:
    """``parallelize``'s recipe: DTensor parameters and example inputs give the mesh and the
    parameters' placements (explicit ones win)."""
    if example_inputs is None and example_kwargs is None:
        raise ReshardError("parallelize: example_inputs or example_kwargs (global tensors or DTensors) are needed to "
                           "plan, or a plan= made by reshard.plan_training")
    dtensors = {n: p for n, p in _named_state(module) if _is_dtensor(p)}
    if mesh is None:
        args = (*(example_inputs or ()), *(example_kwargs or {}).values())
        first = next((x for x in (*dtensors.values(), *args) if _is_dtensor(x)), None)
        if first is None:
            raise ReshardError("parallelize: a mesh is needed (a reshard.DeviceMesh or a torch DeviceMesh), or "
                               "DTensor parameters that carry one")
        mesh = first.device_mesh
    params = {**{n: list(p.placements) for n, p in dtensors.items()}, **(param_placements or {})}
    return _Recipe(mesh, tuple(example_kwargs or {}), len(example_inputs or ()), input_placements, params, plan_kwargs)


def _same_state(first: TrainingPlan, new: TrainingPlan) -> TrainingPlan:
    """``new`` when it reads every parameter and buffer as ``first`` does (the module's state
    is sharded as ``first`` says), else ``ReshardError``."""
    for name in new.state_inputs:
        want = first.sharding(name) if name in first.state_inputs else None
        if new.sharding(name) != want:
            raise ReshardError(f"ParallelModule: planned for new input shapes, {name!r} would be read at "
                               f"{new.sharding(name)}, but the module holds it at {want} (the example inputs' plan); "
                               "parallelize with the new shapes' example inputs instead")
    return new


#: how long the other ranks wait for rank 0's plan: planning a large model takes minutes, more
#: than the process group's timeout is often set to (torchrun scripts, ``launch``'s 60 s)
PLAN_WAIT = timedelta(hours=2)


def _made_once(make: Callable[[], TrainingPlan], where: str, distributed: bool) -> TrainingPlan:
    """``make()``; when ``distributed``, run on rank 0 and sent to every rank (a collective:
    every rank calls), over a gloo group of its own that waits up to ``PLAN_WAIT``.  If it
    raises, rank 0 raises its exception and every other rank a ``ReshardError`` with its
    message (not a timeout)."""
    import torch.distributed as dist

    if not distributed:
        return make()
    group = dist.new_group(backend="gloo", timeout=PLAN_WAIT)
    made: list[Any] = [None]
    error: Exception | None = None
    try:
        if dist.get_rank() == 0:
            try:
                made[0] = ("ok", make())
            except Exception as e:
                error = e
                made[0] = ("error", f"{type(e).__name__}: {e}")
        dist.broadcast_object_list(made, src=0, group=group)
        dist.barrier(group=group)  # both sides done with the group before either destroys it
    finally:
        dist.destroy_process_group(group)
    if error is not None:
        raise error
    status, value = made[0]
    if status == "error":
        raise ReshardError(f"{where}: rank 0 failed to plan: {value}")
    return value


@contextmanager
def _global_stand_ins(module: torch.nn.Module, shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]]
                      ) -> Iterator[None]:
    """Each parameter or buffer named in ``shapes`` replaced, inside the block, by an
    uninitialized plain tensor of its global (shape, dtype) there (export traces plain tensors
    of global shapes; the values are not read)."""
    saved = {n: _state_of(module, n) for n in shapes}
    for n, (shape, dtype) in shapes.items():
        p, stand_in = saved[n], torch.empty(shape, dtype=dtype)
        _set_state(module, n, torch.nn.Parameter(stand_in, p.requires_grad) if isinstance(p, torch.nn.Parameter)
                   else stand_in)
    try:
        yield
    finally:
        for n, p in saved.items():
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
        local = shard(_planned_shape(value.detach()), ts)[rank].clone()
        new = torch.nn.Parameter(local, value.requires_grad) if isinstance(value, torch.nn.Parameter) else local
        for alias in aliases[id(value)]:
            _set_state(module, alias, new)


def _planned_shape(x: Any) -> Any:
    """A tensor as the program input it is fed as (``frontend.program.planned_shape``: a complex
    tensor's pairs); a DTensor or anything else as it is."""
    from .frontend.program import planned_shape

    return planned_shape(x) if isinstance(x, torch.Tensor) and not _is_dtensor(x) else x


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
