"""A ``ParallelModule``'s plans by the shapes of a call's inputs: each planned once, then kept.

A plan is made for the global shapes and dtypes of the example inputs; a call whose inputs
have other shapes (the last, smaller batch of an epoch, an evaluation batch) needs its own.
``ShapePlans`` keys the plans by ``(train, shapes)``: ``train`` whether the call records
gradients (the joint forward-and-backward plan) or not (the forward-only plan of the loss),
``shapes`` each argument's global ``(shape, dtype)``.  Laws:

* one key, one plan: the first call with a key makes its plan (``replan``, on every rank: rank
  0 plans and sends it), every later call with that key runs the same ``TrainingPlan`` object;
* the forward-only plan of shapes that have a training plan is that plan's ``forward_only()``
  (no export); of new shapes, ``replan(args, False)`` plans the loss alone, never both passes;
* a DTensor argument's shape is its global shape; a plain tensor's is its shape, unless that
  does not name a planned batch while the tensors are, every one, either of a planned
  batch's global shape or this rank's shard of it under that batch's plan: then it is that
  batch (a rank may pass its shards of a batch that was planned).  The shards of a batch of
  new shapes read as a smaller global batch: give a new batch as global tensors or DTensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import torch

from .ir.dtypes import DTYPES
from .ir.errors import ReshardError


class PlanOfInputs(Protocol):
    """What ``ShapePlans`` reads of a ``train.TrainingPlan``: its joint plan (``plan.source``,
    the Fusion) and its user inputs by name, each with the shardings it is fed at."""

    plan: Any
    user_inputs: tuple[str, ...]

    def user_shardings(self, name: str) -> list[tuple[str, Any]]: ...


TrainingPlan = TypeVar("TrainingPlan", bound=PlanOfInputs)

#: each argument's (shape, dtype); None for an argument that is not a tensor
Shapes = tuple[tuple[tuple[int, ...], torch.dtype] | None, ...]
Key = tuple[bool, Shapes]


def shapes_of(args: Sequence[Any]) -> Shapes:
    """Each argument's global (shape, dtype): a DTensor's global shape, a tensor's shape."""
    return tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else None for x in args)


def planned_shapes(tp: PlanOfInputs) -> Shapes:
    """The (shape, dtype) of each of ``tp``'s user inputs, as ``shapes_of`` gives them."""
    f = tp.plan.source
    by_name = {f.tensors[i].name: f.tensors[i] for i in f.inputs}
    return tuple((tuple(by_name[n].shape), DTYPES[by_name[n].dtype]) for n in tp.user_inputs)


class ShapePlans(Generic[TrainingPlan]):
    """The plans of one module by ``(train, shapes)`` (module docstring).  ``first``: the plan of
    the example inputs' shapes ``first_shapes`` (a training plan); ``replan(args, train)``: a
    plan for the shapes of ``args`` (None: the module was given a plan, not examples, and new
    shapes are a ``ReshardError``); ``forward_only(tp)``: ``tp``'s forward-only plan, made
    (on rank 0 when distributed) the first time it is needed; ``rank``: this process's rank (None:
    every rank simulated, every argument a global tensor)."""

    def __init__(self, first: TrainingPlan, replan: Callable[[Sequence[Any], bool], TrainingPlan] | None,
                 forward_only: Callable[[TrainingPlan], TrainingPlan], rank: int | None) -> None:
        self.plans: dict[Key, TrainingPlan] = {(True, planned_shapes(first)): first}
        self._replan = replan
        self._forward_only = forward_only
        self._rank = rank

    def get(self, args: Sequence[Any], train: bool) -> TrainingPlan:
        """The plan for a call with ``args`` (positional inputs, keyword inputs, targets),
        made on the first call that needs it (a collective when distributed: every rank calls
        with the same global shapes)."""
        shapes = self._batch_of(args)
        key = (train, shapes)
        if key in self.plans:
            return self.plans[key]
        trained = self.plans.get((True, shapes))
        if not train and trained is not None:
            self.plans[key] = self._forward_only(trained)
        elif self._replan is None:
            planned = sorted({_describe(s) for _, s in self.plans})
            raise ReshardError(f"ParallelModule: inputs of shapes {_describe(shapes)}; the plan given (plan=) reads "
                               f"{' or '.join(planned)}: pass inputs of those shapes, or parallelize with "
                               "example_inputs / example_kwargs so that new shapes are planned on their first call")
        else:
            self.plans[key] = self._replan(args, train)
        return self.plans[key]

    def _batch_of(self, args: Sequence[Any]) -> Shapes:
        """The shapes that name ``args``' batch (module docstring's third law)."""
        given = shapes_of(args)
        known = {s: tp for (_, s), tp in self.plans.items()}
        if given in known or self._rank is None:
            return given
        for shapes, tp in known.items():
            if all(self._reads(tp, name, x, s) for name, x, s in zip(tp.user_inputs, args, shapes)):
                return shapes
        return given

    def _reads(self, tp: TrainingPlan, name: str, x: Any, planned: Any) -> bool:
        """Whether argument ``x`` is input ``name`` of ``tp`` (global shape ``planned``): of that
        global shape and dtype, or a plain tensor of this rank's shard's."""
        if not isinstance(x, torch.Tensor) or planned is None or x.dtype != planned[1]:
            return False
        if tuple(x.shape) == planned[0]:
            return True
        feeds = tp.user_shardings(name)
        if len(feeds) != 1 or type(x).__name__ == "DTensor":
            return False
        ts = feeds[0][1]
        return tuple(x.shape) == tuple(ts.local_extent(ts.mesh.coords(self._rank)))


def _describe(shapes: Shapes) -> str:
    return "(" + ", ".join("?" if s is None else f"{list(s[0])} {str(s[1]).removeprefix('torch.')}"
                           for s in shapes) + ")"
