"""Exact windows (``extract/windows.py``): the ILP on windows of the program improves
the greedy extraction and sharing search, soundly."""

from __future__ import annotations

import reshard as rs
from benchmarks.suite import qkv_heads
from reshard.plan import CostProfile, Limits, Saturated
from reshard.testing.extract_compare import problem
from reshard.testing.op_oracle import assert_same, inputs_of
from reshard.extract.dag import greedy_dag, share_communication
from reshard.extract.extract_ilp import ilp_dag, root_cost
from reshard.extract.windows import op_positions


def test_windows_find_the_plan_the_sharing_search_misses():
    """The fused QKV block on 2 ranks: greedy + sharing search 20.563 us, the exact windows
    (``extractor="windows"``) reach the ILP's optimum (20.184 us), and so does the default
    greedy, whose adoption of rejected alternatives (``extract.adopt_alternatives``) follows
    the search; the plan still matches the reference."""
    f = qkv_heads(rs.DeviceMesh([0, 1], ("x",)), 2)
    p = problem(Saturated.build(f, CostProfile.load(None), Limits()))
    shared = root_cost(share_communication(p.nodes, p.costs, p.roots, greedy_dag(p.nodes, p.costs))[0], p.roots,
                       p.costs)
    optimum = ilp_dag(p.nodes, p.costs, p.roots).cost
    plan = rs.optimize(f, extractor="windows")
    assert plan.extraction.cost == optimum == rs.optimize(f).extraction.cost < shared
    inputs = inputs_of(f, 0)
    for out, ref in zip(plan.simulate(inputs), rs.run_reference(f, inputs), strict=True):
        assert_same(out, ref)
    assert "exact windows" in str(plan.extraction)


def test_positions_put_inputs_at_their_first_consumer():
    f = rs.Fusion()
    mesh = rs.DeviceMesh([0, 1], ("x",))
    a = f.input("a", (4, 4), "float32", mesh, [rs.Replicate()])
    b = f.input("b", (4, 4), "float32", mesh, [rs.Replicate()])
    c = f.unary("exp", a)
    d = f.add(c, b)
    f.output(d, [rs.Replicate()])
    pos = op_positions(f)
    assert pos[c.id] < pos[d.id] == pos[b.id] and pos[a.id] == pos[c.id]


def test_windows_on_a_training_step_with_gradient_buckets():
    """A training step's e-graph holds gradient buckets, which the greedy and the windows first
    leave out (``extract.select``): the windows must index the e-nodes they are given by id, not
    by position (an IndexError before).  The plan is never costlier than the greedy's and
    matches the reference."""
    from reshard.testing.programs import training_block
    f = training_block()
    plan = rs.optimize(f, extractor="windows")
    assert "exact windows" in str(plan.extraction)
    assert plan.cost <= rs.optimize(f).cost
    inputs = inputs_of(f, 0)
    for out, ref in zip(plan.simulate(inputs), rs.run_reference(f, inputs), strict=True):
        assert_same(out, ref)
