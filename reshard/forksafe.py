"""optimize() in a process forked after egglog ran: in a fresh interpreter.

egglog 13.2 runs on rayon's global thread pool: a large e-graph's rebuilds and merges
fan out to it, and dropping an e-graph broadcasts a clean-up job to every pool thread
(``egglog_core_relations::free_join::Database::drop``).  ``fork()`` copies the pool's
state but none of its threads, so in a child forked after the parent used egglog (the
pool starts on first use) the first such job waits forever for threads that do not exist:
``optimize()`` of a program over 64 ops (segmented: it drops e-graphs) deadlocked in a
``multiprocessing`` child with the ``fork`` start method.  Nothing in the child can restart
the pool, so there optimize() runs in a fresh interpreter (``subprocess``, not
``multiprocessing``: a daemonic pool worker may not have children) and the plan comes back
pickled; progress reports are relayed as they come.  Elsewhere nothing changes.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from .ir.errors import ReshardError

_state = {"used": False, "lost": False}


def _after_fork_in_child() -> None:
    _state["lost"] = _state["used"]


os.register_at_fork(after_in_child=_after_fork_in_child)


def note_egglog_used() -> None:
    """Called before an e-graph is made: from now on a forked child has no egglog pool."""
    _state["used"] = True


def pool_lost() -> bool:
    """Is this a child forked after its parent used egglog (whose thread pool it lacks)?"""
    return _state["lost"]


def optimize_in_fresh_process(fusion: Any, kwargs: dict[str, Any],
                              progress: Callable[[Any], None] | None) -> Any:
    """``reshard.optimize(fusion, **kwargs)`` in a fresh interpreter (``kwargs["limits"]``
    given); its time limit counts from now (the interpreter's start is part of the call)."""
    ends_at = time.time() + kwargs["limits"].time_limit_s
    try:
        payload = pickle.dumps((fusion, kwargs, ends_at, progress is not None))
    except Exception as e:
        raise ReshardError(f"optimize: this process was forked after egglog ran here, so optimize() runs in a fresh "
                           f"process, which needs its arguments pickled, and they do not pickle ({e}); "
                           "or use the 'spawn' start method") from e
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    with subprocess.Popen([sys.executable, "-c", "from reshard.forksafe import serve; serve()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env) as proc:
        stdin, stdout = proc.stdin, proc.stdout
        stdin.write(payload)  # type: ignore[union-attr]
        stdin.close()  # type: ignore[union-attr]
        while True:
            try:
                kind, value = pickle.load(stdout)  # type: ignore[arg-type]
            except EOFError:
                raise ReshardError(f"optimize: the fresh process it ran in (this process was forked after egglog ran "
                                   f"here) exited with code {proc.wait()} without a result") from None
            if kind == "progress":
                progress(value)  # type: ignore[misc]
            elif kind == "plan":
                return value
            else:
                raise value


def serve() -> None:
    """The fresh process: read the call, run it, send progress reports and the plan (or the
    exception) to stdout, pickled; anything else printed goes to stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)

    def send(kind: str, value: Any) -> None:
        pickle.dump((kind, value), out)
        out.flush()

    try:
        import dataclasses

        from .plan import optimize
        fusion, kwargs, ends_at, relay = pickle.load(sys.stdin.buffer)
        kwargs["limits"] = dataclasses.replace(kwargs["limits"], time_limit_s=max(1e-6, ends_at - time.time()))
        plan = optimize(fusion, **kwargs, progress=(lambda r: send("progress", r)) if relay else None)
        for node in plan.lowered.nodes:
            _ = node.alternatives  # priced here: the pricing needs the e-graph, which stays here
        send("plan", plan)
    except Exception as e:
        try:
            pickle.dumps(e)
        except Exception:
            e = ReshardError(f"optimize (in a fresh process): {''.join(traceback.format_exception(e))}")
        send("error", e)
