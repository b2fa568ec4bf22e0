"""Uneven sharding: DTensor's torch.chunk semantics outside (``shard``/``unshard``, ``Plan.simulate``,
``Plan.shard_inputs``, ``Plan.run``), padding inside the plan (``reshard.passes.padding``).

Local shapes and offsets are compared with DTensor's own computation
(``torch.distributed.tensor._utils._compute_local_shape_and_global_offset``, a pure function of
the mesh shape and coordinates), plans with ``run_reference`` on random float64 inputs (random
Partial summands), and one plan runs over gloo in two processes.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor as dt

import reshard as rs
from reshard.passes.padding import CONSTANT_PREFIX, pad_fusion
from reshard.ir.sharding import TensorSharding, shard, unshard

M2 = rs.DeviceMesh([0, 1], ("tp",))
M4 = rs.DeviceMesh([0, 1, 2, 3], ("tp",))
M8 = rs.DeviceMesh(list(range(8)), ("tp",))
M2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
F64 = "float64"


def _dtensor_local(shape, mesh: rs.DeviceMesh, placements, coords) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """DTensor's local shape and global offset at mesh ``coords``."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    dplace = [dt.Shard(p.dim) if isinstance(p, rs.Shard) else dt.Replicate() for p in placements]
    shape_, offset = _compute_local_shape_and_global_offset(tuple(shape), tuple(mesh.shape), list(coords), dplace)
    return tuple(shape_), tuple(offset)


CASES = [
    ((7, 3), M2, [rs.Shard(0)]),
    ((3, 5), M4, [rs.Shard(1)]),
    ((1, 4), M4, [rs.Shard(0)]),  # three empty pieces
    ((50257, 2), M2, [rs.Shard(0)]),
    ((50257, 2), M4, [rs.Shard(0)]),
    ((50257, 2), M8, [rs.Shard(0)]),
    ((7, 5), M2x2, [rs.Shard(0), rs.Shard(1)]),
    ((7, 5), M2x2, [rs.Shard(0), rs.Shard(0)]),  # nested chunks 4, 3 -> 2, 2, 2, 1
    ((6, 5), M2x2, [rs.Shard(0), rs.Shard(0)]),  # nested chunks 3, 3 -> 2, 1, 2, 1 (tests/ir/test_nested_uneven.py)
    ((5, 3), M2x2, [rs.Replicate(), rs.Shard(0)]),
]


@pytest.mark.parametrize("shape,mesh,placements", CASES, ids=lambda v: str(v))
def test_shard_and_unshard_are_dtensors_chunks(shape, mesh, placements):
    g = torch.randn(shape, dtype=torch.float64)
    ts = TensorSharding.from_placements(shape, placements, mesh)
    locals_ = shard(g, ts)
    for r, loc in locals_.items():
        want_shape, offset = _dtensor_local(shape, mesh, placements, mesh.coords(r))
        assert tuple(loc.shape) == want_shape == ts.local_extent(mesh.coords(r))
        assert torch.equal(loc, g[tuple(slice(o, o + s) for o, s in zip(offset, want_shape))])
    # torch.chunk on a 1-D mesh
    if mesh.ndim == 1:
        d = placements[0].dim
        chunks = list(g.chunk(mesh.shape[0], d))
        for r in mesh.ranks:
            want = chunks[r] if r < len(chunks) else g.narrow(d, 0, 0)
            assert torch.equal(locals_[r], want)
    assert ts.local_shape == tuple(-(-n // math.prod(mesh.shape[a] for a, p in enumerate(placements)
                                                     if p == rs.Shard(d))) for d, n in enumerate(ts.shape))
    assert torch.equal(unshard(locals_, ts), g)
    assert torch.equal(unshard(locals_, placements, mesh, shape=shape), g)


def test_uneven_partial_round_trip_and_local_shape_errors():
    g = torch.randn(7, 3, dtype=torch.float64)
    ts = TensorSharding.from_placements((7, 3), [rs.Shard(0), rs.Partial()], M2x2)
    locals_ = shard(g, ts, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(locals_[0], locals_[1])  # random summands
    torch.testing.assert_close(unshard(locals_, ts), g)
    bad = dict(locals_)
    bad[2] = torch.zeros(4, 3, dtype=torch.float64)  # rank 2 (block 1) holds 3 rows
    with pytest.raises(rs.ReshardError, match=r"local tensor of shape \(4, 3\).*gives it \(3, 3\)"):
        unshard(bad, ts)


# ---- plans ---------------------------------------------------------------------------------
def check(f: rs.Fusion, seed: int = 0, special: float | None = None) -> rs.Plan:
    """optimize ``f``; its simulation on random float64 inputs (random Partial summands) equals
    run_reference; so do its random extractions."""
    plan = rs.optimize(f)
    gen = torch.Generator().manual_seed(seed)
    inputs = {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=gen, dtype=torch.float64)
              for i in f.inputs}
    outs = plan.simulate(inputs, generator=torch.Generator().manual_seed(seed + 1))
    refs = rs.run_reference(f, inputs)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r, rtol=1e-9, atol=1e-9)
    return plan


def test_elementwise_rows_7_on_2_ranks_stay_sharded():
    f = rs.Fusion()
    x = f.input("x", (7, 4), F64, M2, [rs.Shard(0)])
    y = f.input("y", (7, 4), F64, M2, [rs.Shard(0)])
    f.output(f.gelu(f.add(x, y)), [rs.Shard(0)])
    plan = check(f)
    assert plan.communications == ()
    assert "input x dim 0: 7 padded to 8 for Shard(0) on 2 ranks" in plan.explain()
    locals_ = plan.shard_inputs({"x": torch.zeros(7, 4, dtype=torch.float64), "y": torch.zeros(7, 4, dtype=torch.float64)})
    assert [tuple(v.shape) for v in locals_[0].values()] == [(4, 4)] * 2
    assert [tuple(v.shape) for v in locals_[1].values()] == [(3, 4)] * 2


@pytest.mark.parametrize("fn", ["sum", "max", "mean"])
def test_reductions_over_an_uneven_sharded_dim(fn):
    f = rs.Fusion()
    x = f.input("x", (7, 5), F64, M2, [rs.Shard(0)])
    f.output(f.reduce(fn, f.exp(x), 0), [rs.Replicate()])   # over the uneven dim: masked
    f.output(f.reduce(fn, x, 1), [rs.Shard(0)])             # keeps it: stays padded
    plan = check(f)
    assert "t1 dim 0: padding 7..8 masked with" in plan.explain()


def test_reduction_masks_nan_and_inf_in_padding():
    """Padding computed from zeros can be -inf or NaN (log 0, 0/0): the mask removes it."""
    f = rs.Fusion()
    x = f.input("x", (5, 3), F64, M4, [rs.Shard(0)])
    f.output(f.sum(f.log(f.abs(x)), 0), [rs.Replicate()])
    f.output(f.max(f.div(x, x), 0), [rs.Replicate()])
    check(f)


def test_matmul_contraction_over_an_uneven_dim():
    f = rs.Fusion()
    a = f.input("a", (3, 7), F64, M2, [rs.Shard(1)])
    b = f.input("b", (7, 4), F64, M2, [rs.Shard(0)])
    f.output(f.matmul(f.exp(a), b), [rs.Replicate()])
    plan = check(f)
    assert [c.kind for c in plan.communications] == ["allreduce"]


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [M2, M4, M8], ids=lambda m: f"{len(m.ranks)}ranks")
def test_vocab_50257_lm_head_and_softmax(mesh):
    """Vocab-parallel lm head (weight Shard(0) on the vocab) and softmax over the uneven vocab
    (64 rows: with 2 the cost model rightly gathers the weight, as it does for an even vocab)."""
    V, H, B = 50257, 4, 64
    f = rs.Fusion()
    h = f.input("h", (B, H), F64, mesh, [rs.Replicate()])
    w = f.input("w", (V, H), F64, mesh, [rs.Shard(0)])
    logits = f.matmul(h, f.permute(w, (1, 0)), name="logits")
    m = f.max(logits, 1)
    e = f.exp(f.sub(logits, f.broadcast(m, (B, V), (0,))))
    p = f.div(e, f.broadcast(f.sum(e, 1), (B, V), (0,)), name="probs")
    f.output(logits, [rs.Shard(1)])
    f.output(p, [rs.Shard(1)])
    plan = check(f)
    n = len(mesh.ranks)
    big = n * -(-V // n)
    assert f"input w dim 0: {V} padded to {big} for Shard(0) on {n} ranks" in plan.explain()
    # the logits stay vocab-sharded: only the row max and sum are communicated
    assert all(c.kind == "allreduce" for c in plan.communications), plan.explain()


def test_reshape_of_an_uneven_dim():
    f = rs.Fusion()
    x = f.input("x", (7, 4), F64, M2, [rs.Shard(0)])
    f.output(f.reshape(x, (28,)), [rs.Shard(0)])          # 28 is even on 2 ranks: sliced back at the output
    f.output(f.reshape(x, (7, 2, 2)), [rs.Shard(0)])      # keeps it: stays padded, local
    f.output(f.reshape(f.permute(x, (1, 0)), (28,)), [rs.Replicate()])  # merged as the inner factor: sliced back
    plan = check(f)
    assert "sliced back from 8 to 7 before reshape" in plan.explain()


def test_reshape_merging_and_splitting_an_outer_uneven_dim_stays_local():
    """[7->8, 4] -> [28->32] -> [7->8, 4] on 4 ranks: the padding stays at the end of the
    outermost dim, so both reshapes are local views and nothing is communicated."""
    f = rs.Fusion()
    x = f.input("x", (7, 4), F64, M4, [rs.Shard(0)])
    flat = f.reshape(f.exp(x), (28,))
    f.output(f.reshape(f.neg(flat), (7, 4)), [rs.Shard(0)])
    plan = check(f)
    assert plan.communications == () and "sliced back" not in plan.explain(), plan.explain()
    assert [t.shape for t in plan.fusion.tensors if t.name.startswith("t")][:3] == [(8, 4), (32,), (32,)]


def test_outputs_requested_uneven_from_even_inputs_and_cat_pad_slice():
    f = rs.Fusion()
    x = f.input("x", (8, 3), F64, M4, [rs.Shard(0)])
    y = f.slice(x, 0, 1, 6)                                # 5 rows
    f.output(y, [rs.Shard(0)])                             # uneven on 4 ranks: 2, 2, 1, 0
    z = f.cat([y, f.pad(y, 0, 1, 0)], 0)                   # 11 rows
    f.output(z, [rs.Shard(0)])
    f.output(f.slice(f.neg(y), 0, 2, 5), [rs.Shard(0)])
    check(f)


def test_redistribute_between_uneven_shardings_on_a_2x2_mesh():
    f = rs.Fusion()
    x = f.input("x", (7, 5), F64, M2x2, [rs.Shard(0), rs.Shard(1)])
    w = f.input("w", (5, 3), F64, M2x2, [rs.Replicate(), rs.Shard(0)])
    y = f.matmul(x, w)                                     # contraction over the uneven 5 (on 'tp')
    r = f.redistribute(f.tanh(y), [rs.Shard(0), rs.Shard(0)])
    f.output(r, [rs.Shard(0), rs.Shard(0)])
    f.output(f.mean(x, 0), [rs.Replicate(), rs.Shard(0)])
    check(f)


def test_even_programs_are_planned_unchanged():
    f = rs.Fusion()
    x = f.input("x", (8, 4), F64, M2, [rs.Shard(0)])
    f.output(f.sum(x, 0), [rs.Replicate()])
    assert pad_fusion(f) is None
    assert rs.optimize(f).padding is None


def test_padded_fusion_masks_only_folds_and_names_its_constants():
    f = rs.Fusion()
    x = f.input("x", (7, 4), F64, M2, [rs.Shard(0)])
    f.output(f.sum(f.exp(x), 0), [rs.Replicate()])
    f.output(f.exp(x), [rs.Shard(0)])
    pad = pad_fusion(f)
    kinds = [op.kind for op in pad.fusion.ops]
    assert kinds.count("masked") == 1 and "slice" not in kinds
    assert sorted(pad.constants) == [f"{CONSTANT_PREFIX}valid.7.8"]
    assert pad.fusion.tensors[pad.fusion.inputs[0]].shape == (8, 4)


# ---- gloo ----------------------------------------------------------------------------------
def _gloo_program() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (7, 4), F64, M2, [rs.Shard(0)])
    w = f.input("w", (4, 5), F64, M2, [rs.Replicate()])
    y = f.gelu(f.matmul(x, w))
    f.output(y, [rs.Shard(0)])
    f.output(f.sum(y, 0), [rs.Replicate()])
    return f


def _gloo_rank(rank: int) -> tuple[torch.Tensor, ...]:
    f = _gloo_program()
    plan = rs.optimize(f)
    gen = torch.Generator().manual_seed(7)
    inputs = {"x": torch.randn(7, 4, generator=gen, dtype=torch.float64),
              "w": torch.randn(4, 5, generator=gen, dtype=torch.float64)}
    return plan.run(plan.shard_inputs(inputs)[rank])


def _gloo_ranks(rank: int) -> dict[str, object]:
    """Both gloo cases on one process group: the run, then the wrong local input."""
    return {"run": _gloo_rank(rank), "wrong": _gloo_wrong_local_rank(rank)}


@pytest.fixture(scope="module")
def gloo_results() -> list[dict[str, object]]:
    """Each rank's results of both gloo cases, from one launch."""
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("gloo is not available")
    return rs.launch(_gloo_ranks, 2, timeout_s=60)


@pytest.mark.multiproc
@pytest.mark.slow
def test_plan_run_on_gloo_takes_and_gives_dtensor_locals(gloo_results):
    results = [r["run"] for r in gloo_results]
    f = _gloo_program()
    gen = torch.Generator().manual_seed(7)
    inputs = {"x": torch.randn(7, 4, generator=gen, dtype=torch.float64),
              "w": torch.randn(4, 5, generator=gen, dtype=torch.float64)}
    ref_y, ref_s = rs.run_reference(f, inputs)
    assert [tuple(r[0].shape) for r in results] == [(4, 5), (3, 5)]
    torch.testing.assert_close(torch.cat([results[0][0], results[1][0]]), ref_y)
    for r in results:
        torch.testing.assert_close(r[1], ref_s)


def _gloo_wrong_local_rank(rank: int) -> str:
    """Rank 1 gives its padded block (4 rows) instead of its DTensor local tensor (3 rows)."""
    plan = rs.optimize(_gloo_program())
    local = plan.shard_inputs({"x": torch.randn(7, 4, dtype=torch.float64),
                               "w": torch.randn(4, 5, dtype=torch.float64)})[rank]
    if rank == 1:
        (x,) = [buf for buf, name, _ in plan.lowered.inputs if name == "x"]
        local = {**local, x: torch.randn(4, 4, dtype=torch.float64)}
    with pytest.raises(rs.ReshardError) as e:
        plan.run(local)
    return str(e.value)


@pytest.mark.multiproc
def test_plan_run_names_the_dtensor_local_shape_of_a_wrong_uneven_input(gloo_results):
    """A rank giving a wrong local tensor for an uneven input (its padded block): every rank
    raises, naming that rank's DTensor local shape (3 of 7 rows on rank 1), not the block."""
    zero, one = (r["wrong"] for r in gloo_results)
    assert "rank(s) [1]" in zero and "(3, 4)" in zero, zero
    assert "input 'x'" in one and "has shape (4, 4)" in one and "expects (3, 4)" in one, one


def test_from_torch_block_with_7_rows_sequence_parallel():
    """A transformer block through from_torch with 7 rows Shard(0) on 2 ranks (was a
    ReshardError): its plan's simulation matches the module's eager output."""
    from tests.frontend.test_from_torch import MESH, _block, _weights
    m, _ = _block()
    x = torch.randn(7, m.ln.weight.shape[0])
    tp = rs.from_torch(m, (x,), [rs.Shard(0)], [rs.Shard(0)], MESH, param_placements=_weights(rs.Shard, rs.Replicate))
    plan = rs.optimize(tp.fusion)
    assert plan.padding is not None
    with torch.no_grad():
        expected = m(x)
    (y,) = plan.simulate(tp.inputs(x))
    torch.testing.assert_close(y, expected)


def test_int_and_bool_reductions_over_an_uneven_dim():
    """Masks keep their law for ints (sum: exact zero; max: the int minimum) and bools (max = any:
    False)."""
    f = rs.Fusion()
    x = f.input("x", (7, 3), "int64", M2, [rs.Shard(0)])
    f.output(f.sum(f.neg(x), 0), [rs.Replicate()])
    f.output(f.max(f.neg(x), 0), [rs.Replicate()])
    f.output(f.max(f.gt(x, f.neg(x)), 0), [rs.Replicate()])
    plan = rs.optimize(f)
    x_ = -torch.arange(1, 22, dtype=torch.int64).reshape(7, 3)  # all negative: max(-x) > 0 > padding's 0?
    for got, ref in zip(plan.simulate({"x": x_}), rs.run_reference(f, {"x": x_})):
        assert torch.equal(got, ref)
    x_ = torch.arange(1, 22, dtype=torch.int64).reshape(7, 3)  # -x all negative: a zero in padding would win max
    for got, ref in zip(plan.simulate({"x": x_}), rs.run_reference(f, {"x": x_})):
        assert torch.equal(got, ref)


@pytest.mark.parametrize("mesh", [M2, M4], ids=lambda m: f"{len(m.ranks)}ranks")
def test_vocab_parallel_embedding_and_pick_with_vocab_50257(mesh):
    """Lookups never read padding rows of the table (indices < V); the indices' own padding (an
    uneven sequence dim) is zeroed first, a valid index."""
    V, H, B, S = 50257, 4, 2, 7
    f = rs.Fusion()
    w = f.input("w", (V, H), F64, mesh, [rs.Shard(0)])
    ids = f.input("ids", (B, S), "int64", mesh, [rs.Shard(1)])       # 7 positions: uneven too
    emb = f.embedding(w, f.add(ids, ids))                            # computed indices: padding zeroed
    f.output(emb, [rs.Shard(1)])
    logits = f.input("logits", (B, V), F64, mesh, [rs.Shard(1)])
    labels = f.input("labels", (B,), "int64", mesh, [rs.Replicate()])
    f.output(f.pick(logits, labels), [rs.Replicate()])
    plan = rs.optimize(f)
    gen = torch.Generator().manual_seed(3)
    inputs = {"w": torch.randn(V, H, generator=gen, dtype=torch.float64),
              "ids": torch.randint(0, V // 2, (B, S), generator=gen),
              "logits": torch.randn(B, V, generator=gen, dtype=torch.float64),
              "labels": torch.tensor([V - 1, 5])}
    for got, ref in zip(plan.simulate(inputs), rs.run_reference(f, inputs)):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert "ids" in " ".join(plan.padding.notes)


def test_vocab_parallel_cross_entropy_with_vocab_50257():
    """Megatron's vocab-parallel cross entropy on an uneven vocab: local max and sum-exp reduced
    across the vocab shards, the target logit by a masked pick; the logits are never gathered
    (nor the weight: at H = 64 its allgather costs more than the allreduces)."""
    V, H, B = 50257, 64, 64
    f = rs.Fusion()
    h = f.input("h", (B, H), F64, M2, [rs.Replicate()])
    w = f.input("w", (V, H), F64, M2, [rs.Shard(0)])
    labels = f.input("labels", (B,), "int64", M2, [rs.Replicate()])
    logits = f.matmul(h, f.permute(w, (1, 0)), name="logits")
    m = f.max(logits, 1)
    lse = f.add(f.log(f.sum(f.exp(f.sub(logits, f.broadcast(m, (B, V), (0,)))), 1)), m)
    loss = f.mean(f.reshape(f.sub(lse, f.pick(logits, labels)), (1, B)), 1, name="loss")
    f.output(loss, [rs.Replicate()])
    plan = rs.optimize(f)
    gen = torch.Generator().manual_seed(5)
    inputs = {"h": torch.randn(B, H, generator=gen, dtype=torch.float64),
              "w": torch.randn(V, H, generator=gen, dtype=torch.float64),
              "labels": torch.randint(0, V, (B,), generator=gen)}
    (got,) = plan.simulate(inputs)
    torch.testing.assert_close(got, rs.run_reference(f, inputs)[0], rtol=1e-9, atol=1e-9)
    want = torch.nn.functional.cross_entropy(inputs["h"] @ inputs["w"].T, inputs["labels"])
    torch.testing.assert_close(got.reshape(()), want)
    assert "allgather" not in [c.kind for c in plan.communications], plan.explain()


def test_zero_padding_needs_no_mask():
    """Inputs' padding is exactly zero on every rank (Partial summands too), and linear ops keep
    it so: a sum or a contraction over it masks nothing; a contraction masks only the operand
    whose padding is not zero (exp's)."""
    f = rs.Fusion()
    x = f.input("x", (7, 5), F64, M2, [rs.Shard(0)])
    a = f.input("a", (3, 7), F64, M2, [rs.Shard(1)])
    b = f.input("b", (7, 4), F64, M2, [rs.Shard(0)])
    f.output(f.sum(f.add(f.scale(x, 2.0), f.permute(f.permute(x, (1, 0)), (1, 0))), 0), [rs.Replicate()])
    f.output(f.matmul(a, b), [rs.Replicate()])
    f.output(f.matmul(f.exp(a), f.neg(b)), [rs.Replicate()])
    pad = pad_fusion(f)
    masked = [op for op in pad.fusion.ops if op.kind == "masked"]
    assert len(masked) == 1 and pad.fusion.tensors[masked[0].inputs[0]].shape == (3, 8)  # exp(a) only
    check(f)
    g = rs.Fusion()  # Partial summands (random in check) are zero-padded each
    p = g.input("p", (7, 5), F64, M2x2, [rs.Shard(0), rs.Partial()])
    g.output(g.sum(g.neg(p), 0), [rs.Replicate(), rs.Replicate()])
    assert not any(op.kind == "masked" for op in pad_fusion(g).fusion.ops)
    check(g)


def test_constant_inputs_join_the_local_inputs_device():
    """The pass's constant inputs (a ``valid`` mask) are added on the device of the rank's local
    inputs (was: always the CPU, so ``simulate(device="cuda")`` of a masked plan, a vocab-50257
    cross entropy, mixed devices in its ``masked`` step)."""
    f = rs.Fusion()
    x = f.input("x", (4, 11), F64, M2, [rs.Shard(1)])
    f.output(f.sum(f.exp(x), 1), [rs.Replicate()])
    plan = rs.optimize(f)
    assert plan.padding.constants
    for rank, locals_ in plan.shard_inputs({"x": torch.randn(4, 11, dtype=torch.float64)}).items():
        got = plan.plan_locals(rank, {k: v.to("meta") for k, v in locals_.items()})
        assert len(got) > len(locals_) and all(t.device.type == "meta" for t in got.values())
