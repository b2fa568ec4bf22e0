"""Fused attention's strategies for Partial operands and uneven shapes (``reshard.ir.ops.attention``'s
``operand_strategies``): the result is linear in v, so v's ``Partial("sum")`` summands give the
result's; the gradient ``attention_grad`` is linear in g, so g's give its.  A plan that asks for
the Partial result runs the fused op on the summands with no collective; every plan (the chosen one
and random extractions) matches the unsharded reference, also with q's sequence split unevenly."""

from __future__ import annotations

import random

import pytest

import reshard as rs
from reshard.plan import Saturated

from tests import programs as P

TWO = rs.DeviceMesh([0, 1])
REP, PART = [rs.Replicate()], [rs.Partial("sum")]
SHAPE = (2, 2, 4, 8)


def _plans(f: rs.Fusion) -> list[rs.Plan]:
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    rng = random.Random(0)
    return [sat.plan(), *(sat.plan(perturb=rng) for _ in range(3))]


def _collectives(plan: rs.Plan) -> list[str]:
    return [s.kind for s in plan.steps if s.kind != "local"]


@pytest.mark.parametrize("kind", ["attention", "attention_grad"])
def test_partial_operand_gives_a_partial_result_locally(kind: str) -> None:
    f = rs.Fusion()
    q, k = (f.input(n, SHAPE, "float32", TWO, REP) for n in "qk")
    v = f.input("v", SHAPE, "float32", TWO, PART if kind == "attention" else REP)
    if kind == "attention":
        out = f.attention(q, k, v)
    else:
        out = f.attention_grad(q, k, v, f.input("g", SHAPE, "float32", TWO, PART), scale=0.3)
    f.output(out, PART)
    inputs = P.random_inputs(f, seed=1)
    plans = _plans(f)
    assert _collectives(plans[0]) == [] and any(s.attr("fop") == kind for s in plans[0].steps)
    for plan in plans:
        P.assert_plan_matches_reference(plan, f, inputs)


def test_uneven_query_sequence_split_matches_the_reference() -> None:
    """q's L = 5 split on 2 ranks (padded inside the plan), a causal-free float mask."""
    f = rs.Fusion()
    q = f.input("q", (2, 2, 5, 8), "float32", TWO, [rs.Shard(2)])
    k, v = (f.input(n, (2, 2, 6, 8), "float32", TWO, REP) for n in "kv")
    mask = f.input("mask", (1, 1, 5, 6), "float32", TWO, REP)
    f.output(f.attention(q, k, v, mask), [rs.Shard(2)])
    inputs = P.random_inputs(f, seed=2)
    for plan in _plans(f):
        P.assert_plan_matches_reference(plan, f, inputs)
