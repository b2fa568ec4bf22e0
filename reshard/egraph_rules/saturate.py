"""Bounded equality saturation: one phase at a time, limits checked between iterations.

Each iteration saturates the shrinking families (IterDomain laws, transports, placement
analysis) and then applies one round of the growing ones (strategies, resharding).  The
loop stops at a fixpoint or when a limit (iterations, e-nodes, wall time) is hit; the
report says which.  egglog panics are turned into ``ReshardError``.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import egglog.bindings as eb

from ..ir.errors import ReshardError
from .encode import Encoding


@dataclass(frozen=True)
class Limits:
    """Saturation bounds: rounds of the growth phase and e-nodes (both per e-graph, i.e. per
    segment), seconds (in all); and
    ``segment_ops``: programs with more ops are saturated in segments of about this many
    ops (``segments``), which keeps optimize() time linear in program size."""

    max_iterations: int = 40
    max_enodes: int = 250_000
    time_limit_s: float = 20.0
    segment_ops: int = 64

    def __post_init__(self) -> None:
        if not isinstance(self.segment_ops, int) or isinstance(self.segment_ops, bool):
            raise ReshardError(f"Limits: segment_ops must be a positive integer, got {self.segment_ops!r}")
        for name in ("max_iterations", "max_enodes", "time_limit_s", "segment_ops"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ReshardError(f"Limits: {name} must be a positive number, got {v!r}")


@dataclass
class SaturationReport:
    iterations: int = 0
    enodes: int = 0
    seconds: float = 0.0
    saturated: bool = False
    limit_hit: str | None = None
    #: growth iterations run after a limit was hit, only to make the outputs reachable
    completion_iterations: int = 0
    rule_matches: Counter = field(default_factory=Counter)
    #: e-graphs the program was saturated in (``segments``), and the one being grown (1-based)
    segments: int = 1
    segment: int = 1

    def __str__(self) -> str:
        state = "saturated" if self.saturated else f"stopped: {self.limit_hit}"
        if self.completion_iterations:
            state += f", then {self.completion_iterations} iterations to reach the outputs"
        where = f" in {self.segments} segments" if self.segments > 1 else ""
        return f"{self.iterations} iterations{where}, {self.enodes} e-nodes, {self.seconds:.2f} s, {state}"


def _is_panic(e: BaseException) -> bool:
    return type(e).__name__ == "PanicException"


def run_egglog(egraph: eb.EGraph, text: str | list, what: str) -> list:
    """Run egglog program ``text`` (or commands already parsed from it) on ``egraph``; egglog
    errors and panics become ``ReshardError``."""
    try:
        return egraph.run_program(*(egraph.parse_program(text) if isinstance(text, str) else text))
    except eb.EggSmolError as e:
        raise ReshardError(f"egglog rejected the {what}: {e}") from e
    except BaseException as e:  # pyo3 PanicException derives from BaseException
        if _is_panic(e):
            raise ReshardError(f"egglog panicked during {what}: {e}") from e
        raise


def _count_enodes(egraph: eb.EGraph) -> int:
    out = run_egglog(egraph, "(print-size)", "size query")
    total = 0
    for o in out:
        sizes = getattr(o, "sizes", None)
        if sizes is not None:
            total += sum(n for _, n in sizes)
    return total


def _record(report: SaturationReport, outputs: list) -> bool:
    updated = False
    for o in outputs:
        rep = getattr(o, "report", None)
        if rep is None:
            continue
        updated |= bool(rep.updated)
        for name, n in rep.num_matches_per_rule.items():
            report.rule_matches[name] += n
    return updated


PHASE = "(run-schedule (saturate (saturate (run ids)) (saturate (run analysis)) (run strategy)) (run reshard))"
FINISH = "(run-schedule (saturate (run ids)) (saturate (run analysis)) (saturate (run alias)) (saturate (run cost)))"


#: facts per loaded chunk: egglog's parser is quadratic in the length of one program text.
FACT_CHUNK = 200


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


def _complete(egraph: eb.EGraph, checks: list[str], report: SaturationReport) -> int:
    """After a limit stopped exploration: keep growing only until ``checks`` hold (the outputs
    are reachable: a limit bounds the search, it must not leave the user without a plan)."""
    extra = 0
    while not _reachable(egraph, checks):
        if not _record(report, run_egglog(egraph, PHASE, "saturation (completion)")):
            break  # saturated without reaching the outputs: extraction reports it
        extra += 1
    return extra


def _grow(egraph: eb.EGraph, limits: Limits, report: SaturationReport, start: float,
          progress: Callable[[SaturationReport], None] | None, enodes_before: int) -> str | None:
    """Rounds of PHASE until nothing changes or a limit is hit; returns the limit hit.
    ``enodes_before``: e-nodes of earlier segments (reported in the sum; the e-node limit
    bounds the e-graph being grown)."""
    rounds = 0
    while True:
        if rounds >= limits.max_iterations:
            return f"max_iterations={limits.max_iterations}"
        updated = _record(report, run_egglog(egraph, PHASE, "saturation"))
        report.iterations += 1
        rounds += 1
        size = _count_enodes(egraph)
        report.enodes = enodes_before + size
        report.seconds = time.perf_counter() - start
        if progress is not None:
            progress(report)
        if not updated:
            return None
        if size > limits.max_enodes:
            return f"max_enodes={limits.max_enodes} ({size} e-nodes)"
        if report.seconds > limits.time_limit_s:
            return f"time_limit_s={limits.time_limit_s} ({report.seconds:.1f} s)"


def saturate_chunks(declarations: str | list, chunks: list[str], checks: list[str], limits: Limits,
                    report: SaturationReport, start: float,
                    progress: Callable[[SaturationReport], None] | None = None) -> eb.EGraph:
    """One e-graph: load ``declarations`` and the fact ``chunks``, grow it within ``limits``
    (time counted from ``start``), complete it until ``checks`` hold if a limit stopped it,
    and run the cost analysis.  ``report`` accumulates over calls (one per segment);
    ``declarations`` may be parsed once (``parse_declarations``) and shared by the calls."""
    enodes_before = report.enodes
    egraph = eb.EGraph()
    run_egglog(egraph, declarations, "declarations")
    for chunk in chunks:
        run_egglog(egraph, chunk, "program facts")
    hit = _grow(egraph, limits, report, start, progress, enodes_before)
    if hit is not None:
        report.limit_hit = report.limit_hit or hit
        report.completion_iterations += _complete(egraph, checks, report)
    _record(report, run_egglog(egraph, FINISH, "cost analysis"))
    report.enodes = enodes_before + _count_enodes(egraph)
    report.seconds = time.perf_counter() - start
    return egraph


def parse_declarations(text: str) -> list:
    """The declarations' egglog commands, parsed once for several e-graphs (parsing and
    compiling the rules is most of what loading them into an e-graph costs)."""
    egraph = eb.EGraph()
    try:
        return egraph.parse_program(text)
    except eb.EggSmolError as e:
        raise ReshardError(f"egglog rejected the declarations: {e}") from e


def check_limits(limits: Limits) -> None:
    if not isinstance(limits, Limits):
        raise ReshardError(f"optimize: limits must be a reshard.Limits, got {type(limits).__name__}")


def saturate(enc: Encoding, limits: Limits, progress: Callable[[SaturationReport], None] | None = None
             ) -> tuple[eb.EGraph, SaturationReport]:
    """Build the e-graph for the whole of ``enc`` and grow it within ``limits``
    (``segments.saturate_program`` cuts deep programs into segments first).

    (Saturating after each loaded chunk reaches the same e-graph but was measured slower:
    an egglog iteration costs time proportional to the whole e-graph, and per-chunk
    saturation runs more of them.)
    """
    check_limits(limits)
    report = SaturationReport()
    egraph = saturate_chunks(enc.declarations, enc.chunks(FACT_CHUNK), output_checks(enc), limits, report,
                             time.perf_counter())
    report.saturated = report.limit_hit is None
    return egraph, report
