"""The fused linear cross entropy's local steps on one GPU against the unfused loss (issue 28, item 3).

    python benchmarks/fused_loss_gpu.py [--steps 10] [--chunks 22 24]

Per configuration (tokens N, hidden H, vocab V, dtype; random h, w, targets): a mean cross
entropy of ``x = h @ w^T`` and the gradients of h and w, timed after warm-up as the median of
``--steps`` (CUDA-synchronized), with the peak memory above the inputs
(``torch.cuda.max_memory_allocated``):

- **eager**: ``F.cross_entropy(h @ w.T, t)`` and its backward (autograd: ``[N, V]`` logits and
  their gradient);
- **fused, both**: the local steps of ``reshard.ir.ops.linear_loss``'s ops
  (``reshard.runtime.cpu_steps.linear_loss``), as a plan under a memory budget runs them:
  ``linear_max``, ``linear_sumexp``, then ``linear_sumexp_grad(..., "both")`` (one pass over
  the chunks for both gradients), the target terms as ``embedding`` /
  ``index_add`` (what the plan's ``embedding`` / ``embedding_grad`` steps do);
- **fused, apart**: the same with the input's and the weight's gradients as two steps (each
  recomputing the logits: what a vocab-parallel plan runs).

``--chunks``: log2 of ``CHUNK_ELEMENTS`` (the logits elements a step holds at once) to try.
The loss's relative difference from eager's is printed as a check.  Figures are measured.

Measured on one H200 (torch 2.11, TF32 off; ``--steps 10 --chunks 22 24 26``), ms / peak MiB:

| N, H, V, dtype | eager | fused both 2^22 | 2^24 | 2^26 | fused apart 2^24 |
|---|---|---|---|---|---|
| 4096, 768, 50257, fp32 | 20.3 / 2358 | 58.2 / 203 | 44.1 / 299 | 36.3 / 683 | 54.2 / 299 |
| 4096, 1024, 50257, bf16 | 11.3 / 1178 | 39.6 / 130 | 26.8 / 178 | 22.3 / 370 | 33.4 / 178 |
| 8192, 2048, 128256, bf16 | 22.5 / 6012 | 266.0 / 629 | 77.9 / 629 | 48.7 / 821 | 94.0 / 629 |
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from reshard.ir.ops import linear_loss
from reshard.runtime.cpu_steps import CPU_STEPS

MIB = 2 ** 20
CONFIGS = [(4096, 768, 50257, torch.float32), (4096, 1024, 50257, torch.bfloat16),
           (8192, 2048, 128256, torch.bfloat16)]


class _Step:
    def __init__(self, **attrs: object) -> None:
        self.attrs = attrs

    def attr(self, name: str, default: object = None) -> object:
        return self.attrs.get(name, default)


def eager(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    h, w = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(h @ w.t(), t)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def fused(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, apart: bool) -> tuple[torch.Tensor, ...]:
    n = h.shape[0]
    m = CPU_STEPS["linear_max"].run(_Step(), [h, w])
    s = CPU_STEPS["linear_sumexp"].run(_Step(), [h, w, m])
    rows = w.index_select(0, t)
    loss = (torch.log(s) + m - (h * rows).sum(-1)).mean()
    g = torch.full_like(s, 1.0 / n) / s  # dloss / ds
    grad = CPU_STEPS["linear_sumexp_grad"]
    if apart:
        dh = grad.run(_Step(wrt="input"), [h, w, m, g])
        dw = grad.run(_Step(wrt="weight"), [h, w, m, g])
    else:
        both = grad.run(_Step(wrt="both"), [h, w, m, g])
        dh, dw = both[:n], both[n:]
    dh = dh - rows / n
    dw = dw.index_add_(0, t, h, alpha=-1.0 / n)
    return loss, dh, dw


def measure(fn: Callable[[], tuple[torch.Tensor, ...]], steps: int) -> tuple[float, float, torch.Tensor]:
    """(median ms, peak MiB above what was allocated before, the loss)."""
    out = fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    peak = (torch.cuda.max_memory_allocated() - base) / MIB
    return statistics.median(times), peak, out[0].float()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--chunks", type=int, nargs="+", default=[22, 24])
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{'N':>6} {'H':>5} {'V':>7} {'dtype':>9} {'way':>18} {'ms':>8} {'peak MiB':>9} {'logits MiB':>10} "
          f"{'loss rel diff':>13}")
    for n, hid, v, dt in CONFIGS:
        gen = torch.Generator(device="cuda").manual_seed(0)
        h = (torch.randn(n, hid, device="cuda", generator=gen) * 0.5).to(dt)
        w = (torch.randn(v, hid, device="cuda", generator=gen) * 0.05).to(dt)
        t = torch.randint(0, v, (n,), device="cuda", generator=gen)
        logits = n * v * h.element_size() / MIB
        ms, peak, ref = measure(lambda: eager(h, w, t), args.steps)
        print(f"{n:>6} {hid:>5} {v:>7} {str(dt)[6:]:>9} {'eager':>18} {ms:>8.2f} {peak:>9.0f} {logits:>10.0f} "
              f"{0:>13.1e}")
        for c in args.chunks:
            linear_loss.CHUNK_ELEMENTS = 1 << c
            for apart in (False, True):
                way = f"fused {'apart' if apart else 'both'} 2^{c}"
                ms, peak, loss = measure(lambda: fused(h, w, t, apart), args.steps)
                rel = float((loss - ref).abs() / ref.abs())
                print(f"{n:>6} {hid:>5} {v:>7} {str(dt)[6:]:>9} {way:>18} {ms:>8.2f} {peak:>9.0f} {logits:>10.0f} "
                      f"{rel:>13.1e}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
