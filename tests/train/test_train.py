"""Training through reshard (issue 21): ``reshard.parallelize`` in the user's own loop.

GPT-2 and Llama (tiny configs, dropout 0, random weights, fp32) train 20 AdamW steps on 2 and
4 gloo processes (tp: Megatron placements, ``reshard.testing.hf_models.megatron``) and on a 2x2
dp x tp mesh (the batch sharded along dp): every step's loss matches a single-process eager
run of the same loop within 1e-4 relative, and the parameters after 20 steps within 1e-4.
Each configuration is planned once, here, and the plan is sent to its ranks (``plan=``).
Also the simulated mode (``simulate=True``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist

import reshard as rs
from reshard.ir.sharding import unshard
from reshard.testing.train_loop import optimizer_steps

T = pytest.importorskip("transformers")

from reshard.testing.hf_models import megatron  # noqa: E402
from reshard.testing.train_models import LR, MESHES, MODELS, STEPS, batch, build, input_placements  # noqa: E402

pytestmark = pytest.mark.hf

gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")


def train(model: torch.nn.Module, steps: int = STEPS) -> list[float]:
    """The user's loop: AdamW on ``model.parameters()``; the per-step losses."""
    return optimizer_steps(torch.optim.AdamW(model.parameters(), lr=LR), lambda step: model(*batch(step)), steps)


@functools.cache
def plan_for(name: str, mesh: rs.DeviceMesh) -> rs.TrainingPlan:
    """The config's plan, made once per session."""
    module = build(name)
    return rs.plan_training(module, batch(0), mesh, input_placements=input_placements(mesh),
                            param_placements=megatron(module, mesh))


_EAGER: dict[str, tuple[list[float], dict[str, torch.Tensor]]] = {}


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside the block: tiny ops, several processes on few cores (CI's 2),
    where intra-op threads only contend (a step of the 4-rank plans runs 5-20x faster)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def eager(name: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """(per-step losses, parameters after ``STEPS`` steps) of the eager loop, once per model."""
    if name not in _EAGER:
        module = build(name)
        with one_thread():
            losses = train(module)
        _EAGER[name] = losses, {n: p.detach().clone() for n, p in module.named_parameters(remove_duplicate=False)}
    return _EAGER[name]


def train_worker(rank: int, jobs: list[tuple[str, str, rs.TrainingPlan]]) -> dict[str, Any]:
    """A rank's part of each job (key, model, plan): {key: (losses, {FQN: local parameter shard})}."""
    torch.set_num_threads(1)  # see one_thread
    out = {}
    for key, name, plan in jobs:
        model = rs.parallelize(build(name), plan=plan)
        losses = train(model)
        model.close()
        out[key] = losses, {n: p.detach() for n, p in model.module.named_parameters(remove_duplicate=False)}
    return out


def check_against_eager(name: str, plan: rs.TrainingPlan, per_rank: list[tuple[list[float], dict]]) -> None:
    """Each rank's losses and the parameters gathered from the ranks' shards match eager."""
    want_losses, want_params = eager(name)
    assert want_losses[-1] < want_losses[0] - 1e-2  # it trained: a wrong update would show
    for losses, _ in per_rank:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-4, atol=0)
    for n in plan.state_inputs:
        got = unshard({r: params[n] for r, (_, params) in enumerate(per_rank)}, plan.sharding(n))
        torch.testing.assert_close(got, want_params[n], rtol=1e-4, atol=1e-4, msg=lambda m: f"{name} {n}: {m}")


@pytest.mark.multiproc
@pytest.mark.slow
@gloo
@pytest.mark.parametrize("nprocs", [2, 4], ids=["2procs", "4procs"])
def test_training_matches_eager(nprocs: int) -> None:
    """2 processes: tp2; 4 processes: tp4 and dp2 x tp2; GPT-2 and Llama each, planned once here."""
    jobs = [(f"{name}-{key}", name, plan_for(name, mesh)) for key, mesh in MESHES.items() if mesh.size == nprocs
            for name in MODELS]
    results = rs.launch(train_worker, nprocs, jobs, timeout_s=300)
    for key, name, plan in jobs:
        check_against_eager(name, plan, [results[r][key] for r in range(nprocs)])


def test_simulated_training_matches_eager() -> None:
    """``simulate=True``: every rank in this process, parameters and inputs global."""
    model = rs.parallelize(build("gpt2"), plan=plan_for("gpt2", MESHES["tp2"]), simulate=True)
    want = eager("gpt2")[0][:3]
    with one_thread():
        torch.testing.assert_close(torch.tensor(train(model, 3)), torch.tensor(want), rtol=1e-4, atol=0)
