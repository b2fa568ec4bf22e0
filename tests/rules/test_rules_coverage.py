"""Every rewrite rule is exercised: it fires while optimizing the program suite (whose plans,
including randomly extracted ones, are checked against the reference in test_optimize), or it
is an IterDomain law proven on random instances in test_id_algebra."""

from __future__ import annotations

from collections import Counter

import pytest

import reshard as rs
from reshard.rules import id_algebra
from reshard.plan import Saturated
from reshard.testing import programs as P
from tests.rules.test_id_algebra import LAWS


@pytest.mark.slow
def test_every_rule_fires_on_the_program_suite_or_is_a_proven_id_law():
    fired: Counter = Counter()
    rules: dict[str, str] = {}
    for build in P.ALL:
        sat = Saturated.build(build(), rs.CostProfile(), rs.Limits())
        fired.update(sat.report.rule_matches)
        rules.update({r.reported_name: r.law for r in sat.encoding.rules})
    id_laws = {r.name for r in id_algebra.RULES} & set(LAWS)
    silent = sorted(n for n in rules if fired[n] == 0 and n not in id_laws)
    assert not silent, f"rules that never fire on reshard/testing/programs.py: {silent}"
    assert len(rules) > 60


def test_every_rule_states_its_law():
    sat = Saturated.build(P.mlp(), rs.CostProfile(), rs.Limits())
    for r in sat.encoding.rules:
        assert r.law and len(r.law) > 8, r.reported_name
