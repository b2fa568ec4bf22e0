"""The gradient of Megatron's fused QKV slices: a slice's gradient is a pad, and a pad of whole
parts (``reshard.ir.ops.slicing``, ``Pad.part_map``) keeps a head sharding, so the backward of a
fused projection needs no gather: the law's oracle, a pad planned without communication, and a
joint attention block whose fused ``qkv`` gradient stays at the fused layout."""

from __future__ import annotations

import math

import pytest
import torch

import reshard as rs
from reshard.codegen.step_attrs import attrs_of
from reshard.ir import shard
from reshard.passes.autodiff import joint
from reshard.ir.fusion import Fusion
from reshard.ir.ids import Outer, evaluate
from reshard.ir.ops import op_kind
from reshard.ir.sharding import TensorSharding
from reshard.testing.autodiff_oracle import check_joint, loss_weights, weighted_loss
from reshard.testing.op_oracle import check_plan

MESH = rs.DeviceMesh([0, 1], ("tp",))
DT = "float64"


def _values(x, shape: tuple[int, ...]) -> torch.Tensor:
    index = [torch.arange(e).view([e if j == d else 1 for j in range(len(shape))]) for d, e in enumerate(shape)]
    return evaluate(x, index).expand(shape)


@pytest.mark.parametrize("n,lo,hi", [(32, 0, 64), (32, 32, 32), (32, 64, 0), (6, 4, 2), (12, 18, 6)])
def test_pad_law_oracle(n, lo, hi):
    """Law: padding a dim of extent n by lo and hi, g = gcd(lo, n, hi) > 1, reads the operand's
    ``i mod g`` as the result's ``i' mod g`` (i' = lo + i); a shard bound to an ID over the
    operand's pair, padded locally by its step attributes (``codegen.step_attrs``), is the shard of the padded tensor bound to
    the same ID over the result's pair."""
    f = Fusion()
    x = f.input("x", (2, n), "float32", MESH, [rs.Replicate()])
    f.output(f.pad(x, 1, lo, hi), [rs.Replicate()])
    op, e = f.ops[1], lo + n + hi
    ((xa, ya),) = op_kind("pad").part_map(f, op, 0)
    assert torch.equal(_values(xa, (2, n)), _values(ya, (2, e))[:, lo:lo + n])
    t = torch.randn(2, n, generator=torch.Generator().manual_seed(0))
    src, dst = TensorSharding(MESH, (2, n), (Outer(xa, 2),)), TensorSharding(MESH, (2, e), (Outer(ya, 2),))
    a = attrs_of(f, op, dst.local_shape)
    want = shard(torch.nn.functional.pad(t, [lo, hi]), dst)
    for r, local in shard(t, src).items():
        assert torch.equal(torch.nn.functional.pad(local, [a["lo"], a["hi"]]), want[r])


def test_pad_law_absent_without_whole_parts():
    f = Fusion()
    x = f.input("x", (2, 4), "float32", MESH, [rs.Replicate()])
    f.output(f.pad(x, 1, 3, 1), [rs.Replicate()])
    assert math.gcd(3, 4, 1) == 1 and op_kind("pad").part_map(f, f.ops[1], 0) == []


def test_head_sharded_pad_to_the_fused_layout_is_local():
    """q's gradient [T, H], heads sharded, padded into [T, 3H] at the fused layout: no communication."""
    f = Fusion()
    g = f.input("g", (4, 8), "float32", MESH, [rs.Shard(1)])
    f.output(f.pad(g, 1, 8, 8), [rs.FusedShard(1, groups=3)])
    assert check_plan(f).communications == ()


def _fused_attention() -> tuple[rs.Fusion, object]:
    t, d, heads = 4, 8, 2
    f = rs.Fusion()
    x = f.input("x", (t, d), DT, MESH, [rs.Replicate()])
    wqkv = f.input("wqkv", (d, 3 * d), DT, MESH, [rs.FusedShard(1, groups=3)])
    wo = f.input("wo", (d, d), DT, MESH, [rs.Shard(0)])
    qkv = f.matmul(x, wqkv, name="qkv")
    q, k, v = (f.permute(f.reshape(f.slice(qkv, 1, i * d, (i + 1) * d), (t, heads, d // heads)), (1, 0, 2))
               for i in range(3))
    s = f.matmul(q, f.permute(k, (0, 2, 1)))
    e = f.exp(f.sub(s, f.broadcast(f.detach(f.max(s, 2)), s.shape, (0, 1))))
    p = f.div(e, f.broadcast(f.sum(e, 2), s.shape, (0, 1)))
    y = f.matmul(f.reshape(f.permute(f.matmul(p, v), (1, 0, 2)), (t, d)), wo, name="y")
    f.output(y, [rs.Replicate()])
    return f, weighted_loss(f, [y])


def test_fused_qkv_backward_needs_no_gather():
    """Megatron's backward: the one forward allreduce (y) and nothing else; the gradients match."""
    f, loss = _fused_attention()
    values = {n: torch.randn(f.tensors[i].shape, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
              for i in f.inputs for n in [f.tensors[i].name]}
    check_joint(f, loss, {**values, **loss_weights(f, 1)}, ["wqkv", "wo"], plan=True)
    plan = rs.optimize(joint(f, loss, ["wqkv", "wo"]).fusion)
    assert [(c.kind, c.tensor) for c in plan.communications] == [("allreduce", "y")]
