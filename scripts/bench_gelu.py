#!/usr/bin/env python3
"""Is the generated gelu kernel bound by memory or by instructions, and is it accurate?

Variants inside ``kernels.pointwise_kernel``'s 16-byte vector path:

- ``gelu16``: the kernel as generated for a 16-bit output, ``fast_math``'s ``rs_gelu16``
  (tail ``Phi(-|x|)`` from a rational fit, the SFU's approximate rcp/ex2);
- ``erff``: the same kernel with torch's formula ``0.5 x (1 + erff(x / sqrt 2))`` (what the
  generator emits for float32 results, and emitted for 16-bit ones before ``fast_math``);
- ``neg``: a one-instruction chain, the vector loop's own ceiling;
- torch's ``gelu`` and ``y.copy_(x)``.

Accuracy: every finite bfloat16 / float16 value as input (exhaustive), against the
correctly rounded float64 ``x Phi(x)`` (``Phi`` through ``erfc``: no cancellation):
how many outputs are not correctly rounded and the largest distance in ulps, over outputs of
magnitude >= 1e-30 (bf16) or the smallest normal (fp16); NaN where the reference is finite
counts as wrong.  Timing: 256 MiB operands of random normal data, median of 5 groups of
``--iters`` launches, as % of the copy's bandwidth in the same run.

Usage: python scripts/bench_gelu.py [--mib 256] [--iters 20]
"""

from __future__ import annotations

import argparse
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), _HERE]

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gpu_check_kernels  # noqa: E402
from reshard.codegen import kernels as K  # noqa: E402
from reshard.codegen import nvrtc as N  # noqa: E402
from reshard.testing.rounding import SMALLEST, every_finite, rounding_errors  # noqa: E402


def kernel(variant: str, dt: str) -> K.KernelSource:
    if variant == "neg":
        return K.pointwise_kernel([dt], dt, [("neg", "in0")], vectorize=True)
    ks = K.pointwise_kernel([dt], dt, [("gelu", "in0")], vectorize=True)
    if variant == "gelu16" or "rs_gelu16(x0)" not in ks.source:
        return ks
    src = ks.source.replace("rs_gelu16(x0)", K._UNARY["gelu"].format(a="x0"))
    return K.KernelSource(name=ks.name + "_erff", source=src.replace(ks.name, ks.name + "_erff"), kind=ks.kind,
                          params=ks.params, block=ks.block, grid=ks.grid, elems_per_thread=ks.elems_per_thread)


def run(ks: K.KernelSource, x: torch.Tensor, y: torch.Tensor) -> None:
    n = x.numel()
    N.launch(ks, [y, x, np.int64(n)], ks.grid_for(n), ks.block)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'case':<22} {'misrounded':>16} {'max ulp':>8} {'ms':>7} {'GB/s':>6} {'% copy':>7}")
    for tdt, dt in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16"), (torch.float32, "float32")):
        errs: dict[str, tuple[int, int, int]] = {}
        if tdt in SMALLEST:
            xs = every_finite(tdt, "cuda")
            for v in ("gelu16", "erff"):
                y = torch.full_like(xs, float("nan"))
                run(kernel(v, dt), xs, y)
                errs[v] = rounding_errors(y, xs)
            errs["torch gelu"] = rounding_errors(torch.nn.functional.gelu(xs), xs)
        n = args.mib * (1 << 20) // tdt.itemsize
        x = torch.randn(n, device="cuda", dtype=tdt, generator=g)
        y = torch.empty_like(x)
        moved = 2 * n * x.element_size()
        copy_ms = gpu_check_kernels.time_ms(lambda: y.copy_(x), args.iters)
        rows = [("copy_", copy_ms)]
        for v in ("gelu16", "erff", "neg") if tdt in SMALLEST else ("erff", "neg"):
            ks = kernel(v, dt)
            rows.append((v, gpu_check_kernels.time_ms(lambda: run(ks, x, y), args.iters)))
        rows.append(("torch gelu", gpu_check_kernels.time_ms(lambda: torch.nn.functional.gelu(x), args.iters)))
        for label, ms in rows:
            e = errs.get(label)
            acc = f"{e[0]:>7} of {e[2]:>5} {e[1]:>8}" if e else f"{'':>16} {'':>8}"
            print(f"{label + ' ' + dt:<22} {acc} {ms:>7.3f} {moved / ms / 1e6:>6.0f} {100 * copy_ms / ms:>6.1f}%")
        x = y = None  # free both before the next dtype
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
