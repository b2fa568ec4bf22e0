#!/usr/bin/env python3
"""Is the generated bf16/fp32 gelu kernel bound by memory or by instructions?  Variants of
the erf evaluation inside ``kernels.pointwise_kernel``'s 16-byte vector path, each checked
against float64 (relative norm error and the largest elementwise relative error over
|x| <= 6), then timed on 256 MiB operands against ``y.copy_(x)`` and torch's gelu.

- ``erff``: the kernel as generated, ``0.5 x (1 + erff(x / sqrt 2))`` (torch's formula);
- ``erfc``: ``x * Phi(x)`` with ``Phi`` from the Chebyshev erfc fit of Numerical Recipes
  (fractional error < 1.2e-7 for all z >= 0): branch-free, no cancellation for x < 0.

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

ERFC_GELU = r'''
__device__ __forceinline__ float rs_gelu_erfc(float a) {
  const float z = fabsf(a) * 0.7071067811865476f;
  const float t = __fdividef(1.0f, fmaf(0.5f, z, 1.0f));
  const float p = fmaf(t, fmaf(t, fmaf(t, fmaf(t, fmaf(t, fmaf(t, fmaf(t, fmaf(t, fmaf(t, 0.17087277f,
      -0.82215223f), 1.48851587f), -1.13520398f), 0.27886807f), -0.18628806f), 0.09678418f), 0.37409196f),
      1.00002368f), -1.26551223f);
  const float h = 0.5f * t * expf(fmaf(-z, z, p));  /* 0.5 erfc(z) */
  return a * (a < 0.0f ? h : 1.0f - h);
}
'''


def kernel(variant: str, dt: str) -> K.KernelSource:
    ks = K.pointwise_kernel([dt], dt, [("gelu", "in0")], vectorize=True)
    if variant == "erff":
        return ks
    gelu = K._UNARY["gelu"].format(a="x0")
    assert gelu in ks.source, "the generated gelu expression changed: update bench_gelu.py"
    head, _, rest = ks.source.partition('extern "C"')
    src = head + ERFC_GELU + 'extern "C"' + rest.replace(gelu, "rs_gelu_erfc(x0)")
    return K.KernelSource(name=ks.name, source=src, kind=ks.kind, params=ks.params, block=ks.block,
                          grid=ks.grid, elems_per_thread=ks.elems_per_thread)


def run(ks: K.KernelSource, x: torch.Tensor, y: torch.Tensor) -> None:
    n = x.numel()
    N.launch(ks, [y, x, np.int64(n)], ks.grid_for(n), ks.block)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'case':<28} {'rel norm err':>12} {'max rel err':>12} {'ms':>7} {'GB/s':>6} {'% copy':>7}")
    for tdt, dt in ((torch.bfloat16, "bfloat16"), (torch.float32, "float32")):
        x = torch.linspace(-6, 6, 1 << 20, device="cuda").to(tdt)
        x64 = x.double()
        ref = torch.nn.functional.gelu(x64)
        nz = ref.abs() > 1e-30
        errs = {}
        for v in ("erff", "erfc"):
            y = torch.full_like(x, float("nan"))
            run(kernel(v, dt), x, y)
            d = y.double() - ref
            errs[v] = (float(d.norm() / ref.norm()), float((d[nz].abs() / ref[nz].abs()).max()))
        t = torch.nn.functional.gelu(x).double() - ref
        errs["torch"] = (float(t.norm() / ref.norm()), float((t[nz].abs() / ref[nz].abs()).max()))
        n = args.mib * (1 << 20) // x.element_size()
        x = torch.randn(n, device="cuda", dtype=tdt, generator=g)
        y = torch.empty_like(x)
        moved = 2 * n * x.element_size()
        copy_ms = gpu_check_kernels.time_ms(lambda: y.copy_(x), args.iters)
        rows = [("copy_", None, copy_ms)]
        for v in ("erff", "erfc"):
            ks = kernel(v, dt)
            rows.append((v, errs[v], gpu_check_kernels.time_ms(lambda: run(ks, x, y), args.iters)))
        rows.append(("torch gelu", errs["torch"], gpu_check_kernels.time_ms(lambda: torch.nn.functional.gelu(x),
                                                                             args.iters)))
        for label, err, ms in rows:
            e = f"{err[0]:>12.2e} {err[1]:>12.2e}" if err else f"{'':>12} {'':>12}"
            bw = moved / ms / 1e6
            print(f"{label + ' ' + dt:<28} {e} {ms:>7.3f} {bw:>6.0f} {100 * copy_ms / ms:>6.1f}%")
        x = y = None  # free both before the next dtype
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
