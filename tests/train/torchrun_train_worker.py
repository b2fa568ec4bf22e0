"""One rank of a training run under torchrun (``tests/train/test_train_torchrun.py`` launches it):

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m tests.train.torchrun_train_worker OUT.json

Each process: ``reshard.init_from_env()`` (``env://`` from torchrun's environment), then two
jobs, each ``reshard.parallelize`` with Megatron placements (rank 0 plans, the others receive
the plan) and ``STEPS`` AdamW steps on the global batch: ``"loss"``, a tiny MLP whose forward
returns its loss; ``"loss_fn"``, ``tests.train.test_train_loss_fn``'s classifier (logits) with
``loss_fn=F.cross_entropy``, then evaluated under ``torch.no_grad()`` on ``eval_batch()``
(the forward-only plan).  Rank 0 gathers the ranks' parameter shards and writes ``{job:
{"losses": [...], "params": {FQN: nested list}}, "world_size": n, "local_ranks": [...]}`` to
``OUT.json``, and for "loss_fn" also ``"eval_loss"`` and ``"grads_after_eval"`` (whether each
``.grad`` is still None after it).  ``build``, ``batch``, ``train`` and ``train_classifier`` are also the test's
eager runs.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.nn.functional as F

import reshard as rs
from reshard.ir.sharding import unshard
from tests.train import test_train_loss_fn as C

STEPS = 3
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


def train(model: torch.nn.Module) -> list[float]:
    """``tests.train.test_train_loss_fn``'s AdamW loop on ``batch``; the per-step losses."""
    return C.adamw(model, model.parameters(), batch, STEPS)


def train_classifier(model: torch.nn.Module, loss_of: Any) -> list[float]:
    """The same loop on the classifier's batches, ``loss_of(x, y)`` each loss."""
    return C.adamw(loss_of, model.parameters(), C.batch, STEPS)


def eval_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return C.batch(STEPS)


def gathered(model: rs.ParallelModule, world: int) -> dict[str, list[Any]]:
    """The module's global parameters from the ranks' shards, as nested lists (a collective;
    rank 0's are the values)."""
    shards = {n: p.detach() for n, p in model.module.named_parameters()}
    per_rank: list[Any] = [None] * world
    torch.distributed.all_gather_object(per_rank, shards)
    return {n: unshard({r: s[n] for r, s in enumerate(per_rank)}, model.training_plan.sharding(n)).tolist()
            for n in shards}


def stage(rank: int, what: str) -> None:
    """One line on stderr per stage, so a failed run's output says how far each rank got."""
    print(f"rank {rank}: {what}", file=sys.stderr, flush=True)


def main(out_path: str) -> None:
    rank, world, _ = rs.init_from_env(backend="gloo", timeout_s=60)
    stage(rank, "process group up")
    mesh = rs.DeviceMesh(list(range(world)), ("tp",))
    out: dict[str, Any] = {"world_size": world}
    model = rs.parallelize(build(), mesh, example_inputs=batch(0), param_placements=PLACEMENTS)
    out["loss"] = {"losses": train(model)}
    stage(rank, "job loss trained")
    out["loss"]["params"] = gathered(model, world)
    model.close()
    x, y = C.batch(0)
    model = rs.parallelize(C.Classifier(), mesh, example_inputs=(x,), loss_fn=F.cross_entropy, example_targets=y,
                           param_placements=C.PLACEMENTS)
    out["loss_fn"] = {"losses": train_classifier(model, lambda x, y: model(x, targets=y))}
    stage(rank, "job loss_fn trained")
    x, y = eval_batch()
    with torch.no_grad():
        out["loss_fn"]["eval_loss"] = float(model(x, targets=y))
    out["loss_fn"]["grads_after_eval"] = [p.grad is None for p in model.parameters()]
    out["loss_fn"]["params"] = gathered(model, world)
    model.close()
    local_ranks: list[Any] = [None] * world
    torch.distributed.all_gather_object(local_ranks, int(os.environ["LOCAL_RANK"]))
    out["local_ranks"] = local_ranks
    if rank == 0:
        with open(out_path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(out_path + ".tmp", out_path)
    torch.distributed.barrier()  # no rank destroys the group while a peer still uses it
    torch.distributed.destroy_process_group()
    stage(rank, "process group destroyed")
    # Leave without the interpreter's teardown: under load, gloo's C++ threads can still be
    # finishing when Python finalizes, and the process then aborts ("terminate called without
    # an active exception", pytorch/pytorch#190489) after all of its work is done.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
