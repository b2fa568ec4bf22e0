"""``reshard.launch`` puts no wall-clock cap on a healthy run: a run outlives every timeout it
is given (each made short here), while a hung rank is still stopped, with an error that names
what timed out and the knob: a rank left waiting in a collective (the communication timeout,
``timeout_s``), a frozen process (its heartbeat, ``heartbeat_timeout_s``), and the optional
wall-clock cap (``join_timeout_s``)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch
import torch.distributed as dist

import reshard as rs

pytestmark = [pytest.mark.multiproc,
              pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")]

TIMEOUT_S = 5.0  # the communication timeout: long enough for both ranks to rendezvous on a busy machine
HEARTBEAT_S = 2.0


def sum_of_ranks() -> float:
    x = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(x)
    return float(x)


def slow_but_alive(rank: int, seconds: float) -> tuple[float, float, float]:
    """A collective, ``seconds`` without one (asleep, then computing), another collective."""
    first = sum_of_ranks()
    start = time.monotonic()
    time.sleep(seconds / 2)
    a = torch.randn(64, 64)
    while time.monotonic() - start < seconds:
        a = torch.tanh(a @ a)
    return first, sum_of_ranks(), time.monotonic() - start


@pytest.mark.slow
def test_a_healthy_run_outlives_every_timeout_it_is_given() -> None:
    """Each rank spends 1.5x the longest timeout given between two collectives, asleep for half
    of it and computing for the other half (each half longer than the heartbeat's timeout): the
    run ends with its results (before: killed at ``timeout_s + 60``, whatever it was doing)."""
    seconds = 1.5 * max(TIMEOUT_S, HEARTBEAT_S)
    results = rs.launch(slow_but_alive, 2, seconds, timeout_s=TIMEOUT_S, heartbeat_timeout_s=HEARTBEAT_S)
    for first, second, took in results:
        assert (first, second) == (1.0, 1.0)
        assert took >= seconds


def waits_on_a_peer(rank: int) -> float:
    """Rank 1 enters a collective that rank 0, alive but stuck in its own work, never joins."""
    if rank == 0:
        time.sleep(3600)
    return sum_of_ranks()


@pytest.mark.slow
def test_a_rank_left_waiting_in_a_collective_fails_at_the_communication_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(rs.ReshardError) as e:
        rs.launch(waits_on_a_peer, 2, timeout_s=TIMEOUT_S, heartbeat_timeout_s=HEARTBEAT_S, grace_s=1)
    msg = str(e.value)
    assert "rank 1 failed:" in msg and f"launch(timeout_s={TIMEOUT_S:g})" in msg, msg
    assert "rank 0 was still running after another rank failed or hung and was terminated" in msg, msg
    assert time.monotonic() - start < 120  # rank 0's hour of sleep was cut short


def freezes(rank: int) -> float:
    """After a collective, rank 1 stops (SIGSTOP: its heartbeat stops with it); rank 0 is busy."""
    total = sum_of_ranks()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)
    return total


def test_a_frozen_rank_is_found_by_its_heartbeat_and_killed() -> None:
    """No rank waits on a collective (the communication timeout is long): the frozen rank is
    found by its heartbeat, killed, and the live one ended with it."""
    start = time.monotonic()
    with pytest.raises(rs.ReshardError) as e:
        rs.launch(freezes, 2, timeout_s=300, heartbeat_timeout_s=HEARTBEAT_S)
    msg = str(e.value)
    assert "rank 1 was hung: no heartbeat for" in msg and f"launch(heartbeat_timeout_s={HEARTBEAT_S:g})" in msg, msg
    assert "rank 0 was still running after another rank failed or hung and was terminated" in msg, msg
    assert time.monotonic() - start < 120


def sleeps(rank: int) -> int:
    time.sleep(3600)
    return rank


def test_the_wall_clock_cap_applies_only_when_asked_and_is_named() -> None:
    with pytest.raises(rs.ReshardError, match=r"rank 0 was still running at the wall-clock cap "
                                              r"launch\(join_timeout_s=3\)"):
        rs.launch(sleeps, 2, join_timeout_s=3)


@pytest.mark.parametrize("knob,value,message", [
    ("timeout_s", 0, "timeout_s must be a positive number of seconds, got 0"),
    ("timeout_s", None, "timeout_s must be a positive number of seconds, got None"),
    ("heartbeat_timeout_s", -1.0, "heartbeat_timeout_s must be a positive number of seconds or None, got -1.0"),
    ("join_timeout_s", "60", "join_timeout_s must be a positive number of seconds or None, got '60'"),
    ("grace_s", -1, "grace_s must be a non-negative number of seconds, got -1")])
def test_a_timeout_that_is_not_a_number_of_seconds_is_refused(knob: str, value: object, message: str) -> None:
    with pytest.raises(rs.ReshardError, match=re.escape(f"launch: {message}")):
        rs.launch(sleeps, 2, **{knob: value})


def a_plan_rank_1_never_runs(rank: int) -> None:
    """Both ranks build the runtime of a plan with an allgather (3 s team timeout); rank 1,
    alive, never runs it."""
    from reshard.runtime.distributed import DistRuntime
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", rs.DeviceMesh([0, 1], ("tp",)), [rs.Shard(0)])
    f.output(f.gelu(x), [rs.Replicate()])
    plan = rs.optimize(f, cache=False)
    runtime = DistRuntime.from_plan(plan, timeout_s=3, check_inputs=False)
    if rank == 1:
        time.sleep(3600)
    plan.run(plan.shard_inputs({"x": torch.randn(4, 8)})[rank], runtime=runtime)


@pytest.mark.slow
def test_a_collective_timeout_inside_the_runtime_names_its_knobs() -> None:
    """Under torchrun as under launch: the runtime's error says which timeout passed and what sets it."""
    with pytest.raises(rs.ReshardError) as e:
        rs.launch(a_plan_rank_1_never_runs, 2, timeout_s=60, grace_s=1)
    msg = str(e.value)
    assert "rank 0 failed: reshard.ir.errors.ReshardError: rank 0: step " in msg, msg
    assert "the wait for the team passed its timeout, 3 s: DistRuntime(timeout_s=...), $RESHARD_TIMEOUT_S, " \
           "launch(timeout_s=...) or init_from_env(timeout_s=...) set it" in msg, msg
