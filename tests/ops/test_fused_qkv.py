"""Megatron's fused QKV layouts (issue 20, item 3): the whole-parts laws of slice and cat
(``reshard.ir.ops.slicing``), the ``FusedShard`` placement (``reshard.ir.fused_shard``), and
GPT-2's ``c_attn`` planned without gathering the fused projection."""

from __future__ import annotations

import math

import pytest
import torch

import reshard as rs
from reshard.codegen.step_attrs import attrs_of
from reshard.ir import shard, unshard
from reshard.ir.fusion import Fusion
from reshard.ir.ids import ID, Outer, evaluate
from reshard.ir.ops import op_kind
from reshard.ir.sharding import TensorSharding

MESH = rs.DeviceMesh([0, 1], ("tp",))


def _index(shape: tuple[int, ...]) -> list[torch.Tensor]:
    return [torch.arange(e).view([e if j == d else 1 for j in range(len(shape))]) for d, e in enumerate(shape)]


def _values(x: ID, shape: tuple[int, ...]) -> torch.Tensor:
    return evaluate(x, _index(shape)).expand(shape)


def _slice_cases(rng: torch.Generator, count: int) -> list[tuple[int, int, int]]:
    """Random (E, start, n) with a range of whole parts of length g > 1, plus GPT-2's q, k, v."""
    out = [(96, 0, 32), (96, 32, 32), (96, 64, 32)]
    while len(out) < count:
        g = int(torch.randint(2, 7, (1,), generator=rng))
        parts = int(torch.randint(1, 7, (1,), generator=rng))
        first = int(torch.randint(0, parts, (1,), generator=rng))
        many = int(torch.randint(1, parts - first + 1, (1,), generator=rng))
        out.append((g * parts, g * first, g * many))
    return out


def _slice_fusion(e: int, start: int, n: int) -> tuple[Fusion, int]:
    f = Fusion()
    x = f.input("x", (3, e), "float32", MESH, [rs.Replicate()])
    f.output(f.slice(x, 1, start, start + n), [rs.Replicate()])
    return f, 1


def test_slice_law_oracle():
    """Law: slicing ``[s, s + n)`` of a dim of extent E, g = gcd(s, n, E) > 1, reads the result's
    ``i' mod g`` as the operand's ``i mod g``: every pair of ``Slice.part_map`` has equal values at
    corresponding indices; a sharding bound to an ID over the operand's pair transports to the same
    ID over the result's, and the slice step's local range (``step_attrs``) on each device's shard
    is the shard of the sliced tensor."""
    rng = torch.Generator().manual_seed(0)
    kind = op_kind("slice")
    for e, s, n in _slice_cases(rng, 12):
        f, k = _slice_fusion(e, s, n)
        op = f.ops[k]
        pairs = kind.part_map(f, op, 0)
        assert len(pairs) == 1 and math.gcd(s, n, e) > 1
        x, y = pairs[0]
        ops_ids = _values(x, (3, e))[:, s:s + n]
        assert torch.equal(ops_ids, _values(y, (3, n)))
        g = math.gcd(s, n, e)
        for p in (p for p in (2, 3) if g % p == 0):
            src = TensorSharding(MESH if p == 2 else rs.DeviceMesh([0, 1, 2], ("tp",)), (3, e), (Outer(x, p),))
            dst = TensorSharding(src.mesh, (3, n), (Outer(y, p),))
            t = torch.randn(3, e, generator=rng)
            want = shard(t[:, s:s + n], dst)
            attrs = attrs_of(f, op, dst.local_shape)
            for r, local in shard(t, src).items():
                assert torch.equal(local[:, attrs["start"]:attrs["stop"]], want[r]), (e, s, n, p)


def test_slice_law_absent_without_whole_parts():
    """A range that is not a run of whole parts (gcd 1) has no part image: the dim cannot stay sharded."""
    f, k = _slice_fusion(10, 3, 4)
    assert op_kind("slice").part_map(f, f.ops[k], 0) == []


def test_cat_law_oracle():
    """Law: cat of extents A, B along a dim, g = gcd(A, B) > 1: each operand's ``i mod g`` is the
    result's ``i' mod g``; the local cat of shards bound to IDs over the operands' pairs is the
    shard of the cat bound to the same ID over the result's pair."""
    rng = torch.Generator().manual_seed(1)
    for a, b in [(32, 32), (64, 32), (12, 18), (6, 4)]:
        f = Fusion()
        u = f.input("u", (2, a), "float32", MESH, [rs.Replicate()])
        v = f.input("v", (2, b), "float32", MESH, [rs.Replicate()])
        f.output(f.cat([u, v], 1), [rs.Replicate()])
        op = f.ops[2]
        (xa, ya), (xb, yb) = (op_kind("cat").part_map(f, op, slot)[0] for slot in (0, 1))
        assert ya == yb
        whole = _values(ya, (2, a + b))
        assert torch.equal(_values(xa, (2, a)), whole[:, :a]) and torch.equal(_values(xb, (2, b)), whole[:, a:])
        ta, tb = torch.randn(2, a, generator=rng), torch.randn(2, b, generator=rng)
        sa, sb = (TensorSharding(MESH, (2, e), (Outer(x, 2),)) for e, x in ((a, xa), (b, xb)))
        want = shard(torch.cat([ta, tb], 1), TensorSharding(MESH, (2, a + b), (Outer(ya, 2),)))
        la, lb = shard(ta, sa), shard(tb, sb)
        for r in MESH.ranks:
            assert torch.equal(torch.cat([la[r], lb[r]], 1), want[r])


# ---- the placement -----------------------------------------------------------------------------------
def test_fused_shard_is_dtensor_strided_shard():
    """``FusedShard(d, groups=g)`` and torch's ``_StridedShard(d, split_factor=g)`` give every rank
    the same local tensor as DTensor's own split (one axis, and its docstring's 2-D example)."""
    from torch.distributed.tensor.placement_types import Shard as DShard
    from torch.distributed.tensor.placement_types import _StridedShard

    t = torch.arange(24.0).view(2, 12)
    for p in (rs.FusedShard(1, groups=3), rs.FusedShard(-1, groups=3), _StridedShard(1, split_factor=3)):
        local = shard(t, [p], MESH)
        want = _StridedShard(1, split_factor=3)._split_tensor(t, 2, with_padding=False)[0]
        for r in MESH.ranks:
            assert torch.equal(local[r], want[r])
        assert torch.equal(unshard(local, [p], MESH, shape=t.shape), t)
    mesh = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
    rows = shard(torch.arange(8.0), [_StridedShard(0, split_factor=2), DShard(0)], mesh)
    assert [rows[r].tolist() for r in mesh.ranks] == [[0, 1], [4, 5], [2, 3], [6, 7]]
    assert TensorSharding.from_placements((8,), [rs.FusedShard(0, groups=1)], MESH) == \
        TensorSharding.from_placements((8,), [rs.Shard(0)], MESH)


def test_fused_shard_errors():
    with pytest.raises(rs.ReshardError, match="parts of 2 equal blocks"):
        TensorSharding.from_placements((9,), [rs.FusedShard(0, groups=3)], MESH)
    with pytest.raises(rs.ReshardError, match="on a 1-D tensor"):
        TensorSharding.from_placements((12,), [rs.FusedShard(1, groups=3)], MESH)
    with pytest.raises(rs.ReshardError, match="groups must be"):
        rs.FusedShard(0, groups=0)


# ---- plans ---------------------------------------------------------------------------------------------
def _check_plan(f: Fusion, seed: int = 0) -> rs.Plan:
    plan = rs.optimize(f)
    g = torch.Generator().manual_seed(seed)
    inputs = {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=g) for i in f.inputs}
    for y, want in zip(plan.simulate(inputs), rs.run_reference(f, inputs)):
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)
    return plan


def fused_attention(out_proj: bool = False) -> Fusion:
    """A [B, S, 3H] fused projection head-sharded (``FusedShard``), sliced into q, k, v, heads
    reshape, scores, softmax numerator, context; ``out_proj``: then a row-parallel output
    projection to a replicated result (one allreduce), else the context head-sharded."""
    b, s, heads, hd = 2, 4, 4, 8
    h = heads * hd
    f = Fusion()
    qkv = f.input("qkv", (b, s, 3 * h), "float32", MESH, [rs.FusedShard(2, groups=3)])
    q, k, v = (f.permute(f.reshape(f.slice(qkv, 2, j * h, (j + 1) * h), (b, s, heads, hd)), (0, 2, 1, 3))
               for j in range(3))
    p = f.exp(f.matmul(q, f.permute(k, (0, 1, 3, 2))))
    ctx = f.reshape(f.permute(f.matmul(p, v), (0, 2, 1, 3)), (b, s, h))
    if out_proj:
        f.output(f.matmul(ctx, f.input("w_o", (h, h), "float32", MESH, [rs.Shard(0)])), [rs.Replicate()])
    else:
        f.output(ctx, [rs.Shard(2)])
    return f


def test_fused_attention_is_local():
    """The fused attention (``fused_attention``): every op runs on the local heads, no
    collective (no gather of the fused activation); with the output projection, one allreduce."""
    plan = _check_plan(fused_attention())
    assert plan.communications == (), plan.communications
    plan = _check_plan(fused_attention(out_proj=True))
    assert [c.kind for c in plan.communications] == ["allreduce"], plan.communications


def _rank_main(rank: int, plan: rs.Plan, local: dict[int, dict[str, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    return plan.run(local[rank])


@pytest.mark.multiproc
def test_fused_attention_gloo_run():
    """Two gloo processes run the fused attention's plan (local slices of the fused shards, the
    allreduce); the result matches the reference."""
    f = fused_attention(out_proj=True)
    plan = rs.optimize(f)
    g = torch.Generator().manual_seed(3)
    inputs = {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=g) for i in f.inputs}
    results = rs.launch(_rank_main, 2, plan, plan.shard_inputs(inputs), timeout_s=120)
    for k, ((_, ts), ref) in enumerate(zip(plan.lowered.outputs, rs.run_reference(f, inputs))):
        torch.testing.assert_close(unshard({r: results[r][k] for r in range(2)}, ts), ref, rtol=1e-4, atol=1e-4)


def test_cat_of_head_sharded_parts_is_fused_layout():
    """q, k, v head-sharded (``Shard(2)``) cat into the fused layout ``FusedShard(2, groups=3)``
    locally (the inverse direction)."""
    f = Fusion()
    parts = [f.input(n, (2, 3, 16), "float32", MESH, [rs.Shard(2)]) for n in "qkv"]
    f.output(f.cat(parts, 2), [rs.FusedShard(2, groups=3)])
    plan = _check_plan(f, seed=1)
    assert plan.communications == (), plan.communications


@pytest.mark.hf
def test_gpt2_block_megatron_fused_qkv():
    """GPT-2's block through ``from_torch`` with Megatron's placements (``c_attn`` fused-head
    sharded): the plan matches the module's eager output and moves no more than Megatron's two
    allreduces of [B, S, H]; neither the fused projection nor a weight is gathered."""
    pytest.importorskip("transformers")
    from benchmarks.fused_qkv import Block, megatron_bytes, megatron_placements

    torch.manual_seed(0)
    module = Block(32, 4, 8).eval()
    x = torch.randn(2, 8, 32)
    tp = rs.from_torch(module, (x,), [rs.Replicate()], [rs.Replicate()], MESH,
                       param_placements=megatron_placements(rs.FusedShard(-1, groups=3)))
    plan = rs.optimize(tp.fusion)
    (y,) = plan.simulate(tp.inputs(x))
    with torch.no_grad():
        torch.testing.assert_close(y, module(x), rtol=1e-4, atol=1e-5)
    assert plan.comm_bytes <= megatron_bytes(2, 8, 32, 2), plan.communications
    assert all(c.kind == "allreduce" for c in plan.communications), plan.communications
