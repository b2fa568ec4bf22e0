"""Whether egglog's thread pool survived ``fork()`` in this process.

egglog 13.2 runs on rayon's global thread pool, which starts on first use; ``fork()``
copies the pool's state but none of its threads, so a child forked after its parent used
egglog waits forever on the first job sent to the pool (``forksafe`` says when, and what
``optimize()`` does there).  Saturation notes each use before it makes an e-graph.
"""

from __future__ import annotations

import os

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
