"""Megatron MLP with sequence parallelism on 4 devices.

Only the activations' sequence sharding and the weights' column/row sharding are given;
the optimizer finds the classic plan: all-gather x before the first matmul, keep the
hidden activation sharded on its ffn dim, and reduce-scatter the partial sums of the
second matmul back to sequence sharding.

    python examples/megatron_mlp.py
"""

import reshard as rs
from reshard import Shard

MESH = rs.DeviceMesh([0, 1, 2, 3], ("tp",))


def build(seq: int = 64, hidden: int = 128) -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (seq, hidden), "bfloat16", MESH, [Shard(0)])
    w1 = f.input("w1", (hidden, 4 * hidden), "bfloat16", MESH, [Shard(1)])
    w2 = f.input("w2", (4 * hidden, hidden), "bfloat16", MESH, [Shard(0)])
    f.output(f.matmul(f.gelu(f.matmul(x, w1)), w2), [Shard(0)])
    return f


if __name__ == "__main__":
    from reshard.cli import main
    raise SystemExit(main(["explain", __file__, "-q"]))
