"""The model-parallel candidate of extraction (``extract.select``, ``model_split``): the plan
searched and finished with every e-node that splits a data dim (``ir.dim_classes``: the batch,
the sequence) on a model axis priced out, always finished.  Its e-nodes are exactly those; where
the plain search mixes in sequence-parallel steps, it is made, and on a GPT-2 layer at widths
where bytes matter its plan (Megatron's layout) is cheaper, moves fewer bytes, is the same
finished here or in a forked child, and one step through it equals eager PyTorch's."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.extract import extract, second_core
from reshard.extract.dag import collect_enodes
from reshard.extract.priced_out import model_axis_split
from reshard.ir.dim_classes import activation_dims
from reshard.ir.ids import root_dims
from reshard import plan as plan_module
from reshard.extract.layer_reuse import _distinct
from reshard.plan import Saturated
from reshard.search.encode import data_axes
from reshard.search.snapshot import real_classes

from tests.ir.test_dim_classes import mlp_step
from tests.rules.test_candidates import MESHES


def test_the_priced_out_nodes_split_a_data_dim_on_a_model_axis():
    """Law: an e-node is priced out of the model-parallel search iff it is not a fed input and
    its value's dist binds a mesh axis that is not a data axis to an ID over an activation dim
    of the value; on a dp x tp step of a residual MLP block, some are (the tokens split along
    the sequence on tp), none splits only along dp, and a forward program (no parameters) has
    none."""
    f = mlp_step(mesh=MESHES[1])
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    snap, nodes = sat.snapshot, collect_enodes(sat.snapshot)
    names, ids, act = real_classes(snap), snap.id_terms(), activation_dims(sat.fusion)
    data = data_axes(sat.fusion, MESHES[1])
    assert data == {0}

    def split_on_tp(cls) -> bool:
        tid, dist = names[cls]
        t = sat.fusion.tensors[tid]
        ts = snap.sharding(dist, t.mesh, t.shape, ids)
        return 1 in ts.bound_axes and any((tid, r) in act for r in root_dims(ts.axes[1]))

    for tid, dist in set(names.values()):  # (read without building a TensorSharding: a huge fused one raises)
        t = sat.fusion.tensors[tid]
        assert snap.axis_placements(dist, ids) == snap.sharding(dist, t.mesh, t.shape, ids).axes
    family = model_axis_split(snap, nodes, names, sat.fusion, data)
    assert family == {n.id for n in nodes if n.ctor != "InAt" and split_on_tp(n.cls)}
    assert family and len(family) < len(nodes)
    forward = rs.Fusion()
    x = forward.input("x", (4, 8), "float64", MESHES[0], [rs.Replicate()])
    forward.output(forward.matmul(x, forward.input("w", (8, 4), "float64", MESHES[0], [rs.Shard(1)])),
                   [rs.Replicate()])
    fs = Saturated.build(forward, rs.CostProfile(), rs.Limits())
    assert model_axis_split(fs.snapshot, collect_enodes(fs.snapshot), real_classes(fs.snapshot), fs.fusion,
                            frozenset()) == frozenset()


@pytest.mark.hf
def test_a_gpt2_layer_takes_megatrons_layout_from_the_model_parallel_candidate(monkeypatch):
    """A 1-layer GPT-2 (hidden 512, 8 heads, sequence 512, float32) training step at tp 4: the
    plain search mixes sequence-parallel steps in (a reduce-scatter of the MLP's output, then
    all-gathers forward and backward); the model-parallel candidate's plan is chosen, cheaper
    and moving fewer bytes; finished in a forked child (a core spare) or here, the same plan;
    and one step through it equals eager PyTorch's loss and gradients.  ``Limits(model_parallel=False)``
    plans without it."""
    T = pytest.importorskip("transformers")
    from reshard.frontend.loss import LossOf
    from reshard.testing.hf_models import megatron
    from reshard.testing.train_loop import simulated_step_matches_eager

    torch.manual_seed(0)
    module = LossOf(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=1024, n_embd=512, n_layer=1, n_head=8,
                                                   n_positions=512, resid_pdrop=0.0, embd_pdrop=0.0,
                                                   attn_pdrop=0.0)),
                    None, 0, 0, keywords=("input_ids", "labels"))
    ids = torch.randint(0, 1024, (1, 512), generator=torch.Generator().manual_seed(0))
    mesh = rs.DeviceMesh([0, 1, 2, 3], ("tp",))

    def plan(**limits: bool) -> rs.TrainingPlan:
        return rs.plan_training(module, (ids, ids), mesh, param_placements=megatron(module, mesh), cache=False,
                                limits=rs.Limits(**limits))

    plans = []
    for fork in (True, False):
        with monkeypatch.context() as m:
            m.setattr(second_core, "SECOND_CORE", fork)
            plans.append(plan())
    chosen = plans[0]
    assert chosen.plan.extraction.candidate == "model-parallel"
    assert "the model-parallel candidate's plan" in str(chosen.plan.extraction)
    assert plans[1].plan.digest() == chosen.plan.digest()
    plain = plan(model_parallel=False)  # (``Limits.model_parallel`` off: no such candidate)
    assert plain.plan.extraction.candidate != "model-parallel"
    assert chosen.plan.cost < plain.plan.cost and chosen.plan.comm_bytes < plain.plan.comm_bytes
    assert any(c.kind == "reduce_scatter" for c in plain.plan.communications)
    # ranked by another measure (a stack's: its expansion's cost, ``plan.StackProgram.expanded_cost``),
    # the finished candidate ranked lowest is chosen: here the dearest, the plain one (no cheaper
    # than the plan without the model-parallel candidate, which may take the output trials' plan)
    with monkeypatch.context() as m:
        m.setattr(plan_module, "extract", lambda *a, **k: extract.extract(
            *a, **{**k, "rank": lambda roots: -sum(n.cost_ps for n in _distinct(roots))}))
        dearest = plan()
    assert dearest.plan.extraction.candidate == "plain" and dearest.plan.cost >= plain.plan.cost > chosen.plan.cost
    simulated_step_matches_eager(module, chosen, ids, ids)
