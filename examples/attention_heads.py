"""Attention with heads sharded over 2 devices (fused QKV projection, per-head reshape,
q/k/v slices of the fused dim, scores, output projection), from reshard.examples.

    python examples/attention_heads.py
"""

import reshard as rs
from reshard import Shard
from reshard.examples import attention_block

MESH = rs.DeviceMesh([0, 1], ("tp",))


def build(seq: int = 16, hidden: int = 32, heads: int = 4) -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (seq, hidden), "float32", MESH, [Shard(0)])
    f.output(attention_block(f, x, MESH, heads), [Shard(0)])
    return f


if __name__ == "__main__":
    from reshard.cli import main
    raise SystemExit(main(["explain", __file__, "-q"]))
