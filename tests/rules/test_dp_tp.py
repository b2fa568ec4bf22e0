"""Data x tensor parallelism on a ``dp x tp`` mesh (issue 20): a value realized Replicate on one
axis and bound to a non-block index on another (Megatron's fused QKV layout, a cyclic or inner
split) is sliced locally to a block shard on the Replicate axis (``resharding``'s
``slice-candidate``), so GPT-2's ``c_attn`` bias meets the batch-sharded activations without a
gather over ``dp``."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir import Inner, Outer, Root, TensorSharding
from reshard.ir.fused_shard import FusedShard
from reshard.ir.fusion import Fusion
from reshard.ir.ids import ID
from reshard.testing import fuzz_programs as FP

MESH2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))


def _one_dim(x: ID) -> int | None:
    """The dim an index of ``FP.id_candidates`` reads when it reads one (no Merge), else None."""
    while isinstance(x, (Outer, Inner)):
        x = x.x
    return x.dim if isinstance(x, Root) else None


def _law_cases(count: int) -> list[tuple[rs.DeviceMesh, tuple[int, ...], int, ID, int]]:
    """Random (mesh, shape, bound axis b, its index over one dim, sliced dim j): the index is not
    a block split (those are simple candidates already), j another dim that the Replicate axis
    divides; plus GPT-2's fused bias broadcast over [tokens, 3H] with FusedShard on tp."""
    fused, _ = FusedShard(1, groups=3).split(Root(1, 12), 2, "test")
    out = [(MESH2x2, (8, 12), 1, fused, 0)]
    rng = torch.Generator().manual_seed(0)

    def pick(seq: list) -> object:
        return seq[int(torch.randint(0, len(seq), (1,), generator=rng))]

    while len(out) < count:
        mesh = pick([FP.M2x2, FP.M2x3, rs.DeviceMesh([[0, 1], [2, 3], [4, 5]], ("a", "b"))])
        shape = tuple(pick([2, 3, 4, 6, 8, 12]) for _ in range(int(torch.randint(2, 4, (1,), generator=rng))))
        b = pick([0, 1])
        a = 1 - b
        ids = [x for x in FP.id_candidates(shape, mesh.shape[b])
               if _one_dim(x) is not None and not (isinstance(x, Outer) and isinstance(x.x, Root))]
        if not ids:
            continue
        x = pick(ids)
        dims = [j for j, e in enumerate(shape) if j != _one_dim(x) and e % mesh.shape[a] == 0]
        if dims:
            out.append((mesh, shape, b, x, pick(dims)))
    return out


@pytest.mark.parametrize("case", _law_cases(10), ids=lambda c: f"{c[0].shape}-{c[1]}-axis{c[2]}-{c[3]}-dim{c[4]}")
def test_slice_candidate_law_oracle(case):
    """Law (``slice-candidate``): a value at ``d`` with R on axis a is, sliced locally, the same
    value at ``d[a := S(j)]`` when no other axis's index reads dim j.  ``x + exp(b)`` with ``b``
    at ``[R, X]`` (X bound on the other axis: a fused, cyclic or inner split) and ``x`` and the
    result at ``[S(j), X]``: ``exp(b)`` (or ``b``) is sliced to ``[S(j), X]`` locally, so the plan
    moves nothing; it simulates to the reference on random tensors."""
    mesh, shape, b, x, j = case
    a = 1 - b
    at = [rs.Replicate(), rs.Replicate()]
    at[b] = x
    rep = TensorSharding(mesh, shape, tuple(at))
    at[a] = Outer(Root(j, shape[j]), mesh.shape[a])
    sliced = TensorSharding(mesh, shape, tuple(at))
    f = Fusion()
    bias = f.input("b", shape, "float32", mesh, rep)
    act = f.input("x", shape, "float32", mesh, sliced)
    f.output(f.add(act, f.exp(bias)), sliced)
    plan = rs.optimize(f)
    assert plan.communications == (), plan.explain()
    g = torch.Generator().manual_seed(len(shape))
    inputs = {"b": torch.randn(shape, generator=g), "x": torch.randn(shape, generator=g)}
    (y,) = plan.simulate(inputs)
    torch.testing.assert_close(y, rs.run_reference(f, inputs)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.hf
def test_gpt2_block_dp_tp_megatron():
    """GPT-2's block (H=32, 4 heads) through ``from_torch`` on a 2x2 (dp x tp) mesh with Megatron's
    placements (``c_attn`` fused-head sharded on tp, parameters replicated over dp, the block's
    input and output batch-sharded over dp): the plan matches the module's eager output and moves
    no more than Megatron's two allreduces of the local [B/dp, S, H] over tp."""
    pytest.importorskip("transformers")
    from benchmarks.fused_qkv import Block, activation_placements, megatron_bytes, megatron_placements

    torch.manual_seed(0)
    module = Block(32, 4, 8).eval()
    x = torch.randn(4, 8, 32)
    act = activation_placements(dp=2)
    prog = rs.from_torch(module, (x,), act, act, MESH2x2,
                         param_placements=megatron_placements(rs.FusedShard(-1, groups=3), dp=2))
    plan = rs.optimize(prog.fusion)
    (y,) = plan.simulate(prog.inputs(x))
    with torch.no_grad():
        torch.testing.assert_close(y, module(x), rtol=1e-4, atol=1e-5)
    assert plan.comm_bytes <= megatron_bytes(4, 8, 32, tp=2, dp=2), plan.communications
    assert [(c.kind, c.axis) for c in plan.communications] == [("allreduce", "tp")] * 2, plan.communications
