"""Trials judged ahead in a forked process, so that a 2-core machine runs two at once.

The sharing search (``dag.share_communication``) tries one sub-plan after another on one
state, and a trial not kept leaves the state as it was (``dag._try_free``'s law; a release
trial likewise): until one is kept, the trials ahead are independent, each a function of the
state and its item.  ``Ahead`` forks a process holding that state (a copy of the caller's
memory, made by the kernel as pages are written) which judges every other one of the items
ahead (positions 1, 3, 5, ...) while the caller judges the others, and sends each verdict
back (a few bytes).  Law: the caller uses a verdict only to skip a trial that would not be
kept; a trial that would be kept is run again by the caller, which so makes every state it
goes on from itself, in the same order as without ``Ahead``: the same plan, whatever the
machine, its load or the child's fate (a child that dies or is killed only leaves its
items to the caller).  Once a trial is kept, the state the child judges on is gone: the
caller ``close``s it (killed) and may fork another on the new state.

The child runs pure-Python extraction only: no egglog (its thread pool is not fork-safe:
``reshard.forksafe``), no HiGHS; it ends in ``os._exit``, never returning into the caller's
stack.  Forking is worth it only where trials are slow next to a fork of a process holding
the e-graph, and a processor is idle (``worth``).
"""

from __future__ import annotations

import os
import pickle
import signal
import warnings
from typing import Any, Callable

#: e-nodes from which a search judges trials ahead: a trial re-extracts a part of the e-graph or
#: all of it (tens of ms to a second on the 135k e-nodes of the 4-layer Llama-2-7B dp 2 x tp 4
#: stack); tiny e-graphs stay in one process
AHEAD_NODES = 50_000
#: what a fork costs its caller, in whole re-extractions of the e-graph: each page of the caller's
#: memory that it writes next is copied first (that 4-layer stack: 0.2 s of CPU on a 0.6-0.8 s
#: re-extraction from scratch, measured on the first after the fork)
FORK_COST = 0.3


def worth(nodes: int, trials: int, each: float) -> bool:
    """Whether ``trials`` trials on ``nodes`` e-nodes, each re-extracting ``each`` of the e-graph
    (1: all of it), are judged ahead: a large e-graph, the child's half of the trials costing
    more than the fork, ``os.fork``, and a processor idle to run the child on (``_others``: on
    a busy machine two processes only take turns).  Only the speed depends on it, never the
    plan."""
    if nodes < AHEAD_NODES or trials // 2 * each <= FORK_COST or not hasattr(os, "fork"):
        return False
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return _others() <= cpus - 2


def _others() -> int:
    """Processes running now besides this one: ``/proc/loadavg``'s runnable count (this one
    included), else the load average (a minute's, this one's children included)."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0]) - 1
    except (OSError, ValueError, IndexError):
        return round(os.getloadavg()[0]) - 1


class Ahead:
    """A forked process judging ``items[1::2]`` in order with ``judge`` (a function of the item
    and the state at the fork, returning something small to pickle); ``get(k)``: the verdict
    of the item at position k, None where the caller judges it (k even, or the child gone)."""

    def __init__(self, items: list[Any], judge: Callable[[Any], Any]) -> None:
        self.got: dict[int, Any] = {}
        self.next = 1  # the position of the next verdict the child sends
        r, w = os.pipe()
        with warnings.catch_warnings():  # (Python 3.12 warns of fork in a threaded process: the child runs no thread's code)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: verdicts, then out, whatever happens
            code = 1
            try:
                os.close(r)
                with os.fdopen(w, "wb") as out:
                    for item in items[1::2]:
                        pickle.dump(judge(item), out)
                        out.flush()
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        self.pid: int | None = pid
        self.pipe = os.fdopen(r, "rb")
        self.size = len(items)

    def get(self, k: int) -> Any:
        """The child's verdict on the item at position ``k`` (waiting for it), or None: the
        caller's to judge (``k`` even, past the items, or the child ended without it)."""
        while self.pid is not None and k % 2 and self.next <= k < self.size:
            try:
                self.got[self.next] = pickle.load(self.pipe)
            except (EOFError, OSError, pickle.UnpicklingError):
                self.close()
                break
            self.next += 2
        return self.got.get(k)

    def close(self) -> None:
        """End the child (killed: its verdicts are of no more use) and reap it."""
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:  # (reaped elsewhere: SIGCHLD ignored)
            pass
        self.pid = None
        self.pipe.close()
