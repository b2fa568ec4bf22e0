"""``lookup``'s strategies (``rules.lookup``) for ``f.embedding`` and ``f.pick``
(``reshard.ir.ops.lookup``): oracle tests (``plan.simulate`` against ``rs.run_reference``) on
meshes of 2 and 4 ranks and a 2x2 mesh, of the plan the cost model picks and of random
extractions of the same e-graph (every strategy the e-graph holds); the vocab-parallel plans
(Megatron's embedding and cross-entropy target logit: no gather of the table, the result reduced
by a collective).  The ops' builder errors and shapes: ``tests/ops/test_op_lookup.py``; the
scatters' strategies: ``test_lookup_scatter.py``."""

from __future__ import annotations

import random

import pytest
import torch

import reshard as rs
from reshard import Partial, Replicate, Shard
from reshard.ir import Inner, Root, TensorSharding
from reshard.plan import Saturated
from reshard.testing import programs as P

M2 = rs.DeviceMesh([0, 1], ("tp",))
M4 = rs.DeviceMesh([0, 1, 2, 3], ("tp",))
M2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
MESHES = {"2": M2, "4": M4, "2x2": M2x2}
#: vocabularies large enough that gathering the table costs more than reducing the result
V, H = 8192, 64


def rep(mesh: rs.DeviceMesh) -> list:
    return [Replicate()] * mesh.ndim


def on_tp(mesh: rs.DeviceMesh, p: object) -> list:
    """``p`` on the last (tp) axis, Replicate elsewhere."""
    return rep(mesh)[:-1] + [p]


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def check(plan: rs.Plan, f: rs.Fusion, seed: int = 0) -> None:
    """The plan simulated against the reference, on the CPU and (where there is one) on a GPU."""
    for device in DEVICES:
        P.assert_plan_matches_reference(plan, f, P.random_inputs(f, seed), seed + 1, device=device)


def check_all(f: rs.Fusion, n_random: int = 6) -> rs.Plan:
    """The chosen plan and ``n_random`` random extractions of its e-graph, each against the
    reference; returns the chosen plan."""
    plan = rs.optimize(f)
    check(plan, f)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    rng = random.Random(7)
    for i in range(n_random):
        check(sat.plan(perturb=rng), f, seed=i + 1)
    return plan


def comms_of(plan: rs.Plan, name: str) -> list:
    return [c for c in plan.communications if c.tensor == name]


# ---- embedding -----------------------------------------------------------------------------

@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_embedding_vocab_parallel_reduces_the_result_not_the_weight(mesh):
    """Megatron's vocab-parallel embedding: weight Shard(0) on tp, ids replicated there (on the
    2x2 mesh sharded over dp): masked local lookups and a reduction of the [*I, H] result."""
    m = MESHES[mesh]
    f = rs.Fusion()
    w = f.input("w", (V, H), "float32", m, on_tp(m, Shard(0)))
    ids_p = [Shard(0), Replicate()] if m.ndim == 2 else rep(m)
    ids = f.input("ids", (4, 8), "int64", m, ids_p)
    e = f.embedding(w, ids, name="e")
    f.output(e, ids_p)
    plan = check_all(f)
    assert not comms_of(plan, "w"), plan.explain()
    assert {c.kind for c in comms_of(plan, "e")} & {"allreduce", "reduce_scatter"}, plan.explain()
    assert all(c.tensor == "e" for c in plan.communications), plan.explain()


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_embedding_hidden_sharded_is_local(mesh):
    m = MESHES[mesh]
    f = rs.Fusion()
    w = f.input("w", (64, 16), "float32", m, on_tp(m, Shard(1)))
    ids = f.input("ids", (4, 8), "int64", m, rep(m))
    e = f.embedding(w, ids)
    f.output(e, on_tp(m, Shard(2)))
    plan = check_all(f)
    assert not plan.communications, plan.explain()


@pytest.mark.parametrize("mesh", MESHES, ids=str)
@pytest.mark.parametrize("dim", [0, 1], ids=["batch", "seq"])
def test_embedding_ids_sharded_replicated_weight(mesh, dim):
    m = MESHES[mesh]
    f = rs.Fusion()
    w = f.input("w", (64, 16), "float32", m, rep(m))
    ids_p = [Shard(dim)] * m.ndim if m.ndim == 1 else [Shard(0), Shard(1)]
    ids = f.input("ids", (4, 8), "int64", m, ids_p)
    e = f.embedding(w, ids)
    f.output(e, ids_p)
    plan = check_all(f)
    assert not plan.communications, plan.explain()


def test_embedding_open_shardings_random_plans():
    """Nothing fixed but the output: every strategy of the e-graph, random extractions."""
    f = rs.Fusion()
    w = f.input("w", (16, 8), "float64", M2x2)
    ids = f.input("ids", (4, 2), "int64", M2x2)
    f.output(f.tanh(f.embedding(w, ids)), [Shard(0), Replicate()])
    check_all(f, n_random=12)


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_int_tables_are_gathered_exactly(mesh):
    """An int64 table (a position or token-id table: T5's shifted decoder ids, RoBERTa's position
    ids) read by ``embedding`` and ``pick``, split along its indexed dim: masked local lookups
    giving int Partial sums (the outputs asked so: no communication), and a replicated result
    (random extractions: reduced, or the table gathered), each equal to the reference."""
    m = MESHES[mesh]
    f = rs.Fusion()
    w = f.input("w", (64, 8), "int64", m, on_tp(m, Shard(0)))
    x = f.input("x", (4, 64), "int64", m, on_tp(m, Shard(1)))
    ids = f.input("ids", (4, 8), "int64", m, rep(m))
    i = f.input("i", (4,), "int64", m, rep(m))
    f.output(f.embedding(w, ids), on_tp(m, Partial()))
    f.output(f.pick(x, i), on_tp(m, Partial()))
    assert not check_all(f).communications
    g = rs.Fusion()
    w, ids = g.input("w", (64, 8), "int64", m, on_tp(m, Shard(0))), g.input("ids", (4, 8), "int64", m, rep(m))
    g.output(g.mul(g.embedding(w, ids), g.input("c", (4, 8, 8), "int64", m, rep(m))), rep(m))
    check_all(g, n_random=12)


# ---- pick ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_pick_vocab_parallel_never_gathers_x(mesh):
    """The cross-entropy target logit on vocab-sharded logits: masked local picks, a [B]-sized
    reduction; x is never gathered."""
    m = MESHES[mesh]
    f = rs.Fusion()
    x = f.input("x", (8, 1024), "float32", m, on_tp(m, Shard(1)))
    idx = f.input("idx", (8,), "int64", m, rep(m))
    y = f.pick(x, idx, name="y")
    f.output(y, rep(m))
    plan = check_all(f)
    assert not comms_of(plan, "x"), plan.explain()
    assert comms_of(plan, "y") and all(c.bytes <= 8 * 4 for c in plan.communications), plan.explain()


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_pick_batch_sharded_is_local(mesh):
    m = MESHES[mesh]
    f = rs.Fusion()
    p = [Shard(0)] * m.ndim
    x = f.input("x", (8, 4, 32), "float32", m, p)
    idx = f.input("idx", (8, 4), "int64", m, p)
    y = f.pick(x, idx)
    f.output(y, p)
    plan = check_all(f)
    assert not plan.communications, plan.explain()


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_pick_partial_x_stays_partial(mesh):
    """pick is linear in x: a Partial(sum) x gives a Partial(sum) pick, reduced after (x's
    [B, V] is never reduced)."""
    m = MESHES[mesh]
    f = rs.Fusion()
    x = f.input("x", (8, 512), "float32", m, on_tp(m, Partial()))
    idx = f.input("idx", (8,), "int64", m, rep(m))
    y = f.pick(x, idx, name="y")
    f.output(y, rep(m))
    plan = check_all(f)
    assert not comms_of(plan, "x"), plan.explain()
    assert [c.kind for c in plan.communications] == ["allreduce"], plan.explain()


def test_embedding_cyclic_vocab_shards():
    """A loop-domain (cyclic) split of V: the masked lookup reads the rank's rows from the
    sharding's local indices (not a block range)."""
    f = rs.Fusion()
    cyclic = TensorSharding(M2, (V, 4), (Inner(Root(0, V), V // 2),))
    w = f.input("w", (V, 4), "float32", M2, cyclic)
    ids = f.input("ids", (4, 8), "int64", M2, [Replicate()])
    f.output(f.embedding(w, ids, name="e"), [Replicate()])
    plan = check_all(f, n_random=3)
    assert not comms_of(plan, "w") and [c.kind for c in plan.communications] == ["allreduce"], plan.explain()


def test_embedding_partial_weight():
    f = rs.Fusion()
    w = f.input("w", (64, 16), "float32", M2, [Partial()])
    ids = f.input("ids", (2, 3), "int64", M2, [Replicate()])
    f.output(f.embedding(w, ids), [Partial()])
    plan = check_all(f)
    assert not plan.communications, plan.explain()


def test_pick_open_shardings_random_plans():
    f = rs.Fusion()
    x = f.input("x", (4, 2, 8), "float64", M2x2)
    idx = f.input("idx", (4, 2), "int64", M2x2)
    f.output(f.exp(f.pick(x, idx)), [Replicate(), Shard(1)])
    check_all(f, n_random=12)


# ---- cross entropy from existing ops + pick ----------------------------------------------

@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_vocab_parallel_cross_entropy_moves_only_batch_sized_values(mesh):
    """loss = logsumexp(x) - pick(x, labels) = (m + log(sum(exp(x - m)))) - pick(x, labels),
    m = amax(x), on logits sharded over the vocabulary: local max, sum-exp and pick, each
    reduced across the vocab shards as a [B] value (Megatron's vocab-parallel cross entropy);
    the logits are never gathered."""
    m = MESHES[mesh]
    b, v = 64, 131072
    f = rs.Fusion()
    x = f.input("x", (b, v), "float32", m, on_tp(m, Shard(1)))
    labels = f.input("labels", (b,), "int64", m, rep(m))
    mx = f.max(x, 1)
    z = f.sub(x, f.broadcast(mx, (b, v), (0,)))
    lse = f.add(mx, f.log(f.sum(f.exp(z), 1)))
    loss = f.sub(lse, f.pick(x, labels))
    f.output(loss, rep(m))
    plan = rs.optimize(f)
    check(plan, f)
    assert not comms_of(plan, "x"), plan.explain()
    assert plan.communications and all(c.bytes <= b * 4 for c in plan.communications), plan.explain()
