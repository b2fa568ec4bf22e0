"""``parallelize(..., loss_fn=...)``: a module that returns logits, its loss ``loss_fn(module(*inputs),
*targets)`` (PyTorch's criterion convention), the targets given by keyword (``example_targets``
when planning, ``targets=`` in each call).  It trains as the eager loop ``loss_fn(module(x), y)``
(every rank simulated here; over gloo processes in ``tests/train/test_train_torchrun.py``); a
``loss_fn`` that does not return a float scalar, and targets missing or unexpected, are
``ReshardError``s that say so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import reshard as rs
from reshard.testing.train_loop import optimizer_steps

MESH = rs.DeviceMesh([0, 1], ("tp",))
CLASSES = 6
#: Megatron's: fc1 column-parallel, fc2 row-parallel; the logits come out Partial (sum)
PLACEMENTS = {"fc1.weight": [rs.Shard(0)], "fc1.bias": [rs.Shard(0)], "fc2.weight": [rs.Shard(1)]}


class Classifier(torch.nn.Module):
    """x -> logits of a two-layer GELU MLP (no loss)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 8, generator=g), torch.randint(0, CLASSES, (4,), generator=g)


def adamw(step: Callable[..., torch.Tensor], params: object, batches: Callable[[int], tuple] = batch,
          steps: int = 3) -> list[float]:
    """The user's loop: AdamW over ``steps`` batches (``batches(i)``), ``step(*batch)`` giving
    each loss; the per-step losses."""
    return optimizer_steps(torch.optim.AdamW(params, lr=1e-2), lambda i: step(*batches(i)), steps)  # type: ignore[arg-type]


@functools.cache
def plan() -> rs.TrainingPlan:
    x, y = batch(0)
    return rs.plan_training(Classifier(), (x,), MESH, loss_fn=F.cross_entropy, example_targets=(y,),
                            param_placements=PLACEMENTS)


def test_logits_and_loss_fn_train_as_eager() -> None:
    """3 AdamW steps of ``model(x, targets=y)`` match eager ``F.cross_entropy(module(x), y)``:
    losses and parameters; the program's inputs are named as the module's forward, then
    ``target``."""
    tp = plan()
    assert tp.user_inputs == ("x", "target") and tp.targets == ("target",)
    model = rs.parallelize(Classifier(), plan=tp, simulate=True)
    got = adamw(lambda x, y: model(x, targets=y), model.parameters())
    eager = Classifier()
    want = adamw(lambda x, y: F.cross_entropy(eager(x), y), eager.parameters())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=0)
    for n, p in eager.named_parameters():
        assert (p - Classifier().get_parameter(n)).abs().max() > 1e-3  # trained
        torch.testing.assert_close(model.module.get_parameter(n), p, rtol=1e-5, atol=1e-6)


def test_several_targets_in_order() -> None:
    """``loss_fn(out, *targets)``: two targets (a regression target and per-row weights), planned
    by ``parallelize`` itself; the loss and every gradient match eager's."""
    def weighted_mse(out: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ((out - y) ** 2 * w[:, None]).mean()

    g = torch.Generator().manual_seed(1)
    x, y, w = torch.randn(4, 8, generator=g), torch.randn(4, CLASSES, generator=g), torch.rand(4, generator=g)
    model = rs.parallelize(Classifier(), MESH, example_inputs=(x,), loss_fn=weighted_mse, example_targets=(y, w),
                           param_placements=PLACEMENTS, simulate=True)
    assert model.training_plan.targets == ("target_0", "target_1")
    loss = model(x, targets=(y, w))
    loss.backward()
    eager = Classifier()
    want = weighted_mse(eager(x), y, w)
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=0)
    for n, p in eager.named_parameters():
        torch.testing.assert_close(model.module.get_parameter(n).grad, p.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss_fn,got", [
    (functools.partial(F.cross_entropy, reduction="none"), "a torch.float32 tensor of shape (4,)"),
    (lambda out, y: (F.cross_entropy(out, y), out), "a tuple")], ids=["per-element", "tuple"])
def test_loss_fn_must_return_a_float_scalar(loss_fn: Callable[..., object], got: str) -> None:
    x, y = batch(0)
    with pytest.raises(rs.ReshardError, match="loss_fn .* returned ") as e:
        rs.plan_training(Classifier(), (x,), MESH, loss_fn=loss_fn, example_targets=y)
    assert got in str(e.value) and "float scalar" in str(e.value)


def test_targets_missing_or_unexpected() -> None:
    x, y = batch(0)
    model = rs.parallelize(Classifier(), plan=plan(), simulate=True)
    with pytest.raises(rs.ReshardError, match=r"0 targets given \(targets=\), the loss_fn takes 1"):
        model(x, y)
    with pytest.raises(rs.ReshardError, match=r"2 arguments given, the program takes 1 \(\['x'\]\)"):
        model(x, x, targets=y)
    with pytest.raises(rs.ReshardError, match="example_targets are the targets of a loss_fn; none was given"):
        rs.plan_training(Classifier(), (x,), MESH, example_targets=y)
