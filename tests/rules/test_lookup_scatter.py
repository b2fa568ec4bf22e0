"""``lookup``'s scatter strategies (``rules.lookup``: ``scatter-rows``, the masked local scatter,
and the Partial sums of token-sharded scatters) for the lookups' backward ops, ``f.embedding_grad``
and ``f.unpick`` (``reshard.ir.ops.lookup``): plans simulated against the reference, and the
reference against torch's own backward (autograd through ``F.embedding`` / ``torch.gather``), on
2 and 4 ranks and a 2x2 mesh, with random extractions of the same e-graph: the vocab-sharded
result from whole g and ids is a masked local scatter (no communication), tokens sharded alike
give a Partial(sum) result the plan reduces, a hidden-sharded g a hidden-sharded result, uneven
vocabularies (11 on 2 ranks, 13 on 4: 50257's remainder), duplicate ids.  The ops' reference,
builder errors and shapes: ``tests/ops/test_op_embedding_grad.py``; the gathers' strategies:
``test_lookup.py``."""

from __future__ import annotations

import random

import pytest
import torch

import reshard as rs
from reshard import Partial, Replicate, Shard
from reshard.plan import Saturated
from reshard.testing import programs as P
from reshard.testing.scatter_autograd import torch_embedding_grad, torch_unpick

M2 = rs.DeviceMesh([0, 1], ("tp",))
M4 = rs.DeviceMesh([0, 1, 2, 3], ("tp",))
M2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
MESHES = {"2": M2, "4": M4, "2x2": M2x2}


def rep(mesh: rs.DeviceMesh) -> list:
    return [Replicate()] * mesh.ndim


def on_tp(mesh: rs.DeviceMesh, p: object) -> list:
    """``p`` on the last (tp) axis, Replicate elsewhere."""
    return rep(mesh)[:-1] + [p]


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def check(f: rs.Fusion, torch_fn, n_random: int = 4) -> rs.Plan:
    """The chosen plan and ``n_random`` random extractions of its e-graph against the reference
    (on the CPU and, where there is one, on a GPU: the scatters run on their kernels there), and the
    reference against torch's backward (``torch_fn(inputs) -> [outputs]``)."""
    plan = rs.optimize(f)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    rng = random.Random(5)
    for i, p in enumerate([plan] + [sat.plan(perturb=rng) for _ in range(n_random)]):
        inputs = P.random_inputs(f, i)
        for device in DEVICES:
            P.assert_plan_matches_reference(p, f, inputs, i, device=device)
        for got, want in zip(rs.run_reference(f, inputs), torch_fn(inputs), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    return plan


def egrad_program(mesh: rs.DeviceMesh, g_p: list, ids_p: list, out_p: list, *, tokens=(4, 6), h: int = 8,
                  vocab: int = 64) -> rs.Fusion:
    f = rs.Fusion()
    g = f.input("g", tokens + (h,), "float32", mesh, g_p)
    ids = f.input("ids", tokens, "int64", mesh, ids_p)
    f.output(f.embedding_grad(g, ids, vocab, name="dw"), out_p)
    return f


def egrad_torch(vocab: int):
    return lambda x: [torch_embedding_grad(x["g"], x["ids"], vocab)]


def unpick_program(mesh: rs.DeviceMesh, g_p: list, idx_p: list, out_p: list, *, batch=(4, 2),
                   vocab: int = 64) -> rs.Fusion:
    f = rs.Fusion()
    g = f.input("g", batch, "float32", mesh, g_p)
    idx = f.input("idx", batch, "int64", mesh, idx_p)
    f.output(f.unpick(g, idx, vocab, name="dx"), out_p)
    return f


def unpick_torch(vocab: int):
    return lambda x: [torch_unpick(x["g"], x["idx"], vocab)]


def local_scatter_blocks(plan: rs.Plan, fop: str) -> list[tuple[int, ...]]:
    """The result block shapes the plan's ``fop`` steps write."""
    return [s.attr("dst").local_shape for s in plan.steps if s.attr("fop") == fop]


# ---- embedding_grad ------------------------------------------------------------------------

@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_vocab_sharded_gradient_from_whole_g_is_a_masked_local_scatter(mesh):
    """Megatron's vocab-parallel embedding backward: g and ids whole on tp, d weight Shard(0)
    there: each rank writes the ids among its rows, into its block only; nothing moves."""
    m = MESHES[mesh]
    f = egrad_program(m, rep(m), rep(m), on_tp(m, Shard(0)), vocab=4096)
    plan = check(f, egrad_torch(4096))
    assert plan.comm_bytes == 0 and not plan.communications, plan.explain()
    assert local_scatter_blocks(plan, "embedding_grad") == [(4096 // m.shape[-1], 8)], plan.explain()


@pytest.mark.parametrize("mesh", MESHES, ids=str)
@pytest.mark.parametrize("out", ["replicate", "shard", "partial"])
def test_token_sharded_gradient_is_partial_then_reduced(mesh, out):
    """g and ids sharded alike along tokens (data / sequence parallel): each rank scatters its
    tokens into a Partial(sum) gradient, which the plan reduces (allreduce to a replicated one,
    reduce-scatter to a vocab-sharded one) or leaves Partial; g and ids never move."""
    m = MESHES[mesh]
    toks = [Shard(1)] * m.ndim if m.ndim == 1 else [Shard(0), Shard(1)]
    want = {"replicate": rep(m), "shard": [Shard(0)] * m.ndim, "partial": [Partial()] * m.ndim}[out]
    f = egrad_program(m, toks, toks, want, tokens=(4, 256), h=8, vocab=32)
    plan = check(f, egrad_torch(32))
    kinds = {"replicate": {"allreduce"}, "shard": {"reduce_scatter"}, "partial": set()}[out]
    assert {c.kind for c in plan.communications} == kinds, plan.explain()
    assert all(c.tensor == "dw" for c in plan.communications), plan.explain()


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_hidden_sharded_gradient_is_local(mesh):
    m = MESHES[mesh]
    f = egrad_program(m, on_tp(m, Shard(2)), rep(m), on_tp(m, Shard(1)))
    plan = check(f, egrad_torch(64))
    assert not plan.communications, plan.explain()


def test_dp_tp_gradient_reduced_over_dp_only():
    """2x2 dp x tp: tokens sharded over dp, vocab rows over tp (the parameter's placement): a
    masked local scatter per tp rank, Partial over dp, reduced over dp at the block's size."""
    f = egrad_program(M2x2, [Shard(0), Replicate()], [Shard(0), Replicate()], [Replicate(), Shard(0)],
                      vocab=4096)
    plan = check(f, egrad_torch(4096))
    assert [(c.kind, c.axis) for c in plan.communications] == [("allreduce", "dp")], plan.explain()
    assert plan.comm_bytes == 4096 // 2 * 8 * 4, plan.explain()


def test_partial_g_stays_partial():
    """embedding_grad is linear in g: a Partial(sum) g gives a Partial(sum) gradient."""
    f = egrad_program(M2, [Partial()], [Replicate()], [Partial()])
    plan = check(f, egrad_torch(64))
    assert not plan.communications, plan.explain()


def test_open_shardings_random_plans():
    """Nothing fixed but the output: every strategy of the e-graph, random extractions."""
    f = rs.Fusion()
    g = f.input("g", (4, 2, 8), "float64", M2x2)
    ids = f.input("ids", (4, 2), "int64", M2x2)
    f.output(f.tanh(f.embedding_grad(g, ids, 16)), [Replicate(), Shard(0)])
    check(f, lambda x: [torch.tanh(torch_embedding_grad(x["g"], x["ids"], 16))], n_random=10)


@pytest.mark.parametrize("mesh,vocab", [(M2, 11), (M4, 13)], ids=["11on2", "13on4"])
def test_uneven_vocab_gradient_is_local(mesh, vocab):
    """An uneven vocabulary (DTensor's torch.chunk pieces): built at the padded extent, the rows
    past V never written; still no communication."""
    f = egrad_program(mesh, rep(mesh), rep(mesh), [Shard(0)], vocab=vocab)
    plan = check(f, egrad_torch(vocab))
    assert plan.comm_bytes == 0, plan.explain()
    assert local_scatter_blocks(plan, "embedding_grad") == [(-(-vocab // mesh.size), 8)], plan.explain()
    f = egrad_program(mesh, [Shard(1)], [Shard(1)], [Shard(0)], tokens=(2, 4 * mesh.size), vocab=vocab)
    check(f, egrad_torch(vocab))


def test_uneven_tokens_padding_adds_nothing():
    """Tokens sharded unevenly (7 on 2 ranks): g = exp(x) has exp(0) = 1 in its padding, which is
    masked to 0 (its id to the valid index 0), so row 0 gets nothing from the padded tokens; the
    tokens stay sharded (masked, not sliced back) and only the gradient is reduced."""
    f = rs.Fusion()
    x = f.input("x", (2, 7, 3), "float32", M2, [Shard(1)])
    ids = f.input("ids", (2, 7), "int64", M2, [Shard(1)])
    f.output(f.embedding_grad(f.exp(x), ids, 5, name="dw"), [Replicate()])
    plan = check(f, lambda v: [torch_embedding_grad(torch.exp(v["x"]), v["ids"], 5)])
    assert [(c.kind, c.tensor) for c in plan.communications] == [("allreduce", "dw")], plan.explain()


@pytest.mark.parametrize("pad", [0, 37, -1])
def test_padding_idx_row_gets_no_gradient(pad):
    """torch's ``padding_idx``: the ids naming that row add nothing (negative: from the end),
    also in the masked local scatter of a vocab-sharded gradient."""
    f = rs.Fusion()
    g = f.input("g", (4, 6, 8), "float32", M2, [Replicate()])
    ids = f.input("ids", (4, 6), "int64", M2, [Replicate()])
    f.output(f.embedding_grad(g, ids, 64, padding_idx=pad), [Shard(0)])
    inputs = P.random_inputs(f, 3)
    inputs["ids"][:, :2] = pad % 64
    plan = rs.optimize(f)
    P.assert_plan_matches_reference(plan, f, inputs)
    (got,) = plan.simulate(inputs)
    want = torch_embedding_grad(inputs["g"], inputs["ids"], 64, pad)
    torch.testing.assert_close(got, want)
    assert not got[pad].any() and plan.comm_bytes == 0


# ---- unpick ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_unpick_vocab_sharded_from_whole_g_is_local(mesh):
    """The cross-entropy target logit's backward onto vocab-sharded logits: 0 bytes."""
    m = MESHES[mesh]
    f = unpick_program(m, rep(m), rep(m), on_tp(m, Shard(2)), vocab=4096)
    plan = check(f, unpick_torch(4096))
    assert plan.comm_bytes == 0 and not plan.communications, plan.explain()
    assert local_scatter_blocks(plan, "unpick") == [(4, 2, 4096 // m.shape[-1])], plan.explain()


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_unpick_batch_sharded_is_local(mesh):
    m = MESHES[mesh]
    p = [Shard(0)] * m.ndim
    f = unpick_program(m, p, p, p, batch=(8, 2))
    plan = check(f, unpick_torch(64))
    assert not plan.communications, plan.explain()


@pytest.mark.parametrize("mesh,vocab", [(M2, 11), (M4, 13)], ids=["11on2", "13on4"])
def test_unpick_uneven_vocab_is_local(mesh, vocab):
    f = unpick_program(mesh, rep(mesh), rep(mesh), [Shard(2)], vocab=vocab)
    plan = check(f, unpick_torch(vocab))
    assert plan.comm_bytes == 0, plan.explain()
    assert local_scatter_blocks(plan, "unpick") == [(4, 2, -(-vocab // mesh.size))], plan.explain()


def test_unpick_open_shardings_random_plans():
    f = rs.Fusion()
    g = f.input("g", (4, 2), "float64", M2x2)
    idx = f.input("idx", (4, 2), "int64", M2x2)
    f.output(f.exp(f.unpick(g, idx, 8)), [Shard(0), Shard(2)])
    check(f, lambda x: [torch.exp(torch_unpick(x["g"], x["idx"], 8))], n_random=10)
