"""A two-stage pipeline across meshes (seed 001): stage 0 runs on devices {0, 1}, stage 1 on
{2, 3}.  The activation leaves stage 0 sharded by rows and stage 1 wants it replicated.  The
e-graph holds every way to move it: all-gather on stage 0 then parallel send/recv pairs
(0->2, 1->3), send/recv of the shards then all-gather on stage 1, broadcast from one source
device, scatter then all-gather; the cost profile picks (here: ship the shards, gather on
the receiving side, so each link carries half the bytes).

    python examples/pipeline_cross_mesh.py
"""

import reshard as rs
from reshard import Replicate, Shard

STAGE0 = rs.DeviceMesh([0, 1], ("tp",))
STAGE1 = rs.DeviceMesh([2, 3], ("tp",))


def build(seq: int = 256, hidden: int = 512) -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (seq, hidden), "float32", STAGE0, [Shard(0)])
    w0 = f.input("w0", (hidden, hidden), "float32", STAGE0, [Replicate()])
    h = f.gelu(f.matmul(x, w0))                          # stage 0: rows stay sharded
    h1 = f.redistribute(h, [Replicate()], mesh=STAGE1)   # to stage 1, replicated
    w1 = f.input("w1", (hidden, hidden), "float32", STAGE1, [Shard(1)])
    f.output(f.matmul(h1, w1), [Shard(1)])               # stage 1: column parallel
    return f


if __name__ == "__main__":
    from reshard.cli import main
    raise SystemExit(main(["explain", __file__, "-q"]))
