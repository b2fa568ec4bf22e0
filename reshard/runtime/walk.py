"""The one program interpreter: a rank program's steps in order, each dispatched by its kind to
a backend, then the buffers the step frees dropped.

Both executors of a ``Program`` are backends of :func:`walk`: the in-process simulator
(``simulator.simulate``: every rank of the mesh in one process, collectives by their reference
functions; on a GPU with reshard's kernels, which is also what a CUDA graph captures) and the
multi-process runtime (``distributed.DistRuntime.run``: this rank only, collectives through
``torch.distributed``).  What a step means (which buffers it reads and writes, which ranks take
part, what ``free`` drops) is decided here once; a backend only says how a local step, a team
collective and a point-to-point transfer run on its ranks.

Law: for every program, ``walk`` calls exactly one backend method per step the backend takes
part in, in program order, then its ``after``; after every step (taken part in or not) it drops
every buffer of the step's ``free`` attribute; a step kind that is neither ``"local"``, ``"send_recv"`` nor a team
collective is a ``ReshardError`` naming the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..codegen.program import COLLECTIVES, Program, Step
from ..ir.errors import ReshardError

__all__ = ["StepBackend", "walk"]


class StepBackend(Protocol):
    """How a step runs on a backend's ranks (``idx``: the step's index, for messages)."""

    #: prefix of the backend's messages ("" for the simulator, "rank r: " for a process)
    where: str

    def takes_part(self, step: Step) -> bool:
        """Whether this backend runs ``step`` at all (a process skips another mesh's steps)."""
        ...

    def local(self, step: Step, idx: int) -> None:
        """Run the local step on each of the backend's ranks that take part; store its outputs."""
        ...

    def collective(self, step: Step, idx: int) -> None:
        """Run the team collective on each of the backend's teams; store each member's result."""
        ...

    def send_recv(self, step: Step, idx: int) -> None:
        """Move the step's buffer over its ``(src, dst)`` pairs."""
        ...

    def after(self, step: Step) -> None:
        """Called after the step's writes, before its frees (the simulator's measurements)."""
        ...

    def free(self, names: Sequence[str]) -> None:
        """Drop ``names`` from the environments of the backend's ranks."""
        ...


def walk(program: Program, backend: StepBackend) -> None:
    """Run ``program``'s steps on ``backend`` (module docstring's law)."""
    for idx, step in enumerate(program.steps):
        if backend.takes_part(step):
            if step.kind == "local":
                backend.local(step, idx)
            elif step.kind == "send_recv":
                backend.send_recv(step, idx)
            elif step.kind in COLLECTIVES:
                backend.collective(step, idx)
            else:
                raise ReshardError(f"{backend.where}step {idx}: unknown step kind {step.kind!r} "
                                   f"(expected 'local' or one of {sorted(COLLECTIVES)})")
            backend.after(step)
        backend.free(step.attr("free", ()) or ())
