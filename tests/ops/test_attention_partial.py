"""Fused attention's strategies for Partial operands and uneven shapes (``reshard.ir.ops.attention``'s
``operand_strategies``): the result is linear in v, so v's ``Partial("sum")`` summands give the
result's; the gradient ``attention_grad`` is linear in g, so g's give its, and a block of q's
sequence (q and g split along L) gives a Partial sum too (its dq in its rows of zeros, its
summands of dk and dv).  A plan that asks for the Partial result runs the fused op with no
collective; every plan (the chosen one and random extractions) matches the unsharded reference,
also with q's sequence split unevenly."""

from __future__ import annotations

import random

import pytest
import torch

import reshard as rs
from reshard.ir.ops.attention import causal_mask
from reshard.plan import Saturated

from reshard.testing import programs as P

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


@pytest.mark.parametrize("causal", [False, True])
def test_gradient_of_a_query_sequence_block_is_partial(causal: bool) -> None:
    """q and g split along L, k and v whole: the gradient as a Partial sum (each rank's dq in
    its rows, its summands of dk and dv) with no collective; the mask split alike."""
    f = rs.Fusion()
    q, g = (f.input(n, SHAPE, "float32", TWO, [rs.Shard(2)]) for n in "qg")
    k, v = (f.input(n, SHAPE, "float32", TWO, REP) for n in "kv")
    mask = f.input("mask", (1, 1, SHAPE[2], SHAPE[2]), "float32", TWO, [rs.Shard(2)])
    f.output(f.attention_grad(q, k, v, g, mask, scale=0.3, causal=causal), PART)
    inputs = P.random_inputs(f, seed=4)
    if causal:
        inputs["mask"] = causal_mask(SHAPE[2], SHAPE[2], torch.float32).reshape(1, 1, SHAPE[2], SHAPE[2])
    plans = _plans(f)
    assert _collectives(plans[0]) == [] and any(s.attr("fop") == "attention_grad" for s in plans[0].steps)
    for plan in plans:
        P.assert_plan_matches_reference(plan, f, inputs)
