"""A value computed in a forked child process while this process goes on: extraction's
later candidates are finished ahead, on a core no other process is using.

``Forked(fn)`` forks (where ``os.fork`` exists, ``SECOND_CORE`` is on and a CPU this process
may run on is spare, ``spare_cpu``) and calls ``fn()`` in the child, which sends back its pickled result
and exits at once (``os._exit``: no clean-up runs there, so no egglog e-graph is dropped in the
child, which would wait forever on egglog's thread pool, ``reshard.forksafe``).  ``result()``
waits for it.  Law: ``result()`` is ``fn()``'s value, or what ``fn()`` raised, wherever it
ran: when the child cannot be started, dies, or its result or exception does not pickle,
``fn()`` runs here (so it must be a function of the state at the fork, not of what this
process does meanwhile).  Only small results should cross (they are pickled); the child may
write what it likes, its writes are its own (copy on write).

Extraction runs with the garbage collector paused (``extract.gc_paused``): the child inherits
that, so no finalizer of this process's objects runs in it.  A child whose parent dies is
killed (Linux: ``PR_SET_PDEATHSIG``), and ``close()`` kills one whose result is not wanted.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import warnings
from collections.abc import Callable
from typing import Generic, TypeVar

#: fork for extraction's candidates at all (tests turn it off to compare with the serial path)
SECOND_CORE = True

_T = TypeVar("_T")
_PR_SET_PDEATHSIG = 1


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def spare_cpu() -> bool:
    """Whether a CPU this process may run on is idle now: fewer tasks runnable than CPUs
    (``/proc/loadavg``'s running count, this process included; elsewhere the 1-minute load
    average).  Work done ahead on a busy machine (tests on every core) only slows the rest;
    either way the results are the same."""
    n = cpus()
    if n < 2:
        return False
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0] < n - 0.5
        except OSError:
            return False
    return running < n


def available() -> bool:
    """Whether ``Forked`` forks here (else it runs its function when asked for the result)."""
    return SECOND_CORE and hasattr(os, "fork") and spare_cpu()


class Forked(Generic[_T]):
    """``fn()`` computed in a forked child (module docstring)."""

    def __init__(self, fn: Callable[[], _T]) -> None:
        self._fn = fn
        self._pid: int | None = None
        self._read: int | None = None
        if not available():
            return
        r, w = os.pipe()
        try:
            with warnings.catch_warnings():
                # (Python 3.12 warns on fork in a process with threads: the child here only runs
                # Python and numpy code of extraction, which takes no lock another thread holds)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return
        if pid == 0:  # the child
            os.close(r)
            _child(fn, w)
        os.close(w)
        self._pid, self._read = pid, r

    def result(self) -> _T:
        """``fn()``'s value (raised: what it raised), from the child or computed here."""
        if self._pid is None:
            return self._fn()
        data = bytearray()
        try:
            while chunk := os.read(self._read, 1 << 16):
                data += chunk
        finally:
            self.close()
        try:
            ok, value = pickle.loads(bytes(data))
        except Exception:  # (the child died or sent nothing readable: compute it here)
            return self._fn()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stop waiting: the child is killed if still running, and reaped."""
        if self._read is not None:
            os.close(self._read)
            self._read = None
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self._pid, 0)
            self._pid = None


def _child(fn: Callable[[], object], w: int) -> None:
    """The child's whole life: ``fn()``, its outcome pickled to ``w``, exit."""
    code = 0
    try:
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            out: tuple[bool, object] = (True, fn())
        except BaseException as e:  # noqa: BLE001 (handed to the parent, which raises it)
            out = (False, e)
        try:
            data = pickle.dumps(out)
        except Exception:
            data, code = b"", 1  # (the parent computes it then)
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        os._exit(code)
