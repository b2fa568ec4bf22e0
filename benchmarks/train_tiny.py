"""Planning the tests' tiny training configs (issue 27's "< 3 s, nothing cut" goal).

    python benchmarks/train_tiny.py [--models llama qwen2 gpt2] [--mesh tp2 2x2] [--layers 2 4] [--work] [--phases]

For each (model, mesh, layers): a Hugging Face causal LM at the training tests' tiny sizes
(hidden 64, ffn 128, 4 heads, 2 key/value heads where the model has them, vocab 128, batch 4 x
seq 16, random weights), planned for training with ``reshard.plan_training`` of the model's own
loss (``labels=``), Megatron placements (``real_models.megatron_params``: GPT-2's ``c_attn`` at
the per-head ``[q | k | v]`` layout, the tied embedding vocab-parallel); on
``2x2`` (dp x tp) parameters replicated over dp and the batch sharded over it.  The plan cache is
off, so every plan is made.  The modules planning runs (reshard's, which ``import reshard``
loads on first use, and torch.export's, which torch loads on its first export) are imported
before the clock starts, as a process pays them once, like torch's own import; the first plan
still compiles the e-graph's rules (``saturate.declared``, kept for later plans of the same
rules).  Columns: **plan s** (``plan_training`` wall: export, optimize,
lowering), **saturate s** and **e-nodes** (``plan.report``), the search state, the modeled step
(us) and the plan's digest, and **goal** (issue 27: planned in < 3 s with nothing cut).
``--work`` adds, per row, what saturation's egglog calls did (``SaturationReport.work``): per
kind of call, the egglog iterations run, those that changed the e-graph (the costly ones:
``SliceWork``) and the seconds.  ``--phases`` adds, per row, where the plan's time went
(``train_scale.Phases``: export and saturation together, then each extraction step, a
candidate finished in a forked child waited for in "second candidate").
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ["RESHARD_PLAN_CACHE"] = "off"
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402

import torch.export._trace  # noqa: E402,F401  (torch.export's modules, loaded on its first export)

import reshard as rs  # noqa: E402
import reshard.search.saturate  # noqa: E402,F401  (egglog, loaded on first use)
import reshard.train  # noqa: E402,F401  (plan_training: the planner, loaded on first use)
from real_models import megatron_params  # noqa: E402
from train_scale import Phases  # noqa: E402

GOAL_S = 3.0


def tiny_model(name: str, layers: int) -> torch.nn.Module:
    """The tests' tiny config of ``name`` (module docstring), seeded."""
    import transformers as T

    torch.manual_seed(0)
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=128, n_embd=64, n_layer=layers, n_head=4, n_positions=64,
                                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    config, model = {"llama": (T.LlamaConfig, T.LlamaForCausalLM), "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM)}[name]
    return model(config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2))


def measure(name: str, mesh_name: str, layers: int) -> dict[str, Any]:
    model = tiny_model(name, layers)
    pl = megatron_params(model)
    ins = None
    if mesh_name == "2x2":
        mesh = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
        pl = {k: [rs.Replicate(), *v] for k, v in pl.items()}
        ins = {"input_ids": [rs.Shard(0), rs.Replicate()], "labels": [rs.Shard(0), rs.Replicate()]}
    else:
        mesh = rs.DeviceMesh(list(range(int(mesh_name[2:]))), ("tp",))
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0))
    phases = Phases()
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tp = rs.plan_training(model, mesh=mesh, example_kwargs={"input_ids": ids, "labels": ids},
                              param_placements=pl, input_placements=ins, cache=False, progress=phases)
    end = time.perf_counter()
    wall = end - t
    plan = tp.plan
    r = plan.report
    state = "saturated" if r.saturated else f"stopped: {r.limit_hit}"
    if r.cut:
        state += f"; cut: {', '.join(r.cut)}"
    ok = wall < GOAL_S and r.saturated and not r.cut
    return {"model": name, "mesh": mesh_name, "layers": layers, "ops": len(plan.fusion.ops), "plan_s": wall,
            "saturate_s": r.seconds, "enodes": r.enodes, "state": state, "modeled_us": plan.cost * 1e6,
            "digest": plan.digest()[:16], "goal": "PASS" if ok else f"FAIL: {wall:.1f} s" + ("" if not r.cut else ", cut"),
            "work": r.work, "phases": phases.seconds(end)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["llama", "qwen2", "gpt2"], choices=["llama", "qwen2", "gpt2"])
    ap.add_argument("--mesh", nargs="+", default=["tp2", "2x2"], choices=["tp2", "tp4", "2x2"])
    ap.add_argument("--layers", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--work", action="store_true", help="print what saturation's egglog calls did, per row")
    ap.add_argument("--phases", action="store_true", help="print where each row's planning time went")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = [measure(m, mesh, n) for m in args.models for mesh in args.mesh for n in args.layers]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"Tiny training plans; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs (load average {load}), torch {torch.__version__}; {time.perf_counter() - t0:.0f} s in all\n")
    print("| model | mesh | layers | ops | plan s | saturate s | e-nodes | search | modeled us | digest | goal |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['mesh']} | {r['layers']} | {r['ops']} | {r['plan_s']:.1f} | {r['saturate_s']:.1f} | "
              f"{r['enodes']:,} | {r['state']} | {r['modeled_us']:.1f} | {r['digest']} | {r['goal']} |")
    if args.work:
        print("\nSaturation's egglog calls (iterations run, of them changing the e-graph, seconds):\n")
        for r in rows:
            calls = "; ".join(f"{k} {w.iterations:,} ({w.changed:,}) {w.seconds:.2f} s" for k, w in r["work"].items())
            print(f"- {r['model']} {r['mesh']} {r['layers']} layers: {calls}")
    if args.phases:
        print("\nWhere the time went (seconds: export and saturation, then each extraction step):\n")
        for r in rows:
            steps = "; ".join(f"{'export and saturation' if k == 'saturation' else k} {v:.2f}"
                              for k, v in r["phases"].items())
            print(f"- {r['model']} {r['mesh']} {r['layers']} layers: {steps}")
    return 0 if all(r["goal"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
