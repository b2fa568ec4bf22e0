#!/usr/bin/env python3
"""Fused elementwise chains (``codegen.fuse``) vs the same plan unfused, on one GPU.

Programs (2-rank mesh, both ranks simulated on the one GPU, inputs sharded on dim 0):

- ``bias_gelu``: ``gelu(x + b)``: unfused add (read 2, write 1) + gelu (read 1, write 1),
  fused read 2 write 1: predicted 5/3 = 1.67x;
- ``scale_tanh``: ``tanh(0.5 x)`` (the transformer block's logit soft-cap): 4/2 = 2x;
- ``swiglu``: ``silu(a) * b``: 5/3 = 1.67x;
- ``residual_chain``: ``(x + y) * 0.5 + relu(z)`` cast to fp32 at the end:
  unfused add 3 + scale 2 + relu 2 + add 3 + cast 1.5 (bf16 in, fp32 out) = 11.5 units of an
  operand, fused 3 reads + 2 (fp32 write) = 5: 2.3x.

Each plan's local steps run with ``gpu_local_step`` (the runtime's kernel path); time per
whole simulated run (both ranks) with CUDA events, median of 5 groups of ``--iters``; outputs
compared (relative norm error) with the unfused plan's and with ``run_reference`` (the
unsharded program, torch on the CPU op by op in the program's dtype).

Usage: python scripts/bench_fusion.py [--rows 8192 --cols 8192 --dtype bfloat16 --iters 10]
"""

from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), _HERE]

import torch  # noqa: E402

import gpu_check_kernels  # noqa: E402
import reshard as rs  # noqa: E402
from reshard.codegen import lower as L  # noqa: E402
from reshard.ir.fusion import DTYPES, Tensor  # noqa: E402
from reshard.ir.sharding import unshard  # noqa: E402
from reshard.runtime.gpu_local import gpu_local_step  # noqa: E402
from reshard.runtime.simulator import simulate  # noqa: E402

MESH = rs.DeviceMesh([0, 1], ("tp",))


def programs(rows: int, cols: int, dt: str) -> dict[str, rs.Fusion]:
    def inp(f: rs.Fusion, name: str) -> Tensor:
        return f.input(name, (rows, cols), dt, MESH, [rs.Shard(0)])

    out: dict[str, rs.Fusion] = {}
    f = rs.Fusion()
    f.output(f.gelu(f.add(inp(f, "x"), inp(f, "b"))), [rs.Shard(0)])
    out["bias_gelu"] = f
    f = rs.Fusion()
    f.output(f.tanh(f.scale(inp(f, "x"), 0.5)), [rs.Shard(0)])
    out["scale_tanh"] = f
    f = rs.Fusion()
    f.output(f.mul(f.silu(inp(f, "a")), inp(f, "b")), [rs.Shard(0)])
    out["swiglu"] = f
    f = rs.Fusion()
    s = f.add(f.scale(f.add(inp(f, "x"), inp(f, "y")), 0.5), f.relu(inp(f, "z")))
    f.output(f.cast(s, "float32"), [rs.Shard(0)])
    out["residual_chain"] = f
    return out


def plan_of(f: rs.Fusion, fused: bool) -> rs.Plan:
    if fused:
        return rs.optimize(f)
    keep = L.fuse_pointwise
    L.fuse_pointwise = lambda steps, keep_, meta: steps
    try:
        return rs.optimize(f, cache=False)  # fuse_pointwise is patched: no cache key sees it
    finally:
        L.fuse_pointwise = keep


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    print(f"{'program':<16} {'steps':>11} {'unfused ms':>10} {'fused ms':>9} {'speedup':>8} "
          f"{'fused vs unfused':>16} {'vs run_reference':>16}")
    for name, f in programs(args.rows, args.cols, args.dtype).items():
        inputs = {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=g).to(DTYPES[f.tensors[i].dtype])
                  for i in f.inputs}
        ref = rs.run_reference(f, inputs)[0].double()  # torch on the CPU, op by op in the program's dtype
        res, ms, steps = {}, {}, {}
        for fused in (False, True):
            plan = plan_of(f, fused)
            per_rank = {r: {k: v.cuda() for k, v in d.items()} for r, d in plan.shard_inputs(inputs).items()}
            buf, ts = plan.lowered.outputs[0]

            def run() -> dict:
                return simulate(plan.program, per_rank, gpu_local_step)

            outs = run()
            res[fused] = unshard({r: outs[r][buf].cpu() for r in plan.program.mesh_ranks}, ts)
            ms[fused] = gpu_check_kernels.time_ms(run, args.iters)
            steps[fused] = sum(s.kind == "local" and s.attr("op") == "apply" for s in plan.steps)
            per_rank = outs = None  # free the device inputs and results before the next plan
            torch.cuda.empty_cache()
        d_fu = float((res[True].double() - res[False].double()).norm() / res[False].double().norm())
        d_ref = float((res[True].double() - ref).norm() / ref.norm())
        print(f"{name:<16} {f'{steps[False]} -> {steps[True]}':>11} {ms[False]:>10.3f} {ms[True]:>9.3f} "
              f"{ms[False] / ms[True]:>7.2f}x {d_fu:>16.1e} {d_ref:>16.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
