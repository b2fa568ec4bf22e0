"""CPU steps of the fused linear loss ops (``ir.ops.linear_loss``): the logits computed a chunk
of tokens at a time (``chunks``: at most ``CHUNK_ELEMENTS`` logits held at once), never the
whole ``[tokens, vocab]`` result."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...ir.ops.linear_loss import chunks
from ...ir.ops.registry import StepLike
from .registry import CpuStep, cpu_step

Tensor = torch.Tensor


def _shifted_exp(h: Tensor, w: Tensor, m: Tensor) -> Tensor:
    """``exp(h @ w^T - m)`` (m broadcast along V; the exp in place)."""
    return torch.matmul(h, w.t()).sub_(m[:, None]).exp_()


def _rows(h: Tensor, w: Tensor, per_chunk: Callable[[slice], Tensor]) -> Tensor:
    """``[N]`` from ``per_chunk`` on each chunk of tokens."""
    out = torch.empty(h.shape[0], dtype=h.dtype, device=h.device)
    for c in chunks(h.shape[0], w.shape[0]):
        out[c] = per_chunk(c)
    return out


@cpu_step("linear_max")
class LinearMax(CpuStep):
    def run(self, step: StepLike, xs: list[Tensor]) -> Tensor:
        h, w = xs
        return _rows(h, w, lambda c: torch.matmul(h[c], w.t()).amax(-1))


@cpu_step("linear_sumexp")
class LinearSumexp(CpuStep):
    def run(self, step: StepLike, xs: list[Tensor]) -> Tensor:
        h, w, m = xs
        return _rows(h, w, lambda c: _shifted_exp(h[c], w, m[c]).sum(-1))


@cpu_step("linear_sumexp_grad")
class LinearSumexpGrad(CpuStep):
    def run(self, step: StepLike, xs: list[Tensor]) -> Tensor:
        """The input gradient chunk by chunk; the weight gradient (and with ``"both"`` the input
        gradient's rows before it) accumulated over the chunks."""
        h, w, m, g = xs
        parts = chunks(h.shape[0], w.shape[0])
        if step.attr("wrt") == "input":
            out = torch.empty_like(h)
            for c in parts:
                out[c] = torch.matmul(_shifted_exp(h[c], w, m[c]).mul_(g[c, None]), w)
            return out
        n = h.shape[0] if step.attr("wrt") == "both" else 0
        out = torch.empty(n + w.shape[0], h.shape[1], dtype=h.dtype, device=h.device)
        acc = out[n:].zero_()
        for c in parts:
            p = _shifted_exp(h[c], w, m[c]).mul_(g[c, None])
            if n:
                out[c] = torch.matmul(p, w)
            acc.addmm_(p.t(), h[c])
        return out
