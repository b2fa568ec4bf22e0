"""The fused linear cross entropy in a budgeted GPT-2 plan (issue 28, item 3): a GPT-2-tiny
training plan (the logits dominate) keeps a logits-sized ``exp(x - max)`` for its backward
pass.  Under a budget every way fits, extraction takes the unfused loss (the fastest: the fused
steps recompute the logits, in several torch calls per chunk); under a budget of half a logits
buffer it keeps fewer bytes than one logits buffer, choosing by time among the ways that fit
(recomputing the logits in the backward pass from saved operands, ``rules.remat``, or the
fused gradients, ``passes.fused_loss``), and its loss and gradients are autograd's.  Random
extractions of the same e-graph reach plans running every fused op, which also compute
autograd's values while holding no logits-sized buffer at all."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

import reshard as rs
from reshard.frontend.loss import LossOf
from reshard.plan import Saturated

from tests.lower.test_loss_memory import logits_sized_live, simulated_matches_autograd

T = pytest.importorskip("transformers")
VOCAB, HID, BATCH, SEQ = 4096, 32, 2, 32
MESH1 = rs.DeviceMesh([0], ("tp",))
FUSED = ("linear_max", "linear_sumexp", "linear_sumexp_grad")


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :3] = -100
    return {"input_ids": ids, "labels": labels}


def _fused_steps(plan: rs.Plan) -> set[str]:
    return {str(s.attr("fop")) for s in plan.steps if s.attr("fop") in FUSED}


def _model() -> torch.nn.Module:
    cfg = T.GPT2Config(vocab_size=VOCAB, n_embd=HID, n_layer=1, n_head=2, n_positions=SEQ, bos_token_id=0,
                       eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    return T.GPT2LMHeadModel(cfg)


LOGITS = BATCH * SEQ * VOCAB * 4


@pytest.fixture(scope="module")
def roomy() -> tuple[torch.nn.Module, rs.TrainingPlan]:
    """The model and its plan under a budget every way fits."""
    model = _model()
    return model, rs.plan_training(model, mesh=MESH1, example_kwargs=_batch(), cache=False,
                                   memory_budget=4 * LOGITS)


def test_gpt2_budgets_pick_by_time_among_the_ways_that_fit(roomy: tuple[torch.nn.Module, rs.TrainingPlan]) -> None:
    model, free = roomy
    assert not _fused_steps(free.plan) and free.plan.saved_bytes >= LOGITS
    tp = rs.plan_training(model, mesh=MESH1, example_kwargs=_batch(), cache=False, memory_budget=LOGITS // 2)
    assert tp.plan.saved_bytes < LOGITS // 2
    simulated_matches_autograd(model, tp, _batch())


def test_gpt2_fused_plans_match_autograd(roomy: tuple[torch.nn.Module, rs.TrainingPlan]) -> None:
    """Random extractions of the same e-graph reach a plan taking every fused value (the target
    logit too: no ``pick`` of the logits) that holds no logits-sized buffer at any step and keeps
    fewer bytes than one (not every such plan does: one may recompute an unfused value too), and
    it computes autograd's loss and gradients.  (About one random extraction in 40 is such a
    plan, 4 of the first 200, which ones depending on the order of the e-graph's rows: up to 300
    are drawn, the first such one taken.)"""
    model, tp = roomy
    prog = rs.from_torch(LossOf(model, None, 0, keywords=tuple(_batch())), tuple(_batch().values()), None, None, MESH1,
                         train=True)
    sat = Saturated.build(prog.fusion, rs.CostProfile(), rs.Limits(), recompute=True)
    rng = random.Random(0)
    plan = next(p for p in (sat.plan(perturb=rng) for _ in range(300))
                if _fused_steps(p) == set(FUSED) and not any(s.attr("fop") == "pick" for s in p.steps)
                and logits_sized_live(p, LOGITS) == 0 and p.saved_bytes < LOGITS)
    simulated_matches_autograd(model, dataclasses.replace(tp, plan=plan), _batch())
