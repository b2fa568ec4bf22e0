"""Trials judged ahead in a forked process (``extract.ahead``): the sharing search ends in the
same plan, with the same re-extractions counted, as in one process; a child that dies leaves
its trials to the caller."""

from __future__ import annotations

import os
import random

import pytest

from reshard.extract import ahead, dag
from reshard.extract.dag import SHARED_KINDS, _Costs, greedy_dag, share_communication

from .test_sharing_passes import _layered

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _search(nodes, costs, roots, greedy, one_of, case):
    others: list = []
    best, evals, before, after = share_communication(nodes, costs, roots, greedy, one_of=one_of,
                                                     alternatives=others if case % 3 == 0 else None)
    return dag._plan_bits(best, roots), evals, before, after, [dag._plan_bits(b, roots) for b in others]


def test_judged_ahead_the_search_ends_the_same(monkeypatch):
    rng = random.Random(11)
    forked = compared = 0
    real = ahead.Ahead

    class Counting(real):
        def __init__(self, *a):
            nonlocal forked
            forked += 1
            super().__init__(*a)

    for case in range(120):
        nodes, roots = _layered(rng)
        costs = _Costs(nodes)
        greedy = greedy_dag(nodes, costs)
        if dag._plan_cost(greedy, roots, costs) is None:
            continue
        comms = list(dict.fromkeys(n.cls for n in nodes if n.ctor in SHARED_KINDS))
        one_of = {c: rng.randrange(3) for c in comms} if case % 2 else None
        alone = _search(nodes, costs, roots, greedy, one_of, case)
        with monkeypatch.context() as m:
            m.setattr(dag, "worth", lambda *a: True)
            m.setattr(dag, "AHEAD_NODES", 0)
            m.setattr(dag, "Ahead", Counting)
            assert _search(nodes, costs, roots, greedy, one_of, case) == alone
        compared += 1
    assert compared > 80 and forked > 50  # (judged ahead: exercised)


def test_a_child_that_dies_leaves_its_items_to_the_caller():
    a = ahead.Ahead([1, 2, 3, 4, 5], lambda k: os._exit(3) if k == 4 else k * 10)
    assert a.get(0) is None  # (the caller's)
    assert a.get(1) == 20
    assert a.get(3) is None  # (the child died judging it)
    assert a.pid is None
    a.close()


def test_close_ends_a_child_still_judging():
    a = ahead.Ahead(list(range(6)), lambda k: __import__("time").sleep(60))
    pid = a.pid
    a.close()
    assert a.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
