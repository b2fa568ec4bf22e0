"""Matmul strategies (``propagation``): a pair of operand dists is tried only when the axis
strategy of every mesh axis resolves (``mmok``), so every ``MMD`` the e-graph holds is a
well-formed dist the matmul runs at; the plan extracted from such an e-graph is correct."""

from __future__ import annotations

import pytest

import reshard as rs
from reshard.plan import Saturated
from reshard.rules.cost_profile import CostProfile
from reshard.testing import programs as P
from tests.fuzz.test_fuzz import check_plan


@pytest.mark.parametrize("build", [P.mesh2d_block, P.mlp], ids=["mesh2d", "mlp"])
def test_every_matmul_pair_tried_runs(build):
    f = build()
    sat = Saturated.build(f, CostProfile(), rs.Limits())
    snap = sat.snapshot
    tried = {row.output for row in snap.rows("MMD")}
    ok = {row.inputs[0] for row in snap.rows("okD")}
    assert tried and tried <= ok
    assert len(snap.rows("mmok")) > 0
    plan = sat.plan()
    check_plan(plan, f, 0, "matmul strategies")
