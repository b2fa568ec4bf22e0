"""The same program gives the same plan on any machine and under any load (issue 27): planning
is bounded by work (iterations, e-nodes, re-extractions), not by the clock, unless the user
sets ``Limits(time_limit_s=...)``; a cut then warns, says what it cut, and never returns a plan
costlier than the greedy plan it started from."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch

import reshard as rs
from reshard.examples import transformer_stack
from reshard.extract import second_core

MESH = rs.DeviceMesh([0, 1], ("tp",))


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


def _training_plan() -> rs.Plan:
    """The tiny GPT-2 of the training tests, on tp 2, planned without the cache."""
    T = pytest.importorskip("transformers")
    from reshard.testing.hf_models import megatron
    from reshard.testing.train_models import LossOf

    torch.manual_seed(0)
    module = LossOf(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=16,
                                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)))
    ids = torch.randint(0, 64, (2, 8))
    return rs.plan_training(module, (ids, ids), MESH, param_placements=megatron(module, MESH), cache=False).plan


def test_default_limits_have_no_clock() -> None:
    assert rs.Limits().time_limit_s is None


@pytest.mark.hf
@pytest.mark.multiproc
def test_same_plan_with_both_cores_busy(monkeypatch) -> None:
    """Planned idle, then again while two processes burn both cores: the same digest (with
    extraction's second core on, as outside the suite: ``tests/conftest.py``)."""
    monkeypatch.setattr(second_core, "SECOND_CORE", True)
    idle = _training_plan()
    ctx = multiprocessing.get_context("spawn")
    burners = [ctx.Process(target=_burn, args=(120.0,), daemon=True) for _ in range(2)]
    for p in burners:
        p.start()
    try:
        busy = _training_plan()
    finally:
        for p in burners:
            p.terminate()
            p.join()
    assert not idle.report.cut and not busy.report.cut
    assert busy.digest() == idle.digest() and busy.cost == idle.cost


def test_a_time_limit_cut_warns_and_keeps_the_baseline() -> None:
    """A time limit that cuts saturation and the sharing search: a warning naming what was cut,
    ``report.cut`` saying it, and the plan never costlier than the greedy plan it started from;
    still a correct plan."""
    f = transformer_stack(2, MESH)
    with pytest.warns(UserWarning, match="time_limit_s=1e-06 cut short: saturation"):
        plan = rs.optimize(f, limits=rs.Limits(time_limit_s=1e-6), cache=False)
    assert "saturation" in plan.report.cut
    ex = plan.extraction
    assert ex.greedy_cost is None or ex.cost <= ex.greedy_cost
    g = torch.Generator().manual_seed(0)
    inputs = {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=g) * 0.05 for i in f.inputs}
    out, want = plan.simulate(inputs)[0], rs.run_reference(f, inputs)[0]
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@pytest.mark.parametrize("segment_ops", [16, 1000], ids=["segmented", "one-egraph"])
def test_a_reused_egraph_of_declarations_gives_the_same_plan(monkeypatch: pytest.MonkeyPatch,
                                                              segment_ops: int) -> None:
    """``saturate.declared``: the second plan of the same rules reuses the e-graph the first
    handed back (no new one is made) and is the plan a new e-graph gives, in segments and as
    one e-graph (a program of fewer ops than ``segment_ops``)."""
    from reshard.search import saturate

    made: list[int] = []
    real = saturate.new_egraph
    monkeypatch.setattr(saturate, "new_egraph", lambda d: made.append(1) or real(d))
    monkeypatch.setattr(saturate._IDLE, "egraphs", {})
    program = transformer_stack(2, MESH)
    opts = dict(limits=rs.Limits(segment_ops=segment_ops), cache=False)
    first = rs.optimize(program, **opts)
    assert len(made) == 1 and len(saturate._IDLE.egraphs) == 1
    second = rs.optimize(program, **opts)
    assert len(made) == 1, "the idle e-graph of the same declarations was not reused"
    assert second.digest() == first.digest() and second.cost == first.cost
    monkeypatch.setattr(saturate._IDLE, "egraphs", {})
    fresh = rs.optimize(program, **opts)
    assert len(made) == 2 and fresh.digest() == first.digest()


def test_plans_in_other_threads_use_their_own_egraphs() -> None:
    """egglog's e-graphs are pinned to the thread that made them (used from another, egglog
    panics): plans made in two threads at once, after one in this thread left its e-graph
    idle, and one made here after they ended, are all made (the same plan), and the threads'
    idle e-graphs go with them without an error."""
    import threading

    program = transformer_stack(2, MESH)
    opts = dict(limits=rs.Limits(segment_ops=16), cache=False)
    here = rs.optimize(program, **opts)
    got: list[object] = []

    def plan() -> None:
        try:
            got.append(rs.optimize(program, **opts).digest())
        except BaseException as e:  # a panic is a BaseException
            got.append(e)

    threads = [threading.Thread(target=plan) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert got == [here.digest()] * 2
    assert rs.optimize(program, **opts).digest() == here.digest()


def _egglog_workers(env_value: str | None) -> tuple[int, str | None]:
    """In a fresh interpreter with ``RAYON_NUM_THREADS`` at ``env_value`` (None: unset): the
    threads that importing reshard's egglog adds, and the variable's value afterwards."""
    import json
    import os
    import subprocess
    import sys
    code = ("import json, os\n"
            "n = lambda: len(os.listdir('/proc/self/task'))\n"
            "before = n()\n"
            "import reshard.search.saturate\n"
            "print(json.dumps([n() - before, os.environ.get('RAYON_NUM_THREADS')]))\n")
    env = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
    if env_value is not None:
        env["RAYON_NUM_THREADS"] = env_value
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    added, value = json.loads(out.stdout.strip().splitlines()[-1])
    return added, value


@pytest.mark.multiproc
@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_egglog_has_one_pool_size_whatever_the_environment() -> None:
    """egglog's rayon pool starts when its extension is imported, sized by ``RAYON_NUM_THREADS``
    (default: the cores), and its workers' number changes the e-graph egglog grows (measured:
    the tiny Llama's tp 2 training plan had another digest at 2 and 16 workers than at 1).
    reshard imports it with ``egglog_pool.WORKERS`` workers and puts the caller's value back."""
    unset = _egglog_workers(None)
    assert _egglog_workers("16") == (unset[0], "16") and _egglog_workers("2") == (unset[0], "2")
    assert unset[1] is None
