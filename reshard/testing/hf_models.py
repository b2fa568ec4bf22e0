"""The tiny Hugging Face models of the tests (their sizes) and Megatron's tensor-parallel
placements of a model's parameters by name (``megatron``): column-parallel q/k/v/gate/up,
row-parallel o/down, vocab-parallel embedding and lm head, GPT-2's fused ``c_attn`` as a
``FusedShard`` of its three parts."""

from __future__ import annotations

from typing import Any

import torch

import reshard as rs

SEQ, VOCAB, HID, HEADS, KV_HEADS, FFN = 8, 128, 64, 8, 4, 128
S, R = rs.Shard, rs.Replicate

#: parameter-name pieces -> the Megatron placement of the tp axis (nn.Linear weights are
#: [out, in]: column-parallel is Shard(0); GPT-2's Conv1D weights are [in, out]: Shard(1))
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "query", "key", "value", "intermediate.dense")
_ROW = ("o_proj", "down_proj", "attention.output.dense", "output.dense")
_VOCAB = ("embed_tokens.weight", "lm_head.weight", "word_embeddings.weight", "wte.weight")


def _tp_placement(name: str, p: torch.Tensor) -> Any:
    if any(k in name for k in _VOCAB):
        return S(0)
    if ".c_attn." in name:  # GPT-2's fused [q | k | v] Conv1D [in, 3 out]: each rank its heads' q, k, v
        return rs.FusedShard(p.dim() - 1, groups=3)
    if ".c_fc." in name:  # GPT-2 Conv1D [in, out], column-parallel
        return S(p.dim() - 1)
    if ".c_proj.weight" in name:  # GPT-2 Conv1D row-parallel
        return S(0)
    if any(k in name for k in _COLUMN):
        return S(0)
    if any(k in name for k in _ROW) and name.endswith("weight"):
        return S(1)
    return None


def megatron(module: torch.nn.Module, mesh: rs.DeviceMesh) -> dict[str, list[Any]]:
    """Placements of every sharded parameter: replicated along dp, Megatron's along tp."""
    out = {}
    for name, p in module.named_parameters():
        tp = _tp_placement(name, p)
        if tp is not None:
            out[name] = [R()] * (mesh.ndim - 1) + [tp]
    return out
