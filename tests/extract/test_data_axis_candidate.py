"""The data-axis candidate of extraction (``extract.select``, ``data_split``): the search
beside the plain one on the e-graph with every node computing a value split along a data axis
priced out, the cheaper search finished first.  Its e-nodes are exactly those; its plan
computes the step whole on each rank of the data axis; where it wins, the plan is finished
from it (cheaper, and as sound: it simulates to the reference), and on the tiny Llama training
step over a 2 x 2 dp x tp mesh it is cheaper than the plain search's plan."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.extract import extract
from reshard.extract.dag import _Costs, _graph, _plan_cost, collect_enodes, entries_of, greedy_dag, share_communication
from reshard.extract.extract import _finished_elsewhere, _priced_out_search, data_axis_split
from reshard.extract.priced_out import dear
from reshard.ir.sharding import Replicate
from reshard.plan import Saturated
from reshard.search.encode import data_axes
from reshard.search.snapshot import real_classes

from tests.rules.test_candidates import MESHES, _dp_tp_step


@pytest.fixture(scope="module")
def step():
    """The dp x tp training step's e-graph: (its Fusion, saturated e-graph, e-nodes, the nodes
    computing a value split along dp)."""
    f = _dp_tp_step(open_bias=True)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    nodes = collect_enodes(sat.snapshot)
    return f, sat, nodes, data_axis_split(sat.snapshot, nodes, real_classes(sat.snapshot), data_axes(f, MESHES[1]))


def test_the_priced_out_nodes_are_those_computing_a_value_split_along_the_data_axis(step):
    """Law: an e-node is priced out of the data-axis search iff its value's dist is not
    Replicate on the data axis and it is not a fed input (an input fed split is gathered by a
    node of a replicated class); no data axis, none."""
    _, sat, nodes, split = step
    f, snap = sat.fusion, sat.snapshot
    names, ids = real_classes(snap), snap.id_terms()

    def on_dp(cls):
        tid, dist = names[cls]
        t = f.tensors[tid]
        return snap.sharding(dist, t.mesh, t.shape, ids).axes[0]

    expected = {n.id for n in nodes if n.ctor != "InAt" and not isinstance(on_dp(n.cls), Replicate)}
    assert expected and split == expected and len(expected) < len(nodes)
    assert any(n.ctor == "InAt" and not isinstance(on_dp(n.cls), Replicate) for n in nodes)
    assert data_axis_split(snap, nodes, names, frozenset()) == frozenset()


def test_the_data_axis_search_computes_the_step_whole_on_each_dp_rank_and_wins(step):
    """On the dp x tp step (an open bias), the plain search computes values split along dp and
    gathers two of them; the data-axis search computes none split (the batch ``x`` gathered
    once, where it is fed) and ends cheaper (52.0 -> 44.0 us), priced at the true costs; the
    plan chosen is finished from it (its one dp step the gather of ``x``) and simulates to the
    unsharded reference."""
    from tests.fuzz.test_fuzz import check_plan

    _, sat, nodes, split = step
    f, snap = sat.fusion, sat.snapshot
    by_name = {v: k for k, v in real_classes(snap).items()}
    roots = [by_name[(tid, snap.let(let))] for (tid, _), let in zip(f.outputs, sat.encoding.output_lets)]
    costs = _Costs(nodes)

    def plan_of(best):
        bits = 0
        for c in roots:
            bits |= best[c].nodes
        return bits, sum(1 for i in split if bits >> i & 1)

    plain, _, _, searched = share_communication(nodes, costs, roots, greedy_dag(nodes, costs))
    dp, _ = _priced_out_search(nodes, _graph(nodes), nodes, costs, roots, split, None)
    (bits, n_dp), (_, n_plain) = plan_of(dp), plan_of(plain)
    assert n_dp == 0 < n_plain
    assert _plan_cost(dp, roots, costs) == costs.of(bits) < searched
    plan = sat.plan()
    assert plan.cost * 1e12 <= costs.of(bits)
    dp_axis = MESHES[1].axis_names[0]
    assert [(c.kind, c.tensor) for c in plan.communications if c.axis == dp_axis] == [("allgather", "x")]
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
        m.setattr(extract, "data_axis_split", lambda *a: frozenset())
        plain = plan()
    assert with_dp.plan.cost < plain.plan.cost
    gathers = [[(c.tensor, c.bytes) for c in p.plan.communications if c.kind == "allgather" and c.axis == "dp"]
               for p in (with_dp, plain)]
    assert len(gathers[0]) < len(gathers[1])
    assert not any(c.kind == "allreduce" and c.axis == "dp" for c in with_dp.plan.communications)
    assert any(c.kind == "allreduce" and c.axis == "dp" for c in plain.plan.communications)
    simulated_step_matches_eager(module, with_dp, ids, ids)


def _bucketed_dp_tp_step() -> rs.Fusion:
    """A dp x tp training step with three parameters (a column- and a row-parallel weight and a
    replicated scale, all replicated over dp): their gradients share a bucket."""
    from reshard.passes.autodiff import joint

    mesh = MESHES[1]
    f = rs.Fusion()
    x = f.input("x", (4, 6, 8), "float64", mesh, [rs.Shard(0), rs.Replicate()])
    w1 = f.input("w1", (8, 4), "float64", mesh, [rs.Replicate(), rs.Shard(1)])
    w2 = f.input("w2", (4, 8), "float64", mesh, [rs.Replicate(), rs.Shard(0)])
    v = f.input("v", (8,), "float64", mesh, [rs.Replicate(), rs.Replicate()])
    z = f.matmul(f.tanh(f.matmul(x, w1)), w2)
    z = f.mul(z, f.broadcast_to(v, z.shape))
    loss = f.mean(f.reshape(f.tanh(z), (1, 4 * 48)), 1, name="loss")
    f.output(loss, [rs.Replicate(), rs.Replicate()])
    return joint(f, loss, wrt=["w1", "w2", "v"]).fusion


def test_the_data_axis_candidates_buckets_are_shared_at_its_own_pricing(monkeypatch):
    """Law (``select``): the data-axis candidate, where it is finished, shares its gradient
    buckets at its search's pricing (every node computing a value split along dp priced out,
    ``_dear``), trying only the reductions of values whole on each dp rank, then is priced at
    the true costs and kept only where no dearer than without them.  On a dp x tp step whose
    three gradients share a bucket, where that candidate wins: the bucket search runs at
    exactly that pricing over those reductions (at the true costs each of its trials
    re-extracted the plan back towards split steps), and the plan computes no value split along
    dp but the batch, gathered once, costs no more than the candidate's search and simulates to
    the unsharded reference."""
    from tests.fuzz.test_fuzz import check_plan

    f = _bucketed_dp_tp_step()
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    nodes = collect_enodes(sat.snapshot)
    costs = _Costs(nodes)
    split = data_axis_split(sat.snapshot, nodes, real_classes(sat.snapshot), data_axes(f, MESHES[1]))
    by_name = {v: k for k, v in real_classes(sat.snapshot).items()}
    roots = [by_name[(tid, sat.snapshot.let(let))] for (tid, _), let in zip(f.outputs, sat.encoding.output_lets)]
    searched = _plan_cost(_priced_out_search(nodes, _graph(nodes), nodes, costs, roots, split, None)[0], roots, costs)
    seen = []
    real_share = extract.share_communication

    def share(nodes, costs, roots, best, budget=None, **kw):
        seen.append((kw.get("only"), costs.costs.copy()))
        return real_share(nodes, costs, roots, best, budget, **kw)

    monkeypatch.setattr(extract, "share_communication", share)
    plan = sat.plan()
    buckets = [(only, c) for only, c in seen if only is not None]
    assert len(buckets) == 1 and (buckets[0][1] == dear(costs, split).costs).all()
    assert (buckets[0][1] != costs.costs).any()
    # (its trials: the bucket's reductions of values whole on each dp rank, none split along dp)
    split_classes = {nodes[i].cls for i in split}
    assert buckets[0][0] and not buckets[0][0] & split_classes
    dp_axis = MESHES[1].axis_names[0]
    assert [(c.kind, c.tensor) for c in plan.communications if c.axis == dp_axis] == [("allgather", "x")]
    assert plan.cost * 1e12 <= searched
    check_plan(plan, f, 0, "data-axis candidate with a bucket")
