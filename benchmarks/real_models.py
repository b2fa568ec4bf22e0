"""Llama-2-7B and GPT-2 XL shapes at tp 2/4/8: reshard's plan side by side with Megatron-SP's.

    python benchmarks/real_models.py [--models llama2-7b gpt2-xl] [--tp 2 4 8] [--layers N] [--full]
                                     [--dtype bfloat16]

Each model is built with ``transformers`` on the meta device (no weights are materialized)
and traced by ``reshard.from_torch`` at its real shapes, with Megatron's placements for the
weights (column-parallel q/k/v/up/gate and GPT-2's ``c_attn``/``c_fc``, row-parallel o/down
and ``c_proj``; with ``--full`` the embedding and lm head vocab-parallel, ``Shard(0)`` of
``[vocab, hidden]``, GPT-2's tied).  What is planned is either the model's decoder stack
(``--layers``, default the model's own depth) with sequence-parallel activations in and out
(``Shard(1)`` of ``[B, S, H]``) and rope's cos/sin given as inputs, or with ``--full`` the
whole ``LlamaForCausalLM`` / ``GPT2LMHeadModel`` from input ids and labels (replicated) to
its own loss (HF's shifted cross entropy, averaged over the tokens not ignored; replicated):
the embedding, the causal mask and rope folded to constants, the decoder stack, the final
norm, the lm head and the cross entropy.

Two plans per (model, tp), both planned and priced by reshard with the same cost profile
(``--profile``, default the built-in one), so the comparison is like for like:

- **reshard**: ``optimize()`` of the traced program; every intermediate sharding is open.
- **Megatron-SP**: the same Fusion with Megatron-SP's activations pinned
  (``f.redistribute(t, placements, pin=True)``; ``megatron_pins``): per layer, the norm's
  output sequence-sharded then all-gathered (``[S(1)] -> [R]``) before attention and
  before the MLP, the q/k/v (``c_attn``) and up/gate (``c_fc``) outputs column-sharded,
  the o/down (``c_proj``) outputs ``Partial(sum)`` then reduce-scattered to ``[S(1)]``,
  the residual stream sequence-sharded.  GPT-2's fused ``c_attn`` output is pinned at
  Megatron's per-head layout (each rank holds its heads' ``[q | k | v]``: the loop-domain
  sharding ``FusedShard(2, 3)`` = ``Outer(Inner(Root(2, 3H), 3), tp)``); its weight and bias are
  placed the same way.  With ``--full``, around the stack (``_ends_pins``): the word
  embedding's masked lookup ``Partial(sum)`` then reduce-scattered to ``[S(1)]`` (GPT-2's
  replicated position embedding is added there, ``[S(1)]``), the final norm ``[S(1)] -> [R]``
  (all-gathered for the lm head), the logits vocab-parallel ``[S(2)]``, and the vocab-parallel
  cross entropy's per-token max ``P(max) -> [R]``, sum of exponentials and target logit
  ``P(sum) -> [R]``: Megatron's three per-token all-reduces.

Each plan runs in its own process (``--one``), so peak RSS is per plan; CPU share is the
process's user+system time over optimize()'s wall time.  Columns: ops of the Fusion,
optimize() wall seconds (and CPU share), peak RSS, collectives (kinds and counts), bytes each
rank receives, modeled time of the collectives and of the whole plan (kernels included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's reshard, also in the --one child processes

import reshard as rs  # noqa: E402
from reshard.ir.fusion import Fusion  # noqa: E402
from reshard.passes.pins import pin_values  # noqa: E402


@dataclass(frozen=True)
class Shapes:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    seq: int
    vocab: int
    batch: int = 1
    #: a mixture of experts: experts per layer, experts per token (0: a dense MLP)
    experts: int = 0
    top_k: int = 0


MODELS = {
    "llama2-7b": Shapes(hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=11008, seq=4096, vocab=32000),
    "gpt2-xl": Shapes(hidden=1600, layers=48, heads=25, kv_heads=25, intermediate=6400, seq=1024, vocab=50257),
}
#: models planned for training only (``train_scale.py``): Mixtral-8x7B with its load-balancing loss
TRAINED = {
    **MODELS,
    "mixtral-8x7b": Shapes(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, seq=4096, vocab=32000,
                           experts=8, top_k=2),
}


# ---- the models, on the meta device ------------------------------------------------------------------------------

def _llama_config(s: Shapes, layers: int) -> Any:
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=s.hidden, num_hidden_layers=layers, num_attention_heads=s.heads,
                       num_key_value_heads=s.kv_heads, intermediate_size=s.intermediate, vocab_size=s.vocab,
                       max_position_embeddings=s.seq, attn_implementation="sdpa", use_cache=False)


def _mixtral_config(s: Shapes, layers: int) -> Any:
    from transformers import MixtralConfig
    return MixtralConfig(hidden_size=s.hidden, num_hidden_layers=layers, num_attention_heads=s.heads,
                         num_key_value_heads=s.kv_heads, intermediate_size=s.intermediate, vocab_size=s.vocab,
                         num_local_experts=s.experts, num_experts_per_tok=s.top_k, output_router_logits=True,
                         max_position_embeddings=s.seq, attn_implementation="sdpa", use_cache=False)


def _gpt2_config(s: Shapes, layers: int) -> Any:
    from transformers import GPT2Config
    return GPT2Config(n_embd=s.hidden, n_head=s.heads, n_layer=layers, n_inner=s.intermediate, vocab_size=s.vocab,
                      n_positions=s.seq, attn_implementation="sdpa", use_cache=False)


def _llama_stack(s: Shapes, layers: int, dtype: Any) -> tuple[Any, tuple, list]:
    import torch
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = _llama_config(s, layers)

    class DecoderStack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([LlamaDecoderLayer(cfg, i) for i in range(layers)])

        def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                out = layer(x, position_embeddings=(cos, sin), attention_mask=None)
                x = out[0] if isinstance(out, tuple) else out
            return x

    with torch.device("meta"):
        module = DecoderStack().to(dtype).eval()
        x = torch.empty(s.batch, s.seq, s.hidden, dtype=dtype)
        cos, sin = LlamaRotaryEmbedding(cfg)(x, torch.arange(s.seq)[None])
    return module, (x, cos.to(dtype), sin.to(dtype)), [[rs.Shard(1)], [rs.Replicate()], [rs.Replicate()]]


def _gpt2_stack(s: Shapes, layers: int, dtype: Any) -> tuple[Any, tuple, list]:
    import torch
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    cfg = _gpt2_config(s, layers)

    class DecoderStack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.h = torch.nn.ModuleList([GPT2Block(cfg, layer_idx=i) for i in range(layers)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.h:
                out = block(x)
                x = out[0] if isinstance(out, tuple) else out
            return x

    with torch.device("meta"):
        module = DecoderStack().to(dtype).eval()
        x = torch.empty(s.batch, s.seq, s.hidden, dtype=dtype)
    return module, (x,), [[rs.Shard(1)]]


def _whole_model(model: str, s: Shapes, layers: int, dtype: Any) -> tuple[Any, tuple, list]:
    """``*ForCausalLM`` from input ids and labels to the model's own loss (HF's shifted cross
    entropy, the mean over the tokens not ignored); ids and labels replicated, as every tp rank
    of Megatron reads the whole batch."""
    import torch
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    class CausalLMLoss(torch.nn.Module):
        def __init__(self, lm: torch.nn.Module) -> None:
            super().__init__()
            self.model = lm

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, labels=labels, use_cache=False).loss

    from transformers import MixtralForCausalLM

    lm = (lambda: LlamaForCausalLM(_llama_config(s, layers))) if model == "llama2-7b" else (
        lambda: MixtralForCausalLM(_mixtral_config(s, layers))) if s.experts else (
        lambda: GPT2LMHeadModel(_gpt2_config(s, layers)))
    with torch.device("meta"):
        module = CausalLMLoss(lm()).to(dtype).eval()
    ids = torch.zeros(s.batch, s.seq, dtype=torch.int64)
    return module, (ids, ids), [[rs.Replicate()], [rs.Replicate()]]


def _fused_qkv(dim: int) -> list:
    """Megatron's fused QKV layout on dim ``dim`` (``[q | k | v]``): rank r holds heads
    ``r*heads/tp ..`` of each of q, k and v (``FusedShard(dim, 3)``: the loop-domain sharding
    ``Outer(Inner(Root(dim, 3*hidden), 3), tp)``)."""
    return [rs.FusedShard(dim, 3)]


def _mesh(tp: int) -> rs.DeviceMesh:
    return rs.DeviceMesh(list(range(tp)), ("tp",))


#: parameter-name endings -> Megatron's placement on the tp axis. ``nn.Linear`` weights are
#: ``[out, in]`` (column-parallel ``Shard(0)``, row-parallel ``Shard(1)``), GPT-2's ``Conv1D``
#: weights ``[in, out]`` (column-parallel ``Shard(1)``, row-parallel ``Shard(0)``); the embedding
#: and the lm head are vocab-parallel (``Shard(0)`` of ``[vocab, hidden]``; GPT-2's are tied).
_MEGATRON_PARAMS: dict[str, list] = {
    **{w: [rs.Shard(0)] for w in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight",
                                  "up_proj.weight", "embed_tokens.weight", "lm_head.weight", "wte.weight")},
    **{w: [rs.Shard(1)] for w in ("o_proj.weight", "down_proj.weight")},
    "c_attn.weight": _fused_qkv(1), "c_attn.bias": _fused_qkv(0), "c_fc.weight": [rs.Shard(1)],
    "c_fc.bias": [rs.Shard(0)], "c_proj.weight": [rs.Shard(0)],
    # a mixture's stacked experts [E, out, in] split along the experts (expert parallel)
    "experts.gate_up_proj": [rs.Shard(0)], "experts.down_proj": [rs.Shard(0)],
}


def megatron_params(module: Any) -> dict[str, list]:
    """Megatron's placement of every sharded parameter of ``module`` (the rest replicated)."""
    out = {}
    for name, _ in module.named_parameters(remove_duplicate=False):
        end = next((e for e in _MEGATRON_PARAMS if name.endswith("." + e) or name == e), None)
        if end is not None:
            out[name] = _MEGATRON_PARAMS[end]
    return out


def trace(model: str, tp: int, layers: int, dtype_name: str, whole: bool = False) -> rs.Fusion:
    """``model`` at its real shapes on a 1-D mesh of ``tp``, traced from the meta device: the
    decoder stack (sequence-parallel activations in and out), or with ``whole`` the whole model
    from input ids and labels to the loss (replicated)."""
    import torch
    dtype = getattr(torch, dtype_name)
    s = MODELS[model]
    if whole:
        module, args, in_pl = _whole_model(model, s, layers, dtype)
        out_pl = [[rs.Replicate()]]
    else:
        module, args, in_pl = (_llama_stack if model == "llama2-7b" else _gpt2_stack)(s, layers, dtype)
        out_pl = [[rs.Shard(1)]]
    return rs.from_torch(module, args, in_pl, out_pl, _mesh(tp), param_placements=megatron_params(module)).fusion


# ---- Megatron-SP: the same Fusion with its activations pinned ---------------------------------------------------

def _layer_pins(model: str, p: str) -> dict[str, list]:
    """Megatron-SP's shardings of one decoder layer's values, ``p`` the layer's name prefix."""
    S, R, P = rs.Shard, rs.Replicate, rs.Partial
    if model == "llama2-7b":
        return {p + "input_layernorm": [[S(1)], [R()]], p + "post_attention_layernorm": [[S(1)], [R()]],
                p + "self_attn.o_proj": [[P()], [S(1)]], p + "mlp.down_proj": [[P()], [S(1)]],
                p + "add": [[S(1)]], p[:-1]: [[S(1)]],
                **{p + m: [[S(2)]] for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                             "mlp.gate_proj", "mlp.up_proj")}}
    # c_proj's matmul is on the (B*S, H) view: Partial, then reduce-scattered over the sequence
    return {p + "ln_1": [[S(1)], [R()]], p + "ln_2": [[S(1)], [R()]],
            p + "attn.c_attn": [_fused_qkv(2)], p + "mlp.c_fc": [[S(2)]],
            p + "attn.c_proj.addmm.matmul": [[P()], [S(0)]], p + "mlp.c_proj.addmm.matmul": [[P()], [S(0)]],
            p + "attn.c_proj": [[S(1)]], p + "mlp.c_proj": [[S(1)]], p[:-1]: [[S(1)]]}


def _ends_pins(model: str) -> dict[str, list]:
    """Megatron-SP's shardings around the decoder stack of the whole model (names as
    ``_whole_model`` traces them): the vocab-parallel embedding (a masked lookup, ``Partial(sum)``,
    reduce-scattered into sequence parallel), the final norm sequence-parallel then all-gathered
    for the vocab-parallel lm head (logits ``Shard(2)``), and the vocab-parallel cross entropy:
    the per-token max, sum of exponentials and target logit each ``Partial`` over the vocab
    shards, then all-reduced."""
    S, R, P = rs.Shard, rs.Replicate, rs.Partial
    body, norm = ("model.model.", "norm") if model == "llama2-7b" else ("model.transformer.", "ln_f")
    embedding = {body + "embed_tokens": [[P()], [S(1)]]} if model == "llama2-7b" else {
        body + "wte": [[P()], [S(1)]], body + "add": [[S(1)]]}  # word + (replicated) position embeddings
    return {**embedding, body + norm: [[S(1)], [R()]], "model.lm_head": [[S(2)]],
            "model.max": [[P("max")], [R()]], "model.sum": [[P()], [R()]], "model.pick": [[P()], [R()]]}


def megatron_pins(model: str, fusion: Fusion) -> dict[str, list]:
    """Per value name, the shardings Megatron-SP gives it, in order (each one a pinned
    redistribute of the previous; the value's consumers read the last).  The decoder layers are
    found by name (``layers.<i>.`` / ``h.<i>.``, under the whole model's prefix when it is one)."""
    names = {t.name for t in fusion.tensors}
    whole = "model.lm_head" in names
    stack = ("model.model.layers." if whole else "layers.") if model == "llama2-7b" else (
        "model.transformer.h." if whole else "h.")
    layers = sorted({n[len(stack):].split(".")[0] for n in names if n.startswith(stack)}, key=int)
    pins: dict[str, list] = _ends_pins(model) if whole else {}
    for i in layers:
        pins |= _layer_pins(model, f"{stack}{i}.")
    missing = sorted(set(pins) - names)
    if missing:
        raise SystemExit(f"megatron_pins: the traced {model} has no values named {missing[:5]} ...: the front end "
                         "names values differently than this benchmark expects")
    return pins


# ---- one measurement per process -------------------------------------------------------------------------------

def measure_one(model: str, tp: int, variant: str, layers: int, dtype: str, profile: str | None,
                time_limit: float, extractor: str = "greedy", whole: bool = False) -> dict:
    t0 = time.perf_counter()
    fusion = trace(model, tp, layers, dtype, whole)
    trace_s = time.perf_counter() - t0
    if variant == "megatron-sp":
        fusion = pin_values(fusion, megatron_pins(model, fusion))
    limits = rs.Limits(time_limit_s=time_limit)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    plan = rs.optimize(fusion, cost_profile=profile, limits=limits, extractor=extractor, cache=False)  # timed
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    comms = plan.communications
    return {"model": model, "tp": tp, "variant": variant, "layers": layers, "whole": whole, "ops": len(fusion.ops),
            "trace_s": trace_s, "optimize_s": wall, "cpu_share": cpu / wall if wall else 0.0,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_before_mb": rss_before,
            "collectives": dict(Counter(c.kind for c in comms)), "n_collectives": len(comms),
            "bytes_per_rank": plan.comm_bytes, "comm_us": sum(c.cost_s for c in comms) * 1e6,
            "modeled_us": plan.cost * 1e6, "report": str(plan.report), "extraction": str(plan.extraction),
            "segments": plan.report.segments, "saturated": plan.report.saturated, "cut": list(plan.report.cut),
            "digest": plan.digest()[:16], "by_value": comms_by_value(comms),
            "profile": plan.profile.name}


def comms_by_value(comms: list) -> list[list]:
    """The plan's collectives grouped by value with the layer index written ``*``
    (``h.*.attn.c_proj.weight``): ``[count, kind, value, src, dst, bytes received]``, most
    frequent first, so two plans' per-layer choices can be compared."""
    groups = Counter((c.kind, re.sub(r"(^|\.)(layers|h)\.\d+\.", r"\1\2.*.", c.tensor), c.src, c.dst, c.moved_bytes)
                     for c in comms)
    return [[n, *key] for key, n in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))]


def _run_child(args: argparse.Namespace, model: str, tp: int, variant: str, layers: int) -> dict:
    cmd = [sys.executable, __file__, "--one", model, str(tp), variant, "--layers", str(layers), "--dtype", args.dtype,
           "--time-limit", str(args.time_limit), "--extractor", args.extractor] + (
               ["--profile", args.profile] if args.profile else []) + (["--full"] if args.full else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"model": model, "tp": tp, "variant": variant, "layers": layers, "whole": args.full,
                "error": tail[0][:300]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _collectives(c: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(c.items())) or "-"


def _mb(b: float) -> str:
    return f"{b / 2**20:,.0f}"


def table(rows: list[dict]) -> str:
    lines = ["| model | tp | plan | ops | optimize() s (CPU share) | search | peak RSS MB | collectives | MiB / rank "
             "| comm ms | modeled ms | vs Megatron-SP bytes / time |",
             "|---|---:|---|---:|---:|---|---:|---|---:|---:|---:|---:|"]
    base = {(r["model"], r["tp"]): r for r in rows if r["variant"] == "megatron-sp" and "error" not in r}
    for r in rows:
        head = f"| {r['model']} ({r['layers']} layers{', whole model' if r['whole'] else ''}) | {r['tp']} | " \
               f"{r['variant']} "
        if "error" in r:
            lines.append(head + f"| error: {r['error']} ||||||||")
            continue
        b = base.get((r["model"], r["tp"]))
        vs = (f"{r['bytes_per_rank'] / b['bytes_per_rank']:.2f}x / {r['modeled_us'] / b['modeled_us']:.2f}x"
              if b and r["variant"] != "megatron-sp" and b["bytes_per_rank"] else "")
        search = f"{r['segments']} segments, " + ("saturated" if r["saturated"] else "stopped by the time limit")
        search += f"; cut: {', '.join(r['cut'])}" if r["cut"] else ""
        lines.append(head + f"| {r['ops']} | {r['optimize_s']:.1f} ({100 * r['cpu_share']:.0f}%) | {search} | "
                     f"{r['peak_rss_mb']:.0f} | {_collectives(r['collectives'])} | {_mb(r['bytes_per_rank'])} | "
                     f"{r['comm_us'] / 1e3:.2f} | {r['modeled_us'] / 1e3:.2f} | {vs} |")
    return "\n".join(lines)


def differences(rows: list[dict]) -> str:
    """Per (model, tp): the collectives (grouped as ``comms_by_value``) that one plan has more
    of than the other, with the bytes each rank receives for them in all."""
    base = {(r["model"], r["tp"]): r for r in rows if r["variant"] == "megatron-sp" and "error" not in r}
    lines = []
    for r in rows:
        b = base.get((r["model"], r["tp"]))
        if r["variant"] == "megatron-sp" or "error" in r or b is None:
            continue
        count = Counter({tuple(g[1:]): g[0] for g in r["by_value"]})
        count.subtract({tuple(g[1:]): g[0] for g in b["by_value"]})
        for side, sign in (("reshard", 1), ("Megatron-SP", -1)):
            extra = [(sign * n, key) for key, n in sorted(count.items()) if sign * n > 0]
            lines.append(f"- {r['model']} tp {r['tp']}, only in {side}'s plan: " + ("; ".join(
                f"{n} {kind} {value} {src} -> {dst}" for n, (kind, value, src, dst, _) in extra) or "nothing") + (
                f" ({_mb(sum(n * key[4] for n, key in extra))} MiB / rank)" if extra else ""))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's own)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--profile", default=None, help="cost profile for both plans (default: the built-in one)")
    ap.add_argument("--time-limit", type=float, default=rs.Limits().time_limit_s)
    ap.add_argument("--extractor", default="greedy", choices=["greedy", "windows"],
                    help="optimize()'s extractor for both plans (windows: the ILP on 30-op windows, slower)")
    ap.add_argument("--variants", nargs="+", default=["reshard", "megatron-sp"], choices=["reshard", "megatron-sp"])
    ap.add_argument("--full", action="store_true",
                    help="plan the whole *ForCausalLM (input ids and labels to the loss) instead of the decoder stack")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--one", nargs=3, metavar=("MODEL", "TP", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        model, tp, variant = args.one
        layers = args.layers or MODELS[model].layers
        print(json.dumps(measure_one(model, int(tp), variant, layers, args.dtype, args.profile, args.time_limit,
                                     args.extractor, args.full)))
        return 0
    rows = []
    for model in args.models:
        layers = args.layers or MODELS[model].layers
        for tp in args.tp:
            for variant in args.variants:
                rows.append(_run_child(args, model, tp, variant, layers))
                r = rows[-1]
                print(f"  {model} tp {tp} {variant}: " + (r.get("error") or f"{r['optimize_s']:.1f} s, "
                      f"{r['report']}; {r['extraction']}"), file=sys.stderr, flush=True)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    what = "Whole models (input ids and labels to the loss)" if args.full else "Decoder stacks"
    print(f"{what} at real shapes ({args.dtype}, batch 1), traced from the meta device; {when}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; cost profile "
          f"{next((r['profile'] for r in rows if 'profile' in r), '?')}\n")
    print(table(rows))
    print("\nCollectives that differ (layer index written *):\n" + differences(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
