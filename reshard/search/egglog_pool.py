"""Whether egglog's thread pool survived ``fork()`` in this process.

egglog 13.2 runs on rayon's global thread pool, which starts on first use; ``fork()``
copies the pool's state but none of its threads, so a child forked after its parent used
egglog waits forever on the first job sent to the pool (``forksafe`` says when, and what
``optimize()`` does there).  Saturation notes each use before it makes an e-graph.
"""

from __future__ import annotations

import gc
import os

_state = {"used": False, "lost": False}


def _after_fork_in_child() -> None:
    """Mark the pool lost, and keep the cyclic garbage collector away from every object
    inherited from the parent (``gc.freeze``): an e-graph the parent had dropped into a
    reference cycle (a caught exception's frames, say) but not yet collected would otherwise
    be freed here, and freeing an e-graph sends a job to the pool the child lacks."""
    _state["lost"] = _state["used"]
    if _state["lost"]:
        gc.freeze()


os.register_at_fork(after_in_child=_after_fork_in_child)


def note_egglog_used() -> None:
    """Called before an e-graph is made: from now on a forked child has no egglog pool."""
    _state["used"] = True


def pool_lost() -> bool:
    """Is this a child forked after its parent used egglog (whose thread pool it lacks)?"""
    return _state["lost"]
