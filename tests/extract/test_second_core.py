"""Candidates finished on a second core (``extract.second_core``, ``extract.extract``'s ``choose``).

* ``Forked``'s law: ``result()`` is the function's value or raises what it raised, whether it ran
  in a forked child or here (no second core, forking off, or a child that died);
* extraction keeps the cheapest of ``select``'s candidates, each finished: the plan costs no
  more than either candidate's plan alone, and the plan is the same with the candidates
  finished side by side (forked) and one after the other.
"""

from __future__ import annotations

import os

import pytest

from reshard.extract import dag, extract, second_core
from reshard.extract.second_core import Forked
from reshard.plan import optimize

from .test_sharing import _residual_step, _slow_network

import reshard as rs


def _forks() -> bool:
    return second_core.available()


def test_forked_gives_the_value_computed_in_the_child():
    parent = os.getpid()
    got = Forked(lambda: (os.getpid(), [1, 2, 3])).result()
    assert got[1] == [1, 2, 3]
    assert (got[0] != parent) == _forks()


def test_forked_raises_what_the_function_raised():
    def fail() -> None:
        raise rs.ReshardError("no way to produce output 3")

    with pytest.raises(rs.ReshardError, match="no way to produce output 3"):
        Forked(fail).result()


def test_a_child_that_dies_is_computed_here():
    parent = os.getpid()

    def dies_in_the_child() -> int:
        if os.getpid() != parent:
            os._exit(3)  # (killed, out of memory: no result sent)
        return 42

    assert Forked(dies_in_the_child).result() == 42


def test_without_the_second_core_nothing_forks(monkeypatch):
    monkeypatch.setattr(second_core, "SECOND_CORE", False)
    assert not second_core.available()
    assert Forked(os.getpid).result() == os.getpid()


def test_the_plan_is_the_cheapest_candidate_finished_and_the_same_forked_or_not(monkeypatch):
    """A residual training step whose sharing search is cut short has two candidates (the
    plain search's and the output trials'): the plan costs no more than each alone, and the
    same plan comes out with the candidates finished side by side and one after the other."""
    f = _residual_step(rs.DeviceMesh([0, 1, 2, 3], ("tp",)), h=32)
    monkeypatch.setattr(dag, "SHARING_BUDGET", 9_000)
    select, counts = extract.select, []

    def only(i: int | None):
        def pick(*a, **k):
            cands = select(*a, **k)
            counts.append(len(cands))
            return cands if i is None else [cands[i]]
        return pick

    alone = []
    for i in (0, -1):
        with monkeypatch.context() as m:
            m.setattr(extract, "select", only(i))
            alone.append(optimize(f, cost_profile=_slow_network(), cache=False).cost)
    assert counts == [2, 2]
    plans = []
    for fork in (True, False):
        with monkeypatch.context() as m:
            m.setattr(second_core, "SECOND_CORE", fork)
            plans.append(optimize(f, cost_profile=_slow_network(), cache=False))
    assert plans[0].digest() == plans[1].digest()
    assert plans[0].cost <= min(alone)
    assert plans[0].extraction.search_evals == plans[1].extraction.search_evals
