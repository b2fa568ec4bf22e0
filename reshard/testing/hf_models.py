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


class LossOf(torch.nn.Module):
    """(input_ids, labels) -> the model's loss (``cache``: called with ``use_cache=False``, which an
    encoder's forward does not take)."""

    def __init__(self, model: torch.nn.Module, cache: bool = True) -> None:
        super().__init__()
        self.model = model
        self.kwargs = {"use_cache": False} if cache else {}

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels, **self.kwargs).loss


# ---- more architectures: each at a number of layers (``scripts/hf_architectures.py``) --------------

def _decoder(config: str, model: str, **kw: Any) -> Callable[[int], torch.nn.Module]:
    """A Llama-like decoder (``transformers.<model>(<config>(...))``: hidden 64, 4 heads, 2 key /
    value heads, ffn 128) at ``layers`` layers."""
    def build(layers: int) -> torch.nn.Module:
        args = dict(vocab_size=VOCAB, hidden_size=HID, intermediate_size=FFN, num_hidden_layers=layers,
                    num_attention_heads=4, num_key_value_heads=2)
        return getattr(T, model)(getattr(T, config)(**{**args, **kw}))
    return build


def _other(depth: tuple[str, ...], config: str, model: str, **kw: Any) -> Callable[[int], torch.nn.Module]:
    """Another architecture: its config's ``kw``, and ``layers`` at each of its ``depth`` keys."""
    def build(layers: int) -> torch.nn.Module:
        return getattr(T, model)(getattr(T, config)(vocab_size=VOCAB, **kw, **{k: layers for k in depth}))
    return build


_GPT = dict(n_embd=HID, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
_BERT = dict(hidden_size=HID, num_attention_heads=4, intermediate_size=FFN, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0)

#: name -> the tiny model of that architecture at a number of layers (an attribute error where
#: the installed transformers lacks it)
ARCHITECTURES: dict[str, Callable[[int], torch.nn.Module]] = {
    "llama": _decoder("LlamaConfig", "LlamaForCausalLM"),
    "mistral": _decoder("MistralConfig", "MistralForCausalLM", sliding_window=4),
    "qwen2": _decoder("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": _decoder("Qwen3Config", "Qwen3ForCausalLM", head_dim=16),
    "gemma": _decoder("GemmaConfig", "GemmaForCausalLM", head_dim=16),
    "gemma2": _decoder("Gemma2Config", "Gemma2ForCausalLM", head_dim=16),
    "gemma3": _decoder("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=16),
    "phi3": _decoder("Phi3Config", "Phi3ForCausalLM", pad_token_id=0),
    "olmo2": _decoder("Olmo2Config", "Olmo2ForCausalLM", pad_token_id=0),
    "stablelm": _decoder("StableLmConfig", "StableLmForCausalLM"),
    "granite": _decoder("GraniteConfig", "GraniteForCausalLM"),
    "smollm3": _decoder("SmolLM3Config", "SmolLM3ForCausalLM", pad_token_id=0),
    # mixtures of experts (``frontend.moe``: every token through every expert), with their
    # load-balancing loss where the config has one (``output_router_logits``: ``histc``)
    "mixtral": _decoder("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2,
                        output_router_logits=True),
    "qwen2_moe": _decoder("Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, shared_expert_intermediate_size=64, output_router_logits=True),
    "qwen3_moe": _decoder("Qwen3MoeConfig", "Qwen3MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, head_dim=16),
    "olmoe": _decoder("OlmoeConfig", "OlmoeForCausalLM", num_experts=4, num_experts_per_tok=2, pad_token_id=0),
    "granitemoe": _decoder("GraniteMoeConfig", "GraniteMoeForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    "deepseek_v3": _decoder("DeepseekV3Config", "DeepseekV3ForCausalLM", n_routed_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=1,
                            topk_group=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
                            v_head_dim=16, num_key_value_heads=4),
    "gpt_oss": _decoder("GptOssConfig", "GptOssForCausalLM", num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                        sliding_window=8),
    "phimoe": _decoder("PhimoeConfig", "PhimoeForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    "gpt2": _other(("n_layer",), "GPT2Config", "GPT2LMHeadModel", **_GPT),
    "gpt_bigcode": _other(("n_layer",), "GPTBigCodeConfig", "GPTBigCodeForCausalLM", **_GPT),
    "gpt_neox": _other(("num_hidden_layers",), "GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=HID,
                       intermediate_size=FFN, num_attention_heads=4),
    "opt": _other(("num_hidden_layers",), "OPTConfig", "OPTForCausalLM", hidden_size=HID, ffn_dim=FFN,
                  num_attention_heads=4, word_embed_proj_dim=HID, dropout=0.0, attention_dropout=0.0,
                  pad_token_id=0),
    "bloom": _other(("n_layer",), "BloomConfig", "BloomForCausalLM", hidden_size=HID, n_head=4,
                    hidden_dropout=0.0, attention_dropout=0.0),
    "falcon": _other(("num_hidden_layers",), "FalconConfig", "FalconForCausalLM", hidden_size=HID,
                     num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0),
    "gptj": _other(("n_layer",), "GPTJConfig", "GPTJForCausalLM", rotary_dim=8, **_GPT),
    "codegen": _other(("n_layer",), "CodeGenConfig", "CodeGenForCausalLM", rotary_dim=8, **_GPT),
    "phi": _other(("num_hidden_layers",), "PhiConfig", "PhiForCausalLM", hidden_size=HID, intermediate_size=FFN,
                  num_attention_heads=4, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
    "mpt": _other(("n_layers",), "MptConfig", "MptForCausalLM", d_model=HID, n_heads=4),
    "bert": _other(("num_hidden_layers",), "BertConfig", "BertForMaskedLM", **_BERT),
    "roberta": _other(("num_hidden_layers",), "RobertaConfig", "RobertaForMaskedLM", max_position_embeddings=40,
                      **_BERT),
    "distilbert": _other(("n_layers",), "DistilBertConfig", "DistilBertForMaskedLM", dim=HID, n_heads=4,
                         hidden_dim=FFN, dropout=0.0, attention_dropout=0.0),
    "electra": _other(("num_hidden_layers",), "ElectraConfig", "ElectraForMaskedLM", embedding_size=32, **_BERT),
    "bart": _other(("encoder_layers", "decoder_layers"), "BartConfig", "BartForConditionalGeneration", d_model=HID,
                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                   dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=32),
    "t5": _other(("num_layers",), "T5Config", "T5ForConditionalGeneration", d_model=HID, d_kv=16, d_ff=FFN,
                 num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0),
}
#: the architectures whose forward takes no ``use_cache`` (encoders: ``LossOf(model, cache=False)``)
NO_CACHE_ARG = ("bert", "roberta", "distilbert", "electra")


#: parameter-name pieces -> the Megatron placement of the tp axis (nn.Linear weights are
#: [out, in]: column-parallel is Shard(0); GPT-2's Conv1D weights are [in, out]: Shard(1))
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "query", "key", "value", "intermediate.dense")
_ROW = ("o_proj", "down_proj", "attention.output.dense", "output.dense")
_VOCAB = ("embed_tokens.weight", "lm_head.weight", "word_embeddings.weight", "wte.weight")


def _tp_placement(name: str, p: torch.Tensor, conv1d: bool) -> Any:
    """``conv1d``: the parameter is a GPT-2 ``Conv1D``'s (``[in, out]``)."""
    if any(k in name for k in _VOCAB):
        return S(0)
    if ".experts." in name and p.dim() == 3:  # a mixture's stacked experts [E, ...]: expert parallel
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
