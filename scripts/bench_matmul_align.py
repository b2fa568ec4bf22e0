"""What cuBLAS needs aligned: the lm head's three bf16 GEMMs of GPT-2 (vocabulary 50257) on the GPU.

    python scripts/bench_matmul_align.py [--tokens 4096] [--hidden 1024] [--vocab 50257]

``codegen.aligned_matmuls`` pads every misaligned extent with zeros (``pad`` steps).  This
times, per GEMM (logits ``h @ W.T``, input gradient ``dlogits @ W``, weight gradient
``dlogits.T @ h``), with CUDA events (median of 20 after 5 warm-up runs):

- **plain**: contiguous operands as they are (odd leading dimensions);
- **padded**: every misaligned extent zero-padded to a multiple of 8 (what the lowered plan
  computes; here torch's pad copies are timed with the GEMM), the result's cut not timed;
- **aligned ld**: the operands as views of buffers whose leading dimension is a multiple of 8
  while their extents stay odd, the result written into such a view (``out=``): whether
  cuBLAS needs only aligned strides (then a producer writing a padded-stride buffer makes
  every copy go), or the extents too;
- **pad copy**: one zero-padding copy of the vocabulary-sized operand, for scale.

Prints one line per GEMM and variant: ms, and the largest difference from ``plain``'s result.
"""

from __future__ import annotations

import argparse
import statistics

import torch


def timed(fn, runs: int = 20) -> float:
    for _ in range(5):
        fn()
    ts = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def strided(x: torch.Tensor, ld_dim: int) -> torch.Tensor:
    """``x``'s values in a view whose stride along ``ld_dim``'s neighbour is padded to a multiple of 8."""
    if ld_dim == 1:  # row-major: rows padded
        buf = torch.zeros(x.shape[0], -(-x.shape[1] // 8) * 8, dtype=x.dtype, device=x.device)
        buf[:, : x.shape[1]] = x
        return buf[:, : x.shape[1]]
    return strided(x.T.contiguous(), 1).T  # column-major


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    bf = dict(dtype=torch.bfloat16, device="cuda")
    t, h, v = a.tokens, a.hidden, a.vocab
    vp = -(-v // 8) * 8
    x = torch.randn(t, h, **bf)
    w = torch.randn(v, h, **bf) / 32
    g = torch.randn(t, v, **bf) / 256
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: tokens {t}, hidden {h}, vocab {v} (bf16)")
    cases = {
        "logits h @ W.T": (lambda: x @ w.T, lambda: (x @ torch.nn.functional.pad(w, (0, 0, 0, vp - v)).T),
                           (x, w.T), (t, v)),
        "dh = dlogits @ W": (lambda: g @ w, lambda: torch.nn.functional.pad(g, (0, vp - v)) @
                             torch.nn.functional.pad(w, (0, 0, 0, vp - v)), (strided(g, 1), w), (t, h)),
        "dW = dlogits.T @ h": (lambda: g.T @ x, lambda: torch.nn.functional.pad(g, (0, vp - v)).T @ x,
                               (strided(g, 1).T, x), (v, h)),
    }
    for name, (plain, padded, (p, q), out_shape) in cases.items():
        want = plain()
        out_buf = torch.empty(out_shape[0], -(-out_shape[1] // 8) * 8, **bf)
        out = out_buf[:, : out_shape[1]]
        rows = [("plain", plain, want), ("padded", padded, None), ("aligned ld", lambda: torch.mm(p, q, out=out), out)]
        for label, fn, res in rows:
            ms = timed(fn)
            got = fn() if res is None else (fn(), res)[1]
            got = got[: out_shape[0], : out_shape[1]]
            print(f"  {name:22s} {label:11s} {ms:7.3f} ms  max diff {float((got.float() - want.float()).abs().max()):.3g}"
                  f"  strides in {tuple(p.stride())} {tuple(q.stride())}")
    print(f"  pad copy [{t}, {v}] -> [{t}, {vp}]: {timed(lambda: torch.nn.functional.pad(g, (0, vp - v))):.3f} ms")


if __name__ == "__main__":
    main()
