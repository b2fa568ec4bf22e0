"""Simple candidates built in the e-graph (``rules.candidates``): from a value's dims, exactly the
unnested Replicate / Shard(d) dists that divide evenly (``encode.unnested_shardings``), with
Replicate on every mesh axis of size 1."""

from __future__ import annotations

import egglog.bindings as eb
import pytest

from reshard.ir.mesh import DeviceMesh
from reshard.rules import candidates
from reshard.rules.rule import render_all
from reshard.rules.schema import schema
from reshard.search.encode import dist_term, unnested_shardings
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
