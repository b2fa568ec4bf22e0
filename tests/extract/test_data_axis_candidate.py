"""The data-axis candidate of extraction (``extract.select``, ``data_moves``): the search
beside the plain one on the e-graph with the steps that move or split rows along a data axis
priced out, the cheaper search finished first.  Its e-nodes are exactly those steps; its plan
takes only the moves an output needs; where it wins, the plan is finished from it (cheaper, and
as sound: it simulates to the reference), and on the tiny Llama training step over a 2 x 2
dp x tp mesh it is cheaper than the plain search's plan."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.extract import extract
from reshard.extract.dag import _Costs, _graph, _plan_cost, collect_enodes, entries_of, greedy_dag, share_communication
from reshard.extract.extract import _data_axis_search, _finished_elsewhere, data_axis_moves
from reshard.ir.sharding import Partial
from reshard.plan import Saturated
from reshard.search.encode import data_axes
from reshard.search.snapshot import real_classes

from tests.rules.test_candidates import MESHES, _dp_tp_step


@pytest.fixture(scope="module")
def step():
    """The dp x tp training step's e-graph: (its Fusion, saturated e-graph, e-nodes, the data moves)."""
    f = _dp_tp_step(open_bias=True)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    nodes = collect_enodes(sat.snapshot)
    return f, sat, nodes, data_axis_moves(sat.snapshot, nodes, data_axes(f, MESHES[1]))


def test_the_data_moves_are_the_steps_changing_a_data_axis_placement_without_reducing(step):
    """Law: an e-node is a data move iff it implements a value from the same value at another
    dist whose placement on the data axis differs, neither of the two partial (a gather, a
    split or an exchange of rows between the axis's ranks; a reduction or a local partial is
    not one)."""
    _, sat, nodes, moves = step
    f, snap = sat.fusion, sat.snapshot
    names, ids = real_classes(snap), snap.id_terms()

    def on_dp(cls):
        tid, dist = names[cls]
        t = f.tensors[tid]
        return tid, snap.sharding(dist, t.mesh, t.shape, ids).axes[0]

    expected = set()
    for n in nodes:
        if len(n.children) != 1 or n.cls not in names or n.children[0] not in names:
            continue
        (v, p), (u, q) = on_dp(n.cls), on_dp(n.children[0])
        if v == u and p != q and not isinstance(p, Partial) and not isinstance(q, Partial):
            expected.add(n.id)
    assert expected and moves == expected
    assert data_axis_moves(snap, nodes, frozenset()) == frozenset()


def test_the_data_axis_search_gathers_only_what_an_output_needs_and_wins(step):
    """On the dp x tp step (an open bias), the plain search gathers two values over dp; the
    data-axis search only the one its loss needs (the mean of a reshape that merges the
    batch with other dims), and ends cheaper (52.0 -> 44.0 us), priced at the true costs; the
    plan chosen is finished from it and simulates to the unsharded reference."""
    from tests.fuzz.test_fuzz import check_plan

    _, sat, nodes, moves = step
    f, snap = sat.fusion, sat.snapshot
    by_name = {v: k for k, v in real_classes(snap).items()}
    roots = [by_name[(tid, snap.let(let))] for (tid, _), let in zip(f.outputs, sat.encoding.output_lets)]
    costs = _Costs(nodes)

    def plan_of(best):
        bits = 0
        for c in roots:
            bits |= best[c].nodes
        return bits, sum(1 for i in moves if bits >> i & 1)

    plain, _, _, searched = share_communication(nodes, costs, roots, greedy_dag(nodes, costs))
    dp, _ = _data_axis_search(nodes, _graph(nodes), nodes, costs, roots, moves, None)
    (bits, n_dp), (_, n_plain) = plan_of(dp), plan_of(plain)
    assert (n_dp, n_plain) == (1, 2)
    assert _plan_cost(dp, roots, costs) == costs.of(bits) < searched
    plan = sat.plan()
    assert plan.cost * 1e12 <= costs.of(bits)
    check_plan(plan, step[0], 0, "data-axis candidate")


def test_the_data_axis_search_beside_the_plain_one_gives_the_same_plan(step, spare, monkeypatch):
    """Searched in a forked child beside the plain search (a core spare), its entries read back
    as rows where it wins (it does on this step), or searched here: the same plan, the same
    re-extractions counted."""
    from reshard.extract import second_core

    _, sat, _, _ = step
    read, plans = [], []
    for fork in (True, False):
        with monkeypatch.context() as m:
            m.setattr(second_core, "SECOND_CORE", fork)
            m.setattr(extract, "entries_of", lambda *a, fork=fork: read.append(fork) or entries_of(*a))
            plans.append(sat.plan())
    assert read == ([True] if spare else [])
    assert plans[0].digest() == plans[1].digest() and plans[0].cost == plans[1].cost
    assert plans[0].extraction.search_evals == plans[1].extraction.search_evals


def test_a_child_whose_search_ends_above_the_first_finishes_nothing():
    """A later candidate finished ahead (``_finished_elsewhere``) whose search ends above the
    first candidate's is not finished: ``choose`` would not take it (finishing never raises a
    cost), so the child returns at once."""
    finished = []

    def finish(*a):
        finished.append(a)
        raise AssertionError("finished")

    assert _finished_elsewhere(finish, None, [], None, None, {}, 100, (101, {}, 0)) is None
    assert _finished_elsewhere(finish, None, [], None, None, {}, 100, (None, {}, 0)) is None
    assert not finished


@pytest.mark.hf
def test_the_tiny_llama_step_on_a_dp_tp_mesh_is_cheaper_with_the_data_axis_candidate(monkeypatch):
    """A 2-layer tiny Llama's training step (the benchmark's tiny config, ``train_tiny.py``: batch 4
    x 16) on the 2 x 2 dp x tp mesh: the plan with the data-axis candidate is cheaper than
    the plain search's alone (which gathers two of the loss's terms over dp and all-reduces the
    gradients over it: 1069.3 -> 886.9 us), gathers less over dp (the batch once:
    ids and labels are one tensor; the plain plan gathers two of the loss's terms) and reduces no
    gradient there, and one step through it equals eager PyTorch's loss and gradients."""
    T = pytest.importorskip("transformers")
    from reshard.frontend.loss import LossOf
    from reshard.testing.hf_models import megatron
    from reshard.testing.train_loop import simulated_step_matches_eager
    from reshard.testing.train_models import MESHES as TRAIN_MESHES, input_placements

    torch.manual_seed(0)
    module = LossOf(T.LlamaForCausalLM(T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                                     num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2)),
                    None, 0, 0, keywords=("input_ids", "labels"))
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0))
    mesh = TRAIN_MESHES["dp2xtp2"]

    def plan() -> rs.TrainingPlan:
        return rs.plan_training(module, (ids, ids), mesh, input_placements=input_placements(mesh),
                                param_placements=megatron(module, mesh), cache=False)

    with_dp = plan()
    with monkeypatch.context() as m:
        m.setattr(extract, "data_axis_moves", lambda *a: frozenset())
        plain = plan()
    assert with_dp.plan.cost < plain.plan.cost
    gathers = [[(c.tensor, c.bytes) for c in p.plan.communications if c.kind == "allgather" and c.axis == "dp"]
               for p in (with_dp, plain)]
    assert len(gathers[0]) < len(gathers[1])
    assert not any(c.kind == "allreduce" and c.axis == "dp" for c in with_dp.plan.communications)
    assert any(c.kind == "allreduce" and c.axis == "dp" for c in plain.plan.communications)
    simulated_step_matches_eager(module, with_dp, ids, ids)
