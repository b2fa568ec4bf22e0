"""Recompute as an e-graph alternative (``rules.remat``): the class of ``saved(v)`` for
``v = op_k(a, ..)`` also holds op k run on the saved operands' classes.  Plans that recompute
simulate like the reference; forward steps run before backward ones; e-graphs of programs
without ``saved`` ops are unchanged."""

from __future__ import annotations

import random

import pytest
import torch

import reshard as rs
from reshard.search.encode import encode
from reshard.plan_view import recomputed
from reshard.passes.phases import backward_values
from reshard.plan import Saturated
from reshard.testing import programs as P

RULES = ("recompute-Loc", "recompute-Loc2", "recompute-MMT", "recompute-Expand", "kept-bytes", "kept-input",
         "cost-keep", "cost-recompute-fused-Loc", "cost-recompute-fused-Loc2", "cost-recompute-fused-Expand")


@pytest.fixture(scope="module")
def block() -> Saturated:
    return Saturated.build(P.training_block(), rs.CostProfile(), rs.Limits())


@pytest.fixture(scope="module")
def tight(block) -> rs.Plan:
    """A plan that keeps the gathered w (256 B) and the loss, and recomputes the rest."""
    return block.plan(memory_budget=300)


def test_every_recompute_rule_fires_on_the_training_block(block):
    fired = block.report.rule_matches
    assert all(fired[r] > 0 for r in RULES), {r: fired[r] for r in RULES}


def _recomputed(plan: rs.Plan) -> set[str]:
    return {plan.fusion.tensors[n.value].name for n in plan.lowered.nodes if recomputed(plan, n)}


def test_random_plans_with_twins_simulate_like_the_reference(block):
    """Random extractions pick twins (an op run on saved operands in a saved value's class)
    the real costs would not; every such plan, on random sharded inputs, equals the reference."""
    f = block.fusion
    inputs = P.random_inputs(f, seed=3)
    rng = random.Random(5)
    twins: set[str] = set()
    for i in range(8):
        plan = block.plan(perturb=rng)
        twins |= _recomputed(plan)
        P.assert_plan_matches_reference(plan, f, inputs, seed=i)
    assert {"xw.saved", "sc.saved", "bm.saved", "p.saved"} & twins, twins


def test_a_plan_recomputing_every_activation_is_correct(block):
    """The budget that forces the fewest kept bytes makes the plan recompute the saved chain
    (matmul, the matmul reading a transpose as a view, the mask's local expansion, elementwise
    ops) from the saved inputs; its outputs equal the reference."""
    plan = block.plan(memory_budget=4)
    assert {"xw.saved", "q.saved", "sc.saved", "u.saved", "t.saved", "p.saved"} <= _recomputed(plan)
    P.assert_plan_matches_reference(plan, block.fusion, P.random_inputs(block.fusion, seed=4))
    forms = {(len(n.args), any(n.head.transposed)) for n in plan.lowered.nodes if recomputed(plan, n)}
    assert {(1, False), (2, False), (2, True)} <= forms, forms  # unary, binary, a matmul reading a view


def test_lowering_runs_forward_steps_before_backward_steps(tight):
    plan = tight
    back = backward_values(plan.fusion)
    phases = [n.value in back for n in plan.lowered.nodes]
    assert phases == sorted(phases) and any(phases) and not all(phases)
    k = plan.program.backward_from
    written_by_backward = {s.out for s in plan.steps[k:]}
    assert k is not None and not written_by_backward & {s.out for s in plan.steps[:k]}
    assert {plan.fusion.tensors[n.value].name for n in plan.lowered.nodes if n.value in back} >= {"grad.w", "g"}


def test_phases_follow_saved_and_the_seed():
    f = P.training_block()
    names = {f.tensors[t].name for t in backward_values(f)}
    assert {"x.saved", "p.saved", "g", "grad.w", "grad.x"} <= names
    assert not {"x", "q", "sc", "p", "loss"} & names
    assert backward_values(P.mlp()) == frozenset()


@pytest.mark.parametrize("build", [P.mlp, P.mask_broadcast, P.embedding_lookups])
def test_egraphs_without_saved_ops_are_unchanged(build):
    """No remat declarations, facts or rules enter the e-graph of a program without ``saved``."""
    enc = encode(build(), rs.CostProfile())
    text = enc.declarations + "\n".join(x for g in enc.groups for x in g)
    assert "twin" not in text and "kept" not in text and "(keep " not in text
    assert not [r for r in enc.rules if r.ruleset == "remat" or r.name.startswith(("recompute", "kept"))]
    plan = rs.optimize(build())
    assert plan.program.backward_from is None and plan.saved_bytes == 0
    assert '"backward_from"' not in plan.program.to_json()


def test_explain_lists_saved_activations_and_recomputed_values(tight):
    plan = tight
    text = plan.explain()
    saved = text.split("saved activations")[1].split("\n\n")[0]
    assert f"{plan.saved_bytes} B per rank" in saved
    for b in plan.program.saved_buffers:
        n = next(n for n in plan.lowered.nodes if f"b{n.uid}" == b)
        assert f"{plan.fusion.tensors[n.value].name} {n.sharding}:" in saved
    again = text.split("recomputed in the backward pass")[1].split("\n\n")[0]
    assert all(f"  {name} = " in again for name in _recomputed(plan))
    assert "  p.saved = unary(exp)(t.saved" in again


def test_segmented_saturation_recomputes_too():
    """A deep training step is saturated in segments: each saved op goes with its operand's
    producer and the saved twins of that producer's operands are fed there, so the recomputes
    exist (else the saved op's segment would hold only the fed forward value, no node to twin)."""
    f = P.training_block()
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits(segment_ops=3))
    assert sat.report.segments > 3
    assert all(sat.report.rule_matches[r] > 0 for r in ("recompute-Loc", "recompute-Loc2", "recompute-MMT"))
    plan = sat.plan(memory_budget=300)
    assert {"xw.saved", "q.saved", "sc.saved"} <= _recomputed(plan) and plan.saved_bytes <= 300
    P.assert_plan_matches_reference(plan, f, P.random_inputs(f, seed=6))


def test_lookups_and_the_masked_local_scatter_are_recomputed():
    """A vocab-parallel embedding (``Loc2``, the lookup cost law) and a forward scatter into a
    vocab-sharded table (``LocAt``) recomputed in the backward pass from the saved table and ids."""
    f = P.training_lookups()
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    assert sat.report.rule_matches["recompute-LocAt"] > 0
    plan = sat.plan(memory_budget=100)
    assert {"e.saved", "rows.saved"} <= _recomputed(plan) and plan.saved_bytes <= 100 < sat.plan().saved_bytes
    assert "scatter rows" in {n.head.form for n in plan.lowered.nodes if recomputed(plan, n)}
    P.assert_plan_matches_reference(plan, f, P.random_inputs(f, seed=2))


def test_draw_marks_saved_activations_and_recomputed_ops(tight, tmp_path):
    plan = tight
    svg = plan.draw(tmp_path / "train.svg").read_text()
    assert f"{plan.saved_bytes} B of saved activations per rank" in svg
    assert svg.count("recomputed, ") == len(_recomputed(plan))
    assert svg.count(", saved ") == len(plan.program.saved_buffers)


def test_saved_operands_close_the_recompute_chains():
    """``passes.recompute.with_saved_operands``: every operand of the producer of a saved value has
    a saved twin too (the closure law), the added ones after the program (ids, values, inputs
    and outputs unchanged); a Fusion without saved ops is returned as it is."""
    from reshard.passes.autodiff import joint
    from reshard.passes.recompute import with_saved_operands
    from tests.train.test_autodiff_plans import M2, _values, megatron_mlp

    f, loss = megatron_mlp(M2, [rs.Replicate()], [rs.Shard(1)], [rs.Shard(0)])
    j = joint(f, loss).fusion
    g = with_saved_operands(j)
    assert [(op.kind, op.inputs) for op in g.ops[:len(j.ops)]] == [(op.kind, op.inputs) for op in j.ops]
    assert g.outputs == j.outputs and len(g.ops) > len(j.ops)
    assert all(op.kind == "saved" for op in g.ops[len(j.ops):])
    saved = {op.inputs[0] for op in g.ops if op.kind == "saved"}
    assert all(a in saved for v in saved for a in g.ops[g.producer[v]].inputs)
    inputs = _values(f)
    for a, b in zip(rs.run_reference(j, inputs), rs.run_reference(g, inputs)):
        assert a.equal(b)
    plain = P.mlp()
    assert with_saved_operands(plain) is plain


class _Head(torch.nn.Module):
    """bf16 logits of a linear head, cross entropy over them in float32 (Hugging Face's loss)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 64, bias=False, dtype=torch.bfloat16)

    def forward(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.lin(h).float(), labels)


def _head_plan(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> rs.TrainingPlan:
    return rs.plan_training(model, mesh=rs.DeviceMesh([0], ("tp",)), example_kwargs=batch, cache=False)


def test_without_a_budget_the_softmax_numerator_is_recomputed_from_the_logits(monkeypatch):
    """``rules.remat``'s prices without a memory budget: keeping the float32 ``exp(x - max)`` would
    write it in the forward pass and read it back (2 x 4 bytes per logit), recomputing it in the
    backward kernel reads the kept bf16 logits (2 bytes): the plan keeps no float32 logits-sized
    buffer, recomputes the numerator, and keeps fewer bytes than the plan made without the
    chain's saved twins (``passes.recompute``), which keeps it; its loss and gradient are
    autograd's."""
    model = _Head()
    g = torch.Generator().manual_seed(0)
    batch = {"h": torch.randn(8, 16, generator=g).to(torch.bfloat16), "labels": torch.randint(0, 64, (8,), generator=g)}
    tp = _head_plan(model, batch)
    plan = tp.plan

    def kept_f32_logits(plan: rs.Plan) -> list[str]:
        return [plan.fusion.tensors[n.value].name for n in plan.lowered.nodes
                if f"b{n.uid}" in plan.program.saved_buffers and plan.fusion.tensors[n.value].shape == (8, 64)
                and plan.fusion.tensors[n.value].dtype == "float32"]

    assert kept_f32_logits(plan) == []
    assert any(plan.fusion.tensors[n.value].name.endswith(".exp") for n in plan.lowered.nodes if recomputed(plan, n))
    import reshard.passes.prepare as prepare
    whole = prepare.with_saved_operands
    monkeypatch.setattr(prepare, "with_saved_operands", lambda f, fused_only=False: f if fused_only else whole(f))
    keeping = _head_plan(model, batch).plan
    assert [n for n in kept_f32_logits(keeping) if n.endswith(".exp")]
    assert plan.saved_bytes < keeping.saved_bytes
    outs = plan.simulate({**dict(zip(tp.user_inputs, batch.values())), "lin.weight": model.lin.weight.detach(),
                          **tp.constants})
    loss = model(**batch)
    loss.backward()
    torch.testing.assert_close(outs[0].reshape(()), loss.detach(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outs[1].reshape(model.lin.weight.shape), model.lin.weight.grad, rtol=2e-2, atol=2e-2)


class _UpcastHead(torch.nn.Module):
    """bf16 logits upcast to float32, then flattened for cross entropy (Hugging Face's
    ``ForCausalLMLoss``: the upcast and the view come before the softmax's ``x - max``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(16, 64, bias=False, dtype=torch.bfloat16)

    def forward(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.lin(h).float().view(-1, 64), labels.view(-1))


def test_the_numerator_is_recomputed_through_the_upcast_and_the_view_in_any_segments():
    """The saved twins reach the bf16 logits through the upcast (fused) and the view
    (``passes.recompute``), and a recompute is built where the view and ``x - max`` fall in
    different segments (``segments``: the fed saved view's ``twin`` facts and ``TrD`` terms):
    planned in one segment and in segments that cut between the two, the plan keeps no float32
    logits-sized buffer, and its loss and gradient are autograd's."""
    from reshard.search.segments import cut
    model = _UpcastHead()
    g = torch.Generator().manual_seed(0)
    batch = {"h": torch.randn(2, 4, 16, generator=g).to(torch.bfloat16),
             "labels": torch.randint(0, 64, (2, 4), generator=g)}
    whole = _head_plan(model, batch)
    f = whole.plan.fusion
    ops = {op.kind: op for op in f.ops if f.tensors[op.output].shape == (8, 64) and op.kind in ("reshape", "binary")}
    assert set(ops) == {"reshape", "binary"}
    split = next(n for n in range(2, 64) if len({i for i, ks in enumerate(cut(f, n))
                                                  for k in ks if k in (ops["reshape"].index, ops["binary"].index)}) == 2)
    cut_plan = rs.plan_training(model, mesh=rs.DeviceMesh([0], ("tp",)), example_kwargs=batch, cache=False,
                                limits=rs.Limits(segment_ops=split))
    loss = model(**batch)
    loss.backward()
    for tp in (whole, cut_plan):
        plan = tp.plan
        kept = [plan.fusion.tensors[n.value] for n in plan.lowered.nodes if f"b{n.uid}" in plan.program.saved_buffers]
        assert not [t.name for t in kept if t.numel == 8 * 64 and t.dtype == "float32"]
        outs = plan.simulate({**dict(zip(tp.user_inputs, batch.values())), "lin.weight": model.lin.weight.detach(),
                              **tp.constants})
        torch.testing.assert_close(outs[0].reshape(()), loss.detach(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(outs[1].reshape(model.lin.weight.shape), model.lin.weight.grad, rtol=2e-2,
                                   atol=2e-2)


def test_which_values_stay_in_registers_and_which_saved_values_are_read_fused():
    """``ir.fused_values`` on the training block: ``u = sc + bm`` (read by ``tanh`` alone) and
    ``t = tanh(u)`` (read by ``exp`` alone, saved aside) stay in registers; ``q`` (read by a matmul
    and a permute), the matmul ``sc`` and the input ``x`` are written anyway.  ``saved(p)`` is read
    by a multiply (fused), ``saved(x)`` through a permute by a matmul (not)."""
    from reshard.ir.fused_values import in_registers, read_fused
    f = P.training_block()
    readers = f.readers()
    by_name = {t.name: t.id for t in f.tensors}
    assert {n for n in ("u", "t", "q", "sc", "x") if in_registers(f, by_name[n], readers)} == {"u", "t"}
    saved = {f.tensors[op.output].name: op for op in f.ops if op.kind == "saved"}
    assert read_fused(saved["p.saved"], readers) and not read_fused(saved["x.saved"], readers)
