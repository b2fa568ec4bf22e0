"""Exhaustive accuracy of 16-bit float results: every finite input value, compared with the
correctly rounded float64 function (used by ``test_fast_math`` and ``scripts/bench_gelu.py``)."""

from __future__ import annotations

import math

import torch

#: Outputs smaller in magnitude are not checked (bf16: below this the float32 evaluation
#: itself underflows; fp16: its subnormals).
SMALLEST = {torch.bfloat16: 1e-30, torch.float16: 2.0 ** -14}


def every_finite(dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """Every finite value of a 16-bit float dtype, truncated to a multiple of 8 elements
    (the vectorized kernels' width)."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    x = x[torch.isfinite(x.float())]
    return x[: x.numel() // 8 * 8].to(device)


def gelu_exact(x64: torch.Tensor) -> torch.Tensor:
    """``x Phi(x)`` in float64 with ``Phi`` through ``erfc`` (torch's ``1 + erf`` form loses
    every digit for x below about -8 even in float64)."""
    return x64 * 0.5 * torch.special.erfc(-x64 / math.sqrt(2.0))


def _ordered(t: torch.Tensor) -> torch.Tensor:
    b = t.view(torch.int16).int()
    return torch.where(b < 0, -32768 - b, b)


def rounding_errors(out: torch.Tensor, x: torch.Tensor) -> tuple[int, int, int]:
    """``(misrounded, max ulps, checked)`` of the 16-bit ``out = gelu(x)`` against the correctly
    rounded gelu, over outputs of magnitude >= ``SMALLEST``; a NaN counts as 2**20 ulps."""
    ref = gelu_exact(x.double().cpu())
    keep = ref.abs() >= SMALLEST[x.dtype]
    out = out.cpu()
    d = (_ordered(out) - _ordered(ref.to(x.dtype))).abs()
    d = torch.where(torch.isnan(out.float()), torch.full_like(d, 1 << 20), d)[keep]
    return int((d > 0).sum()), int(d.max()), int(keep.sum())
