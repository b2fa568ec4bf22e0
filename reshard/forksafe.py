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
(``search.egglog_pool`` says whether the pool was lost; ``fresh_process`` is the
fresh interpreter's side.)
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from .ir.errors import ReshardError


def optimize_in_fresh_process(fusion: Any, kwargs: dict[str, Any],
                              progress: Callable[[Any], None] | None) -> Any:
    """``reshard.optimize(fusion, **kwargs)`` in a fresh interpreter (``kwargs["limits"]``
    given); its time limit counts from now (the interpreter's start is part of the call)."""
    limit = kwargs["limits"].time_limit_s
    ends_at = None if limit is None else time.time() + limit
    try:
        payload = pickle.dumps((fusion, kwargs, ends_at, progress is not None))
    except Exception as e:
        raise ReshardError(f"optimize: this process was forked after egglog ran here, so optimize() runs in a fresh "
                           f"process, which needs its arguments pickled, and they do not pickle ({e}); "
                           "or use the 'spawn' start method") from e
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    with subprocess.Popen([sys.executable, "-c", "from reshard.fresh_process import serve; serve()"],
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
