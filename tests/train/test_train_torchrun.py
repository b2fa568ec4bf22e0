"""``reshard.parallelize`` under torchrun, as users launch it: ``python -m torch.distributed.run
--standalone --nproc-per-node 2`` on ``tests/train/torchrun_train_worker.py`` (CPU, gloo over the
loopback interface), each process ``reshard.init_from_env()`` (``env://``), rank 0 planning
and sending the plan; 3 AdamW steps whose losses and final parameters (gathered by rank 0,
written as JSON) match a single-process eager run of the same loop.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import reshard as rs
from reshard.testing.child_env import child_env
from tests.train import test_train_loss_fn as C
from tests.train import torchrun_train_worker as W

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.multiproc, pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")]


def torchrun(nprocs: int, module: str, *args: str, timeout_s: float = 240) -> None:
    """``python -m torch.distributed.run --standalone`` of ``module`` on ``nprocs`` CPU processes
    from the repository root; its output is the assertion's message when it fails."""
    env = child_env(ROOT, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", RESHARD_TIMEOUT_S="60")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}",
           "--max-restarts=0", "--monitor-interval=0.2", "-m", module, *args]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert res.returncode == 0, f"{' '.join(cmd)} exited with {res.returncode}:\n{res.stdout}\n{res.stderr}"


@pytest.mark.slow
def test_torchrun_training_matches_eager(tmp_path: Path) -> None:
    """Both jobs of the worker: a module returning its loss, and logits with ``loss_fn``,
    evaluated after training under ``torch.no_grad()``."""
    out = tmp_path / "result.json"
    torchrun(2, "tests.train.torchrun_train_worker", str(out))
    got = json.loads(out.read_text())
    assert got["world_size"] == 2 and sorted(got["local_ranks"]) == [0, 1]
    mlp, classifier = W.build(), C.Classifier()
    eager = {"loss": (mlp, W.train(mlp)),
             "loss_fn": (classifier, W.train_classifier(classifier, lambda x, y: F.cross_entropy(classifier(x), y)))}
    for job, (module, want) in eager.items():
        torch.testing.assert_close(torch.tensor(got[job]["losses"]), torch.tensor(want), rtol=1e-4, atol=0)
        fresh = W.build() if job == "loss" else C.Classifier()
        for n, p in module.named_parameters():
            assert (p.detach() - fresh.get_parameter(n)).abs().max() > 1e-3  # trained: a missing update would show
            torch.testing.assert_close(torch.tensor(got[job]["params"][n]), p.detach(), rtol=1e-4, atol=1e-5,
                                       msg=lambda m, n=n, job=job: f"{job} {n}: {m}")
    x, y = W.eval_batch()
    with torch.no_grad():
        want_eval = float(F.cross_entropy(classifier(x), y))
    assert got["loss_fn"]["eval_loss"] == pytest.approx(want_eval, rel=1e-4)
    assert got["loss_fn"]["grads_after_eval"] == [True] * len(list(classifier.parameters()))


# ---- rank 0 plans, the others wait for its plan (or its error) ---------------------------------
class SlowToExport(W.Mlp):
    """``Mlp`` whose export (rank 0's planning) takes longer than the process group's timeout."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_exporting():
            time.sleep(PG_TIMEOUT_S + 3)
        return super().forward(x, y)


class Dropped(W.Mlp):
    """``Mlp`` with dropout: planning it for training is a ``ReshardError`` (on rank 0)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.nn.functional.dropout(x, 0.5), y)


PG_TIMEOUT_S = 5  # short, as a torchrun script may set it; long enough for both ranks to start on a busy machine


def planning_worker(rank: int) -> dict[str, Any]:
    """Each rank: parallelize ``Dropped`` (its error), then ``SlowToExport`` (its shard shapes)."""
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    try:
        rs.parallelize(Dropped(), mesh, example_inputs=W.batch(0), param_placements=W.PLACEMENTS)
        error = None
    except rs.ReshardError as e:
        error = str(e)
    model = rs.parallelize(SlowToExport(), mesh, example_inputs=W.batch(0), param_placements=W.PLACEMENTS)
    return {"error": error, "shapes": {n: tuple(p.shape) for n, p in model.module.named_parameters()}}


@pytest.mark.slow
def test_ranks_wait_for_rank0_plan_or_its_error() -> None:
    """Rank 0 plans longer than the process group's timeout (``launch``'s ``timeout_s``, as a
    torchrun script's ``init_from_env(timeout_s=...)``): rank 1 waits for the plan, not the
    timeout (before: gloo's "Timed out waiting ... for recv").  Rank 0's planning error is
    raised on every rank, with its message (before: rank 1 waited for a plan that never came)."""
    results = rs.launch(planning_worker, 2, timeout_s=PG_TIMEOUT_S)
    for rank, res in enumerate(results):
        assert res["error"] is not None and "dropout" in res["error"], res["error"]
        assert (rank == 0) or res["error"].startswith("parallelize: rank 0 failed to plan: ConvertError"), res["error"]
        assert res["shapes"] == {"fc1.weight": (8, 8), "fc1.bias": (8,), "fc2.weight": (8, 8), "fc2.bias": (8,)}
