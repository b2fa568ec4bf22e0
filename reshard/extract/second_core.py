"""A value computed in a forked child process while this process goes on: extraction's
later candidates are finished ahead, on a core no other process is using.

``Forked(fn)`` forks (where ``os.fork`` exists, ``SECOND_CORE`` is on and a CPU this process
may run on is spare, ``spare_cpu``) and calls ``fn()`` in the child, which sends back its
pickled result (with ``first``, two results: a first stage's, then the rest's) and exits at
once (``os._exit``: no clean-up runs there, so no egglog e-graph is dropped in the child,
which would wait forever on egglog's thread pool, ``reshard.forksafe``).  ``result()`` waits
for it.  Law: ``result()`` is ``fn()``'s value, or what ``fn()`` raised, wherever it
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
import time
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar

#: fork for extraction's candidates at all (tests turn it off to compare with the serial path)
SECOND_CORE = True
#: the niceness a speculative child adds to its own (``Forked(nice=...)``, ``os.nice``): the
#: candidates finished ahead whose result is read only where their search ends at or below the
#: plan so far (``extract``'s ``choose``) yield the CPUs to the planning process and to a child
#: whose result is always read (the model-parallel candidate's).  Three processes on the box's
#: 2 CPUs shared them evenly before: the Mixtral-8x7B step at dp 2 x tp 4 (4 layers planned) took
#: 35.6 s, the planning process's windows, buckets and adoption twice as slow as alone and then
#: waiting for the model-parallel child, while the output trials' child finished a plan it then
#: dropped; at +10, 27.0 s (GPT-2 XL dp 2 x tp 4 32 layers 21.7 -> 18.9 s, Llama-2-7B tp 2 14.4
#: -> 12.3; where the speculative plan is the one chosen, Llama-2-7B at dp 2 x tp 4, 20.8 -> 21.5,
#: it is waited for at the end).  The plans are the same (only timing changes)
SPECULATIVE_NICE = 10

_T = TypeVar("_T")
_PR_SET_PDEATHSIG = 1


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: looks at the run queue ``spare_cpu`` takes, ``SPARE_PAUSE_S`` apart: one that finds a CPU
#: idle is enough.  A single look decided on whatever ran at that instant: a thread of this
#: process sampling memory, a short-lived process (planning the 8-layer Llama-2-7B step at
#: dp 2 x tp 4 in the benchmark once ran serially so: 50.6 s where its neighbours took 37-40 s)
SPARE_LOOKS = 5
SPARE_PAUSE_S = 0.002
#: when every look finds the CPUs busy, the span over which their idle time is measured
#: (``_idle_cpus``): five looks 2 ms apart still made the 32-layer step above plan serially
#: once (49.4 s against 36-39 s), some task runnable through all of them
IDLE_SPAN_S = 0.05
#: CPUs' worth of idle time over ``IDLE_SPAN_S`` that count as one spare CPU
IDLE_SPARE = 0.5


def _running() -> int | None:
    """Tasks runnable now, this process included (``/proc/loadavg``), None where unknown."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


def _idle_ticks(mine: set[int]) -> int | None:
    """Clock ticks the CPUs ``mine`` have spent idle (or waiting for I/O) since boot
    (``/proc/stat``), None where unknown."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    total, seen = 0, 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in mine and len(fields) >= 5:
            total += int(fields[3]) + int(fields[4])
            seen += 1
    return total if seen == len(mine) else None


def _idle_cpus(span_s: float) -> float | None:
    """How many CPUs this process may run on were idle over the next ``span_s`` seconds, on
    average (``/proc/stat``'s idle ticks), None where unknown."""
    try:
        mine, hz = set(os.sched_getaffinity(0)), os.sysconf("SC_CLK_TCK")
    except (AttributeError, OSError, ValueError):
        return None
    before = _idle_ticks(mine)
    start = time.perf_counter()
    time.sleep(span_s)
    after = _idle_ticks(mine)
    elapsed = time.perf_counter() - start
    if before is None or after is None or elapsed <= 0:
        return None
    return (after - before) / hz / elapsed


def spare_cpu() -> bool:
    """Whether a CPU this process may run on is idle: fewer tasks runnable than CPUs at one of
    ``SPARE_LOOKS`` looks at the run queue, or, when every look finds them busy, at least
    ``IDLE_SPARE`` CPUs' worth of idle time over the next ``IDLE_SPAN_S`` (elsewhere: the
    1-minute load average).  Work done ahead on a busy machine (tests on every core) only slows
    the rest; either way the results are the same."""
    n = cpus()
    if n < 2:
        return False
    for look in range(SPARE_LOOKS):
        running = _running()
        if running is None:
            try:
                return os.getloadavg()[0] < n - 0.5
            except OSError:
                return False
        if running < n:
            return True
        if look + 1 < SPARE_LOOKS:
            time.sleep(SPARE_PAUSE_S)
    idle = _idle_cpus(IDLE_SPAN_S)
    return idle is not None and idle >= IDLE_SPARE


#: e-nodes below which an extraction finishes its candidates here, without asking
#: ``spare_cpu``: forking a process that holds torch and an e-graph, and reading the child's
#: rows back, cost more than the candidate finished ahead saves (a 1-layer transformer stack,
#: 3,854 e-nodes, 0.16 s serial: 0.19-0.24 s forked; with the CPUs busy ``spare_cpu`` alone
#: measures their idle time for 50 ms)
FORK_MIN_ENODES = 10_000


def available(enodes: int | None = None) -> bool:
    """Whether ``Forked`` forks here (else it runs its function when asked for the result);
    ``enodes``: the size of the extraction it would fork for (``FORK_MIN_ENODES``)."""
    if enodes is not None and enodes < FORK_MIN_ENODES:
        return False
    return SECOND_CORE and hasattr(os, "fork") and spare_cpu()


class Forked(Generic[_T]):
    """``fn()`` computed in a forked child (module docstring).  Staged, with ``first``: the
    child computes ``a = first()``, sends ``shown(a)`` at once (``first()`` here returns it),
    then ``fn(a)`` (``result()``); a parent that only needs the first stage to decide reads it
    while the child goes on, and ``close()``s it when the rest is not wanted.  ``spare``: the
    answer of an ``available()`` the caller already asked (None: ask it here).  ``nice``: added
    to the child's niceness (``os.nice``; ``SPECULATIVE_NICE`` for work whose result may never be
    read).  Law, per stage: the value computed wherever it ran, or what it raised (here:
    ``first()`` raises what ``first`` raised, ``result()`` also what ``fn`` raised)."""

    def __init__(self, fn: Callable[..., _T], first: Callable[[], Any] | None = None,
                 shown: Callable[[Any], Any] = lambda a: a, spare: bool | None = None, nice: int = 0) -> None:
        self._fn, self._first, self._shown = fn, first, shown
        self._pid: int | None = None
        self._read: int | None = None
        self._a: tuple[bool, Any] | None = None  # (first's outcome computed here: ok, value or exception)
        self._seen: tuple[bool, Any] | None = None  # (the first stage's outcome as shown, from either)
        if not (available() if spare is None else spare):
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
            _child(self._stages(), w, nice)
        os.close(w)
        self._pid, self._read = pid, r

    def _stages(self) -> list[Callable[[], tuple[bool, Any]]]:
        """The outcomes to send, in order: the first stage's as shown (staged only), then fn's."""
        if self._first is None:
            return [lambda: _outcome(self._fn)]
        got: list[tuple[bool, Any]] = []

        def first() -> tuple[bool, Any]:
            ok, a = _outcome(self._first)
            got.append((ok, a))
            return (True, self._shown(a)) if ok else (False, a)

        def then() -> tuple[bool, Any]:
            ok, a = got[0]
            return _outcome(lambda: self._fn(a)) if ok else (False, a)

        return [first, then]

    def _here_first(self) -> tuple[bool, Any]:
        if self._a is None:
            self._a = _outcome(self._first)
        return self._a

    def first(self) -> Any:
        """``shown(first())`` (staged only), from the child or computed here."""
        if self._seen is None:
            got = _recv(self._read) if self._pid is not None else None
            if got is None:  # (no child, or it died or sent nothing readable: here, and no more from it)
                self.close()
                ok, a = self._here_first()
                got = (True, self._shown(a)) if ok else (False, a)
            self._seen = got
        ok, value = self._seen
        if not ok:
            raise value
        return value

    def result(self) -> _T:
        """``fn()``'s value, or staged ``fn(first())``'s (raised: what it raised), from the child
        or computed here."""
        if self._first is not None:
            self.first()  # (raises what the first stage raised)
        got = _recv(self._read) if self._pid is not None else None
        self.close()
        if got is None:
            if self._first is None:
                return self._fn()
            ok, a = self._here_first()
            if not ok:
                raise a
            return self._fn(a)
        ok, value = got
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


def _outcome(fn: Callable[[], Any]) -> tuple[bool, Any]:
    """(True, ``fn()``) or (False, what it raised)."""
    try:
        return True, fn()
    except BaseException as e:  # noqa: BLE001 (handed to the caller, which raises it)
        return False, e


#: bytes of a message's length, before its pickle
_LEN = 8


def _recv(fd: int | None) -> tuple[bool, Any] | None:
    """The next message on ``fd``: an outcome, or None where the child died before sending it
    whole or it does not unpickle."""
    if fd is None:
        return None

    def exactly(n: int) -> bytes | None:
        data = bytearray()
        while len(data) < n:
            chunk = os.read(fd, min(n - len(data), 1 << 20))
            if not chunk:
                return None
            data += chunk
        return bytes(data)

    head = exactly(_LEN)
    body = None if head is None else exactly(int.from_bytes(head, "little"))
    try:
        return None if body is None else pickle.loads(body)
    except Exception:
        return None


def _child(stages: list[Callable[[], tuple[bool, Any]]], w: int, nice: int = 0) -> None:
    """The child's whole life (``nice`` added to its niceness first, where it can be): each
    stage's outcome pickled to ``w`` as one message (its length, then its pickle), in order,
    then exit; one that does not pickle ends it (the parent computes the rest)."""
    code = 0
    try:
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if nice:
            try:
                os.nice(nice)
            except (AttributeError, OSError):
                pass  # (only the timing changes)
        for stage in stages:
            try:
                data = pickle.dumps(stage())
            except Exception:
                code = 1  # (the parent computes it then)
                break
            view = memoryview(len(data).to_bytes(_LEN, "little") + data)
            while view:
                view = view[os.write(w, view):]
    except BaseException:  # noqa: BLE001
        code = 1
    finally:
        os._exit(code)
