"""Bounded equality saturation: egglog runs in bounded slices, limits checked between them.

A growth round (``_Runner.phase``) brings the shrinking families (IterDomain laws,
transports, placement analysis) and strategy propagation to a fixpoint, then applies one
iteration of resharding.  Every egglog call runs a bounded slice (``STEP``: at most 40
iterations; a ``(saturate ...)`` schedule inside egglog could not be stopped, and a rule
family that grows without bound kept one such call running forever), so a limit stops the
growth within one slice.  Growth stops at a fixpoint or when a limit (rounds, e-nodes, the
``Deadline`` of the whole optimize() call) is hit; then the e-graph is completed only until
the outputs are reachable (``_complete``; a ``ReshardError`` rather than endless growth past
``hard_cap``), and the report says which limit was hit and which phases were cut.  A family
that multiplies the e-graph within one slice can still exhaust memory there: such families
are fixed at the law (``id_algebra``'s unit laws).  egglog panics are turned into
``ReshardError``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable

from ..ir.errors import ReshardError
from ..rules.schema import unread
from .egglog_pool import eb, note_egglog_used, pool_lost, run_egglog, run_forms
from .encode import Encoding
from .load import load_facts


@dataclass(frozen=True)
class Limits:
    """Bounds of one optimize() call: rounds of the growth phase and e-nodes (both per
    e-graph, i.e. per segment): work, not time, so the same program gets the same plan on any
    machine and under any load; ``time_limit_s``: wall-clock seconds for the whole call
    (saturation, extraction, the sharing search; ``Deadline``; None, the default: no clock),
    a stop for a run far past its expected work: past it, growth stops and only what a first
    plan needs still runs (growing until the outputs are reachable, the cost analysis, one
    greedy extraction, lowering), the report says which phases were cut and ``optimize``
    warns (the plan then depends on the machine's speed and load); and ``segment_ops``: programs with more ops are saturated in segments of about this
    many ops (``segments``), which keeps optimize() time linear in program size."""

    max_iterations: int = 40
    max_enodes: int = 250_000
    time_limit_s: float | None = None
    segment_ops: int = 64
    #: plan a program's repeated layers once (``ir.layers``, ``plan._plan_stack``)
    reuse_layers: bool = True
    #: extraction's model-parallel candidate (``extract.select``: a plan splitting, on the model
    #: axes, only what the parameters' dims index, finished beside the plain one where the plain
    #: search mixes sequence-parallel steps in); off, planning skips its finishing (a forked
    #: child's, or this process's where no core is spare) and the plan may cost more
    model_parallel: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.segment_ops, int) or isinstance(self.segment_ops, bool):
            raise ReshardError(f"Limits: segment_ops must be a positive integer, got {self.segment_ops!r}")
        for name in ("reuse_layers", "model_parallel"):
            if not isinstance(getattr(self, name), bool):
                raise ReshardError(f"Limits: {name} must be a bool, got {getattr(self, name)!r}")
        for name in ("max_iterations", "max_enodes", "time_limit_s", "segment_ops"):
            v = getattr(self, name)
            if v is None and name == "time_limit_s":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ReshardError(f"Limits: {name} must be a positive number, got {v!r}")


@dataclass
class SliceWork:
    """What saturation's egglog calls of one kind did (``_Runner.once``): the calls, the egglog
    iterations they ran, those of them that changed the e-graph, and the seconds.  The changed
    iterations are the costly ones (one that changes nothing costs ~20 us), but by the rows
    their rules match and write, not by their number: the same growth in a third fewer
    changing iterations took as long (design.md, *The e-graph*)."""

    calls: int = 0
    iterations: int = 0
    changed: int = 0
    seconds: float = 0.0


@dataclass
class SaturationReport:
    iterations: int = 0
    enodes: int = 0
    seconds: float = 0.0
    saturated: bool = False
    limit_hit: str | None = None
    #: growth rounds run after a limit was hit, only to make the outputs reachable
    completion_iterations: int = 0
    rule_matches: Counter = field(default_factory=Counter)
    #: egglog's work by the kind of call (``SliceWork``), over every segment: "step" (the
    #: ``ids``, ``analysis`` and ``strategy`` rulesets of a growth round, ``STEP``), "reshard"
    #: (``GROWING``), and each finishing ruleset (``FINISH``)
    work: dict[str, SliceWork] = field(default_factory=dict)
    #: e-graphs the program was saturated in (``segments``), and the one being grown (1-based)
    segments: int = 1
    segment: int = 1
    #: the phases of optimize() a limit cut short, in order ("saturation", "sharing search",
    #: "ILP extraction"; ``Deadline.check``)
    cut: list[str] = field(default_factory=list)
    #: a stack planned once per layer (``plan._plan_stack``): (its depth, the layers planned,
    #: the one of them whose plan was repeated); None: every op was planned
    layers: tuple[int, tuple[int, ...], int] | None = None
    #: the plan came from the plan cache (``reshard.plan_cache``): this report is the one of
    #: the call that made it
    cached: bool = False
    #: what optimize() does as ``progress`` gets this report: "saturation" (a growth round
    #: ended), "extraction" (saturation ended; extracting the plan, the longer phase on large
    #: programs, follows: ``saturation_ended``, then a report per ``step`` of it)
    phase: str = "saturation"
    #: in phase "extraction", what extraction does now ("" when it starts; ``extraction_steps``):
    #: "greedy", "sharing search 12/154 re-extractions" (so far / the budget's), "sharing
    #: search releasing 1/3", "data-axis search", "exact windows 40/205",
    #: "gradient buckets ...", "adopting alternatives", "second candidate", "lowering"
    step: str = ""

    def __str__(self) -> str:
        state = "saturated" if self.saturated else f"stopped: {self.limit_hit}"
        if self.completion_iterations:
            state += f", then {self.completion_iterations} iterations to reach the outputs"
        if self.cut:
            state += f"; cut short: {', '.join(self.cut)}"
        where = f" in {self.segments} segments" if self.segments > 1 else ""
        reuse = ""
        if self.layers is not None:
            depth, kept, t = self.layers
            reuse = (f"; {depth} layers: planned layers {', '.join(map(str, kept))}, layer {kept[t]}'s plan "
                     f"repeated for layers {kept[t]}..{depth - len(kept) + t}")
        cached = "; from the plan cache" if self.cached else ""
        return (f"{self.iterations} iterations{where}, {self.enodes} e-nodes, {self.seconds:.2f} s, "
                f"{state}{reuse}{cached}")


class Deadline:
    """The end of one optimize() call's time budget: ``limit_s`` seconds after ``start`` (None:
    never).  ``check(phase)`` says whether it has passed, and records ``phase`` in ``cut``
    (once) when it has: the phase that asked stops there."""

    def __init__(self, limit_s: float | None, start: float | None = None) -> None:
        self.limit_s = limit_s
        self.start = time.perf_counter() if start is None else start
        self.cut: list[str] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return math.inf if self.limit_s is None else self.limit_s - self.elapsed()

    def passed(self) -> bool:
        return self.limit_s is not None and self.elapsed() > self.limit_s

    def check(self, phase: str) -> bool:
        if not self.passed():
            return False
        if phase not in self.cut:
            self.cut.append(phase)
        return True


def _count_enodes(egraph: eb.EGraph) -> int:
    out = run_egglog(egraph, "(print-size)", "size query")
    total = 0
    for o in out:
        sizes = getattr(o, "sizes", None)
        if sizes is not None:
            total += sum(n for name, n in sizes if not unread(name))
    return total


def _record(report: SaturationReport, outputs: list) -> tuple[bool, int]:
    """Add a run's rule matches to ``report``; (did it change the e-graph, matches)."""
    updated, matches = False, 0
    for o in outputs:
        rep = getattr(o, "report", None)
        if rep is None:
            continue
        updated |= bool(rep.updated)
        for name, n in rep.num_matches_per_rule.items():
            report.rule_matches[name] += n
            matches += n
    return updated, matches


#: the round's last step: one iteration of resharding
GROWING = "reshard"
#: run to a fixpoint after growth: the analyses (for the new classes), aliases, recomputes, costs
FINISH = ("ids", "analysis", "alias", "remat", "cost")


def output_checks(enc: Encoding) -> list[str]:
    """``check`` facts that hold once every output value exists at its required dist."""
    return [f"(real {tid} {let})" for (tid, _), let in zip(enc.fusion.outputs, enc.output_lets)]


def _reachable(egraph: eb.EGraph, checks: list[str]) -> bool:
    """Do all ``checks`` hold?  A ``real`` term is only ever created together with an
    implementation whose operands are older ``real`` terms, so existence means a plan exists."""
    for c in checks:
        try:
            egraph.run_program(*egraph.parse_program(f"(check {c})"))
        except eb.EggSmolError:
            return False
    return True


#: one bounded slice of a growth round's propagation, at most ``4 * (6 + 3 + 1)`` egglog
#: iterations: a few times over, the shrinking families (IterDomain laws and transports,
#: placement analysis: a strategy's result needs a chain of them before the next strategy
#: iteration can use it) and one iteration of strategy.  A slice that changes nothing means
#: all three are at a fixpoint; iterations that change nothing are cheap.  (Measured: 5-10%
#: more saturation time than egglog's unbounded nested ``saturate`` schedule; one iteration
#: per call, or fewer of the shrinking ones per strategy iteration, 15-20% more.)
STEP = "(run-schedule (repeat 4 (repeat 6 (run ids)) (repeat 3 (run analysis)) (run strategy)))"


#: rule matches between two recounts of the e-graph's size (a match adds a few rows at most)
RECOUNT_MATCHES = 2_000


def hard_cap(limits: Limits) -> int:
    """E-nodes past which completing a plan gives up (``ReshardError``) rather than grow on."""
    return 4 * max(limits.max_enodes, 250_000)


class _Runner:
    """Bounded slices of saturation per egglog call (each parsed once), so that the caller
    can stop between any two; ``rows()`` is the e-graph's size (recounted when enough rules
    matched since the last count)."""

    def __init__(self, egraph: eb.EGraph, report: SaturationReport) -> None:
        self.egraph, self.report = egraph, report
        self.cmds = {r: egraph.parse_program(f"(run-schedule (repeat 8 (run {r})))") for r in FINISH}
        self.cmds[GROWING] = egraph.parse_program(f"(run-schedule (run {GROWING}))")
        self.cmds["step"] = egraph.parse_program(STEP)
        self.size, self.unchecked = _count_enodes(egraph), 0

    def once(self, name: str) -> bool:
        """One slice (a ruleset's name: 8 iterations of it, one of ``GROWING``; "step":
        ``STEP``); did it change the e-graph?"""
        start = time.perf_counter()
        outputs = run_egglog(self.egraph, self.cmds[name], f"saturation ({name})")
        work = self.report.work.setdefault(name, SliceWork())
        work.seconds += time.perf_counter() - start
        work.calls += 1
        for o in outputs:
            for it in getattr(getattr(o, "report", None), "iterations", ()):
                work.iterations += 1
                work.changed += bool(it.rule_set_report.changed)
        updated, matches = _record(self.report, outputs)
        self.unchecked += matches
        return updated

    def rows(self) -> int:
        if self.unchecked > RECOUNT_MATCHES:
            self.size, self.unchecked = _count_enodes(self.egraph), 0
        return self.size

    def fixpoint(self, name: str, stop: Callable[[], bool], max_slices: int | None = None) -> bool | None:
        """Slices ``name`` until one changes nothing or ``max_slices`` ran: did any change the
        e-graph?  None when ``stop()`` said to stop first."""
        changed = False
        n = 0
        while max_slices is None or n < max_slices:
            if stop():
                return None
            if not self.once(name):
                return changed
            changed, n = True, n + 1
        return changed

    def phase(self, stop: Callable[[], bool]) -> bool | None:
        """One growth round: the shrinking families and strategy to a fixpoint (strategies
        propagate through the whole segment, ``STEP``), then one iteration of ``GROWING``.
        Did it change the e-graph?  None when ``stop()`` said to stop first (between two
        slices)."""
        updated = self.fixpoint("step", stop)
        if updated is None or stop():
            return None
        return self.once(GROWING) | updated

    def finish(self, stop: Callable[[], bool], cap: int | None) -> None:
        """``FINISH``: each ruleset to a fixpoint, in order; the shrinking families at most
        ``cap`` slices each (after a limit: a family that never reaches a fixpoint cannot
        hold up the plan; the classes it did not finish analysing only lack alternatives)."""
        for r in FINISH:
            if self.fixpoint(r, stop, cap if r in ("ids", "analysis") else None) is None:
                return


def completion_slices(ops: int) -> int:
    """Slices of propagation in a completion round: enough for strategies to cross ``ops``
    ops (about one strategy iteration per op of depth, four per slice), and a bound on what
    a family that never reaches a fixpoint can take before the round's resharding."""
    return ops // 4 + 2


def _complete(run: _Runner, checks: list[str], ops: int, stop: Callable[[], bool]) -> int:
    """After a limit stopped exploration: keep growing only until ``checks`` hold (the outputs
    are reachable: a limit bounds the search, it must not leave the user without a plan).
    Growth rounds as ``_Runner.phase``, with the propagation capped at
    ``completion_slices(ops)`` slices and ``checks`` tried after each; returns the rounds
    run (or those before ``stop()`` said to give up)."""
    rounds = 0
    while not _reachable(run.egraph, checks):
        changed = False
        for _ in range(completion_slices(ops)):
            if stop():
                return rounds
            if not run.once("step"):
                break
            changed = True
            if _reachable(run.egraph, checks):
                return rounds + 1
        if stop():
            return rounds
        if not run.once(GROWING) and not changed:
            break  # saturated without reaching the outputs: extraction reports it
        rounds += 1
    return rounds


def _grow(run: _Runner, limits: Limits, deadline: Deadline,
          progress: Callable[[SaturationReport], None] | None, enodes_before: int) -> str | None:
    """Growth rounds (``_Runner.phase``) until nothing changes or a limit is hit; returns the
    limit hit.  The deadline and the e-graph's size are checked between any two slices.
    ``enodes_before``: e-nodes of earlier segments (reported in the sum; the e-node limit
    bounds the e-graph being grown)."""
    report = run.report
    rounds = 0
    while True:
        if rounds >= limits.max_iterations:
            return f"max_iterations={limits.max_iterations}"
        updated = run.phase(lambda: deadline.passed() or run.rows() > limits.max_enodes)
        report.seconds = deadline.elapsed()
        size = _count_enodes(run.egraph)
        report.enodes = enodes_before + size
        too_big = f"max_enodes={limits.max_enodes} ({size} e-nodes)"
        timeout = f"time_limit_s={limits.time_limit_s} ({report.seconds:.1f} s)"
        if updated is None:  # stopped within the round
            return too_big if size > limits.max_enodes else timeout
        report.iterations += 1
        rounds += 1
        if progress is not None:
            progress(report)
        if not updated:
            return None
        if size > limits.max_enodes:
            return too_big


def new_egraph(declarations: str) -> eb.EGraph:
    """An e-graph with reshard's ``declarations`` (sorts, tables, rules) loaded, one command at a
    time (``egglog_pool.run_forms``: the tiny Llama's tp 2 training plan's 0.30 -> 0.05 s).  In a child
    forked after egglog ran (``egglog_pool``) egglog would wait forever: a ``ReshardError``
    (``optimize()`` itself moves such a call to a fresh interpreter before it gets here)."""
    if pool_lost():
        raise ReshardError("egglog cannot run in a process forked after egglog ran in its parent (its thread pool "
                           "does not survive fork()): call reshard.optimize(), which plans in a fresh interpreter "
                           "there, or start the process with the 'spawn' method")
    note_egglog_used()
    egraph = eb.EGraph()
    run_forms(egraph, declarations, "declarations")
    return egraph


class _Idle(threading.local):
    """This thread's e-graphs holding only their declarations, idle, by declarations text
    (``declared``).  Per thread: egglog's ``EGraph`` is pinned to the thread that made it (pyo3
    ``unsendable``: used from another thread it panics, dropped from another it leaks with an
    error), so a thread reuses only its own, and they are dropped with the thread's locals, in
    that thread, when it ends.  (A child forked while another thread holds idle e-graphs drops
    that thread's locals itself: pyo3 leaks those e-graphs there and prints an error for each;
    nothing else happens, egglog does not run in such a child, ``new_egraph``.)"""

    def __init__(self) -> None:
        self.egraphs: dict[str, eb.EGraph] = {}


_IDLE = _Idle()
#: at most this many idle e-graphs are kept per thread (each tens of MB)
IDLE_KEPT = 2


@contextmanager
def declared(declarations: str) -> Iterator[eb.EGraph]:
    """An e-graph holding ``declarations`` for the block, which must hand it back holding
    them only (every fact in ``scratch`` blocks): one an earlier block of this thread handed
    back, idle, else a new one (``new_egraph``); kept idle after the block (the last
    ``IDLE_KEPT`` declarations texts of the thread).  egglog takes 0.05 s for the
    declarations run command by command (``new_egraph``; 0.16-0.30 s as one program text), and
    a process that plans often (a test run, a sweep, ``optimize_symbolic``) mostly plans with
    the same rules.

    Law: the block sees what a new e-graph of ``declarations`` is (egglog's ``pop`` restores
    the e-graph ``push`` saved, so the plan is the same: ``scripts/plan_digests.py``).  One
    block at a time holds an e-graph (a nested block of the same declarations gets a new one);
    an e-graph is only ever used in the thread that made it (``_Idle``); none is reused in a
    process forked after egglog ran (``new_egraph``'s error)."""
    idle = _IDLE.egraphs
    egraph = idle.pop(declarations, None)
    if egraph is None or pool_lost():
        egraph = new_egraph(declarations)
    yield egraph
    idle[declarations] = egraph
    while len(idle) > IDLE_KEPT:
        del idle[next(iter(idle))]


@contextmanager
def scratch(egraph: eb.EGraph) -> Iterator[eb.EGraph]:
    """``egraph`` for the block, restored as it was after it (egglog ``push``/``pop``): segments
    (and one-segment programs) grow one after another on top of one e-graph of declarations,
    compiled once."""
    run_egglog(egraph, "(push)", "push")
    try:
        yield egraph
    finally:
        run_egglog(egraph, "(pop)", "pop")


def saturate_facts(egraph: eb.EGraph, facts: list[str], checks: list[str], ops: int, limits: Limits,
                   report: SaturationReport, deadline: Deadline,
                   progress: Callable[[SaturationReport], None] | None = None) -> str | None:
    """Load the ``facts`` (of ``ops`` ops) into ``egraph`` (``new_egraph``; ``load_facts``), grow it
    within ``limits`` and ``deadline``, complete it until ``checks`` hold if a limit stopped
    it, and run the cost analysis; returns the limit that stopped its growth (None:
    saturated).  ``report`` accumulates over calls (one per segment).

    (Saturating after each loaded chunk reaches the same e-graph but was measured slower:
    an egglog iteration costs time proportional to the whole e-graph, and per-chunk
    saturation runs more of them.)"""
    enodes_before = report.enodes
    _record(report, load_facts(egraph, facts))
    run = _Runner(egraph, report)
    hit = _grow(run, limits, deadline, progress, enodes_before)
    cap = hard_cap(limits)

    def too_big() -> bool:
        return run.rows() > cap

    if hit is not None:
        report.limit_hit = report.limit_hit or hit
        if "saturation" not in report.cut:
            report.cut.append("saturation")
        report.completion_iterations += _complete(run, checks, ops, too_big)
    run.finish(too_big, None if hit is None else completion_slices(ops))
    if too_big():
        raise ReshardError(f"optimize: the e-graph grew past {cap} e-nodes while completing a plan after the "
                           f"limit {hit}; a rule family does not terminate on this program (please report it)")
    report.enodes = enodes_before + _count_enodes(egraph)
    report.seconds = deadline.elapsed()
    return hit


def saturation_ended(report: SaturationReport, progress: Callable[[SaturationReport], None] | None) -> None:
    """Tell ``progress`` (if any) that saturation ended and extraction starts: a copy of
    ``report`` in phase "extraction", step "" (``extraction_steps``; the report itself stays
    as it is)."""
    say = extraction_steps(report, progress)
    if say is not None:
        say("")


def extraction_steps(report: SaturationReport, progress: Callable[[SaturationReport], None] | None
                     ) -> Callable[[str], None] | None:
    """The call extraction reports each step with (None without ``progress``): ``progress``
    gets a copy of ``report`` in phase "extraction" with that ``step``.  Only from this
    process: a forked child that finishes a candidate beside it (``extract.second_core``)
    reports nothing."""
    if progress is None:
        return None
    here = os.getpid()

    def say(step: str) -> None:
        if os.getpid() == here:
            progress(replace(report, phase="extraction", step=step))

    return say


def check_limits(limits: Limits) -> None:
    if not isinstance(limits, Limits):
        raise ReshardError(f"optimize: limits must be a reshard.Limits, got {type(limits).__name__}")
