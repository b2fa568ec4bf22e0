"""The sharing search's work (``extract.dag.share_communication``): what it need not redo.

* a failed trial is not repeated while no trial was kept since (``dag._try_free``'s law): on
  random e-graphs, with and without groups of alternatives (``one_of``, a gradient bucket's
  reductions), the search ends in the same plan as one that repeats every trial each pass,
  with fewer re-extractions, and no class is tried twice on one state;
* with groups, every group's first class is tried before any group's second
  (``dag._round_robin``), so the trials kept come early in a pass;
* a free trial reprices only the entries that hold a paid node (``dag._holding``): the
  classes above the paid nodes' classes, or every entry when those are many, or the entries
  above the paid nodes' own in the entries' graph (``dag._EntryDag``, a search's index of its
  state), the same set as reading every entry;
* the later half of a pass's trials tried ahead in a forked child (``dag._Ahead``) changes
  nothing: the same plan and re-extractions as trying each here.
"""

from __future__ import annotations

import random
from typing import Any

from reshard.extract import dag
from reshard.extract.dag import SHARED_KINDS, ENode, _Costs, greedy_dag, share_communication

KINDS = ["AllGather", "AllReduce", "ReduceScatter", "Op", "Op"]


def _layered(rng: random.Random) -> tuple[list[ENode], list[str]]:
    """Classes c0, c1 (inputs) .. c{n-1}, 1-4 nodes each (communications and ops, cheap and
    dear) on 1-3 lower classes; roots: the last three, so that trials interact across passes."""
    spec = [("InAt", "c0", (), 0), ("InAt", "c1", (), 0)]
    n = rng.randint(8, 16)
    for c in range(2, n):
        for _ in range(rng.randint(1, 4)):
            kids = tuple(sorted({f"c{rng.randrange(c)}" for _ in range(rng.randint(1, 3))}))
            spec.append((rng.choice(KINDS), f"c{c}", kids, rng.choice([1, 2, 3, 5, 8, 20, 40, 100])))
    nodes = [ENode(i, ctor, cls, kids, kids, cost) for i, (ctor, cls, kids, cost) in enumerate(spec)]
    return nodes, [f"c{n - 1}", f"c{n - 2}", f"c{n - 3}"]


def _searches(rng: random.Random, cases: int):
    """Of ``cases`` random e-graphs (``_layered``), those whose greedy plan reaches the roots:
    (nodes, costs, roots, the greedy's entries, groups of the communications' classes: every
    other case, else None)."""
    for case in range(cases):
        nodes, roots = _layered(rng)
        costs = _Costs(nodes)
        greedy = greedy_dag(nodes, costs)
        if dag._plan_cost(greedy, roots, costs) is None:
            continue
        comms = list(dict.fromkeys(n.cls for n in nodes if n.ctor in SHARED_KINDS))
        yield nodes, costs, roots, greedy, ({c: rng.randrange(3) for c in comms} if case % 2 else None)


def _repeating(nodes: list[ENode], costs: _Costs, roots: list[str], best: dict, one_of: dict | None) -> dag._Search:
    """The search's passes trying every candidate each pass (none skipped), then its releases."""
    order = list(dict.fromkeys(n.cls for n in nodes if n.ctor in SHARED_KINDS))
    order = order if one_of is None else dag._round_robin(order, one_of)
    graph = dag._graph(nodes)
    class_list, by_id = list(graph.cls_bit), {n.id: n for n in nodes}
    s = dag._Search(best, dag._plan_cost(best, roots, costs), 0, costs, [])
    settled: set[Any] = set()
    improved = True
    while improved:
        improved = False
        for c in order:
            if one_of is not None and one_of.get(c, c) in settled:
                continue
            if dag._try_free(s, c, nodes, costs, roots, graph, class_list, by_id):
                improved = True
                if one_of is not None:
                    settled.add(one_of.get(c, c))
    dag._release(s, list(s.accepted), nodes, costs, roots, graph, None)
    return s


def test_failed_trials_are_not_repeated_and_the_plan_is_the_same(monkeypatch):
    rng = random.Random(7)
    tried: list[tuple[Any, int, bool]] = []
    real = dag._try_free

    def recording(s, c, *args):
        state = len(s.accepted)
        kept = real(s, c, *args)
        tried.append((c, state, kept))
        return kept

    saved = compared = 0
    for nodes, costs, roots, greedy, one_of in _searches(rng, 300):
        ref = _repeating(nodes, costs, roots, greedy, one_of)
        tried.clear()
        with monkeypatch.context() as m:
            m.setattr(dag, "_try_free", recording)
            best, evals, _, after = share_communication(nodes, costs, roots, greedy, one_of=one_of)
        failed = [(c, state) for c, state, kept in tried if not kept]
        assert len(failed) == len(set(failed)), "a failed trial was repeated on the state it failed in"
        assert after == ref.cur and dag._plan_bits(best, roots) == dag._plan_bits(ref.best, roots)
        assert evals <= ref.evals
        saved += ref.evals - evals
        compared += 1
    assert compared > 200 and saved > 50  # (the skip was exercised)


def test_holding_reads_the_entries_that_hold_paid_nodes():
    rng = random.Random(3)
    for _ in range(300):
        nodes, roots = _layered(rng)
        costs = _Costs(nodes)
        best = greedy_dag(nodes, costs)
        parents = dag._graph(nodes).parents
        for size in (1, 3, len(nodes)):
            delta = 0
            for n in rng.sample(nodes, min(size, len(nodes))):
                delta |= 1 << n.id
            ids = dag._bits(delta)
            start = {nodes[i].cls for i in ids}
            every = {k: sum(1 << j for j, i in enumerate(ids) if e.nodes >> i & 1)  # (bit j: node ids[j])
                     for k, e in best.items() if e.nodes & delta}
            assert dag._holding(best, ids, start, parents) == every
            assert dag._EntryDag(best).holding(ids) == every
            holders = dag._Holders()  # (a search's: the index once the class graph's walk finds too many)
            assert dag._holding(best, ids, start, parents, holders) == every
            assert holders.cached(best) is None or dag._holding(best, ids, start, parents, holders) == every


def test_round_robin_tries_every_groups_first_class_first():
    one_of = {"a1": "a", "a2": "a", "a3": "a", "b1": "b", "b2": "b"}  # (c1: a group of its own)
    assert dag._round_robin(["a1", "a2", "b1", "a3", "c1", "b2"], one_of) == ["a1", "b1", "c1", "a2", "b2", "a3"]


def test_trials_tried_ahead_on_a_spare_core_give_the_same_search(spare, monkeypatch):
    """Every pass forks for the later half of its trials as soon as one failed (``AHEAD_AFTER``
    1, no time floor): on random e-graphs, with and without groups, the plan, its cost and the
    re-extractions are those of the serial search, and failed outcomes from the children were
    read (and kept ones run again here)."""
    if not spare:
        return
    from reshard.extract import second_core

    rng = random.Random(11)
    read = {"failed": 0, "here": 0}
    real_failed = dag._Ahead.failed

    def counting(self, i):
        got = real_failed(self, i)
        if i >= self.classes[0]:
            read["failed" if got is not None else "here"] += 1
        return got

    compared = 0
    for nodes, costs, roots, greedy, one_of in _searches(rng, 40):
        with monkeypatch.context() as m:
            m.setattr(second_core, "SECOND_CORE", False)
            serial = share_communication(nodes, costs, roots, greedy, one_of=one_of)
        with monkeypatch.context() as m:
            m.setattr(dag, "AHEAD_MIN_S", 0.0)
            m.setattr(dag, "AHEAD_AFTER", 1)
            m.setattr(dag._Ahead, "failed", counting)
            ahead = share_communication(nodes, costs, roots, greedy, one_of=one_of)
        assert ahead[1:] == serial[1:]
        assert dag._plan_bits(ahead[0], roots) == dag._plan_bits(serial[0], roots)
        compared += 1
    assert compared > 25 and read["failed"] > 20 and read["here"] > 0
