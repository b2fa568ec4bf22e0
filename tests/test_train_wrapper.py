"""``reshard.parallelize`` on a given ``TrainingPlan`` (written by hand here, so that the
wrapper is checked apart from autodiff): the loss it returns, ``backward`` scaling the plan's
gradients by ``grad_output`` and accumulating them, and one rank per process over gloo."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import reshard as rs
from reshard.ir.sharding import unshard

MESH = rs.DeviceMesh([0, 1], ("tp",))


class LeastSquares(torch.nn.Module):
    """(x, y) -> mean((x @ w - y)^2)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(16, 4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((x @ self.w - y) ** 2).mean()


def least_squares_plan() -> rs.TrainingPlan:
    """``LeastSquares``' training plan written by hand: d loss / d w = 2 x^T (x w - y) / numel,
    ``w`` column-sharded on 2 ranks."""
    mesh = MESH
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", mesh, [rs.Replicate()])
    y = f.input("y", (8, 4), "float32", mesh, [rs.Replicate()])
    w = f.input("w", (16, 4), "float32", mesh, [rs.Shard(1)])
    r = f.sub(f.matmul(x, w), y)
    f.output(f.reduce("mean", f.reshape(f.mul(r, r), (1, 8, 4)), (1, 2)), [rs.Replicate()])
    f.output(f.scale(f.matmul(f.permute(x, (1, 0)), r), 2 / 32, name="grad.w"), [rs.Shard(1)])
    return rs.TrainingPlan(rs.optimize(f), ("x", "y"), ("w",), {}, {"w": "grad.w"})


def test_backward_scales_by_grad_output_and_accumulates() -> None:
    """``(loss * 3).backward()`` twice, then an SGD step: w moves by 6 lr d loss / d w, as in eager."""
    g = torch.Generator().manual_seed(0)
    inputs = (torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g))
    models = [LeastSquares(), rs.parallelize(LeastSquares(), plan=least_squares_plan(), simulate=True)]
    for model in models:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            (model(*inputs) * 3).backward()
        opt.step()
    torch.testing.assert_close(models[1].module.w, models[0].w, rtol=1e-5, atol=1e-6)
    assert (models[0].w - LeastSquares().w).abs().max() > 0.1


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def sgd_steps(model: torch.nn.Module, steps: int = 3) -> list[float]:
    """SGD on ``data()`` (the global batch: every rank passes the same tensors); the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = model(*data())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def gloo_worker(rank: int, plan: rs.TrainingPlan) -> tuple[list[float], torch.Tensor]:
    model = rs.parallelize(LeastSquares(), plan=plan)
    assert model.module.w.shape == (16, 2)  # this rank's column block
    losses = sgd_steps(model)
    model.close()
    return losses, model.module.w.detach()


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
def test_two_gloo_processes_match_eager() -> None:
    plan = least_squares_plan()
    results = rs.launch(gloo_worker, 2, plan, timeout_s=120)
    eager = LeastSquares()
    want = sgd_steps(eager)
    for losses, _ in results:
        assert losses == pytest.approx(want, rel=1e-5)
    w = unshard({r: results[r][1] for r in range(2)}, plan.sharding("w"))
    torch.testing.assert_close(w, eager.w.detach(), rtol=1e-5, atol=1e-6)
