"""``reshard.launch`` says what went wrong in a spawned process: the exception's type, message
and traceback (sent back through the result folder, and chained), a function that cannot be
sent or loaded, and a main module that calls ``launch`` without the ``__main__`` guard; both
start methods run the ranks with the caller's environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import reshard as rs
from reshard.testing.child_env import child_env

pytestmark = pytest.mark.multiproc

ROOT = Path(__file__).resolve().parents[2]
GUARD = 'if __name__ == "__main__":'


def failing_or_unpicklable(rank: int) -> object:
    """After a barrier (both ranks' process groups fully connected: on a loaded machine rank 1
    could otherwise exit while rank 0's gloo still connected to it), rank 1 raises; rank 0
    returns, a second later, a value that cannot be sent back."""
    import torch.distributed as dist

    dist.barrier()
    if rank == 1:
        raise KeyError("no input named 'w9' on rank 1")
    time.sleep(1.0)
    return lambda: rank


@pytest.mark.slow
def test_a_child_exception_comes_back_with_type_message_and_traceback() -> None:
    with pytest.raises(rs.ReshardError) as e:
        rs.launch(failing_or_unpicklable, 2, timeout_s=30, grace_s=3)
    msg = str(e.value)
    assert "rank 1 failed: KeyError: \"no input named 'w9' on rank 1\"" in msg
    assert "Traceback (most recent call last)" in msg and "in failing_or_unpicklable" in msg
    assert "rank 0 failed: reshard.ir.errors.ReshardError: rank 0: fn's return value could not be sent back" in msg
    assert isinstance(e.value.__cause__, KeyError)  # the earliest failure's exception itself, chained


def rank_sum_and_mark(rank: int) -> tuple[int, str | None]:
    """The sum of the ranks (a gloo all-reduce) and the rank's ``$RESHARD_TEST_MARK``."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank])
    dist.all_reduce(t)
    return int(t), os.environ.get("RESHARD_TEST_MARK")


def test_forkserver_ranks_run_with_the_callers_environment(monkeypatch) -> None:
    """A forkserver started by an earlier launch forks later ranks from its own environment:
    they still see the caller's, as it is at the call (as spawned ranks do: the tests of the
    main-module guard below run ``spawn``, a user script's default)."""
    rs.launch(rank_sum_and_mark, 2, timeout_s=30, start_method="forkserver")  # a forkserver starts here
    monkeypatch.setenv("RESHARD_TEST_MARK", "set after the first launch")
    got = rs.launch(rank_sum_and_mark, 2, timeout_s=30, start_method="forkserver")
    assert got == [(1, "set after the first launch")] * 2


def test_an_unknown_start_method_is_refused_before_starting() -> None:
    with pytest.raises(rs.ReshardError, match="start_method .* must be 'spawn' or 'forkserver', got 'fork'"):
        rs.launch(rank_sum_and_mark, 2, start_method="fork")


def test_a_function_that_does_not_pickle_is_refused_before_spawning() -> None:
    with pytest.raises(rs.ReshardError, match="not a lambda or a nested function"):
        rs.launch(lambda rank: rank, 2)


def _run_python(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = child_env(ROOT, GLOO_SOCKET_IFNAME="lo", RESHARD_START_METHOD="spawn")  # a user script's default
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=240, cwd=cwd, env=env)


SCRIPT = """\
import reshard as rs


def worker(rank):
    return rank


def report(call):
    try:
        call()
    except rs.ReshardError as e:
        print("LAUNCH ERROR:", e)
    else:
        print("LAUNCH OK")
"""


@pytest.mark.slow
def test_a_main_module_without_the_guard_is_named_with_the_guard(tmp_path: Path) -> None:
    """spawn re-imports the script in every process, which calls launch again there: the
    parent's error (not only the children's stderr) names the guard."""
    p = tmp_path / "unguarded.py"
    p.write_text(SCRIPT + "report(lambda: rs.launch(worker, 2, timeout_s=30, grace_s=3))\n")
    r = _run_python([str(p)], tmp_path)
    out = r.stdout.split("LAUNCH ERROR:", 1)
    assert len(out) == 2, r.stdout + r.stderr[-3000:]
    assert "ranks 0, 1 failed: reshard.ir.errors.ReshardError: launch was called while a spawned process " \
           f"re-imported the main module {p}" in out[1]
    assert GUARD in out[1]


@pytest.mark.slow
def test_a_function_the_children_cannot_load_is_reported(tmp_path: Path) -> None:
    """A function of a main module that spawned processes cannot import (``python -c``: no
    file to re-import) fails to load in the children; the error says why."""
    guarded = SCRIPT + f"{GUARD}\n    report(lambda: rs.launch(worker, 2, timeout_s=30))\n"
    r = _run_python(["-c", guarded], tmp_path)
    out = r.stdout.split("LAUNCH ERROR:", 1)
    assert len(out) == 2, r.stdout + r.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} failed: reshard.ir.errors.ReshardError: rank {rank} could not load fn" in out[1]
    assert "AttributeError" in out[1]  # the unpickling error, in the chained traceback


def plan_on_more_ranks_than_the_world(rank: int) -> None:
    """A plan for a 2-rank "tp" mesh run by a world of 1 process."""
    from reshard.runtime.distributed import DistRuntime
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", rs.DeviceMesh([0, 1], ("tp",)), [rs.Shard(0)])
    f.output(f.gelu(x), [rs.Shard(0)])
    DistRuntime.from_plan(rs.optimize(f, cache=False))


def test_a_rank_count_error_names_the_mesh_axes_as_the_plan_does() -> None:
    """The runtime's mesh carries the plan's axis names (before: the program's default 'x')."""
    with pytest.raises(rs.ReshardError) as e:
        rs.launch(plan_on_more_ranks_than_the_world, 1, timeout_s=30)
    msg = str(e.value)
    assert "the program's mesh DeviceMesh(shape=(2,), axes=('tp',), ranks=[0, 1]) needs ranks [1], but the " \
           "process group has only 1 ranks" in msg, msg
