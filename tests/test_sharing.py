"""The greedy extractor's sharing search (``egraph_rules.dag.share_communication``) and its
release trials (``dag.release_trial``): a sub-plan the search assumed paid is priced again.

* a hand-made e-graph of the miss found on the whole Llama-2-7B at tp 8: the search's first
  accepted trial assumes a table's all-gather paid (it beats the greedy's plan, whose consumers
  each bought their own all-reduce), and that sub-plan stayed free, so the cheaper route (one
  reduce-scatter shared by every consumer, each all-gathering its own copy) was never priced
  against it again; the release trial finds the optimum (proved by the ILP);
* a program (2x2 mesh) where the release trials find a cheaper plan than the search without
  them; the plan simulates to the reference values;
* the search is sound with its release trials: random e-graphs, it never ends above the
  greedy and every entry's cost is its node set's true cost.
"""

from __future__ import annotations

import random

import reshard as rs
from reshard.egraph_rules import dag
from reshard.egraph_rules.dag import ENode, _Costs, greedy_dag, share_communication
from reshard.egraph_rules.extract_ilp import ilp_dag, root_cost
from reshard.ir.ids import Inner, Outer, Root
from reshard.ir.sharding import TensorSharding
from reshard.plan import CostProfile, Limits, Saturated
from tests.extract_compare import problem
from tests.fuzz_programs import M2x2
from tests.op_oracle import assert_same, inputs_of

CONSUMERS = 3


def _nodes(spec: list[tuple[str, str, tuple[str, ...], int]]) -> list[ENode]:
    return [ENode(i, ctor, cls, children, children, cost) for i, (ctor, cls, children, cost) in enumerate(spec)]


def _table_gather_egraph() -> tuple[list[ENode], list[str]]:
    """T: a vocab-sharded table; G: T all-gathered (50); M: the masked lookup on T's shard (a
    partial sum, free); ES: M reduce-scattered (25), read by root R0; per consumer i, its own
    replicated copy Ei: a lookup on G (1), M all-reduced (29) or ES all-gathered (5), read by
    root Ri (1).  Greedy: each Ei alone prefers the all-reduce (30 < 1 + 25 + 5), 27 + 3 * 30 =
    117.  Assuming G paid, every Ei takes the lookup: 50 + 27 + 3 * 2 = 83, kept.  The optimum
    shares ES: 27 + 3 * 6 = 45."""
    spec = [("InAt", "T", (), 0), ("AllGather", "G", ("T",), 50), ("Op", "M", ("T",), 1),
            ("ReduceScatter", "ES", ("M",), 25), ("Op", "R0", ("ES",), 1)]
    for i in range(1, CONSUMERS + 1):
        spec += [("Op", f"E{i}", ("G",), 1), ("AllReduce", f"E{i}", ("M",), 29), ("AllGather", f"E{i}", ("ES",), 5),
                 ("Op", f"R{i}", (f"E{i}",), 1)]
    return _nodes(spec), ["R0"] + [f"R{i}" for i in range(1, CONSUMERS + 1)]


def test_release_prices_a_gather_assumed_paid_again():
    nodes, roots = _table_gather_egraph()
    costs = _Costs(nodes)
    greedy = greedy_dag(nodes, costs)
    assert root_cost(greedy, roots, costs) == 117
    best, _, before, after = share_communication(nodes, costs, roots, greedy)
    optimum = ilp_dag(nodes, costs, roots)
    assert optimum.report.optimal and optimum.cost == 45
    assert (before, after) == (117, 45) and root_cost(best, roots, costs) == 45
    used = 0
    for r in roots:
        used |= best[r].nodes
    assert not used & (1 << 1), "the table's all-gather is still in the plan"
    assert all(best[f"E{i}"].node.ctor == "AllGather" for i in range(1, CONSUMERS + 1))


def _pinned_twice() -> rs.Fusion:
    """A program the fuzzer found (2x2 mesh): ``x0`` arrives as partial sums on both axes and
    is read by two outputs of one matmul at two shardings; without release trials, the
    search keeps a collective it assumed paid, 54.0 us where 52.0 us exists."""
    f = rs.Fusion()
    x0 = f.input("x0", (12, 12, 4), "float64", M2x2, [rs.Partial("sum"), rs.Partial("sum")])
    x1 = f.input("x1", (12, 4, 8), "float64", M2x2, [rs.Shard(2), rs.Replicate()])
    t7 = f.unary("neg", f.unary("tanh", x1))
    t9 = f.matmul(x0, t7)
    f.output(f.binary("mul", t7, x1),
             TensorSharding(M2x2, (12, 4, 8), (Outer(Root(2, 8), 2), Outer(Inner(Root(2, 8), 2), 2))))
    f.output(t9, [rs.Shard(0), rs.Replicate()])
    f.output(t9, [rs.Shard(2), rs.Shard(1)])
    return f


def test_release_finds_the_cheaper_plan_of_a_program_and_it_simulates(monkeypatch):
    f = _pinned_twice()
    p = problem(Saturated.build(f, CostProfile.load(None), Limits()))

    def searched() -> int:
        best = share_communication(p.nodes, p.costs, p.roots, greedy_dag(p.nodes, p.costs))[0]
        return root_cost(best, p.roots, p.costs)

    released = searched()
    with monkeypatch.context() as m:  # release trials that never improve: the search as it was
        m.setattr(dag, "release_trial", lambda nodes, costs, used, delta, graph: (greedy_dag(nodes, costs), costs))
        kept = searched()
    assert released < kept
    plan = rs.optimize(f)
    assert plan.extraction.cost == released
    inputs = inputs_of(f, 0)
    for out, ref in zip(plan.simulate(inputs), rs.run_reference(f, inputs), strict=True):
        assert_same(out, ref)


def test_search_is_sound_on_random_egraphs():
    """Random layered e-graphs (communications and ops, 1-3 nodes per class): the search never
    ends above the greedy, its reported cost is its plan's true cost, and every entry's cost
    is the true cost of its node set."""
    rng = random.Random(0)
    for _ in range(300):
        spec = [("InAt", "c0", (), 0)]
        n = rng.randint(4, 9)
        for c in range(1, n):
            for _ in range(rng.randint(1, 3)):
                kids = tuple(sorted({f"c{rng.randrange(c)}" for _ in range(rng.randint(1, min(2, c)))}))
                spec.append((rng.choice(["AllGather", "AllReduce", "ReduceScatter", "Op"]), f"c{c}", kids,
                             rng.choice([1, 2, 5, 10, 20, 50, 100])))
        nodes, roots = _nodes(spec), [f"c{n - 1}", f"c{n - 2}"]
        costs = _Costs(nodes)
        greedy = greedy_dag(nodes, costs)
        best, _, before, after = share_communication(nodes, costs, roots, greedy)
        assert after <= before == root_cost(greedy, roots, costs)
        assert root_cost(best, roots, costs) == after
        assert all(e.cost == costs.of(e.nodes) for e in best.values())
