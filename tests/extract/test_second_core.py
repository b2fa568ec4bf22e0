"""Candidates finished ahead on a spare core (``extract.second_core``, ``extract.extract``'s ``choose``).

* ``Forked``'s law: ``result()`` is the function's value or raises what it raised, whether it ran
  in a forked child or here (no second core, forking off, or a child that died); staged, so is
  ``first()`` of the first stage, read while the child goes on;
* entries sent as rows (``dag.entry_rows``) are made again alike (``dag.entries_of``): costs,
  nodes, shared children, node and class bits, on random e-graphs after the sharing search and
  adoption;
* a later candidate finished ahead in a forked child and read back gives the plan that
  finishing it here gives.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

from reshard.extract import dag, extract, second_core
from reshard.extract.dag import _Costs, class_bits, entries_of, entry_rows, fold_dag, greedy_dag, share_communication
from reshard.extract.extract import adopt_alternatives, canonical_plan
from reshard.extract.second_core import Forked
from reshard.plan import optimize

from .test_sharing import _random_egraph, _residual_step, _slow_network

import reshard as rs


@pytest.mark.parametrize("queue, idle, spare_now", [
    ([3, 3, 1], 0.0, True), ([3] * second_core.SPARE_LOOKS, 0.0, False), ([1], 0.0, True),
    ([2, 2, 2, 2, 1], 0.0, True), ([3] * second_core.SPARE_LOOKS, 0.9, True),
    ([3] * second_core.SPARE_LOOKS, 0.3, False), ([3] * second_core.SPARE_LOOKS, None, False)])
def test_a_cpu_is_spare_when_one_look_finds_it_idle(monkeypatch, queue, idle, spare_now):
    """``spare_cpu`` on 2 CPUs: a look at the run queue with fewer tasks than CPUs is enough
    (a task runnable for a moment does not decide); when every one of the ``SPARE_LOOKS`` looks
    finds them busy, the CPUs' idle time over a short span decides (at least ``IDLE_SPARE`` of
    a CPU idle), measured only then."""
    looks = iter(queue)
    measured = []
    monkeypatch.setattr(second_core, "cpus", lambda: 2)
    monkeypatch.setattr(second_core, "_running", lambda: next(looks))
    monkeypatch.setattr(second_core, "_idle_cpus", lambda span: measured.append(span) or idle)
    monkeypatch.setattr(second_core, "SPARE_PAUSE_S", 0.0)
    assert second_core.spare_cpu() is spare_now
    assert next(looks, None) is None  # (each look taken, none past the first idle one)
    assert measured == ([second_core.IDLE_SPAN_S] if 1 not in queue else [])


@pytest.mark.skipif(not os.path.exists("/proc/stat") or not hasattr(os, "sched_getaffinity"),
                    reason="idle time is read from /proc/stat")
def test_idle_time_counts_a_burning_neighbour_on_every_cpu():
    """``_idle_cpus`` against processes burning every CPU this process may run on: well under
    one CPU idle (``IDLE_SPARE``), and the measure is never above the CPUs there are."""
    cpus = second_core.cpus()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        time.sleep(0.3)
        idle = second_core._idle_cpus(0.2)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert idle is not None and 0 <= idle < second_core.IDLE_SPARE
    assert second_core._idle_cpus(0.05) <= cpus + 0.5


def test_forked_gives_the_value_computed_in_the_child(spare):
    parent = os.getpid()
    got = Forked(lambda: (os.getpid(), [1, 2, 3])).result()
    assert got[1] == [1, 2, 3]
    assert (got[0] != parent) == spare


def test_forked_raises_what_the_function_raised(spare):
    def fail() -> None:
        raise rs.ReshardError("no way to produce output 3")

    with pytest.raises(rs.ReshardError, match="no way to produce output 3"):
        Forked(fail).result()


def test_a_child_that_dies_is_computed_here(spare):
    parent = os.getpid()

    def dies_in_the_child() -> int:
        if os.getpid() != parent:
            os._exit(3)  # (killed, out of memory: no result sent)
        return 42

    assert Forked(dies_in_the_child).result() == 42


def test_a_staged_child_sends_its_first_stage_at_once(spare, tmp_path):
    """Staged: ``first()`` is ``shown(first())``, read while the child goes on with ``fn``
    (here it waits for a file the parent writes after reading the first stage), and
    ``result()`` is ``fn(first())``, both computed in the child."""
    parent, go = os.getpid(), tmp_path / "go"

    def rest(a: tuple[int, list[int]]) -> tuple[int, int]:
        while os.getpid() != parent and not go.exists():
            time.sleep(0.01)
        return a[0], sum(a[1])

    staged = Forked(rest, first=lambda: (os.getpid(), [1, 2, 3]), shown=lambda a: a[0])
    seen = staged.first()
    go.touch()
    assert staged.result() == (seen, 6)
    assert (seen != parent) == spare


def test_a_staged_first_stage_that_raises_raises_in_both(spare):
    def fail() -> None:
        raise rs.ReshardError("no candidate")

    staged = Forked(lambda a: a, first=fail)
    with pytest.raises(rs.ReshardError, match="no candidate"):
        staged.first()
    with pytest.raises(rs.ReshardError, match="no candidate"):
        staged.result()


def test_a_staged_child_that_dies_after_its_first_stage_is_finished_here(spare):
    """The child sends its first stage and dies: the first stage is its, the rest is computed
    here, from the first stage computed here again (a function of the state at the fork)."""
    parent = os.getpid()

    def rest(a: int) -> tuple[int, int]:
        if os.getpid() != parent:
            os._exit(3)
        return a, os.getpid()

    staged = Forked(rest, first=lambda: 7)
    assert staged.first() == 7
    assert staged.result() == (7, parent)


def test_a_staged_child_not_wanted_after_its_first_stage_is_killed(spare):
    staged = Forked(lambda a: time.sleep(60), first=lambda: 1)
    assert staged.first() == 1
    started = time.perf_counter()
    staged.close()
    assert time.perf_counter() - started < 5 and staged._pid is None


def test_without_the_second_core_nothing_forks(monkeypatch):
    monkeypatch.setattr(second_core, "SECOND_CORE", False)
    assert not second_core.available()
    assert Forked(os.getpid).result() == os.getpid()


def test_a_small_extraction_forks_nothing_and_asks_nothing(monkeypatch):
    """Below ``FORK_MIN_ENODES`` no fork, and the CPUs are not even looked at."""
    asked = []
    monkeypatch.setattr(second_core, "spare_cpu", lambda: asked.append(1) or True)
    monkeypatch.setattr(second_core, "SECOND_CORE", True)
    big = second_core.FORK_MIN_ENODES
    assert not second_core.available(big - 1) and not asked
    assert second_core.available(big) == hasattr(os, "fork") and asked == [1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_the_caller_already_asked_for_asks_nothing_again(monkeypatch):
    """``Forked(spare=...)`` takes the caller's ``available()`` answer: no second look at the
    CPUs (which, busy, measures their idle time); the value is the same either way."""
    asked = []
    monkeypatch.setattr(second_core, "spare_cpu", lambda: asked.append(1) or True)
    monkeypatch.setattr(second_core, "SECOND_CORE", True)
    forked = Forked(os.getpid, spare=True)
    assert forked._pid is not None and not asked
    assert forked.result() != os.getpid()
    here = Forked(os.getpid, spare=False)
    assert here._pid is None and not asked and here.result() == os.getpid()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_speculative_child_runs_at_a_lower_priority(monkeypatch):
    """``Forked(nice=k)``: the child adds ``k`` to its niceness before its work (extraction's
    speculative candidates, ``SPECULATIVE_NICE``), this process keeps its own; the value is
    the same either way (run here, the function sees this process's niceness)."""
    monkeypatch.setattr(second_core, "SECOND_CORE", True)
    mine = os.nice(0)
    assert second_core.SPECULATIVE_NICE > 0
    assert Forked(lambda: os.nice(0), spare=True, nice=second_core.SPECULATIVE_NICE).result() == \
        min(19, mine + second_core.SPECULATIVE_NICE)
    assert Forked(lambda: os.nice(0), spare=True).result() == mine == os.nice(0)
    assert Forked(lambda: os.nice(0), spare=False, nice=5).result() == mine


def test_entries_sent_as_rows_are_made_again_alike():
    rng = random.Random(2)
    checked = 0
    for _ in range(100):
        nodes, roots = _random_egraph(rng, 0.2)
        costs = _Costs(nodes)
        best, _, _, _ = share_communication(nodes, costs, roots, greedy_dag(nodes, costs))
        if any(r not in best for r in roots):
            continue
        plan = adopt_alternatives(nodes, costs, best, canonical_plan([best[r] for r in roots], costs))
        cls_bit = class_bits(nodes)
        again_best, again_plan = entries_of(entry_rows([best.values(), plan], cls_bit), nodes, cls_bit)
        pairs: dict[int, object] = {}

        def same(e, _):  # each original entry and the one made again, walked alike
            return e

        originals = fold_dag([*best.values(), *plan], lambda e: e.children, same)
        remade = fold_dag([*again_best, *again_plan], lambda e: e.children, same)
        assert len(originals) == len(remade)  # (shared entries stay shared)
        for a, b in zip([*best.values(), *plan], [*again_best, *again_plan]):
            stack = [(a, b)]
            while stack:
                x, y = stack.pop()
                if pairs.setdefault(id(x), y) is not y:
                    raise AssertionError("an entry shared in the original is two entries again")
                assert (x.cost, x.node, x.nodes, x.classes) == (y.cost, y.node, y.nodes, y.classes)
                assert len(x.children) == len(y.children)
                stack += list(zip(x.children, y.children))
        checked += 1
    assert checked > 50


def test_a_later_candidate_finished_ahead_gives_the_same_plan(monkeypatch, spare):
    """A residual training step whose sharing search is cut short has two candidates (the
    plain search's and the output trials', which end cheaper and so are finished too): the
    same plan with the later one finished ahead in a forked child, read back as rows, as
    with both finished here, and cheaper than the first candidate's alone."""
    f = _residual_step(rs.DeviceMesh(list(range(8)), ("tp",)), h=24)
    monkeypatch.setattr(dag, "SHARING_BUDGET", 9_000)
    select, counts = extract.select, []

    def first_only(*a, **k):
        cands = select(*a, **k)
        counts.append(len(cands))
        return cands[:1]

    with monkeypatch.context() as m:
        m.setattr(extract, "select", first_only)
        alone = optimize(f, cost_profile=_slow_network(), cache=False)
    assert counts == [2]
    plans, read = [], []
    for fork in (True, False):
        with monkeypatch.context() as m:
            m.setattr(second_core, "SECOND_CORE", fork)
            m.setattr(extract, "entries_of", lambda *a: read.append(fork) or entries_of(*a))
            plans.append(optimize(f, cost_profile=_slow_network(), cache=False))
    assert read == ([True] if spare else [])
    assert plans[0].digest() == plans[1].digest()
    assert plans[0].cost < alone.cost
    assert plans[0].extraction.search_evals == plans[1].extraction.search_evals
    assert plans[0].extraction.windows == plans[1].extraction.windows
