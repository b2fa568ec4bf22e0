"""One rank of a training run under torchrun (``tests/test_train_torchrun.py`` launches it):

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m tests.torchrun_train_worker OUT.json

Each process: ``reshard.init_from_env()`` (``env://`` from torchrun's environment),
``reshard.parallelize`` of a tiny MLP with Megatron placements (rank 0 plans, the others
receive the plan), ``STEPS`` AdamW steps on the global batch.  Rank 0 gathers the ranks'
parameter shards and writes ``{"losses": [...], "params": {FQN: nested list}, "world_size":
n, "local_ranks": [...]}`` to ``OUT.json``.  ``build``, ``batch`` and ``train`` are also the
test's eager run.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import reshard as rs
from reshard.ir.sharding import unshard

STEPS, LR = 3, 1e-2
#: Megatron's: fc1 column-parallel, fc2 row-parallel (its bias replicated)
PLACEMENTS = {"fc1.weight": [rs.Shard(0)], "fc1.bias": [rs.Shard(0)], "fc2.weight": [rs.Shard(1)]}


class Mlp(torch.nn.Module):
    """(x, y) -> mean squared error of a two-layer GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.fc2(torch.nn.functional.gelu(self.fc1(x))) - y) ** 2).mean()


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    return Mlp()


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step (the same on every rank and in eager)."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)


def train(model: torch.nn.Module, steps: int = STEPS) -> list[float]:
    """The user's loop: AdamW on ``model.parameters()``; the per-step losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        loss = model(*batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def main(out_path: str) -> None:
    rank, world, _ = rs.init_from_env(backend="gloo", timeout_s=60)
    mesh = rs.DeviceMesh(list(range(world)), ("tp",))
    model = rs.parallelize(build(), mesh, example_inputs=batch(0), param_placements=PLACEMENTS)
    losses = train(model)
    model.close()
    shards = {n: p.detach() for n, p in model.module.named_parameters()}
    gathered: list[tuple[int, dict[str, torch.Tensor]] | None] = [None] * world
    torch.distributed.all_gather_object(gathered, (int(os.environ["LOCAL_RANK"]), shards))
    if rank == 0:
        params = {n: unshard({r: g[1][n] for r, g in enumerate(gathered)}, model.training_plan.sharding(n)).tolist()
                  for n in shards}
        with open(out_path + ".tmp", "w") as f:
            json.dump({"losses": losses, "params": params, "world_size": world,
                       "local_ranks": [g[0] for g in gathered]}, f)
        os.replace(out_path + ".tmp", out_path)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
