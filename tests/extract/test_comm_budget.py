"""``optimize(..., comm_budget=B)``: bytes each rank receives over the plan's communications
(``Plan.comm_bytes``).  Without a budget extraction counts time only, so on latency-bound shapes
it gathers a whole operand once rather than reducing two small results; with one it prices
received bytes with a searched multiplier (``extract.budget``) and returns the fastest plan
found within the budget, which still computes the reference's outputs; an impossible budget
says the minimum found; with ``memory_budget`` too, the plan meets both."""

from __future__ import annotations

import random
import re

import pytest
import torch

import reshard as rs
from reshard.passes.autodiff import joint
from reshard.plan import Saturated
from reshard.testing import programs as P
from tests.train.test_autodiff_plans import M2, _values, attention
from tests.rules.test_crossmesh import A1, B1, pipeline


def two_heads() -> rs.Fusion:
    """a = x @ w1 and b = tanh(x) @ w2 with x sharded on the contraction dim: gathering x
    (1 KiB received per rank) is one collective, all-reducing the small a and b (64 B each) two."""
    f = rs.Fusion()
    x = f.input("x", (16, 32), "float32", P.MESH1, [rs.Shard(1)])
    w1 = f.input("w1", (32, 1), "float32", P.MESH1, [rs.Replicate()])
    w2 = f.input("w2", (32, 1), "float32", P.MESH1, [rs.Replicate()])
    f.output(f.matmul(x, w1, name="a"), [rs.Replicate()])
    f.output(f.matmul(f.tanh(x, name="t"), w2, name="b"), [rs.Replicate()])
    return f


def two_heads_training() -> rs.Fusion:
    """``two_heads``, ``grad_seed`` of a and b, and the weight gradients x.T @ ga and
    tanh(x).T @ gb reading x and t through ``saved`` (a training step's form)."""
    f = rs.Fusion()
    x = f.input("x", (16, 32), "float32", P.MESH1, [rs.Shard(1)])
    w1 = f.input("w1", (32, 1), "float32", P.MESH1, [rs.Replicate()])
    w2 = f.input("w2", (32, 1), "float32", P.MESH1, [rs.Replicate()])
    t = f.tanh(x, name="t")
    a, b = f.matmul(x, w1, name="a"), f.matmul(t, w2, name="b")
    ga, gb = f.grad_seed(a, name="ga"), f.grad_seed(b, name="gb")
    xs, ts = f.saved(x, name="x.saved"), f.saved(t, name="t.saved")
    f.output(a, [rs.Replicate()])
    f.output(b, [rs.Replicate()])
    f.output(f.matmul(f.permute(xs, (1, 0)), ga, name="grad.w1"), [rs.Replicate()])
    f.output(f.matmul(f.permute(ts, (1, 0)), gb, name="grad.w2"), [rs.Replicate()])
    return f


@pytest.fixture(scope="module")
def forward() -> Saturated:
    return Saturated.build(two_heads(), rs.CostProfile(), rs.Limits())


@pytest.fixture(scope="module")
def training() -> Saturated:
    return Saturated.build(two_heads_training(), rs.CostProfile(), rs.Limits())


def least(sat: Saturated, **kw: int) -> int:
    """The minimum ``comm_budget=0``'s error names."""
    with pytest.raises(rs.ReshardError, match=r"comm_budget=0 bytes received per rank cannot be met") as e:
        sat.plan(comm_budget=0, **kw)
    return int(re.search(r"give at least (\d+)", str(e.value)).group(1))


def checked(plan: rs.Plan, f: rs.Fusion) -> rs.Plan:
    """``plan`` after checking its simulated outputs against the reference on random inputs and
    that extraction priced the bytes its lowered communications move."""
    P.assert_plan_matches_reference(plan, f, P.random_inputs(f, seed=3))
    assert plan.extraction.comm_bytes == plan.comm_bytes
    return plan


def _kinds(plan: rs.Plan) -> list[str]:
    return sorted(f"{c.kind} {c.tensor}" for c in plan.communications)


def test_without_a_budget_the_fastest_plan_gathers(forward):
    free = checked(forward.plan(), forward.fusion)
    assert _kinds(free) == ["allgather x"] and free.comm_bytes == 1024
    assert free.extraction.comm_multiplier is None
    assert "comm budget" not in str(free.extraction)


def test_a_budget_below_the_default_bytes_reduces_the_results_instead(forward):
    free = forward.plan()
    fewest = least(forward)
    assert fewest < free.comm_bytes
    for budget in (fewest, (fewest + free.comm_bytes) // 2, free.comm_bytes - 1):
        plan = checked(forward.plan(comm_budget=budget), forward.fusion)
        assert plan.comm_bytes <= budget and plan.cost >= free.cost
        assert _kinds(plan) == ["allreduce a", "allreduce b"]
        assert plan.extraction.comm_multiplier > 0
        assert f"ps per received byte ({plan.comm_bytes} B received)" in str(plan.extraction)


def test_a_budget_the_default_plan_meets_returns_it(forward):
    free = forward.plan()
    for budget in (free.comm_bytes, 10 * free.comm_bytes):
        plan = forward.plan(comm_budget=budget)
        assert plan.digest() == free.digest() and plan.extraction.comm_multiplier == 0.0


def test_an_impossible_budget_says_the_minimum(forward):
    fewest = least(forward)
    with pytest.raises(rs.ReshardError, match=rf"comm_budget={fewest - 1} .* give at least {fewest}$"):
        forward.plan(comm_budget=fewest - 1)
    assert forward.plan(comm_budget=fewest).comm_bytes <= fewest


def test_a_training_step_within_a_budget(training):
    """The time-only plan gathers x for the forward pass (and keeps it gathered for grad.w1);
    within the fewest bytes, a and b are all-reduced and the weight gradients all-gathered."""
    f = training.fusion
    free = checked(training.plan(), f)
    fewest = least(training)
    assert fewest < free.comm_bytes
    plan = checked(training.plan(comm_budget=fewest), f)
    assert plan.comm_bytes <= fewest and plan.cost >= free.cost
    assert "allgather x" in _kinds(free) and "allgather x" not in _kinds(plan)


def test_both_budgets_are_met_together(training):
    f = training.fusion
    fewest = least(training)
    within = training.plan(comm_budget=fewest)
    memory = within.saved_bytes // 2
    assert memory > 0
    assert training.plan(memory_budget=memory).comm_bytes > fewest  # each budget alone breaks the other
    plan = checked(training.plan(comm_budget=fewest, memory_budget=memory), f)
    stats: dict = {}
    plan.simulate(P.random_inputs(f, seed=3), stats=stats)
    assert plan.comm_bytes <= fewest and max(stats["saved_peak_bytes"].values()) == plan.saved_bytes <= memory
    assert plan.cost >= within.cost
    assert plan.extraction.multiplier > 0 and plan.extraction.comm_multiplier > 0


def test_a_budget_nothing_meets_with_a_memory_budget_says_both(training):
    fewest = least(training)
    memory = training.plan(comm_budget=fewest).saved_bytes
    with pytest.raises(rs.ReshardError, match=rf"comm_budget={fewest - 1} bytes received per rank cannot be met "
                                              rf"with memory_budget={memory}"):
        training.plan(comm_budget=fewest - 1, memory_budget=memory)
    with pytest.raises(rs.ReshardError, match=r"memory_budget=0 bytes per rank of saved activations cannot be met"):
        training.plan(comm_budget=10 ** 9, memory_budget=0)


@pytest.mark.slow
def test_optimize_takes_the_budget_on_a_joint_from_autodiff():
    """The head-parallel attention block's joint (``passes.autodiff``): the time-only plan all-reduces
    four gradients; under the fewest bytes found, the plan reduce-scatters some instead, and its
    gradients are still the reference's.  (The budget's search may find a plan the time-only
    extraction missed: it is not slower then.)"""
    f, loss = attention(M2)
    j = joint(f, loss)
    sat = Saturated.build(j.fusion, rs.CostProfile(), rs.Limits())
    free = sat.plan()
    fewest = least(sat)
    assert fewest < free.comm_bytes
    plan = rs.optimize(j.fusion, comm_budget=fewest)
    kinds = [c.kind for c in plan.communications]
    assert plan.comm_bytes <= fewest and plan.extraction.comm_bytes == plan.comm_bytes
    assert "reduce_scatter" in kinds and kinds.count("allreduce") < [c.kind for c in free.communications].count("allreduce")
    inputs = _values(f)
    for got, want in zip(plan.simulate(inputs), rs.run_reference(j.fusion, inputs)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("budget", [-1, 1.5, "1kB", True])
def test_bad_budgets_raise(forward, budget):
    with pytest.raises(rs.ReshardError, match="comm_budget must be a non-negative int"):
        forward.plan(comm_budget=budget)
    with pytest.raises(rs.ReshardError, match="comm_budget must be a non-negative int"):
        rs.optimize(two_heads(), comm_budget=budget, limits=rs.Limits(time_limit_s=1e-9))  # before saturating


def test_priced_bytes_are_the_lowered_plans():
    """What extraction prices per e-node (``extract.received``) is what the lowered plan's
    communications move, for chosen and random plans of programs that hold every kind of
    communication the e-graph chooses (cross-mesh transfers included)."""
    seen = set()
    for build in (P.attention, P.training_block, P.training_lookups, lambda: pipeline(A1, B1)):
        sat = Saturated.build(build(), rs.CostProfile(), rs.Limits())
        for seed in (None, 0, 1, 2, 3):
            plan = sat.plan(random.Random(seed) if seed is not None else None)
            assert plan.extraction.comm_bytes == plan.comm_bytes
            seen |= {c.kind for c in plan.communications}
    assert seen == {"allgather", "allreduce", "reduce_scatter", "all_to_all", "send_recv", "broadcast", "scatter"}
