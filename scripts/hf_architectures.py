"""Which Hugging Face architectures train through reshard: decoders, encoders (masked LM) and
encoder-decoders (BART, T5), each at a tiny config (hidden 64, 2 layers, 4 heads, 2 key/value heads
where it has them, vocab 128, random weights; inputs ids and labels of 2 x 16 tokens),
planned for training on 2 ranks (tp) with Megatron placements where the parameter names match
(``reshard.testing.hf_models.megatron``), one step simulated, its loss and every parameter's
gradient compared with eager PyTorch (``testing.train_loop.simulated_step_matches_eager``).

    python scripts/hf_architectures.py [name ...]     (about a minute for all)

Prints a table: architecture, parameters sharded, planning seconds, and the outcome ("matches
eager", or the ``ReshardError`` / mismatch).  Architectures the installed transformers lacks are
listed as such.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RESHARD_PLAN_CACHE", "off")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import reshard as rs  # noqa: E402
from reshard.testing.hf_models import megatron  # noqa: E402
from reshard.testing.train_loop import simulated_step_matches_eager  # noqa: E402

VOCAB, HIDDEN, LAYERS = 128, 64, 2


def _decoder(config: str, model: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    """A Llama-like decoder's constructor (``transformers.<model>(<config>(...))``)."""
    def build() -> torch.nn.Module:
        import transformers as T
        args = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
                    num_attention_heads=4, num_key_value_heads=2)
        return getattr(T, model)(getattr(T, config)(**{**args, **kw}))
    return build


def _other(config: str, model: str, **kw: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import transformers as T
        return getattr(T, model)(getattr(T, config)(vocab_size=VOCAB, **kw))
    return build


#: name -> constructor of the tiny model
ARCHITECTURES: dict[str, Callable[[], torch.nn.Module]] = {
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
    "mixtral": _decoder("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    "gpt2": _other("GPT2Config", "GPT2LMHeadModel", n_embd=HIDDEN, n_layer=LAYERS, n_head=4, resid_pdrop=0.0,
                   embd_pdrop=0.0, attn_pdrop=0.0),
    "gpt_bigcode": _other("GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_embd=HIDDEN, n_layer=LAYERS, n_head=4,
                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "gpt_neox": _other("GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_size=HIDDEN, intermediate_size=128,
                       num_hidden_layers=LAYERS, num_attention_heads=4),
    "opt": _other("OPTConfig", "OPTForCausalLM", hidden_size=HIDDEN, ffn_dim=128, num_hidden_layers=LAYERS,
                  num_attention_heads=4, word_embed_proj_dim=HIDDEN, dropout=0.0, attention_dropout=0.0,
                  pad_token_id=0),
    "bloom": _other("BloomConfig", "BloomForCausalLM", hidden_size=HIDDEN, n_layer=LAYERS, n_head=4,
                    hidden_dropout=0.0, attention_dropout=0.0),
    "falcon": _other("FalconConfig", "FalconForCausalLM", hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                     num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0),
    "gptj": _other("GPTJConfig", "GPTJForCausalLM", n_embd=HIDDEN, n_layer=LAYERS, n_head=4, rotary_dim=8,
                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "codegen": _other("CodeGenConfig", "CodeGenForCausalLM", n_embd=HIDDEN, n_layer=LAYERS, n_head=4, rotary_dim=8,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "phi": _other("PhiConfig", "PhiForCausalLM", hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
                  num_attention_heads=4, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
    "mpt": _other("MptConfig", "MptForCausalLM", d_model=HIDDEN, n_layers=LAYERS, n_heads=4),
    "bert": _other("BertConfig", "BertForMaskedLM", hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                   num_attention_heads=4, intermediate_size=128, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0),
    "roberta": _other("RobertaConfig", "RobertaForMaskedLM", hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=4, intermediate_size=128, max_position_embeddings=40,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "distilbert": _other("DistilBertConfig", "DistilBertForMaskedLM", dim=HIDDEN, n_layers=LAYERS, n_heads=4,
                         hidden_dim=128, dropout=0.0, attention_dropout=0.0),
    "electra": _other("ElectraConfig", "ElectraForMaskedLM", embedding_size=32, hidden_size=HIDDEN,
                      num_hidden_layers=LAYERS, num_attention_heads=4, intermediate_size=128, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0),
    "bart": _other("BartConfig", "BartForConditionalGeneration", d_model=HIDDEN, encoder_layers=LAYERS,
                   decoder_layers=LAYERS, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                   decoder_ffn_dim=128, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                   max_position_embeddings=32),
    "t5": _other("T5Config", "T5ForConditionalGeneration", d_model=HIDDEN, d_kv=16, d_ff=128, num_layers=LAYERS,
                 num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0),
}
#: the models whose forward takes no ``use_cache`` (encoders)
NO_CACHE_ARG = ("bert", "roberta", "distilbert", "electra")


class LossOf(torch.nn.Module):
    """(input_ids, labels) -> the model's loss (``cache``: called with ``use_cache=False``)."""

    def __init__(self, model: torch.nn.Module, cache: bool = True) -> None:
        super().__init__()
        self.model = model
        self.kwargs = {"use_cache": False} if cache else {}

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, labels=labels, **self.kwargs).loss


def check(name: str) -> tuple[str, str, str]:
    """(parameters sharded, planning seconds, outcome) of one architecture."""
    torch.manual_seed(0)
    try:
        module = LossOf(ARCHITECTURES[name](), name not in NO_CACHE_ARG).train()
    except (AttributeError, TypeError, ValueError) as e:
        return "-", "-", f"not in this transformers ({type(e).__name__})"
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    g = torch.Generator().manual_seed(0)
    ids, labels = (torch.randint(3, VOCAB, (2, 16), generator=g) for _ in range(2))  # (no pad / special ids)
    params = megatron(module, mesh)
    t = time.perf_counter()
    try:
        plan = rs.plan_training(module, (ids, labels), mesh=mesh, param_placements=params, cache=False)
    except rs.ReshardError as e:
        return str(len(params)), "-", f"ReshardError: {str(e).splitlines()[0][:160]}"
    seconds = f"{time.perf_counter() - t:.1f}"
    try:
        simulated_step_matches_eager(module, plan, ids, labels)
    except AssertionError as e:
        return str(len(params)), seconds, f"MISMATCH: {str(e).splitlines()[0][:160]}"
    return str(len(params)), seconds, "matches eager"


def main() -> int:
    names = sys.argv[1:] or list(ARCHITECTURES)
    unknown = [n for n in names if n not in ARCHITECTURES]
    if unknown:
        print(f"unknown architectures {unknown}; known: {sorted(ARCHITECTURES)}")
        return 2
    import transformers
    print(f"Hugging Face architectures, one training step on tp 2 (transformers {transformers.__version__}, "
          f"torch {torch.__version__})\n")
    print("| architecture | params sharded | plan s | outcome |\n|---|---:|---:|---|")
    bad = 0
    for n in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sharded, seconds, outcome = check(n)
        bad += outcome.startswith("MISMATCH")
        print(f"| {n} | {sharded} | {seconds} | {outcome} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
