"""Simple candidates built in the e-graph (``rules.candidates``): from a value's dims, exactly the
unnested Replicate / Shard(d) dists that divide evenly (``encode.unnested_shardings``), with
Replicate on every mesh axis of size 1."""

from __future__ import annotations

import egglog.bindings as eb
import pytest

import reshard as rs
from reshard.ir.mesh import DeviceMesh
from reshard.passes.autodiff import joint
from reshard.rules import candidates
from reshard.rules.rule import render_all
from reshard.rules.schema import schema
from reshard.search.encode import axis_dim_facts, data_axes, dist_term, unnested_shardings
from reshard.search.snapshot import Snapshot

MESHES = [DeviceMesh([0, 1, 2, 3], ("x",)), DeviceMesh([[0, 1], [2, 3]], ("x", "y")),
          DeviceMesh([[0, 1, 2]], ("x", "y")), DeviceMesh([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], ("x", "y", "z"))]
SHAPES = [(), (4,), (6, 4), (4, 6, 1), (2, 3, 8, 12)]


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "x".join(map(str, m.shape)))
def test_the_rules_build_exactly_the_unnested_shardings(mesh):
    egraph = eb.EGraph()
    m = mesh.ndim
    program = [schema(m), render_all(candidates.rules(m))]
    program += [f"(set (axsize {a}) {n})" for a, n in enumerate(mesh.shape)]
    program += [f"(axdim {a} {j})" for a in range(m) for j in range(max(map(len, SHAPES)))]
    for v, shape in enumerate(SHAPES):
        program += [f"(made {v})"] + [f"(cdim {v} {j} {e})" for j, e in enumerate(shape)]
    program.append("(run-schedule (saturate (run analysis)))")
    egraph.run_program(*egraph.parse_program("\n".join(program)))
    expected = {v: {dist_term(ts, v) for ts in unnested_shardings(shape, mesh)} for v, shape in enumerate(SHAPES)}
    for v, terms in expected.items():
        for term in terms:
            egraph.run_program(*egraph.parse_program(f"(check (cand {v} {term}))"))
    assert len(Snapshot(egraph).rows("cand")) == sum(map(len, expected.values()))



def test_plans_through_candidate_dists_match_the_reference():
    """Both sides on random tensors: a value left open between fixed ends is realized at the
    dists random extractions pick, each one of the candidates (``unnested_shardings``), several of
    them, and every such plan simulates to the unsharded reference."""
    import random

    import reshard as rs
    from reshard.extract.plan_node import Tag
    from reshard.plan import Saturated
    from reshard.testing.rule_sweep import plan_nodes
    from tests.fuzz.test_fuzz import check_plan

    mesh = MESHES[1]
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float64", mesh, [rs.Shard(0), rs.Replicate()])
    y = f.tanh(x)
    f.output(f.exp(y), [rs.Replicate(), rs.Shard(1)])
    op = f.producer[y.id]
    candidates = unnested_shardings(y.shape, mesh)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    rng = random.Random(0)
    seen = []
    for i in range(8):
        plan = sat.plan(perturb=rng) if i else sat.plan()
        (at,) = {n.sharding for n in plan_nodes(plan) if n.head.tag is Tag.APPLY and n.head.op == op}
        assert at in candidates, at
        seen.append(at)
        check_plan(plan, f, i, "candidate")
    assert len(set(seen)) >= 2, seen


def _dp_tp_step(open_bias: bool = False, w_dp: rs.Replicate | rs.Shard = rs.Replicate(), batch: int = 4,
                partial: bool = False) -> rs.Fusion:
    """A dp x tp training step: ``batch`` tokens' rows split along dp by their leading (batch)
    dim, a column-parallel weight ``w`` (the parameter: its gradient an output) placed ``w_dp``
    over dp, a bias left open and not differentiated (``open_bias``), a shift fed as tp partial
    sums, replicated over dp (``partial``), the mean as the loss."""
    mesh = MESHES[1]
    f = rs.Fusion()
    x = f.input("x", (batch, 6, 8), "float64", mesh, [rs.Shard(0), rs.Replicate()])
    w = f.input("w", (8, 4), "float64", mesh, [w_dp, rs.Shard(1)])
    y = f.matmul(x, w)
    if open_bias:
        y = f.add(y, f.broadcast_to(f.input("b", (4,), "float64", mesh), y.shape))
    if partial:
        y = f.add(y, f.broadcast_to(f.input("c", (4,), "float64", mesh, [rs.Replicate(), rs.Partial()]), y.shape))
    loss = f.mean(f.reshape(f.tanh(y), (1, batch * 24)), 1, name="loss")
    f.output(loss, [rs.Replicate(), rs.Replicate()])
    return joint(f, loss, wrt=["w"]).fusion


def test_data_axes_are_the_axes_a_training_step_splits_its_batch_over():
    """An axis over which a training step's parameters are replicated and its other inputs
    replicated or split along their leading dim, one of them split, is a data axis (an open
    input does not count); an axis splitting a parameter, or splitting nothing, is not, nor is
    any axis of a forward program."""
    mesh = MESHES[1]
    assert data_axes(_dp_tp_step(), mesh) == {0}
    assert data_axes(_dp_tp_step(open_bias=True), mesh) == {0}
    assert data_axes(_dp_tp_step(w_dp=rs.Shard(0)), mesh) == set()  # FSDP-style: the planner may move w
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float64", mesh, [rs.Shard(0), rs.Replicate()])
    f.output(f.exp(x), [rs.Shard(0), rs.Replicate()])
    assert data_axes(f, mesh) == set()  # a forward program (a vocab-parallel weight is Shard(0) too)


def test_on_a_data_axis_the_rules_build_the_candidates_splitting_the_leading_dim():
    """The e-graph's simple candidates of a program with a data axis are exactly
    ``encode.candidates``' unnested shardings that split no dim but the leading one on it."""
    f = _dp_tp_step()
    mesh = MESHES[1]
    egraph = eb.EGraph()
    program = [schema(2), render_all(candidates.rules(2))]
    program += [f"(set (axsize {a}) {n})" for a, n in enumerate(mesh.shape)] + axis_dim_facts(f, mesh)
    for t in f.tensors:
        program += [f"(made {t.id})"] + [f"(cdim {t.id} {j} {e})" for j, e in enumerate(t.shape)]
    program.append("(run-schedule (saturate (run analysis)))")
    egraph.run_program(*egraph.parse_program("\n".join(program)))
    expected = {(t.id, dist_term(ts, t.id)) for t in f.tensors for ts in unnested_shardings(t.shape, mesh)
                if not any(ts.placements[a] == rs.Shard(j) for a in data_axes(f, mesh) for j in range(1, len(t.shape)))}
    assert len(Snapshot(egraph).rows("cand")) == len(expected)
    for v, term in expected:
        egraph.run_program(*egraph.parse_program(f"(check (cand {v} {term}))"))
    assert any(term.count("Outer") for _, term in expected)  # (splits remain: the tp axis's, dp's of dim 0)


def test_plans_of_a_data_axis_program_match_the_reference():
    """Both sides on random tensors: random extractions of the dp x tp training step (an open
    bias included) simulate to the unsharded reference, and none of their resharding steps on
    the data axis splits another dim than the leading one (no simple candidate does)."""
    import random

    from reshard.plan import Saturated
    from reshard.testing.rule_sweep import plan_nodes
    from tests.fuzz.test_fuzz import check_plan

    f = _dp_tp_step(open_bias=True)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    rng = random.Random(0)
    for i in range(8):
        plan = sat.plan(perturb=rng) if i else sat.plan()
        for n in plan_nodes(plan):
            if n.head.axis == 0:  # a resharding step on dp: toward a candidate
                p = n.sharding.placements[0]
                assert not isinstance(p, rs.Shard) or p.dim == 0, (n.head, n.sharding)
        check_plan(plan, f, i, "data axis")


def test_plans_of_an_uneven_data_axis_step_with_partial_inputs_match_the_reference():
    """Both sides on random tensors, an uneven batch (5 rows over dp 2: padded) and a shift fed
    as tp partial sums, identical over dp: random extractions simulate to the unsharded
    reference.  (A step on dp may split another dim here: the loss's reshape of the padded
    batch realizes its merged dim split over dp, and a realized dist is a candidate.)"""
    import random

    from reshard.plan import Saturated
    from tests.fuzz.test_fuzz import check_plan

    f = _dp_tp_step(open_bias=True, batch=5, partial=True)
    assert data_axes(f, MESHES[1]) == {0}
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    rng = random.Random(0)
    for i in range(8):
        check_plan(sat.plan(perturb=rng) if i else sat.plan(), f, i, "uneven data axis")
