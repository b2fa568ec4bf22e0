"""``propagation``'s strategy, matmul-strategy and transport rules (and ``placements``'
``trp-*``, ``alias``' matmul views) on random plans, checked by the oracle: random small
programs (the fuzz generator) extract random plans (perturbed costs), every plan is simulated
against the reference, and each plan node is attributed to the rule instance that created it
(``reshard.testing.rule_sweep.rule_instances``).  Every rule must be verified on several random
instances.  The resharding rules' sweep is ``test_resharding``, the IterDomain laws'
``test_id_algebra``."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

import reshard as rs
from reshard.ir.fusion import Tensor
from reshard.plan import Saturated
from reshard.testing import fuzz_programs as FP
from reshard.testing.rule_sweep import MMP_CASES, TRP_CASES, rule_instances
from reshard.testing.rule_sweep import plan_nodes as _nodes
from reshard.testing.rule_sweep import sweep_settings as _sweep
from tests.fuzz.test_fuzz import check_plan

STRATEGY_RULES = (["unop-local", "binop-local", "mm-local", "redistribute", "mm-view-lhs", "mm-view-rhs",
                   "mm-view-both"] + sorted(MMP_CASES.values())
                  + sorted(TRP_CASES.values()))
VERIFIED: Counter = Counter()


@pytest.mark.slow
@_sweep(40)
@given(f=FP.fusions(min_ops=1, max_ops=4), seed=st.integers(0, 2**16))
def test_strategy_rules_on_random_plans(f, seed):
    _random_plans_match_the_reference(f, seed, 3)


def _random_plans_match_the_reference(f: rs.Fusion, seed: int, plans: int) -> None:
    """``plans`` random extractions of ``f``'s e-graph, each checked against the reference; the
    rule instances they ran are counted (``VERIFIED``)."""
    try:
        sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    except rs.ReshardError as e:
        assert str(e).startswith("optimize: found no way"), e
        return
    rng = random.Random(seed)
    for i in range(plans):
        try:
            plan = sat.plan(perturb=rng)
        except rs.ReshardError as e:
            assert str(e).startswith("optimize: found no way"), e
            return
        check_plan(plan, f, seed + i, "strategy sweep")
        VERIFIED.update(rule_instances(plan.fusion, _nodes(plan)))  # padded when uneven


@st.composite
def matmul_programs(draw):
    """``out = a @ b`` (optionally batched, optionally followed by an add) with random operand
    and result shardings: the matmul strategies' instances are drawn here, since random
    programs rarely give a matmul operands that are both sharded.  Either operand may be a
    transpose of the input (``alias``: read as a view)."""
    mesh = draw(st.sampled_from([FP.M2, FP.M4, FP.M2x2]))
    dims = st.sampled_from((2, 4, 8, 12))
    batch = (draw(dims),) if draw(st.booleans()) else ()
    m, k, n = draw(dims), draw(dims), draw(dims)
    b_shape = batch + (k, n) if batch and draw(st.booleans()) else (k, n)
    f = rs.Fusion()

    def operand(name: str, shape: tuple[int, ...]) -> Tensor:
        if not draw(st.booleans()):
            return f.input(name, shape, "float64", mesh, draw(FP.shardings(shape, mesh, allow_partial=True)))
        swapped = shape[:-2] + (shape[-1], shape[-2])
        x = f.input(name, swapped, "float64", mesh, draw(FP.shardings(swapped, mesh, allow_partial=True)))
        return f.permute(x, tuple(range(len(shape) - 2)) + (len(shape) - 1, len(shape) - 2))

    a, b = operand("a", batch + (m, k)), operand("b", b_shape)
    out = f.matmul(a, b)
    f.output(out, draw(FP.shardings(out.shape, mesh, allow_partial=draw(st.booleans()), partial_weight=3)))
    return f


@pytest.mark.slow
@_sweep(60)
@given(f=matmul_programs(), seed=st.integers(0, 2**16))
def test_matmul_strategy_rules_on_random_plans(f, seed):
    _random_plans_match_the_reference(f, seed, 6)  # a matmul has many ways (views, axis strategies)


@st.composite
def reduce_programs(draw):
    """``sum``/``max`` of a randomly sharded tensor over random dims (a sharded reduced dim
    turns its placement Partial: ``trp-reduce``), then an elementwise op."""
    mesh = draw(st.sampled_from([FP.M2, FP.M4, FP.M2x2]))
    shape = tuple(draw(st.sampled_from((2, 4, 8))) for _ in range(draw(st.integers(2, 3))))
    f = rs.Fusion()
    x = f.input("x", shape, "float64", mesh, draw(FP.shardings(shape, mesh, allow_partial=False)))
    dims = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape) - 1, unique=True))
    y = f.reduce(draw(st.sampled_from(["sum", "max"])), x, dims)
    f.output(f.tanh(y), draw(FP.shardings(y.shape, mesh, allow_partial=False)))
    return f


@pytest.mark.slow
@_sweep(25)
@given(f=reduce_programs(), seed=st.integers(0, 2**16))
def test_reduce_strategy_rules_on_random_plans(f, seed):
    test_strategy_rules_on_random_plans.hypothesis.inner_test(f, seed)


@st.composite
def redistribute_programs(draw):
    """An explicit ``redistribute`` of a randomly sharded input (Partial too) to a random
    sharding, then an elementwise op: the pinned redistribute's instances are drawn here, since
    the random programs' op mix may draw few."""
    mesh = draw(st.sampled_from([FP.M2, FP.M4, FP.M2x2]))
    shape = tuple(draw(st.sampled_from((2, 4, 6))) for _ in range(draw(st.integers(1, 3))))
    f = rs.Fusion()
    x = f.input("x", shape, "float64", mesh, draw(FP.shardings(shape, mesh, allow_partial=True)))
    y = f.redistribute(x, draw(FP.shardings(shape, mesh, allow_partial=False)))
    f.output(f.tanh(y), draw(FP.shardings(shape, mesh, allow_partial=False)))
    return f


@pytest.mark.slow
@_sweep(10)
@given(f=redistribute_programs(), seed=st.integers(0, 2**16))
def test_redistribute_rule_on_random_plans(f, seed):
    _random_plans_match_the_reference(f, seed, 2)


def test_every_strategy_rule_was_verified_on_random_instances():
    """Runs after the sweep above (file order): each strategy/transport rule was exercised on
    at least a few random instances whose plans matched the reference."""
    if not VERIFIED:
        pytest.skip("run together with test_strategy_rules_on_random_plans")
    thin = {r: VERIFIED[r] for r in STRATEGY_RULES if VERIFIED[r] < 3}
    print("\nrule instances verified:", dict(sorted(VERIFIED.items())))
    assert not thin, f"rules verified on fewer than 3 random instances: {thin}"
