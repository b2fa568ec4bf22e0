"""The fused linear cross entropy chosen by a memory budget (issue 28, item 3): a GPT-2-tiny
training plan (the logits dominate) keeps a logits-sized ``exp(x - max)`` for its backward pass
without a budget; under a budget of half a logits buffer the extraction takes the fused
gradients (``passes.fused_loss``: no ``[tokens, vocab]`` buffer in the backward pass, the logits
recomputed in chunks), keeps fewer bytes than one logits buffer, and its loss and gradients
are autograd's."""

from __future__ import annotations

import pytest
import torch

import reshard as rs

from tests.test_loss_memory import simulated_matches_autograd

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


def test_gpt2_under_a_budget_takes_the_fused_loss() -> None:
    cfg = T.GPT2Config(vocab_size=VOCAB, n_embd=HID, n_layer=1, n_head=2, n_positions=SEQ, bos_token_id=0,
                       eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(cfg)
    logits = BATCH * SEQ * VOCAB * 4
    free = rs.plan_training(model, mesh=MESH1, example_kwargs=_batch(), cache=False).plan
    assert not _fused_steps(free) and free.saved_bytes >= logits
    tp = rs.plan_training(model, mesh=MESH1, example_kwargs=_batch(), cache=False, memory_budget=logits // 2)
    plan = tp.plan
    assert "linear_sumexp_grad" in _fused_steps(plan) and plan.saved_bytes < logits
    simulated_matches_autograd(model, tp, _batch())
