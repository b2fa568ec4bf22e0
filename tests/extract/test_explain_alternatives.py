"""Rejected alternatives whose extractor entries are cyclic are priced by an acyclic
re-extraction (``extract.pricing.Pricer.acyclic``); each priced alternative is a real plan:
extracting from its ``plan_nodes`` alone forces it, and the forced plan simulates correctly."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import reshard as rs
from reshard.cli import random_inputs
from reshard import alternatives as A
from reshard.extract import pricing
from reshard.extract.dag import collect_enodes
from reshard.examples import transformer_block
from reshard.plan import PS, Saturated
from tests.e2e.test_explain_draw import readme_mlp

HUGE = 10**9


class _Force:
    """A ``perturb`` stand-in for ``Saturated.plan``: extraction draws one cost per e-node in
    e-node id order; e-nodes in bitset ``keep`` cost 1, the others ``HUGE`` (so any plan made
    of ``keep`` alone beats every plan that is not)."""

    def __init__(self, keep: int) -> None:
        self.keep, self.i = keep, -1

    def randrange(self, lo: int, hi: int) -> int:
        self.i += 1
        return 1 if self.keep >> self.i & 1 else HUGE


def _enodes(plan: rs.Plan) -> set[int]:
    return {n.enode for n in plan.lowered.nodes}


def _simulates(plan: rs.Plan, fusion: rs.Fusion) -> None:
    inputs = random_inputs(fusion)
    for out, ref in zip(plan.simulate(inputs), rs.run_reference(fusion, inputs)):
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def mlp() -> tuple[rs.Fusion, Saturated, rs.Plan]:
    f = readme_mlp()
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    return f, sat, sat.plan()


def _gather(plan: rs.Plan):
    (g,) = [n for n in plan.lowered.nodes if n.head.form == "allgather"]
    return g


def test_readme_mlp_allgather_lists_a_priced_alternative(mlp):
    f, sat, plan = mlp
    ilp = sat.plan(extractor="ilp")
    assert ilp.extraction.optimal and plan.cost == pytest.approx(ilp.cost, rel=1e-12)  # chosen = cheapest
    g = _gather(plan)
    assert plan.fusion.tensors[g.value].name == "x"
    values = [a for a in g.alternatives if a.scope == "value"]
    assert values, "the allgather of x has other ways (through x [S(1)]) that must be priced"
    for a in values:
        assert a.plan_cost_ps * PS >= plan.cost * (1 - 1e-12) and a.cost_ps >= g.subplan_cost_ps
        assert a.enode != g.enode and a.plan_bytes >= a.bytes > 0
    lines = plan.explain().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.strip().startswith("comm allgather"))
    assert lines[i + 1].strip().startswith(f"rejected: {values[0].description}: ")
    assert "no other way found" not in plan.explain()


def test_every_alternative_of_the_mlp_forced_simulates_correctly(mlp):
    f, sat, plan = mlp
    real = {n.id: n.cost for n in collect_enodes(sat.snapshot)}
    alts = [a for n in plan.lowered.nodes for a in n.alternatives]
    assert len(alts) >= 10
    for a in alts:
        forced = sat.plan(perturb=_Force(a.plan_nodes))
        used = _enodes(forced)
        assert a.enode in used, a.description
        assert all(a.plan_nodes >> i & 1 for i in used), a.description  # nothing outside its plan
        cost = sum(real[i] for i in used)
        # a real plan: never cheaper than the (proved optimal) chosen one, never above its price
        assert plan.cost * (1 - 1e-12) <= cost * PS and cost <= a.plan_cost_ps, a.description
        _simulates(forced, f)


def test_forbidding_the_allgather_finds_the_priced_way_round(mlp):
    """Dual check of the pricing: with the chosen allgather priced out, extraction finds a
    plan without it, no cheaper than the cheapest alternative the explanation priced."""
    f, sat, plan = mlp
    g = _gather(plan)
    forced = sat.plan(perturb=_Force(((1 << len(collect_enodes(sat.snapshot))) - 1) & ~(1 << g.enode)))
    assert g.enode not in _enodes(forced)
    _simulates(forced, f)


def test_no_other_way_still_says_so():
    """A 1-D input gathered for the output: its only distributions are S(0) and R, so the
    allgather is the only way, and extraction keeps it even when it is priced out."""
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    f = rs.Fusion()
    x = f.input("x", (8,), "float32", mesh, [rs.Shard(0)])
    f.output(x, [rs.Replicate()])
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    plan = sat.plan()
    g = _gather(plan)
    assert [a for a in g.alternatives if a.scope == "value"] == []
    lines = plan.explain().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.strip().startswith("comm allgather"))
    assert lines[i + 1].strip() == "rejected: no other way found"
    forced = sat.plan(perturb=_Force(((1 << len(collect_enodes(sat.snapshot))) - 1) & ~(1 << g.enode)))
    assert g.enode in _enodes(forced)  # truly no other way


def test_work_bound_leaves_cyclic_alternatives_unpriced(mlp, monkeypatch):
    """``ACYCLIC_BUDGET`` bounds the re-extractions: with none, only alternatives whose best
    entries are already acyclic are priced (the allgather's are not)."""
    f, sat, _ = mlp
    monkeypatch.setattr(pricing, "ACYCLIC_BUDGET", 0)
    g = _gather(sat.plan())
    assert [a for a in g.alternatives if a.scope == "value"] == []


def test_demo_block_prices_every_communication():
    f = transformer_block()
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    plan = sat.plan()
    comms = [n for n in plan.lowered.nodes if n.head.communicates]
    assert comms and "no other way found" not in plan.explain()
    for n in comms:
        (a, *_) = [a for a in n.alternatives if a.scope == "value"]
        assert a.plan_cost_ps * PS >= plan.cost * (1 - 1e-12)
        forced = sat.plan(perturb=_Force(a.plan_nodes))
        assert a.enode in _enodes(forced)
        _simulates(forced, f)


def _priced(monkeypatch: pytest.MonkeyPatch, program: str) -> tuple[rs.Plan, A.Explainer]:
    """The plan of ``reshard.testing.programs``' ``program`` and the explainer that priced its
    alternatives."""
    from reshard.testing import programs as P
    seen: list[A.Explainer] = []

    class Recording(A.Explainer):
        def annotate(self, roots, built):
            seen.append(self)
            super().annotate(roots, built)

    monkeypatch.setattr(A, "Explainer", Recording)
    plan = rs.optimize(getattr(P, program)())
    plan.lowered.nodes[0].alternatives  # prices the plan
    (ex,) = seen
    return plan, ex


@pytest.mark.parametrize("program", ["mlp", "attention"])
def test_acyclic_re_extraction_law(monkeypatch, program):
    """``Pricer.acyclic``: with a class of the plan excluded, it finds an entry for exactly
    the classes producible without it (``extract_ilp.prune``'s fixpoint), none holding it,
    each entry's cost the DAG cost of its node set."""
    from reshard.extract.extract_ilp import prune
    plan, ex = _priced(monkeypatch, program)
    targets = tuple(ex.by_cls)
    for cls in {ex.nodes[n.enode].cls for n in plan.lowered.nodes}:
        excluded = frozenset([cls])
        mask = ex._mask(excluded)
        sub = ex.acyclic(excluded, mask, tuple(c for c in targets if c != cls))
        producible = prune([n for n in ex.nodes if n.cls != cls and cls not in n.children],
                           [c for c in targets if c != cls]).by_class
        assert set(sub) == set(producible) - {cls}
        for e in sub.values():
            assert not e.nodes & mask and e.cost == ex.costs.of(e.nodes)
    assert ex.work_left >= 0


@pytest.mark.parametrize("program", ["mlp", "attention", "training_attention"])
def test_one_acyclic_walk_per_class_prices_each_alternative_as_its_own_walk(monkeypatch, program):
    """``Pricer._kids`` re-extracts the children of all of a class's alternatives in one
    ``acyclic`` walk (``Pricer._targets``): each alternative's children get the entries a walk
    from its own children gives (a class below a target reads only classes below it, and
    ``greedy_dag`` visits nodes by (key, id) whatever else the region holds)."""
    plan, ex = _priced(monkeypatch, program)
    compared = 0
    for cls in {ex.nodes[n.enode].cls for n in plan.lowered.nodes}:
        excluded = frozenset([cls])
        mask = ex._mask(excluded)
        for n in ex.by_cls[cls]:
            kids = [ex.best.get(c) for c in n.children]
            if cls in n.children or all(k is not None and not k.nodes & mask for k in kids):
                continue  # (no walk: its children's best entries serve, or it reads its own class)
            ex.work_left = HUGE
            union = ex.acyclic(excluded, mask, ex._targets(cls, excluded))
            own = ex.acyclic(excluded, mask, tuple(dict.fromkeys(n.children)))
            for c in n.children:
                got, want = union.get(c), own.get(c)
                assert (got is None) == (want is None)
                if want is not None:
                    assert (got.cost, got.node.id, got.nodes) == (want.cost, want.node.id, want.nodes)
                    compared += 1
    assert compared


def test_a_dropped_plan_is_freed_by_reference_counting():
    """A plan's nodes hold their deferred pricing (and through it the e-graph snapshot); the
    pricing holds the nodes only weakly, so dropping the plan frees all of it without the cyclic
    collector, and a node kept alone is still explained."""
    f = readme_mlp()
    gc.collect()
    gc.disable()
    try:
        plan = Saturated.build(f, rs.CostProfile(), rs.Limits()).plan()
        g = _gather(plan)
        refs = [weakref.ref(n) for n in plan.lowered.nodes]
        kept: set[int] = set()
        todo = [g]
        while todo:
            n = todo.pop()
            if id(n) not in kept:
                kept.add(id(n))
                todo.extend(n.args)
        pricing = weakref.ref(g.pending)
        assert len(kept) < len(refs)
        del plan
        assert sum(r() is not None for r in refs) == len(kept)  # g's sub-plan, nothing else
        assert pricing() is not None
        assert [a for a in g.alternatives if a.scope == "value"]  # priced from the snapshot
        del g, todo, n
        assert [r() for r in refs] == [None] * len(refs) and pricing() is None
    finally:
        gc.enable()
