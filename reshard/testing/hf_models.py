"""The tiny Hugging Face models of the tests (tiny configs, random weights; ``MODELS`` by name,
``build`` one with its inputs, ``placements`` its inputs' and outputs') and Megatron's
tensor-parallel placements of a model's parameters by name (``megatron``): column-parallel
q/k/v/gate/up, row-parallel o/down, vocab-parallel embedding and lm head, GPT-2's fused
``c_attn`` as a ``FusedShard`` of its three parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers as T

import reshard as rs

SEQ, VOCAB, HID, HEADS, KV_HEADS, FFN = 8, 128, 64, 8, 4, 128
S, R = rs.Shard, rs.Replicate
MESH2 = rs.DeviceMesh([0, 1], ("tp",))
MESH4 = rs.DeviceMesh([0, 1, 2, 3], ("tp",))
MESH22 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))


def _decoder_config(cls: Any, **kw: Any) -> Any:
    return cls(vocab_size=VOCAB, hidden_size=HID, intermediate_size=FFN, num_hidden_layers=1,
               num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=64, **kw)


def llama() -> torch.nn.Module:
    """Llama of one layer, grouped-query attention (fewer kv heads)."""
    return T.LlamaForCausalLM(_decoder_config(T.LlamaConfig))


def mistral() -> torch.nn.Module:
    """Mistral of one layer with a sliding-window mask of 4."""
    return T.MistralForCausalLM(_decoder_config(T.MistralConfig, sliding_window=4))  # a sliding-window mask


def qwen2() -> torch.nn.Module:
    """Qwen2 of one layer."""
    return T.Qwen2ForCausalLM(_decoder_config(T.Qwen2Config))


def gpt2() -> torch.nn.Module:
    """GPT-2 of one layer."""
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=HID, n_layer=1, n_head=HEADS, n_positions=64,
                                          bos_token_id=0, eos_token_id=0))


def bert() -> torch.nn.Module:
    """BERT of one layer, without the pooler."""
    return T.BertModel(T.BertConfig(vocab_size=VOCAB, hidden_size=HID, num_hidden_layers=1, num_attention_heads=HEADS,
                                    intermediate_size=FFN, max_position_embeddings=64), add_pooling_layer=False)


MODELS: dict[str, Callable[[], torch.nn.Module]] = {f.__name__: f for f in (llama, mistral, qwen2, gpt2, bert)}


class CausalLM(torch.nn.Module):
    """(input_ids, labels) -> (loss, logits)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(input_ids=input_ids, labels=labels, use_cache=False)
        return out.loss, out.logits


class Encoder(torch.nn.Module):
    """input_ids -> last hidden state."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).last_hidden_state

#: parameter-name pieces -> the Megatron placement of the tp axis (nn.Linear weights are
#: [out, in]: column-parallel is Shard(0); GPT-2's Conv1D weights are [in, out]: Shard(1))
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "query", "key", "value", "intermediate.dense")
_ROW = ("o_proj", "down_proj", "attention.output.dense", "output.dense")
_VOCAB = ("embed_tokens.weight", "lm_head.weight", "word_embeddings.weight", "wte.weight")


def _tp_placement(name: str, p: torch.Tensor, conv1d: bool) -> Any:
    """``conv1d``: the parameter is a GPT-2 ``Conv1D``'s (``[in, out]``)."""
    if any(k in name for k in _VOCAB):
        return S(0)
    if ".c_attn." in name:  # GPT-2's fused [q | k | v] Conv1D [in, 3 out]: each rank its heads' q, k, v
        # (GPT-BigCode's multi-query c_attn, a Linear [H + 2 head_dim, H], has no three equal parts: whole)
        return rs.FusedShard(p.dim() - 1, groups=3) if conv1d else None
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
        owner = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
        tp = _tp_placement(name, p, type(owner).__name__ == "Conv1D")
        if tp is not None:
            out[name] = [R()] * (mesh.ndim - 1) + [tp]
    return out


def build(name: str, mesh: rs.DeviceMesh, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The model ``name`` in eval mode (weights of ``seed``) wrapped as ``CausalLM`` (``Encoder``
    for BERT) and its inputs: ids (and labels, two positions ignored), a batch of 2 on a dp x tp mesh."""
    torch.manual_seed(seed)
    model = MODELS[name]().eval()
    wrapped = Encoder(model) if name == "bert" else CausalLM(model)
    batch = 2 if mesh.ndim == 2 else 1
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
    if name == "bert":
        return wrapped, (ids,)
    labels = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
    labels[:, :2] = -100  # ignored positions
    return wrapped, (ids, labels)


def placements(name: str, mesh: rs.DeviceMesh, sequence_parallel: bool = False) -> tuple[list, list]:
    """(in_placements, out_placements): ids batch-sharded along dp (seq along tp when
    ``sequence_parallel``); logits vocab-parallel, the loss replicated."""
    dp = [S(0)] if mesh.ndim == 2 else []
    ids = dp + [S(1) if sequence_parallel else R()]
    if name == "bert":
        return [ids], [dp + [S(1) if sequence_parallel else R()]]
    return [ids, dp + [R()]], [[R()] * mesh.ndim, dp + [S(2)]]
