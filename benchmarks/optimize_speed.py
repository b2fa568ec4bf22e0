"""optimize() time, e-nodes and saturation rounds for transformer stacks of growing depth,
and for a GPT-2 body traced with ``from_torch``.

    python benchmarks/optimize_speed.py [--layers 1 2 4 ...] [--gpt2-ranks 2 4] [--repeat 3] [--png PATH]

Prints a markdown table (median wall time of ``--repeat`` runs, whole optimize(): encode,
saturate, extract, lower; peak RSS of the process so far, depths run in increasing order)
and, with matplotlib installed, writes a plot of time vs ops for the stacks.

The GPT-2 body (``--gpt2-ranks``; needs ``transformers``: ``pip install -e '.[bench]'``) is
two ``GPT2Block``s of a tiny config (hidden 256, 4 heads, random weights), the final layer
norm and an lm head (vocabulary 512) on a (2, 16, 256) input, traced by ``reshard.from_torch``
(about 215 Fusion ops), with Megatron placements on a 1-D mesh of each size: column-parallel
``c_attn``/``c_fc`` and row-parallel ``c_proj`` (GPT-2's ``Conv1D`` weight is (in, out): ``Shard(1)``
/ ``Shard(0)``), the lm head sharded on the vocabulary.  Its plan is checked against the
module's own output.
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
import time
from datetime import date
from typing import Any, Callable

import reshard as rs
from reshard.examples import transformer_stack


def gpt2_body(ranks: int, layers: int = 2) -> tuple[Any, Callable[[rs.Plan], None]]:
    """The traced GPT-2 body on ``ranks`` devices (module docstring) and a check of a plan."""
    import torch
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    class Body(torch.nn.Module):
        def __init__(self, cfg: GPT2Config) -> None:
            super().__init__()
            self.h = torch.nn.ModuleList([GPT2Block(cfg, layer_idx=i) for i in range(cfg.n_layer)])
            self.ln_f = torch.nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
            self.lm_head = torch.nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.h:
                out = block(x)
                x = out[0] if isinstance(out, tuple) else out
            return self.lm_head(self.ln_f(x))

    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=256, n_head=4, n_layer=layers, vocab_size=512, n_positions=16, bos_token_id=0,
                     eos_token_id=0, attn_implementation="sdpa")
    module = Body(cfg).eval()
    x = torch.randn(2, 16, 256)
    S, R = rs.Shard, rs.Replicate
    params = {"lm_head.weight": [S(0)]}
    for i in range(layers):
        params |= {f"h.{i}.attn.c_attn.weight": [S(1)], f"h.{i}.attn.c_attn.bias": [S(0)],
                   f"h.{i}.attn.c_proj.weight": [S(0)], f"h.{i}.mlp.c_fc.weight": [S(1)],
                   f"h.{i}.mlp.c_fc.bias": [S(0)], f"h.{i}.mlp.c_proj.weight": [S(0)]}
    tp = rs.from_torch(module, (x,), [R()], [S(2)], rs.DeviceMesh(list(range(ranks)), ("tp",)),
                       param_placements=params)

    def check(plan: rs.Plan) -> None:
        (y,) = plan.simulate(tp.inputs(x))
        with torch.no_grad():
            torch.testing.assert_close(y, module(x), rtol=1e-4, atol=1e-4)

    return tp.fusion, check


def measure(name: str, f: rs.Fusion, layers: int, repeat: int, check: Callable[[rs.Plan], None] | None = None
            ) -> dict:
    times, plan = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = rs.optimize(f, cache=False)  # timed: planned, not read from the plan cache
        times.append(time.perf_counter() - t0)
    assert plan is not None
    if check is not None:
        check(plan)
    return {"name": name, "layers": layers, "ops": len(f.ops), "seconds": statistics.median(times),
            "enodes": plan.report.enodes,
            "rounds": plan.report.iterations, "segments": plan.report.segments, "saturated": plan.report.saturated,
            "saturate_s": plan.report.seconds, "extract_s": plan.extraction.seconds,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "collectives": len(plan.communications), "comm_bytes": plan.comm_bytes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--gpt2-ranks", type=int, nargs="*", default=[2, 4],
                    help="mesh sizes for the traced GPT-2 body (none: skip it)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--png", default="benchmarks/optimize_speed.png")
    args = ap.parse_args()
    rs.optimize(transformer_stack(1))  # warm-up: lazy imports and egglog's first e-graph are not timed
    rows = []
    for n in args.layers:
        rows.append(measure(f"stack, {n} layers", transformer_stack(n), n, args.repeat))
        print(f"  {n} layers done", file=sys.stderr)
    for ranks in args.gpt2_ranks:
        f, check = gpt2_body(ranks)
        rows.append(measure(f"GPT-2 body (from_torch), {ranks} ranks", f, 2, args.repeat, check))
        print(f"  GPT-2 body on {ranks} ranks done", file=sys.stderr)
    print(f"optimize() on transformer stacks (hidden 32, 2-device mesh) and a traced GPT-2 body; {date.today()}, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}\n")
    print("| program | layers | ops | optimize() s | s / layer | ms / op | saturate s | extract s | segments | rounds "
          "| e-nodes | saturated | collectives | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['layers']} | {r['ops']} | {r['seconds']:.3f} | {r['seconds'] / r['layers']:.3f} | "
              f"{1e3 * r['seconds'] / r['ops']:.2f} | {r['saturate_s']:.2f} | {r['extract_s']:.2f} | {r['segments']} | "
              f"{r['rounds']} | {r['enodes']} | {'yes' if r['saturated'] else 'no'} | {r['collectives']} | "
              f"{r['peak_mb']:.0f} |")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(matplotlib not installed: no plot)", file=sys.stderr)
        return 0
    stacks = [r for r in rows if r["name"].startswith("stack")]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["ops"] for r in stacks], [r["seconds"] for r in stacks], "o-")
    ax.set_xlabel("Fusion ops")
    ax.set_ylabel("optimize() seconds")
    ax.set_title("reshard optimize() vs program size")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print(f"\nplot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
