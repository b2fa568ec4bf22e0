"""A broadcast's result sharded on an expanded dim (``rules.expand``): a replicated
causal mask [1, 1, S, S] broadcast to [B, H, S, S] sharded on heads is built locally, each
device broadcasting the whole mask into its own block (no gather, no global broadcast then a
slice), so Megatron's heads-sharded attention needs no communication for the mask and no
gather of q, k or v.  Oracle: ``plan.simulate`` against ``run_reference``."""

from __future__ import annotations

import random

import pytest

import reshard as rs
from reshard.ir.ops import op_kind
from reshard.plan import Saturated
from reshard.testing import programs as P

B, H, S, D = 2, 4, 8, 4


def mask_broadcast(mesh: rs.DeviceMesh, placements: list) -> rs.Fusion:
    """The causal mask, replicated, broadcast to [B, H, S, S] and output at ``placements``."""
    f = rs.Fusion()
    m = f.input("mask", (1, 1, S, S), "float32", mesh, [rs.Replicate()] * mesh.ndim)
    f.output(f.broadcast_to(m, (B, H, S, S)), placements)
    return f


def attention(mesh: rs.DeviceMesh, placements: list) -> rs.Fusion:
    """softmax(q k^T / sqrt(D) + mask) v with q, k, v [B, H, S, D] at ``placements`` (heads
    sharded), the mask a replicated [1, 1, S, S] constant, the result at ``placements``."""
    f = rs.Fusion()
    q, k, v = (f.input(n, (B, H, S, D), "float32", mesh, placements) for n in "qkv")
    mask = f.input("mask", (1, 1, S, S), "float32", mesh, [rs.Replicate()] * mesh.ndim)
    scores = f.add(f.scale(f.matmul(q, f.permute(k, (0, 1, 3, 2))), D ** -0.5), f.broadcast_to(mask, (B, H, S, S)))
    e = f.exp(f.sub(scores, f.broadcast(f.max(scores, 3), (B, H, S, S), (0, 1, 2))))
    p = f.div(e, f.broadcast(f.sum(e, 3), (B, H, S, S), (0, 1, 2)))
    f.output(f.matmul(p, v), placements)
    return f


HEADS_1D = (P.MESH1, [rs.Shard(1)])
HEADS_2D = (P.MESH2D, [rs.Shard(1), rs.Shard(1)])  # heads split over both axes
BATCH_HEADS_2D = (P.MESH2D, [rs.Shard(0), rs.Shard(1)])  # dp x tp: both expanded dims sharded
CASES = [HEADS_1D, HEADS_2D, BATCH_HEADS_2D]
IDS = ["heads-1d", "heads-2x2", "batch-heads-2x2"]


def _broadcast_steps(plan: rs.Plan) -> list:
    return [s for s in plan.steps if s.attr("fop") == "broadcast" or s.attr("bcast")]


@pytest.mark.parametrize("mesh,placements", CASES, ids=IDS)
def test_mask_broadcast_is_built_in_the_local_block(mesh, placements):
    f = mask_broadcast(mesh, placements)
    plan = rs.optimize(f)
    assert plan.communications == ()
    local = rs.TensorSharding.from_placements((B, H, S, S), placements, mesh).local_shape
    # one step: the broadcast writes the local block (no global [B, H, S, S], no slice after it)
    assert [s.attr("op") for s in plan.steps if s.kind == "local"] == ["apply"]
    (step,) = _broadcast_steps(plan)
    assert tuple(step.attr("shape")) == local and local != (B, H, S, S)
    P.assert_plan_matches_reference(plan, f, P.random_inputs(f))


@pytest.mark.parametrize("mesh,placements", CASES, ids=IDS)
def test_heads_sharded_attention_moves_nothing(mesh, placements):
    """Megatron's attention: every head's scores, mask and softmax on the rank holding it; no
    collective at all (none on the mask, no gather of q, k or v)."""
    f = attention(mesh, placements)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    plan = sat.plan()
    assert plan.communications == (), [(c.kind, c.tensor) for c in plan.communications]
    local = rs.TensorSharding.from_placements((B, H, S, S), placements, mesh).local_shape
    assert all(tuple(s.attr("shape"))[:2] == local[:2] for s in _broadcast_steps(plan))
    P.assert_plan_matches_reference(plan, f, P.random_inputs(f))
    rng = random.Random(0)
    for i in range(3):  # randomly extracted plans (any mix of Expand, Loc + slice, gathers) agree too
        P.assert_plan_matches_reference(sat.plan(perturb=rng), f, P.random_inputs(f, i + 1), i + 1)


def test_expand_is_cheaper_than_broadcast_then_slice():
    """The local expansion is priced on the local block: the plan costs less than the global
    broadcast plus slice it replaces (launch + bytes of [B, H/2, S, S] vs of [B, H, S, S])."""
    f = mask_broadcast(*HEADS_1D)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    plan = sat.plan()
    assert sat.report.rule_matches["expand-local-0"] > 0
    assert [n.head.form for n in plan.lowered.nodes if n.head.op is not None] == ["expand"]
    prof = rs.CostProfile()
    mask, block = S * S * 4, B * (H // 2) * S * S * 4
    assert plan.cost == pytest.approx(prof.launch_us * 1e-6 + (mask + block) / (prof.hbm_gbps * 1e9), rel=1e-3)


def test_broadcast_to_new_leading_dim_sharded():
    """A new (not extent-1) dim is expanded too: a bias [S] broadcast to [H, S] sharded on H."""
    f = rs.Fusion()
    b = f.input("b", (S,), "float32", P.MESH1, [rs.Replicate()])
    f.output(f.broadcast_to(b, (H, S)), [rs.Shard(0)])
    plan = rs.optimize(f)
    (step,) = _broadcast_steps(plan)
    assert tuple(step.attr("shape")) == (H // 2, S) and plan.communications == ()
    P.assert_plan_matches_reference(plan, f, P.random_inputs(f))


def test_sharded_operand_dim_is_not_an_expanded_dim():
    """The law needs the operand replicated: an operand sharded on a mapped dim keeps its
    transported placement (the existing strategy), and a broadcast of a tensor with no
    expanded dim declares none."""
    f = rs.Fusion()
    x = f.input("x", (S, D), "float32", P.MESH1, [rs.Shard(0)])
    y = f.broadcast(x, (S, D), (0, 1))
    f.output(y, [rs.Shard(0)])
    op = f.ops[-1]
    assert op_kind(op.kind).expanded_dims(f, op) == ()
    plan = rs.optimize(f)
    assert plan.communications == ()
    P.assert_plan_matches_reference(plan, f, P.random_inputs(f))
