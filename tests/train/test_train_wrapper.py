"""``reshard.parallelize`` on a given ``TrainingPlan`` (written by hand here, so that the
wrapper is checked apart from autodiff): the loss it returns, ``backward`` scaling the plan's
gradients by ``grad_output`` and accumulating them, and one rank per process over gloo; and
DTensor parameters and inputs (rank 0 plans from the DTensors' mesh and placements)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from torch.distributed.tensor import Replicate as DReplicate
from torch.distributed.tensor import Shard as DShard

import reshard as rs
from reshard.ir.sharding import unshard
from reshard.testing.train_loop import optimizer_steps

MESH = rs.DeviceMesh([0, 1], ("tp",))
gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")


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


def sgd_steps(model: torch.nn.Module, steps: int = 3, inputs: Callable[[], tuple] = data) -> list[float]:
    """SGD on ``inputs()`` (the global batch: every rank passes the same tensors); the losses."""
    return optimizer_steps(torch.optim.SGD(model.parameters(), lr=0.1), lambda _: model(*inputs()), steps)


def gloo_worker(rank: int, plan: rs.TrainingPlan) -> tuple[list[float], torch.Tensor]:
    torch.set_num_threads(1)  # tiny ops, processes sharing few cores: intra-op threads only contend
    model = rs.parallelize(LeastSquares(), plan=plan)
    assert model.module.w.shape == (16, 2)  # this rank's column block
    losses = sgd_steps(model)
    model.close()
    return losses, model.module.w.detach()


@pytest.mark.multiproc
@pytest.mark.slow
@gloo
def test_two_gloo_processes_match_eager(gloo_results: list[dict[str, Any]]) -> None:
    plan = least_squares_plan()
    results = [r["plan"] for r in gloo_results]
    eager = LeastSquares()
    want = sgd_steps(eager)
    for losses, _ in results:
        assert losses == pytest.approx(want, rel=1e-5)
    w = unshard({r: results[r][1] for r in range(2)}, plan.sharding("w"))
    torch.testing.assert_close(w, eager.w.detach(), rtol=1e-5, atol=1e-6)


def adamw_steps(model: torch.nn.Module, steps: int, inputs: tuple) -> list[float]:
    """AdamW on ``inputs``; the per-step losses (a DTensor loss: its value)."""
    return optimizer_steps(torch.optim.AdamW(model.parameters(), lr=1e-3), lambda _: model(*inputs), steps)


# ---- DTensor parameters and inputs ------------------------------------------------------------
class Regression(torch.nn.Module):
    """(x, y) -> mean squared error of a two-layer MLP (Megatron placements: fc1 column-, fc2
    row-parallel) shifted by a persistent buffer; fc2's bias frozen."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 16)
        self.fc2.bias.requires_grad_(False)
        self.register_buffer("shift", torch.linspace(-1, 1, 16))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.fc2(torch.nn.functional.gelu(self.fc1(x))) - y - self.shift) ** 2).mean()


#: Megatron's: fc1 column-parallel, fc2 row-parallel (its bias replicated)
DTENSOR_PLACEMENTS = {"fc1.weight": (DShard(0),), "fc1.bias": (DShard(0),), "fc2.weight": (DShard(1),),
                      "fc2.bias": (DReplicate(),)}


def regression() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return Regression(), (torch.randn(8, 16), torch.randn(8, 16))


def dtensor_worker(rank: int, steps: int) -> dict[str, Any]:
    """DTensor parameters (``DTENSOR_PLACEMENTS``) and inputs (x and y batch-sharded) on a
    torch DeviceMesh; no mesh, placements or plan given (rank 0 plans)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    module, (x, y) = regression()
    for name, placements in DTENSOR_PLACEMENTS.items():
        layer, leaf = name.split(".")
        param = getattr(module, layer).get_parameter(leaf).detach()
        frozen = not getattr(module, layer).get_parameter(leaf).requires_grad
        setattr(getattr(module, layer), leaf, torch.nn.Parameter(distribute_tensor(param, mesh, list(placements)),
                                                                 requires_grad=not frozen))
    x, y = distribute_tensor(x, mesh, [DShard(0)]), distribute_tensor(y, mesh, [DShard(0)])
    model = rs.parallelize(module, example_inputs=(x, y))
    losses = adamw_steps(model, steps, (x, y))
    loss = model(x, y)
    loss.backward()
    kinds = {("loss", type(loss).__name__, tuple(loss.placements))}
    kinds.update((n, type(p).__name__, tuple(p.placements)) for n, p in model.module.named_parameters())
    kinds.update((f"grad.{n}", type(p.grad).__name__, tuple(getattr(p.grad, "placements", ())))
                 for n, p in model.module.named_parameters())
    model.close()
    return {"losses": losses, "kinds": kinds, "params": {n: p.full_tensor() for n, p in model.module.named_parameters()}}


@pytest.mark.multiproc
@gloo
def test_dtensor_parameters_and_inputs_round_trip(gloo_results: list[dict[str, Any]]) -> None:
    """DTensors in, DTensors out: the parameters stay DTensors with their placements, their
    ``.grad`` are DTensors of the same placements (None for the frozen bias), the loss is a
    replicated DTensor; after 3 AdamW steps the losses and the parameters match eager."""
    results = [r["dtensor"] for r in gloo_results]
    module, inputs = regression()
    want = adamw_steps(module, DTENSOR_STEPS, inputs)
    for res in results:
        assert res["kinds"] == {("loss", "DTensor", (DReplicate(),)), ("grad.fc2.bias", "NoneType", ())} | {
            (n, "DTensor", tuple(p)) for n, p in DTENSOR_PLACEMENTS.items()} | {
            (f"grad.{n}", "DTensor", tuple(p)) for n, p in DTENSOR_PLACEMENTS.items() if n != "fc2.bias"}
        torch.testing.assert_close(torch.tensor(res["losses"]), torch.tensor(want), rtol=1e-4, atol=0)
        for n, p in module.named_parameters():
            torch.testing.assert_close(res["params"][n], p.detach(), rtol=1e-4, atol=1e-4)


def test_memory_budget_reaches_the_plan() -> None:
    """``memory_budget`` (bytes per rank of saved activations) is the plan's: with less than
    the unbudgeted plan keeps, the plan keeps at most that (it recomputes), and trains as eager."""
    module, inputs = regression()
    mesh = MESH
    places = {"fc1.weight": [rs.Shard(0)], "fc1.bias": [rs.Shard(0)], "fc2.weight": [rs.Shard(1)]}
    free = rs.plan_training(module, inputs, mesh, param_placements=places)
    budget = free.plan.saved_bytes - 1
    tight = rs.plan_training(module, inputs, mesh, param_placements=places, memory_budget=budget)
    assert 0 < free.plan.saved_bytes and tight.plan.saved_bytes <= budget
    model = rs.parallelize(module, plan=tight, simulate=True)
    got = adamw_steps(model, 2, inputs)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(adamw_steps(regression()[0], 2, inputs)), rtol=1e-5, atol=0)


class ScaledSquares(torch.nn.Module):
    """(x, t) -> mean((lin(x) * s / t)^2), ``s`` a 0-dim parameter, ``t`` a 0-dim argument."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.lin = torch.nn.Linear(4, 6)
        self.s = torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return (self.lin(x) * self.s / t).pow(2).mean()


def scalar_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(2)), torch.tensor(0.7)


def scalar_worker(rank: int) -> tuple[list[float], torch.Tensor, tuple[int, ...]]:
    torch.set_num_threads(1)
    model = rs.parallelize(ScaledSquares(), MESH, example_inputs=scalar_inputs(),
                           param_placements={"lin.weight": [rs.Shard(0)]})
    losses = sgd_steps(model, inputs=scalar_inputs)
    model.close()
    return losses, model.module.s.detach(), tuple(model.module.s.shape)


@pytest.mark.multiproc
def test_0_dim_parameter_and_argument_train_as_eager(request: pytest.FixtureRequest) -> None:
    """A 0-dim parameter and a 0-dim argument (0-dim program inputs): the parameter stays
    0-dim, its gradient is 0-dim, and 3 SGD steps match eager (simulated, and 2 gloo ranks)."""
    want = sgd_steps(eager := ScaledSquares(), inputs=scalar_inputs)
    simulated = rs.parallelize(ScaledSquares(), MESH, example_inputs=scalar_inputs(), simulate=True)
    assert sgd_steps(simulated, inputs=scalar_inputs) == pytest.approx(want, rel=1e-5)
    assert simulated.module.s.shape == () and abs(float(simulated.module.s - eager.s)) < 1e-5
    assert abs(float(eager.s) - 1.5) > 1e-3
    if dist.is_available() and dist.is_gloo_available():
        for losses, s, shape in (r["scalar"] for r in request.getfixturevalue("gloo_results")):
            assert losses == pytest.approx(want, rel=1e-5)
            assert shape == () and abs(float(s - eager.s)) < 1e-5


# ---- one process group for the gloo cases above ------------------------------------------------
DTENSOR_STEPS = 3


def gloo_cases(rank: int, plan: rs.TrainingPlan) -> dict[str, Any]:
    """This file's gloo cases, in turn, on one process group: the hand-written plan, DTensor
    parameters and inputs, the 0-dim parameter."""
    return {"plan": gloo_worker(rank, plan), "dtensor": dtensor_worker(rank, DTENSOR_STEPS),
            "scalar": scalar_worker(rank)}


@pytest.fixture(scope="module")
def gloo_results() -> list[dict[str, Any]]:
    """Each rank's results of ``gloo_cases``, from one launch."""
    return rs.launch(gloo_cases, 2, least_squares_plan(), timeout_s=180)
