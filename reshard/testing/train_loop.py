"""The user's training loop, shared by the training tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import reshard as rs


def optimizer_steps(opt: torch.optim.Optimizer, loss_at: Callable[[int], torch.Tensor], steps: int) -> list[float]:
    """``steps`` iterations of ``loss = loss_at(i); loss.backward(); opt.step(); opt.zero_grad()``;
    the per-step losses (a DTensor loss: its full value)."""
    losses = []
    for i in range(steps):
        loss = loss_at(i)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.full_tensor() if hasattr(loss, "full_tensor") else loss.detach()))
    return losses


def simulated_step_matches_eager(module: torch.nn.Module, plan: Any, *args: torch.Tensor) -> None:
    """One step of ``module`` through ``plan`` (``rs.parallelize(..., simulate=True)``): its loss
    and every parameter's gradient equal eager PyTorch's on ``args`` (the gradients cleared
    first: a second call with other inputs compares that step alone)."""
    module.zero_grad(set_to_none=True)
    model = rs.parallelize(module, plan=plan, simulate=True)
    loss = model(*args)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.module.named_parameters()}
    module.zero_grad()
    want = module(*args)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
    for n, p in module.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")

