"""``placements``' transport rules (``trp-*``: how an elementwise or reduction step's placement on
a mesh axis follows from its operands'), each on instances that force it: a program whose input
and output placements leave one way to run the step locally, planned, its plan nodes attributed to
the rule instances that made them (``reshard.testing.rule_sweep.rule_instances``), and every plan
(the chosen one and random extractions of the same e-graph) simulated on random tensors against
the unsharded reference.  The random-program sweep over every strategy and transport rule is
``test_propagation``."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

import reshard as rs
from reshard import Partial, Replicate, Shard
from reshard.plan import Saturated
from reshard.testing import fuzz_programs as FP
from reshard.testing.rule_sweep import TRP_CASES, plan_nodes, rule_instances
from tests.fuzz.test_fuzz import check_plan

M2, M2x2 = FP.M2, FP.M2x2


def _rep(mesh: rs.DeviceMesh) -> rs.Fusion:
    f = rs.Fusion()
    f.output(f.tanh(f.input("x", (4, 6), "float64", mesh, [Replicate()] * mesh.ndim)), [Replicate()] * mesh.ndim)
    return f


def _part(mesh: rs.DeviceMesh) -> rs.Fusion:
    """A linear step of a Partial sum stays a Partial sum (no all-reduce)."""
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float64", mesh, [Partial("sum")] * mesh.ndim)
    f.output(f.scale(x, 3.0), [Partial("sum")] * mesh.ndim)
    return f


def _bind(mesh: rs.DeviceMesh) -> rs.Fusion:
    """Both operands and the result split alike: each device adds its own block."""
    f = rs.Fusion()
    at = [Shard(a % 2) for a in range(mesh.ndim)]
    x, y = (f.input(n, (4, 8), "float64", mesh, at) for n in "xy")
    f.output(f.tanh(f.add(x, y)), at)
    return f


def _reduce(mesh: rs.DeviceMesh) -> rs.Fusion:
    """A sum over a split dim: each device sums its block, a Partial sum of the result."""
    f = rs.Fusion()
    x = f.input("x", (8, 4), "float64", mesh, [Shard(0)] * mesh.ndim)
    f.output(f.reduce("sum", x, [0]), [Partial("sum")] * mesh.ndim)
    return f


CASES: dict[str, Callable[[rs.DeviceMesh], rs.Fusion]] = {
    "trp-rep": _rep, "trp-part": _part, "trp-bind": _bind, "trp-reduce": _reduce}


def test_every_transport_rule_has_a_case():
    assert set(CASES) == set(TRP_CASES.values())


@pytest.mark.parametrize("mesh", [M2, M2x2], ids=["2", "2x2"])
@pytest.mark.parametrize("rule", sorted(CASES))
def test_transport_rule_plans_match_the_reference(rule: str, mesh: rs.DeviceMesh):
    f = CASES[rule](mesh)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    plan = sat.plan()
    assert not plan.communications, plan.explain()
    seen: Counter = Counter(rule_instances(plan.fusion, plan_nodes(plan)))
    assert seen[rule] >= mesh.ndim, (rule, dict(seen))
    check_plan(plan, f, 0, rule)
    rng = random.Random(1)
    for i in range(3):
        other = sat.plan(perturb=rng)
        check_plan(other, f, 1 + i, rule)
