#!/usr/bin/env python3
"""Check reshard's generated CUDA kernels against torch on a GPU, and time them.

Correctness: every kernel kind (pointwise, cast, permute, strided copy, pad, cat, lookup,
fill, reduce) x dtype (fp32 / bf16 / fp16; int64 pointwise once) on random data, output
buffers pre-filled with NaN so unwritten elements show up; max relative error
(max |got - ref| / max |ref|) must stay under fp32 1e-5, bf16 1e-2, fp16 1e-3 (comparisons,
logical ops, ``masked``, ints, lookups and fills: exactly 0).

Speed: pointwise and permute kernels on large tensors (default 256 MiB per operand),
timed with CUDA events against a plain device copy ``y.copy_(x)`` of the same tensor,
reported as achieved bandwidth (bytes read + written / time) and as % of the copy's.

Usage: python scripts/gpu_check_kernels.py [--mib 256] [--iters 20] [--no-bench]
Exit status: 0 all checks pass, 1 a check failed, 2 no GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
SHORT_K = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref| in float64; inf if got has NaNs that ref lacks."""
    g, r = got.double(), ref.double()
    if torch.isnan(g).ne(torch.isnan(r)).any():
        return float("inf")
    g, r = torch.nan_to_num(g), torch.nan_to_num(r)
    return (g - r).abs().max().item() / max(r.abs().max().item(), 1e-30) if r.numel() else 0.0


def nan_like(shape, dtype) -> torch.Tensor:
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device="cuda")


def correctness(rows: list[tuple[str, str, str, float, bool]]) -> None:
    from reshard.codegen import nvrtc as N

    def check(kind: str, case: str, dtype: torch.dtype, got: torch.Tensor, ref: torch.Tensor, scale: float = 1.0):
        e = rel_err(got, ref)
        rows.append((kind, SHORT[dtype], case, e, e <= TOL[dtype] * scale))

    g = torch.Generator(device="cuda").manual_seed(0)
    for dt in DTYPES:
        def rnd(*shape):
            return torch.randn(*shape, device="cuda", generator=g).to(dt)

        # pointwise: a fused chain; torch computes op by op (rounding to dt each time),
        # we compute in fp32, so the reference is the fp32 chain rounded once.
        for n in (1, 1000, 4096, 1 << 22):
            a, b = rnd(n), rnd(n)
            ops = [("add", "in0", "in1"), ("gelu", "t0"), ("mul_scalar", "t1", 0.5), ("silu", "t2"),
                   ("sub", "t3", "in1"), ("tanh", "t4")]
            out = nan_like((n,), dt)
            N.run_pointwise(ops, [a, b], out=out)
            af, bf = a.float(), b.float()
            t = torch.nn.functional.gelu(af + bf) * 0.5
            ref = torch.tanh(torch.nn.functional.silu(t) - bf).to(dt)
            check("pointwise", f"n={n}", dt, out, ref, scale=1.0)
            ops = [("sigmoid", "in0"), ("rsqrt", "t0"), ("abs", "in1"), ("sqrt", "t2"), ("maximum", "t1", "t3"),
                   ("mul", "t4", "in0")]
            out = nan_like((n,), dt)
            N.run_pointwise(ops, [a, b], out=out)
            ref = (torch.maximum(torch.rsqrt(torch.sigmoid(af)), torch.sqrt(bf.abs())) * af).to(dt)
            check("pointwise", f"n={n} sigmoid/rsqrt/abs/sqrt/maximum", dt, out, ref, scale=1.0)
            # bools (0 / 1 in registers, one byte in memory), exact: relu's backward
            # masked(b, y > -y, True) in one kernel, and comparisons stored as bool
            y = torch.relu(a)
            out = nan_like((n,), dt)
            N.run_pointwise([("neg", "in0"), ("gt", "in0", "t0"), ("masked", "in1", "t1", True)], [y, b], out=out)
            ref = torch.where(y > -y, b, torch.zeros((), dtype=dt, device="cuda"))
            check("pointwise", f"n={n} gt/masked (relu backward)", dt, out, ref, scale=0.0)
            got = N.run_pointwise([("lt", "in0", "in1"), ("logical_not", "t0")], [a, b], torch.bool)
            check("pointwise", f"n={n} lt/logical_not -> bool", dt, got.float(), (~(a < b)).float(), scale=0.0)
            other = torch.float32 if dt != torch.float32 else torch.bfloat16
            out = nan_like((n,), other)
            N.run_cast(a, other, out=out)
            check("cast", f"n={n}->{SHORT[other]}", dt, out, a.to(other))
        for shape, perm in [((64, 48), (1, 0)), ((4, 33, 70), (0, 2, 1)), ((2, 3, 4, 5), (3, 1, 0, 2)),
                            ((2, 3, 4, 8), (2, 0, 1, 3)), ((5, 7, 9), (1, 2, 0)), ((1024, 2048), (1, 0)),
                            ((16, 128, 64, 32), (0, 2, 1, 3)),
                            # 16-byte tiled transpose: edge tiles, batch dims, several tiles per dim
                            ((1000, 264), (1, 0)), ((3, 72, 136), (0, 2, 1)), ((2, 40, 3, 24), (3, 1, 0, 2)),
                            ((2, 16, 3, 24), (2, 0, 3, 1)), ((8, 8), (1, 0)), ((24, 5, 16), (2, 1, 0)), ((520, 1032), (1, 0))]:
            x = rnd(*shape)
            ref = x.permute(perm).contiguous()
            out = nan_like(ref.shape, dt)
            N.run_permute(x, perm, out=out)
            check("permute", f"{shape} {perm}", dt, out, ref)
            # 2-byte offset: not 16-byte aligned, so the scalar-tile fallback runs
            xo = torch.empty(x.numel() + 1, device="cuda", dtype=dt)[1:].view(shape)
            xo.copy_(x)
            out = nan_like(ref.shape, dt)
            N.run_permute(xo, perm, out=out)
            check("permute", f"{shape} {perm} unaligned", dt, out, ref)
        base = rnd(100000)
        for shape, strides, off in [((3, 5), (20, 2), 7), ((4, 8), (16, 1), 8), ((4, 3), (0, 1), 0),
                                    ((100, 300), (900, 3), 11)]:
            ref = base.as_strided(shape, strides, off).contiguous()
            out = nan_like(shape, dt)
            N.run_strided_copy(base, shape, strides, off, out=out)
            check("strided_copy", f"{shape} {strides} +{off}", dt, out, ref)
        x = rnd(2, 30, 50)
        pads = [(0, 1), (2, -1), (3, 5)]
        ref = torch.nn.functional.pad(x, [v for p in reversed(pads) for v in p], value=-2.0)
        out = nan_like(ref.shape, dt)
        N.run_pad(x, pads, -2.0, out=out)
        check("pad", f"{tuple(x.shape)} {pads}", dt, out, ref)
        xs = [rnd(8, k, 33) for k in (3, 17, 1)]
        ref = torch.cat(xs, 1)
        out = nan_like(ref.shape, dt)
        N.run_cat(xs, 1, out=out)
        check("cat", "3 x (8,k,33) dim 1", dt, out, ref)
        lookups(dt, rnd, g, check)
        for shape, dim in [((64, 8192), 1), ((256, 100), 1), ((16, 300, 70), 1), ((4096, 64), 0)]:
            x = rnd(*shape)
            for op in ("sum", "max"):
                ref = x.float().sum(dim).to(dt) if op == "sum" else x.amax(dim)
                out = nan_like(ref.shape, dt)
                N.run_reduce(x, dim, op, out=out)
                # an fp32 sum of R terms in another order: allow a few ulps of the row norm
                check(f"reduce_{op}", f"{shape} dim {dim}", dt, out, ref, scale=4.0 if op == "sum" else 1.0)


def lookups(dt: torch.dtype, rnd: Callable[..., torch.Tensor], g: torch.Generator, check: Callable[..., None]) -> None:
    """Exact: ``embedding`` rows and ``pick`` elements (``kernels.lookup_kernel``; ids outside
    the table, and with ``masked`` rows at position -1, give 0), the seed's fill, and for float32
    cross entropy's int64 label arithmetic ``where(labels != -100, labels, 0)`` in one kernel."""
    from reshard.codegen import kernels as K
    from reshard.codegen import nvrtc as N

    v, h, t = 1000, 96, 4096
    ids = torch.randint(-2, v + 2, (t,), device="cuda", generator=g)
    rows = torch.arange(v, device="cuda")
    pos = torch.where(rows % 3 == 0, -1, rows // 3 * 2 + rows % 3 - 1)  # this rank holds 2 of 3 rows
    valid, safe = (ids >= 0) & (ids < v), ids.clamp(0, v - 1)
    zero = torch.zeros((), dtype=dt, device="cuda")
    for masked in (False, True):
        table = rnd(v * 2 // 3 + 1 if masked else v, h)
        hit = valid & (pos[safe] >= 0) if masked else valid
        ref = torch.where(hit[:, None], table[pos[safe].clamp(min=0) if masked else safe], zero)
        for vec in (False, True):
            ks = K.lookup_kernel(t, h, 0, v, SHORT_K[dt], masked, vectorize=vec)
            out = nan_like((t, h), dt)
            N.launch(ks, [out, table, ids, *([pos] if masked else [])], ks.grid_for(out.numel()), ks.block)
            check("lookup", f"embedding {t} ids of {v}x{h}{' masked' if masked else ''}{' 16B' if vec else ''}", dt,
                  out, ref, scale=0.0)
    x = rnd(t, v)
    ks = K.lookup_kernel(t, 1, v, v, SHORT_K[dt], False)
    out = nan_like((t,), dt)
    N.launch(ks, [out, x, ids], ks.grid_for(t), ks.block)
    check("lookup", f"pick {t}x{v}", dt, out, torch.where(valid, x.gather(1, safe[:, None])[:, 0], zero), scale=0.0)
    ks = K.fill_kernel(t, SHORT_K[dt], 1.0)
    out = nan_like((t,), dt)
    N.launch(ks, [out], ks.grid_for(t), ks.block)
    check("fill", f"{t} ones", dt, out, torch.ones_like(out), scale=0.0)
    if dt == torch.float32:
        labels = torch.where(ids % 3 == 0, -100, ids * (2**33) + 7)  # values beyond 2^31
        chain = [("ne", "in0", "in1"), ("masked", "in0", "t0", True), ("masked", "in2", "t0", False),
                 ("add", "t1", "t2")]
        got = N.run_pointwise(chain, [labels, torch.full_like(labels, -100), torch.zeros_like(labels)])
        want = torch.where(labels != -100, labels, 0)
        check("pointwise", f"int64 labels ignore_index n={t}", dt, (got != want).float(), torch.zeros(t, device="cuda"),
              scale=0.0)


def time_ms(fn: Callable[[], object], iters: int, groups: int = 5) -> float:
    """Milliseconds per call: the median over ``groups`` groups of the mean of ``iters``
    back-to-back calls (CUDA events around each group), after 3 warm-up calls.  The median
    keeps one group slowed by a host stall (the GPU running dry) out of the number."""
    import statistics

    for _ in range(3):
        fn()
    times = []
    for _ in range(groups):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def bench(mib: int, iters: int) -> list[tuple[str, float, float, float]]:
    from reshard.codegen import kernels as K
    from reshard.codegen import nvrtc as N

    rows = []
    for dt in (torch.bfloat16, torch.float32):
        n = mib * (1 << 20) // torch.tensor([], dtype=dt).element_size()
        x = torch.randn(n, device="cuda", dtype=dt)
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * x.element_size()
        copy_ms = time_ms(lambda: y.copy_(x), iters)
        copy_bw = nbytes / copy_ms / 1e6
        rows.append((f"torch copy_ {SHORT[dt]}", copy_ms, copy_bw, 100.0))

        def add(label: str, ms: float, moved: int) -> None:
            bw = moved / ms / 1e6
            rows.append((label, ms, bw, 100.0 * bw / copy_bw))

        add(f"pointwise gelu {SHORT[dt]}", time_ms(lambda: N.run_pointwise([("gelu", "in0")], [x], out=y), iters),
            nbytes)
        x2 = torch.randn_like(x)
        add(f"pointwise add+silu (2 in) {SHORT[dt]}", time_ms(
            lambda: N.run_pointwise([("add", "in0", "in1"), ("silu", "t0")], [x, x2], out=y), iters), 3 * nbytes // 2)
        add(f"torch gelu {SHORT[dt]}", time_ms(lambda: torch.nn.functional.gelu(x), iters), nbytes)
        del x2
        side = int(n ** 0.5) // 32 * 32
        for shape, perm in [((side, side), (1, 0)), ((64, n // (64 * 1024), 1024), (0, 2, 1)),
                            ((16, n // (16 * 4096), 32, 128), (0, 2, 1, 3)), ((8, n // (8 * 4096), 4096), (1, 0, 2))]:
            numel = 1
            for s in shape:
                numel *= s
            xv = x[:numel].view(shape)
            yv = y[:numel].view([shape[p] for p in perm])
            moved = 2 * numel * x.element_size()
            add(f"permute {shape} {perm} {SHORT[dt]}", time_ms(lambda: N.run_permute(xv, perm, out=yv), iters), moved)
            old = K.permute_kernel(shape, perm, SHORT_K[dt])  # the scalar 32x32 tile (no 16-byte path)
            if old.kind == "permute_tiled":
                add(f"  old 32x32 tile {SHORT[dt]}", time_ms(lambda: N.launch(old, [yv, xv], old.grid, old.block),
                                                             iters), moved)
            add(f"torch permute {shape} {perm} {SHORT[dt]}",
                time_ms(lambda: yv.copy_(xv.permute(perm)), iters), moved)
        del x, y
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB per operand in the timings")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-bench", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: torch.cuda.is_available() is False; nothing to check")
        return 2
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    t0 = time.perf_counter()
    rows: list[tuple[str, str, str, float, bool]] = []
    correctness(rows)
    torch.cuda.synchronize()
    from reshard.codegen import nvrtc as N

    print(f"\ncorrectness ({len(rows)} checks, {time.perf_counter() - t0:.1f}s incl. compiles; "
          f"cache {N.cache_stats()})")
    print(f"{'kind':<14} {'dtype':<5} {'case':<34} {'rel err':>10}  ok")
    for kind, dt, case, e, ok in rows:
        print(f"{kind:<14} {dt:<5} {case:<34} {e:>10.2e}  {'ok' if ok else 'FAIL'}")
    failed = [r for r in rows if not r[4]]
    if not args.no_bench:
        print(f"\nbandwidth ({args.mib} MiB per operand, bytes read+written / time, median of 5 x mean of {args.iters})")
        print(f"{'case':<52} {'ms':>8} {'GB/s':>8} {'% copy':>7}")
        for label, ms, bw, pct in bench(args.mib, args.iters):
            print(f"{label:<52} {ms:>8.3f} {bw:>8.0f} {pct:>6.1f}%")
    print(f"\n{len(rows) - len(failed)}/{len(rows)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
