"""``egglog_pool.run_forms``: a long egglog program run one top-level command at a time (the
declarations of every e-graph), the same commands in the same order as the whole text."""

from __future__ import annotations

import pytest

import reshard as rs
from reshard.ir.errors import ReshardError
from reshard.search import saturate
from reshard.search.egglog_pool import run_egglog, top_level_forms


def test_top_level_forms_split_a_program_at_its_outermost_parentheses():
    """Law: the forms are the program's top-level s-expressions in order, joined they are the
    program less the text between them; a string literal's or a comment's parentheses do not
    count; unbalanced parentheses raise."""
    text = '(ruleset r)\n(rule ((= x (F "a (b")) ) ((g x)) :ruleset r :name "n)")  ; c ( d\n (h (i) "\\"(")'
    assert top_level_forms(text) == ['(ruleset r)', '(rule ((= x (F "a (b")) ) ((g x)) :ruleset r :name "n)")',
                                     '(h (i) "\\"(")']
    assert top_level_forms("") == []
    for bad in ("(a (b)", "(a))", "(a \"(\""):
        with pytest.raises(ReshardError):
            top_level_forms(bad)


def test_the_declarations_run_form_by_form_give_the_plan_the_whole_text_gives(monkeypatch):
    """``new_egraph`` runs the declarations form by form: the same e-graph (e-nodes) and the
    same plan as with the whole text run at once (two transformer layers at tp 2)."""
    from reshard.examples import transformer_stack

    f = transformer_stack(2, rs.DeviceMesh([0, 1], ("tp",)))
    plans = []
    for whole in (False, True):
        with monkeypatch.context() as m:
            m.setattr(saturate._IDLE, "egraphs", {})
            if whole:
                m.setattr(saturate, "run_forms", run_egglog)
            plans.append(rs.optimize(f, cache=False))
    assert plans[0].digest() == plans[1].digest() and plans[0].cost == plans[1].cost
    assert plans[0].report.enodes == plans[1].report.enodes > 0
