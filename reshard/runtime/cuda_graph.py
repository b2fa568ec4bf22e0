"""A program's step captured once as a CUDA graph and replayed without Python per step.

>>> step = GraphedStep(program, per_rank_inputs)   # warm-up, then one capture
>>> outs = step()                                   # {rank: {output buffer: tensor}}: one replay
>>> outs = step({0: {"x": new_x}})                  # new values copied into the input buffers first

:class:`GraphedStep` runs ``simulate(program, inputs, local_step)`` (every rank of the program on
one GPU, the collectives simulated there; ``local_step`` defaults to
``gpu_local.gpu_local_step``, reshard's kernels and cuBLAS) under ``torch.cuda.graph``: a replay
launches every kernel of the step at once, with no Python walking the program.

**Warm-up.** Before the capture the step runs ``warmup`` times on a side stream (torch's CUDA
graph docs require it): the kernels are compiled and loaded, ``gpu_local``'s launch records and
the device-cached indices are made.  The last warm-up runs under
``torch.cuda.set_sync_debug_mode("error")``.

**Static inputs** (torch's convention, as ``torch.cuda.make_graphed_callables``): the example
inputs' tensors are the graph's input buffers; the graph reads their memory.  A call copies each
tensor it is given into that buffer, unless it is the buffer's memory already (the same data
pointer, shape and strides: a parameter an optimizer updates in place is read where it is, with
no copy).  Inputs not given keep their buffers' current values.

**Static outputs**: the result's tensors live in the graph's memory pool and the next replay
overwrites them (as with every CUDA graph: torch's docs); ``clone=True`` (here or per call)
returns copies instead.  Tensors the graph reads from the runtime's caches (remap indices) are
kept alive with it (``ir.tensor_cache.retained``).

**What cannot be captured is an error, not a fallback** (``Plan.simulate(device="cuda")`` is the
uncaptured path; a silent fallback would hide the host time a graph is asked to remove).  A
``ReshardError`` names it:

* an input that is not a CUDA tensor of the inputs' one device (by rank and buffer);
* a step that synchronizes with the host (``.item()``, a copy to the CPU, a data-dependent shape
  such as ``nonzero``'s; caught by the checked warm-up) or returns a tensor off the device (by
  step index, op, output buffer and rank);
* anything else that fails while capturing (the step it was running).

The multi-process runtime (``runtime.distributed``) is not captured: this graph holds one
process's simulation of every rank.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch

from ..codegen.program import Program, Step
from ..ir.errors import ReshardError
from ..ir.tensor_cache import retained
from .gpu_local import gpu_local_step
from .simulator import Env, LocalStep, simulate

__all__ = ["GraphedStep", "copy_inputs"]

Tensor = torch.Tensor
PerRank = dict[int, dict[str, Tensor]]


class GraphedStep:
    """``program`` (every rank on one GPU) captured as one CUDA graph (module docstring).

    ``example_inputs``: ``{rank: {program input buffer: CUDA tensor}}`` as ``simulate`` takes
    them; they become the graph's input buffers.  ``local_step``: runs a local step (default
    ``gpu_local_step``).  ``warmup``: uncaptured runs before the capture (at least 1).
    ``clone``: calls return copies of the outputs (default: the graph's own output tensors,
    overwritten by the next replay).
    """

    def __init__(self, program: Program, example_inputs: Mapping[int, Mapping[str, Tensor]],
                 local_step: LocalStep = gpu_local_step, *, warmup: int = 2, clone: bool = False) -> None:
        if warmup < 1:
            raise ReshardError(f"GraphedStep: warmup={warmup}, at least 1 run must precede the capture")
        self.program, self.clone = program, clone
        self.device = _one_device(example_inputs)
        self.inputs: PerRank = {r: dict(bufs) for r, bufs in example_inputs.items()}
        steps = _Tracked(program, local_step, self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.device(self.device), torch.cuda.stream(side):
            for i in range(warmup):
                with _host_syncs_raise(i == warmup - 1):
                    steps.run("warm-up", self.inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        self.outputs, self._cached = _capture(self.graph, steps, self.inputs, self.device)

    def __call__(self, inputs: Mapping[int, Mapping[str, Tensor]] | None = None, *,
                 clone: bool | None = None) -> PerRank:
        """Copy ``inputs`` (``{rank: {buffer: tensor}}``, any subset; a tensor that is its
        buffer's memory is not copied) into the input buffers, replay the graph, and return
        ``{rank: {output buffer: tensor}}``: the graph's output tensors, overwritten by the next
        replay, or copies when ``clone`` (default: the constructor's).  The replay is queued on
        the current stream; nothing waits for it."""
        self.replay(inputs)
        if self.clone if clone is None else clone:
            return {r: {k: v.clone() for k, v in outs.items()} for r, outs in self.outputs.items()}
        return self.outputs

    def replay(self, inputs: Mapping[int, Mapping[str, Tensor]] | None = None) -> None:
        """``__call__`` without its result: copy ``inputs`` in, replay; the results are in
        ``outputs``' tensors (the same each replay)."""
        if inputs:
            copy_inputs(self.inputs, inputs)
        self.graph.replay()


def copy_inputs(static: PerRank, inputs: Mapping[int, Mapping[str, Tensor]]) -> None:
    """Copy each tensor of ``inputs`` (``{rank: {buffer: tensor}}``) into that buffer of
    ``static`` (the graph's input buffers) unless it is that buffer's memory (the same data
    pointer, shape and strides); an unknown rank or buffer, or another shape or dtype, is a
    ``ReshardError``."""
    for r, bufs in inputs.items():
        if r not in static:
            raise ReshardError(f"GraphedStep: inputs for rank {r}, the program runs on ranks {sorted(static)}")
        for name, x in bufs.items():
            _copy_in(static[r], r, name, x)


def _copy_in(static: dict[str, Tensor], rank: int, name: str, x: Tensor) -> None:
    dst = static.get(name)
    if dst is None:
        raise ReshardError(f"GraphedStep: rank {rank} has no input buffer {name!r} (it has {sorted(static)})")
    if x is dst or (x.data_ptr() == dst.data_ptr() and x.shape == dst.shape and x.stride() == dst.stride()):
        return
    if x.shape != dst.shape or x.dtype != dst.dtype:
        raise ReshardError(f"GraphedStep: rank {rank}'s input {name!r} is {tuple(x.shape)} {x.dtype}, the graph was "
                           f"captured for {tuple(dst.shape)} {dst.dtype} (capture another for other shapes)")
    dst.copy_(x)


def _one_device(inputs: Mapping[int, Mapping[str, Tensor]]) -> torch.device:
    """The one CUDA device every input is on; ``ReshardError`` naming an input that is not there."""
    device = None
    for r, bufs in inputs.items():
        for name, x in bufs.items():
            if not isinstance(x, Tensor) or not x.is_cuda:
                where = x.device if isinstance(x, Tensor) else type(x).__name__
                raise ReshardError(f"GraphedStep: rank {r}'s input {name!r} is on {where}: a CUDA graph reads CUDA "
                                   "tensors only (move the inputs to the GPU first)")
            if device is None:
                device = x.device
            elif x.device != device:
                raise ReshardError(f"GraphedStep: rank {r}'s input {name!r} is on {x.device}, others on {device}: "
                                   "one graph runs on one device")
    if device is None:
        raise ReshardError("GraphedStep: no inputs given; a graph's inputs are its CUDA buffers")
    return device


@contextmanager
def _host_syncs_raise(on: bool) -> Iterator[None]:
    """While ``on``: a torch operation that synchronizes with the host raises (what a capture
    cannot hold)."""
    if not on:
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():  # (torch calls the mode a prototype each time it is set)
        warnings.filterwarnings("ignore", message="Synchronization debug mode")
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(before)


class _Tracked:
    """``simulate`` with each local step's failure, or a result off the device, a
    ``ReshardError`` naming the step; ``last`` is the last local step started."""

    def __init__(self, program: Program, local_step: LocalStep, device: torch.device) -> None:
        self.program, self.local_step, self.device = program, local_step, device
        self.index = {id(s): i for i, s in enumerate(program.steps)}
        self.phase, self.last = "", "before the first step"

    def _name(self, step: Step, rank: int) -> str:
        return f"step {self.index.get(id(step))} (local {step.attr('fop') or step.attr('op')} -> {step.out!r}) " \
               f"on rank {rank}"

    def __call__(self, step: Step, env: Env, rank: int) -> Tensor | tuple[Tensor, ...]:
        self.last = self._name(step, rank)
        try:
            out = self.local_step(step, env, rank)
        except ReshardError:
            raise
        except Exception as e:  # a host sync under the checked warm-up, or a failure while capturing
            raise ReshardError(f"GraphedStep ({self.phase}): {self.last} cannot run in a CUDA graph: "
                               f"{type(e).__name__}: {e}") from e
        off = [t.device for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, Tensor)
               and t.device != self.device]
        if off:
            raise ReshardError(f"GraphedStep ({self.phase}): {self.last} returned a tensor on {off[0]}, not "
                               f"{self.device}: a CUDA graph holds device work only")
        return out

    def run(self, phase: str, inputs: PerRank) -> PerRank:
        self.phase, self.last = phase, "before the first step"
        try:
            return simulate(self.program, inputs, self)
        except ReshardError:
            raise
        except Exception as e:  # in a simulated collective
            raise ReshardError(f"GraphedStep ({phase}): a collective after {self.last} cannot run in a CUDA graph: "
                               f"{type(e).__name__}: {e}") from e


def _capture(graph: torch.cuda.CUDAGraph, steps: _Tracked, inputs: PerRank, device: torch.device
             ) -> tuple[PerRank, list]:
    """Capture ``steps`` on ``inputs`` into ``graph``: (the outputs, the cached tensors it reads)."""
    failure: ReshardError | None = None
    outs: PerRank = {}
    try:
        with retained() as cached, torch.cuda.device(device), torch.cuda.graph(graph):
            try:
                outs = steps.run("capture", inputs)
            except ReshardError as e:  # ended below, after the capture is closed
                failure = e
    except RuntimeError as e:  # the capture itself failed (an earlier failure invalidated it)
        raise failure or ReshardError(f"GraphedStep (capture): the capture failed after {steps.last}: {e}") from e
    if failure is not None:
        raise failure
    return outs, cached
