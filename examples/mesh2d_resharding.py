"""Resharding along one axis of a 2-D mesh (seed 001: communication teams).

x [1024, 2048] on a 2x4 mesh ("dp", "tp") is [Replicate(), Shard(1)]; the consumer wants
[Replicate(), Shard(0)].  Only the "tp" placement changes, so the plan is one all-to-all run
by the two "tp" teams {0,1,2,3} and {4,5,6,7} in parallel; nothing crosses the "dp" axis.
A tensor x data parallel MLP follows on the same mesh: its partial sums are all-reduced
on the "tp" teams only.

    python examples/mesh2d_resharding.py
"""

import reshard as rs
from reshard import Replicate, Shard

MESH = rs.DeviceMesh([[0, 1, 2, 3], [4, 5, 6, 7]], ("dp", "tp"))


def build() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (1024, 2048), "float32", MESH, [Replicate(), Shard(1)])
    f.output(f.redistribute(x, [Replicate(), Shard(0)]), [Replicate(), Shard(0)])
    a = f.input("a", (16, 32), "float32", MESH, [Shard(0), Replicate()])
    w1 = f.input("w1", (32, 64), "float32", MESH, [Replicate(), Shard(1)])
    w2 = f.input("w2", (64, 32), "float32", MESH, [Replicate(), Shard(0)])
    f.output(f.matmul(f.silu(f.matmul(a, w1)), w2), [Shard(0), Replicate()])
    return f


if __name__ == "__main__":
    from reshard.cli import main
    raise SystemExit(main(["explain", __file__, "-q"]))
