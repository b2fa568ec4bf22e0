"""Seed 000: reshaping a sharded dim.

A hidden dim [h] sharded over 2 devices split into [d, h/d] stays local (each device's
block is whole rows of the result), and so does the per-head reshape of a fused QKV
projection; but slicing q out of a sharded fused [3*d*h] dim is NOT local: the slice's
elements live on other devices, so the optimizer must communicate.  These decisions come
from the IterDomain rules of the e-graph (split/merge laws), not from a special case.

    python examples/seed_reshape_sharded_dim.py      (or: reshard explain examples/seed_reshape_sharded_dim.py)
"""

import reshard as rs
from reshard import Shard

MESH = rs.DeviceMesh([0, 1], ("tp",))
B, S, D, H = 2, 4, 2, 16


def build() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (B, S, D * H), "float32", MESH, [Shard(2)])
    # local: [b, s, d*h] -> [b, s, d, h] keeps every device's block of the sharded dim
    heads = f.reshape(x, (B, S, D, H))
    f.output(heads, [Shard(2)])
    qkv = f.input("qkv", (B, S, 3 * D * H), "float32", MESH, [Shard(2)])
    # not local: q = qkv[..., :d*h] lives on device 0 only, but the output wants it sharded
    q = f.slice(qkv, 2, 0, D * H)
    f.output(q, [Shard(2)])
    return f


if __name__ == "__main__":
    from reshard.cli import main
    raise SystemExit(main(["explain", __file__, "-q"]))
