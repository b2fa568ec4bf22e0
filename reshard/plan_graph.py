"""``Plan.graphed``: a plan's step on one GPU captured as a CUDA graph, fed and read as global
tensors (every rank simulated on the GPU, as ``Plan.simulate(device="cuda")``, but replayed:
``runtime.cuda_graph``).

>>> step = plan.graphed({"x": x, "w": w})        # shards once, warms up, captures
>>> (y,) = step({"x": next_x})                   # copies next_x in, replays; y: the graph's tensor
>>> w.add_(dw); (y,) = step()                    # w is read where it is: no copy

An input whose sharding leaves every rank the whole tensor (``read_in_place``: a 1-rank plan's
inputs, replicated parameters) is read in place: the tensor given at capture is
the graph's buffer for every rank, so an in-place update of it (``optimizer.step()``) is what the
next replay reads, and passing it again costs nothing.  Other inputs are sharded
(``reshard.shard``) into per-rank buffers, at capture and in each call that gives them.  As
torch's ``make_graphed_callables``, a call with a new tensor for a read-in-place input copies
it into the tensor given at capture.

Outputs are global tensors on the GPU: a replicated output is rank ``ts.mesh.ranks[0]``'s
local tensor itself (replicas are not compared: ``Plan.simulate`` checks a plan), overwritten by
the next replay unless ``clone``; others are unsharded (``reshard.unshard``) each call.  A plan
of uneven shardings (``Plan.padding``) is not graphed: ``ReshardError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from .codegen.lower import LoweredPlan
from .ir.errors import ReshardError
from .ir.sharding import TensorSharding, shard, unshard
from .runtime.cuda_graph import GraphedStep

__all__ = ["GraphedPlan"]

Tensor = torch.Tensor


class GraphablePlan(Protocol):
    """What a graph reads of a plan (a ``reshard.Plan``; this module sits under ``plan``)."""

    lowered: LoweredPlan
    padding: Any

    def validate_inputs(self, inputs: Mapping[str, Tensor], where: str = ...) -> None: ...


def read_in_place(ts: TensorSharding) -> bool:
    """Every rank's local tensor is the whole tensor, in its order: no Partial axis, no padding,
    and each rank's block every index of every dim (Replicate axes; a ``Shard`` over a mesh axis
    of size 1)."""
    if ts.partial_axes or ts.true_shape is not None:
        return False
    whole = tuple((0, n) for n in ts.shape)
    return all(ts.block_ranges(ts.mesh.coords(r)) == whole for r in ts.mesh.ranks)


class GraphedPlan:
    """``plan``'s program on ``device`` as one CUDA graph (module docstring); made by
    ``Plan.graphed``.  ``inputs``: global tensors by input name, as ``Plan.simulate`` takes them
    (read in place or sharded: module docstring); ``generator``: Partial inputs' random summands
    (``shard``); ``clone``: calls return copies of the outputs."""

    def __init__(self, plan: GraphablePlan, inputs: Mapping[str, Tensor], *, device: torch.device,
                 generator: torch.Generator | None = None, clone: bool = False) -> None:
        if plan.padding is not None:
            raise ReshardError("Plan.graphed: a plan of uneven shardings (padded blocks) is not captured as a CUDA "
                               "graph; run it with Plan.simulate(device='cuda')")
        plan.validate_inputs(inputs, "Plan.graphed")
        self.plan, self.clone, self.generator = plan, clone, generator
        self._feeds: dict[str, list[tuple[str, TensorSharding]]] = {}
        for buf, name, ts in plan.lowered.inputs:
            self._feeds.setdefault(name, []).append((buf, ts))
        self._given = {n: inputs[n].to(device) for n in self._feeds}
        self._unread = set(inputs) - set(self._feeds)  # inputs of the Fusion the plan does not read
        #: the inputs whose given tensor is every rank's buffer (an in-place update is read)
        self._in_place = {n for n, x in self._given.items()
                          if x.is_contiguous() and all(read_in_place(ts) for _, ts in self._feeds[n])}
        per_rank: dict[int, dict[str, Tensor]] = {r: {} for r in plan.lowered.program.mesh_ranks}
        for name, x in self._given.items():
            for r, bufs in self._locals(name, x, in_place=name in self._in_place).items():
                per_rank[r].update(bufs)
        self.step = GraphedStep(plan.lowered.program, per_rank)
        #: per output: (buffer, sharding, read whole from its first rank), worked out once
        self._outputs = [(buf, ts, read_in_place(ts)) for buf, ts in plan.lowered.outputs]
        #: the outputs when every one is read whole: the graph's own tensors, the same each replay
        self._whole = tuple(self.step.outputs[ts.mesh.ranks[0]][buf] for buf, ts, _ in self._outputs) \
            if all(whole for *_, whole in self._outputs) else None

    def _locals(self, name: str, x: Tensor, in_place: bool) -> dict[int, dict[str, Tensor]]:
        """Input ``name``'s per-rank buffers for the global ``x``: ``x`` itself where its
        sharding is read whole (and ``in_place``: at capture, the input is read in place), else
        its shards."""
        out: dict[int, dict[str, Tensor]] = {}
        for buf, ts in self._feeds[name]:
            parts = dict.fromkeys(ts.mesh.ranks, x) if in_place and read_in_place(ts) else \
                shard(x, ts, generator=self.generator)
            for r, local in parts.items():
                out.setdefault(r, {})[buf] = local
        return out

    @property
    def read_in_place(self) -> frozenset[str]:
        """The inputs read where the tensor given at capture is (module docstring): passing
        that tensor again costs nothing, an in-place update of it is what a replay reads."""
        return frozenset(self._in_place)

    def __call__(self, inputs: Mapping[str, Tensor] | None = None, *, clone: bool | None = None
                 ) -> tuple[Tensor, ...]:
        """Replay the step after copying ``inputs`` (global tensors by name, any subset; the
        others keep their values; one that is the tensor given at capture for a read-in-place
        input is not copied); returns the plan's outputs as global GPU tensors (module
        docstring), copies when ``clone`` (default: ``Plan.graphed``'s).  Where every output
        is read whole (a 1-rank plan), the call after the copies is the replay alone: the
        output tuple is the graph's, made once."""
        clone = self.clone if clone is None else clone
        per_rank: dict[int, dict[str, Tensor]] = {}
        for name, x in (inputs or {}).items():
            given = self._given.get(name)
            if given is None and name in self._unread:
                continue
            if given is None:
                raise ReshardError(f"Plan.graphed: no input {name!r} (the plan reads {sorted(self._given)})")
            if name in self._in_place and (x is given or (x.data_ptr() == given.data_ptr()
                                                          and x.stride() == given.stride() and x.shape == given.shape)):
                continue
            if x.shape != given.shape or x.dtype != given.dtype:
                raise ReshardError(f"Plan.graphed: input {name!r} is {tuple(x.shape)} {x.dtype}, the graph was "
                                   f"captured for {tuple(given.shape)} {given.dtype}")
            for r, bufs in self._locals(name, x.to(given.device), in_place=True).items():  # (copied in)
                per_rank.setdefault(r, {}).update(bufs)
        if self._whole is not None:
            self.step.replay(per_rank)
            return tuple(x.clone() for x in self._whole) if clone else self._whole
        outs = self.step(per_rank, clone=clone)
        return tuple(unshard({r: outs[r][buf] for r in ts.mesh.ranks}, ts, check_replicas=False) if not whole
                     else outs[ts.mesh.ranks[0]][buf] for buf, ts, whole in self._outputs)
