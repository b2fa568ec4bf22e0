"""One process per rank: every process optimizes the Fusion itself, takes its shard of the
inputs and runs its part of the plan over torch.distributed (gloo on CPU here); the main
process gathers the shards and checks them against the unsharded reference.  (This is the
README's "One process per rank" program; `reshard explain` reads its `build()`.)

    python examples/multiprocess_launch.py
"""

import torch

import reshard as rs
from reshard.ir import unshard

MESH = rs.DeviceMesh([0, 1], ("tp",))


def build() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (16, 32), "float32", MESH, [rs.Shard(0)])
    w1 = f.input("w1", (32, 128), "float32", MESH, [rs.Shard(1)])
    w2 = f.input("w2", (128, 32), "float32", MESH, [rs.Shard(0)])
    h = f.gelu(f.matmul(x, w1, name="fc1"), name="gelu")
    f.output(f.matmul(h, w2, name="fc2"), [rs.Shard(0)])
    return f


def global_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(16, 32, generator=g), "w1": torch.randn(32, 128, generator=g),
            "w2": torch.randn(128, 32, generator=g)}


def worker(rank: int) -> tuple[torch.Tensor, ...]:
    plan = rs.optimize(build())  # every process plans; the runtime checks the plans are identical
    local = plan.shard_inputs(global_inputs())[rank]
    return plan.run(local)       # this rank's output shards


if __name__ == "__main__":       # spawned processes re-import this file: launch only from the main one
    outs = rs.launch(worker, 2)  # gloo, file:// rendezvous; or torchrun + rs.init_from_env()
    plan = rs.optimize(build())
    for k, (_, sharding) in enumerate(plan.lowered.outputs):
        got = unshard({rank: outs[rank][k] for rank in range(2)}, sharding)
        want = rs.run_reference(build(), global_inputs())[k]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    print("check: 2 processes ran the plan over gloo; the gathered outputs match the unsharded reference")
