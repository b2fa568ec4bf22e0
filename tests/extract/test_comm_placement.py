"""Communication placement (issue 4, item 4): a change of sharding commutes through
elementwise ops, casts, reshapes, permutes and reductions, so extraction puts the collective
where it moves the fewest bytes — also when the user wrote an explicit ``redistribute``
before the op (redistribute is an identity op whose requested dist is one alternative)."""

from __future__ import annotations

import math
import random

import pytest

import reshard as rs
from reshard import Replicate, Shard
from reshard.extract.dag import collect_enodes
from reshard.plan import Saturated
from reshard.testing.programs import assert_plan_matches_reference, random_inputs

MESH = rs.DeviceMesh([0, 1, 2, 3], ("x",))


def _program(op, explicit: bool, dtype: str = "float32") -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (64, 256), dtype, MESH, [Shard(0)])
    y = f.redistribute(x, [Replicate()]) if explicit else x
    f.output(op(f, y), [Replicate()])
    return f


CASES = {
    # (builder, bytes of the value communicated by the better placement)
    "sum over the unsharded dim": (lambda f, y: f.sum(y, 1), 64 * 4),
    "max over the unsharded dim": (lambda f, y: f.max(y, 1), 64 * 4),
    "cast to bfloat16": (lambda f, y: f.cast(f.exp(y), "bfloat16"), 64 * 256 * 2),
    "slice of the unsharded dim": (lambda f, y: f.slice(y, 1, 0, 32), 64 * 32 * 4),
    "sum then reshape": (lambda f, y: f.reshape(f.sum(y, 1), (8, 8)), 64 * 4),
}


@pytest.mark.parametrize("explicit", [False, True], ids=["implicit", "explicit redistribute"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_communication_moves_after_the_op_that_shrinks_the_value(case, explicit):
    build, small_bytes = CASES[case]
    f = _program(build, explicit)
    plan = rs.optimize(f)
    (comm,) = plan.communications
    assert comm.kind == "allgather"
    # each rank receives (n-1)/n of the small value, not of x (64 KiB)
    assert comm.moved_bytes == small_bytes * 3 // 4, plan.explain()
    assert_plan_matches_reference(plan, f, random_inputs(f))


def test_a_pinned_redistribute_communicates_where_it_is_written():
    """``redistribute(..., pin=True)``: x itself is gathered (the user's order), correct."""
    f = rs.Fusion()
    x = f.input("x", (64, 256), "float32", MESH, [Shard(0)])
    f.output(f.sum(f.redistribute(x, [Replicate()], pin=True), 1), [Replicate()])
    plan = rs.optimize(f)
    (comm,) = plan.communications
    assert comm.kind == "allgather" and comm.tensor == "x" and comm.moved_bytes == 64 * 256 * 4 * 3 // 4
    assert_plan_matches_reference(plan, f, random_inputs(f))


def test_gathering_first_is_in_the_egraph_and_costs_more():
    """The rejected order (gather x, then reduce) is a valid plan of the same e-graph: forcing
    it through random extraction finds it, it is correct, and it moves more bytes."""
    f = _program(CASES["sum over the unsharded dim"][0], explicit=True)
    best = rs.optimize(f)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    seen = set()
    for seed in range(40):
        plan = sat.plan(perturb=random.Random(seed))
        assert_plan_matches_reference(plan, f, random_inputs(f, seed))
        seen.add(plan.comm_bytes)
    assert max(seen) > best.comm_bytes == min(seen)


def test_explicit_redistribute_to_a_required_output_is_kept():
    """Commuting never drops a required sharding: the redistribute's value is the output."""
    f = rs.Fusion()
    x = f.input("x", (1024, 2048), "float32", MESH, [Shard(0)])  # bandwidth-bound: an all-to-all
    f.output(f.redistribute(x, [Shard(1)]), [Shard(1)])
    plan = rs.optimize(f)
    assert [c.kind for c in plan.communications] == ["all_to_all"]
    assert_plan_matches_reference(plan, f, random_inputs(f))


# ---- layout: collectives want the communicated dim outermost (seed 003) ---------------------------
def _copy_bytes(plan: rs.Plan) -> int:
    """Bytes a plan copies locally to reorder data: collective buffers whose communicated dim
    is not outermost, and permutes (each rank's local tensor)."""
    out = sum(c.reorder_copies * c.bytes for c in plan.communications)
    for n in plan.lowered.nodes:
        if n.head.op is not None and plan.fusion.ops[n.head.op].kind == "permute":
            t = plan.fusion.tensors[n.value]
            out += math.prod(n.sharding.local_shape) * t.itemsize
    return out


def _gather_then_permute() -> rs.Fusion:
    """The user asks for x replicated, then transposes it: gathering x's sharded dim 1 needs a
    reorder copy of the whole result, and the permute copies it all again."""
    f = rs.Fusion()
    x = f.input("x", (64, 4096), "float32", MESH, [Shard(1)])
    f.output(f.permute(f.redistribute(x, [Replicate()]), (1, 0)), [Replicate()])
    return f


def test_reorder_copy_is_priced_only_off_the_outermost_dim():
    plans = {}
    for d in (0, 1):
        f = rs.Fusion()
        x = f.input("x", (256, 256), "float32", MESH, [Shard(d)])
        f.output(f.redistribute(x, [Replicate()]), [Replicate()])
        plans[d] = rs.optimize(f)
    (c0,), (c1,) = plans[0].communications, plans[1].communications
    assert (c0.reorder_copies, c1.reorder_copies) == (0, 1) and c0.bytes == c1.bytes
    assert c1.cost_s - c0.cost_s == pytest.approx(plans[1].profile.reorder_copy_s(c1.bytes), rel=1e-6)
    for f_plan in plans.values():
        assert_plan_matches_reference(f_plan, f_plan.fusion, random_inputs(f_plan.fusion))


def test_permute_moves_before_the_collective_so_it_gathers_the_outermost_dim():
    f = _gather_then_permute()
    plan = rs.optimize(f)
    (c,) = plan.communications
    assert c.kind == "allgather" and c.tensor == plan.fusion.tensors[-1].name and c.reorder_copies == 0
    assert_plan_matches_reference(plan, f, random_inputs(f))
    # the order the user wrote (gather x, then permute) is in the same e-graph: correct, costlier,
    # and it copies more
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    naive = None
    for seed in range(60):
        p = sat.plan(perturb=random.Random(seed))
        if [x.tensor for x in p.communications] == ["x"]:
            naive = p
            break
    assert naive is not None
    assert_plan_matches_reference(naive, f, random_inputs(f))
    real = {n.id: n.cost for n in collect_enodes(sat.snapshot)}  # unperturbed costs of its e-nodes
    assert sum(real[n.enode] for n in naive.lowered.nodes) * 1e-12 > plan.cost
    assert _copy_bytes(naive) == 2 * 64 * 4096 * 4 > _copy_bytes(plan) == 64 * 4096 * 4 // 4
