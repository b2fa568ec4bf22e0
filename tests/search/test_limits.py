"""Bounded optimize() on pathological inputs (issue 8, item 3): long chains of reshapes back
and forth over sharded dims (each one multiplies IterDomain terms) on wide meshes.  With
every kind of limit the optimizer stops, says which limit it hit, and still returns a plan
that is correct; run in a child process with a capped address space it neither hangs nor
exhausts memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import reshard as rs
from reshard import Replicate, Shard
from tests.fuzz.test_fuzz import check_plan

MESH_2x3 = rs.DeviceMesh([[0, 1, 2], [3, 4, 5]], ("x", "y"))
MESH_2x2x2 = rs.DeviceMesh([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], ("a", "b", "c"))
#: shapes of 96 elements whose factors cut across the sharded dims in different places
SHAPES = [(96,), (4, 24), (3, 32), (2, 4, 12), (6, 16), (8, 12), (24, 4), (12, 8)]


def reshape_chain(mesh: rs.DeviceMesh, n: int) -> rs.Fusion:
    """x [8, 12] sharded on dim 0 -> n reshapes through SHAPES (with an exp every 5 so that
    values are not all views) -> [8, 12] required sharded on dim 1."""
    rest = [Replicate()] * (mesh.ndim - 1)
    f = rs.Fusion()
    y = f.input("x", (8, 12), "float64", mesh, [Shard(0)] + rest)
    for i in range(n):
        y = f.reshape(y, SHAPES[i % len(SHAPES)])
        if i % 5 == 4:
            y = f.tanh(y)
    f.output(f.reshape(y, (8, 12)), [Shard(1)] + rest)
    return f


@pytest.mark.parametrize("limits, hit", [
    (rs.Limits(max_iterations=1), "max_iterations=1"),
    (rs.Limits(max_enodes=500), "max_enodes=500"),
    (rs.Limits(time_limit_s=0.01), "time_limit_s=0.01"),
], ids=["iterations", "enodes", "time"])
def test_every_limit_stops_with_a_correct_plan_and_says_so(limits, hit):
    f = reshape_chain(MESH_2x2x2, 24)
    plan = rs.optimize(f, limits=limits)
    assert plan.report.limit_hit is not None and plan.report.limit_hit.startswith(hit), plan.report
    assert not plan.report.saturated
    assert f"stopped: {hit}" in str(plan.report)
    check_plan(plan, f, 0, "limited plan")


def test_unlimited_run_of_the_same_program_saturates_and_is_no_worse():
    f = reshape_chain(MESH_2x3, 24)
    full = rs.optimize(f)
    cut = rs.optimize(f, limits=rs.Limits(max_iterations=1))
    assert full.report.saturated and full.report.limit_hit is None
    assert full.cost <= cut.cost + 1e-12
    check_plan(full, f, 1, "saturated plan")


def test_limits_are_validated():
    with pytest.raises(rs.ReshardError, match="max_iterations"):
        rs.optimize(reshape_chain(MESH_2x3, 2), limits=rs.Limits(max_iterations=0))
    with pytest.raises(rs.ReshardError, match="limits"):
        rs.optimize(reshape_chain(MESH_2x3, 2), limits={"max_iterations": 3})  # type: ignore[arg-type]
    for flag in ("reuse_layers", "model_parallel"):
        with pytest.raises(rs.ReshardError, match=f"{flag} must be a bool"):
            rs.Limits(**{flag: 1})


#: a child under an address-space cap: one BLAS thread (OpenBLAS reserves a buffer per thread of
#: the machine's cores, which on 16 cores failed under the 4 GiB cap before reshard ran)
_CAPPED_ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}


@pytest.mark.multiproc
@pytest.mark.slow
def test_pathological_chain_neither_hangs_nor_exhausts_memory():
    """Default limits, 40 reshapes on a 2x3 mesh, in a child with a 4 GiB address-space cap
    and a wall-clock timeout: it must return a plan."""
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, resource.RLIM_INFINITY))
        import reshard as rs
        from tests.search.test_limits import MESH_2x3, reshape_chain
        plan = rs.optimize(reshape_chain(MESH_2x3, 40), cache=False)
        print("plan", len(plan.steps), plan.report)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_CAPPED_ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("plan "), r.stdout


# ---- the time limit bounds the whole call (issue 18) ------------------------------------------

def test_a_tiny_time_limit_cuts_every_optional_phase_and_the_plan_is_correct():
    """Past the time limit only what a first plan needs runs: no growth round, the completion
    until the outputs (and every segment's seam values) are reachable, the cost analysis, one
    greedy extraction (no sharing search), lowering; the report names what was cut."""
    from reshard.examples import transformer_stack
    f = transformer_stack(3)
    plan = rs.optimize(f, limits=rs.Limits(time_limit_s=0.001, segment_ops=32))
    report = plan.report
    assert report.segments > 1 and report.iterations == 0, report
    assert report.limit_hit.startswith("time_limit_s=0.001") and report.completion_iterations > 0
    assert report.cut == ["saturation", "sharing search"], report.cut
    assert "cut short: saturation, sharing search" in str(report)
    assert plan.extraction.search_evals == 0
    check_plan(plan, f, 0, "time-limited plan")


def test_the_ilp_gets_only_the_time_left():
    f = reshape_chain(MESH_2x3, 4)
    plan = rs.optimize(f, limits=rs.Limits(time_limit_s=0.001), extractor="ilp", ilp_time_limit_s=30)
    assert "saturation" in plan.report.cut and plan.extraction.extractor.startswith("ilp")
    check_plan(plan, f, 0, "time-limited ILP plan")


def test_the_ilp_path_stops_its_sharing_search_at_the_limit():
    """The ILP's incumbent (greedy + sharing search) obeys the same deadline as the greedy path."""
    from reshard.examples import transformer_stack
    f = transformer_stack(1)
    plan = rs.optimize(f, limits=rs.Limits(time_limit_s=0.001), extractor="ilp", ilp_time_limit_s=30)
    assert "sharing search" in plan.report.cut, plan.report.cut
    check_plan(plan, f, 0, "time-limited ILP plan")


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_rule_that_never_saturates_is_stopped_by_the_time_limit():
    """A single egglog run is bounded: growth runs in slices of a few iterations, so even a
    rule family that never reaches a fixpoint (here a test-only rule adding a new transport
    term per iteration) stops at the time limit, and the completion still finds a correct
    plan.  (Growth used to run as one nested egglog ``saturate`` schedule: this never
    returned.)  No e-node limit in practice: the rule grows the e-graph past 250k e-nodes
    within the second, and the time limit is the one under test."""
    code = textwrap.dedent("""
        import resource, time
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, resource.RLIM_INFINITY))
        import reshard as rs
        from reshard.rules import id_algebra
        from reshard.rules.rule import Rule
        from reshard.testing import programs as P
        from tests.fuzz.test_fuzz import check_plan
        id_algebra.RULES.append(Rule("never-saturates", "test only: one more Tr term per iteration",
                                     "(= y (Tr x c)) (< c 1000000000)", "(Tr y (+ c 1000))", "ids"))
        f = P.mlp()
        t0 = time.perf_counter()
        plan = rs.optimize(f, limits=rs.Limits(time_limit_s=1, max_enodes=10**8), cache=False)  # the rule is no source file
        print(f"{time.perf_counter() - t0:.1f} s;", plan.report)
        check_plan(plan, f, 0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_CAPPED_ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "stopped: time_limit_s=1" in r.stdout and "cut short: saturation" in r.stdout, r.stdout


def test_completion_that_keeps_growing_gives_up_with_an_error(monkeypatch):
    """Past a limit the completion grows only as far as ``hard_cap``: a rule family that never
    saturates then ends in a clear ``ReshardError``, not in endless growth."""
    from reshard.rules import id_algebra
    from reshard.search import saturate
    from reshard.rules.rule import Rule
    from reshard.testing import programs as P
    monkeypatch.setattr(id_algebra, "RULES", id_algebra.RULES + [
        Rule("never-saturates", "test only: one more Tr term per iteration", "(= y (Tr x c)) (< c 1000000000)",
             "(Tr y (+ c 1000))", "ids")])
    monkeypatch.setattr(saturate, "hard_cap", lambda limits: 3 * limits.max_enodes)
    with pytest.raises(rs.ReshardError, match="grew past 6000 e-nodes while completing a plan after the limit"):
        rs.optimize(P.mlp(), limits=rs.Limits(max_enodes=2000))
