#!/usr/bin/env python3
"""Variants of the generated transpose kernel on a GPU: correctness, then bandwidth vs copy.

For bf16 and fp32: the 16-byte tiled transpose (``kernels._transpose_vec_kernel``, its
default unroll) with tiles in row order (group 0) or in bands of 4..32 tile rows
(``group``; ``kernels._tile_loop``), the default kernel with streaming loads and/or stores
(``__ldcs``/``__stcs``), and the scalar 32x32 tile it replaced, on a square and
a wide 2-D transpose and a (0, 2, 1) batch transpose of 256 MiB, against ``y.copy_(x)`` of
the same bytes.  (The unroll sweep that set ``TRANSPOSE_UNROLL`` is in
docs/history/benchmarks-2026-11.md.)  Every variant is first checked bit-exact against
``x.permute(perm).contiguous()`` on random data (NaN-poisoned outputs), edge tiles included.

Usage: python scripts/bench_transpose.py [--mib 256] [--iters 20]
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from reshard.codegen import kernels as K  # noqa: E402
from reshard.codegen import nvrtc as N  # noqa: E402

import gpu_check_kernels  # noqa: E402  (this script's folder)

DT = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
GROUPS = (0, 4, 8, 16, 32)


def hinted(ks: K.KernelSource, loads: bool, stores: bool) -> K.KernelSource:
    """The 16-byte transpose with streaming (evict-first, ``__ldcs``/``__stcs``) global
    loads and/or stores."""
    src = ks.source
    if loads:
        src = re.sub(r"= \*reinterpret_cast<const uint4\*>\((in \+ [^;]*)\);",
                     r"= __ldcs(reinterpret_cast<const uint4*>(\1));", src)
    if stores:
        src = re.sub(r"\*reinterpret_cast<uint4\*>\((out \+ [^;]*)\) = v;",
                     r"__stcs(reinterpret_cast<uint4*>(\1), v);", src)
    assert src != ks.source
    tag = "_l" * loads + "_s" * stores
    return K.KernelSource(name=ks.name + tag, source=src.replace(ks.name, ks.name + tag), kind=ks.kind,
                          params=ks.params, block=ks.block, grid=ks.grid)


def variants(shape, perm, dt):
    cs, cp = K._collapse_perm(tuple(shape), tuple(perm))
    item = K.ITEMSIZE[DT[dt]]
    out = []
    if cs[cp[-1]] * item % 16 == 0 and cs[-1] * item % 16 == 0:  # where the 16-byte tile applies
        out = [(f"vec16 group {g}", K._transpose_vec_kernel(cs, cp, item, group=g)) for g in GROUPS]
        ks = K._transpose_vec_kernel(cs, cp, item)
        out += [(f"vec16 streaming {w}", hinted(ks, w != "stores", w != "loads")) for w in ("loads", "stores", "both")]
    out.append(("scalar 32x32 tile", K.permute_kernel(shape, perm, DT[dt])))
    out.append(("permute_kernel default (vectorize=True)", K.permute_kernel(shape, perm, DT[dt], vectorize=True)))
    return out


def time_ms(fn, iters: int) -> float:
    """Milliseconds per call: the median of 5 groups of ``iters`` calls (``gpu_check_kernels.time_ms``)."""
    return gpu_check_kernels.time_ms(fn, iters)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    bad = 0
    g = torch.Generator(device="cuda").manual_seed(0)
    for dt in DT:
        for shape, perm in [((1000, 264), (1, 0)), ((3, 72, 136), (0, 2, 1)), ((2, 40, 3, 24), (3, 1, 0, 2)),
                            ((2, 16, 3, 24), (2, 0, 3, 1)), ((8, 8), (1, 0)), ((520, 1032), (1, 0)), ((4, 200, 8), (0, 2, 1))]:
            x = torch.randn(shape, device="cuda", generator=g).to(dt)
            ref = x.permute(perm).contiguous()
            for label, ks in variants(shape, perm, dt):
                out = torch.full(ref.shape, float("nan"), device="cuda", dtype=dt)
                N.launch(ks, [out, x], ks.grid, ks.block)
                if not torch.equal(out, ref):
                    bad += 1
                    print(f"FAIL {label} {shape} {perm} {dt}")
    torch.cuda.synchronize()
    print(f"correctness: {'all bit-exact' if not bad else f'{bad} FAILED'}")
    print(f"\n{'case':<58} {'ms':>7} {'GB/s':>7} {'% copy':>7}")
    for dt in DT:
        item = torch.tensor([], dtype=dt).element_size()
        n = args.mib * (1 << 20) // item
        x = torch.randn(n, device="cuda", dtype=dt)
        y = torch.empty_like(x)
        copy_ms = time_ms(lambda: y.copy_(x), args.iters)
        copy_bw = 2 * n * item / copy_ms / 1e6
        print(f"{'copy_ ' + DT[dt]:<58} {copy_ms:>7.3f} {copy_bw:>7.0f} {100.0:>6.1f}%")
        side = int(n ** 0.5) // 64 * 64
        for shape, perm in [((side, side), (1, 0)), ((side // 4, side * 4), (1, 0)), ((side * 4, side // 4), (1, 0)),
                            ((64, n // (64 * 1024), 1024), (0, 2, 1))]:
            numel = 1
            for s in shape:
                numel *= s
            xv, yv = x[:numel].view(shape), y[:numel]
            for label, ks in variants(shape, perm, dt):
                ms = time_ms(lambda: N.launch(ks, [yv, xv], ks.grid, ks.block), args.iters)
                bw = 2 * numel * item / ms / 1e6
                print(f"{f'{shape} {perm} {DT[dt]} {label}':<58} {ms:>7.3f} {bw:>7.0f} {100 * bw / copy_bw:>6.1f}%")
        del x, y
        torch.cuda.empty_cache()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
