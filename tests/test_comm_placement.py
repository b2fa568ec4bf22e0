"""Communication placement (issue 4, item 4): a change of sharding commutes through
elementwise ops, casts, reshapes, permutes and reductions, so extraction puts the collective
where it moves the fewest bytes — also when the user wrote an explicit ``redistribute``
before the op (redistribute is an identity op whose requested dist is one alternative)."""

from __future__ import annotations

import random

import pytest

import reshard as rs
from reshard import Replicate, Shard
from reshard.plan import Saturated
from tests.programs import assert_plan_matches_reference, random_inputs

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
    x = f.input("x", (64, 256), "float32", MESH, [Shard(0)])
    f.output(f.redistribute(x, [Shard(1)]), [Shard(1)])
    plan = rs.optimize(f)
    assert [c.kind for c in plan.communications] == ["all_to_all"]
    assert_plan_matches_reference(plan, f, random_inputs(f))
