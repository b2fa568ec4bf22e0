"""The tiny GPT-2 and Llama that the training tests and ``scripts/gpu_train_check.py`` train
(dropout 0, random weights, fp32), as a causal LM loss of (input_ids, labels); their meshes
(tp 2, tp 4, dp 2 x tp 2), the batch of each step and the inputs' placements."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers as T

import reshard as rs
from reshard.testing.hf_models import FFN, HEADS, HID, KV_HEADS, SEQ, VOCAB

STEPS, LR, BATCH = 20, 1e-3, 2
MESHES = {"tp2": rs.DeviceMesh([0, 1], ("tp",)), "tp4": rs.DeviceMesh([0, 1, 2, 3], ("tp",)),
          "dp2xtp2": rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))}


def gpt2() -> torch.nn.Module:
    """GPT-2 of one layer, without dropout."""
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=HID, n_layer=1, n_head=HEADS, n_positions=64,
                                          bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                          attn_pdrop=0.0))


def llama() -> torch.nn.Module:
    """Llama of one layer (grouped-query attention: fewer kv heads)."""
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=VOCAB, hidden_size=HID, intermediate_size=FFN,
                                            num_hidden_layers=1, num_attention_heads=HEADS,
                                            num_key_value_heads=KV_HEADS, max_position_embeddings=64))


MODELS: dict[str, Callable[[], torch.nn.Module]] = {"gpt2": gpt2, "llama": llama}


class LossOf(torch.nn.Module):
    """(input_ids, labels) -> the causal LM loss."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels, use_cache=False).loss


def build(name: str) -> torch.nn.Module:
    """``LossOf`` the model ``name`` of ``MODELS``, its weights drawn from seed 0 (the same in every process)."""
    torch.manual_seed(0)
    return LossOf(MODELS[name]())


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step (two batches, alternating; the same on every rank and in eager)."""
    g = torch.Generator().manual_seed(1000 + step % 2)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels[:, :2] = -100  # ignored positions
    return ids, labels


def input_placements(mesh: rs.DeviceMesh) -> list[list[Any]]:
    """ids and labels batch-sharded along dp, replicated along tp."""
    dp = [rs.Shard(0)] if mesh.ndim == 2 else []
    return [dp + [rs.Replicate()]] * 2


def plan_inputs(tp: rs.TrainingPlan, module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    """The joint program's global inputs for one step: ``args`` by the plan's user-input names,
    ``module``'s state (every name, tied ones too) and the plan's constants."""
    state = {**dict(module.named_parameters(remove_duplicate=False)),
             **dict(module.named_buffers(remove_duplicate=False))}
    return {**dict(zip(tp.user_inputs, args)), **{n: state[n].detach() for n in tp.state_inputs}, **tp.constants}
