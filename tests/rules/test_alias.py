"""Alias rules (``reshard.rules.alias``): a matmul reads a transposed operand as a
view.  Both sides of each rule are in the e-graph: the view plan and the copying plan are
extracted, simulated against the reference, and priced; the view plan must not copy."""

from __future__ import annotations

import random

import pytest
import torch

import reshard as rs
from reshard.rules.alias import is_transpose_view
from reshard.extract.dag import collect_enodes
from reshard.plan import Saturated
from reshard.testing.programs import MESH1, assert_plan_matches_reference, random_inputs, transposed_matmuls

R, S = rs.Replicate, rs.Shard


def _permute_steps(plan: rs.Plan) -> int:
    return sum(1 for n in plan.lowered.nodes if n.head.op is not None and plan.fusion.ops[n.head.op].kind == "permute")


def _views(plan: rs.Plan) -> list[tuple[bool, bool]]:
    return [n.head.transposed for n in plan.lowered.nodes if any(n.head.transposed)]


def _linear() -> rs.Fusion:
    """y = x @ w.T with an nn.Linear weight [out, in], sequence-parallel x."""
    f = rs.Fusion()
    x = f.input("x", (64, 256), "float32", MESH1, [S(0)])
    w = f.input("w", (512, 256), "float32", MESH1, [S(0)])
    f.output(f.matmul(x, f.permute(w, (1, 0))), [S(0)])
    return f


@pytest.mark.parametrize("perm, view", [((1, 0), True), ((0, 2, 1), True), ((1, 0, 2), False), ((2, 1, 0), False),
                                        ((0,), False)])
def test_transpose_view_is_a_swap_of_the_last_two_dims(perm, view):
    assert is_transpose_view(perm) is view


def test_linear_reads_its_weight_transposed_without_a_permute_copy():
    f = _linear()
    plan = rs.optimize(f)
    assert _views(plan) == [(False, True)] and _permute_steps(plan) == 0
    assert "w.T (view)" in plan.explain()
    assert_plan_matches_reference(plan, f, random_inputs(f))
    # the copying plan (permute, then matmul) is the other side of the rule: in the same e-graph,
    # correct, and dearer by the permute's copy
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    real = {n.id: n.cost for n in collect_enodes(sat.snapshot)}
    copying = None
    for seed in range(80):
        p = sat.plan(perturb=random.Random(seed))
        if _permute_steps(p) and not _views(p) and [c.kind for c in p.communications] == ["allgather"]:
            copying = p
            break
    assert copying is not None
    assert_plan_matches_reference(copying, f, random_inputs(f))
    assert sum(real[n.enode] for n in copying.lowered.nodes) * 1e-12 > plan.cost


def test_lhs_rhs_and_both_views_are_chosen_and_correct():
    f = transposed_matmuls()
    plan = rs.optimize(f)
    assert sorted(_views(plan)) == [(False, True), (True, True), (True, True)]
    assert _permute_steps(plan) == 1  # only w.T, which is also an output, is materialized
    assert_plan_matches_reference(plan, f, random_inputs(f))
    rules = ("mm-view-lhs", "mm-view-rhs", "mm-view-both")
    assert all(plan.report.rule_matches[r] > 0 for r in rules)


def test_random_plans_with_and_without_views_match_the_reference():
    f = transposed_matmuls()
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    rng, seen = random.Random(3), set()
    for i in range(8):
        p = sat.plan(perturb=rng)
        seen.update(_views(p))
        seen.add(("copies",) if _permute_steps(p) > 1 else ())
        assert_plan_matches_reference(p, f, random_inputs(f, i), seed=i)
    assert {(True, True), ("copies",)} <= seen  # both sides of the rules were extracted


def test_a_permute_that_is_not_a_transpose_is_still_a_copy():
    f = rs.Fusion()
    c = f.input("c", (6, 2, 4), "float32", MESH1, [R()])
    d = f.input("d", (2, 4, 5), "float32", MESH1, [R()])
    f.output(f.matmul(f.permute(c, (1, 0, 2)), d), [R()])
    plan = rs.optimize(f)
    assert _views(plan) == [] and _permute_steps(plan) == 1
    assert plan.report.rule_matches["mm-view-lhs"] == 0
    assert_plan_matches_reference(plan, f, random_inputs(f))


def test_segmented_saturation_keeps_the_transpose_with_its_matmul():
    """With one compute op per segment, each w_i.T is cut into its matmul's segment."""
    f = rs.Fusion()
    h = f.input("x", (8, 16), "float32", MESH1, [S(0)])
    for i in range(3):
        w = f.input(f"w{i}", (16, 16), "float32", MESH1, [S(0)])
        h = f.gelu(f.matmul(h, f.permute(w, (1, 0))))
    f.output(h, [S(0)])
    plan = rs.optimize(f, limits=rs.Limits(segment_ops=1))
    assert plan.report.segments == 6
    assert _views(plan) == [(False, True)] * 3 and _permute_steps(plan) == 0
    assert plan.cost == pytest.approx(rs.optimize(f).cost, rel=1e-12)
    assert_plan_matches_reference(plan, f, random_inputs(f))


def test_a_transpose_fed_to_later_segments_is_still_read_as_a_view():
    """``wt`` feeds matmuls in two segments (and is an output): the later segment gets it fed
    with the permute node that made it, so both matmuls read w through a view."""
    f = transposed_matmuls()
    whole = rs.optimize(f)
    plan = rs.optimize(f, limits=rs.Limits(segment_ops=1))
    assert plan.report.segments == 3  # one per matmul; wt is read in the first two
    assert sorted(_views(plan)) == sorted(_views(whole)) and _permute_steps(plan) == 1
    assert plan.cost == pytest.approx(whole.cost, rel=1e-12)
    assert_plan_matches_reference(plan, f, random_inputs(f))
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits(segment_ops=1))
    rng = random.Random(5)
    for i in range(4):
        assert_plan_matches_reference(sat.plan(perturb=rng), f, random_inputs(f, i), seed=i)


def test_from_torch_linear_layers_need_no_weight_transpose():
    m = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False), torch.nn.GELU(), torch.nn.Linear(64, 32, bias=False))
    x = torch.randn(16, 32)
    tp = rs.from_torch(m, (x,), [S(0)], [S(0)], MESH1,
                       param_placements={"0.weight": [S(0)], "2.weight": [S(1)]})
    assert sum(op.kind == "permute" for op in tp.fusion.ops) == 2  # torch.export's w.T, twice
    plan = rs.optimize(tp.fusion)
    assert _permute_steps(plan) == 0 and len(_views(plan)) == 2
    with torch.no_grad():
        expected = m(x)
    (y,) = plan.simulate(tp.inputs(x))
    torch.testing.assert_close(y, expected)
