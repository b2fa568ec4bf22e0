"""The user's training loop, shared by the training tests."""

from __future__ import annotations

from collections.abc import Callable

import torch


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
