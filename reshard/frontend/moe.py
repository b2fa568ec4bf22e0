"""Mixture-of-experts layers as one dense computation: every token through every expert.

Hugging Face's expert modules (``MixtralExperts``, ``Qwen3MoeExperts``, ``OlmoeExperts``, ...:
a class wrapped by ``transformers.integrations.moe.use_experts_implementation``, the experts'
weights stacked in 3-D parameters ``gate_up_proj`` / ``up_proj`` ``[E, out, in]`` and
``down_proj``) route each token to its top ``k`` experts: the default forward loops over the
experts a batch reaches (``nonzero``: a shape that depends on values), ``grouped_mm`` counts
tokens per expert (``histc``) for its offsets, ``batched_mm`` gathers a copy of an expert's
weights for every (token, choice) pair (``T * k * out * in`` elements).  None of these gives
an exported program of fixed shapes that stays small at real size, so ``dense_experts``
swaps in ``dense_forward`` while ``from_torch`` exports the module: the experts as a batch
dim (``[E, T, in] @ [E, in, out]``), the gate applied as the module applies it
(``_apply_gate``), and the experts' results summed with the router's weights, each token's
weight for an expert it was not routed to 0.

Law: ``dense_forward(x, idx, w)[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t])``, which is what
every experts implementation computes (up to the order of the float additions, and the dtype
it sums in: here the weights' and results' common dtype, then the input's), and so are its
gradients: an expert's weights and the router's weights get exactly zero from the tokens not
routed there (their weight is 0), the rest as the sparse form.  The price is compute and
activation memory: ``E / k`` times the sparse form's expert FLOPs (every token through every
expert), ``[E, T, out]`` intermediates.  Its communication is what the plan makes it: with the
stacked weights split along the experts (``Shard(0)``: expert parallelism) each rank runs its
experts on every token and the weighted sum over experts is a ``Partial`` sum, one all-reduce
(or reduce-scatter) of ``[T, hidden]``.  A module set up for transformers' own expert
parallelism (``_is_expert_parallel``: its routing indices name experts of other ranks) keeps
its forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["dense_experts", "dense_forward", "is_experts_module"]


def is_experts_module(m: torch.nn.Module) -> bool:
    """Is ``m`` a Hugging Face experts module (``use_experts_implementation``'s attributes,
    its stacked weights)?"""
    return (isinstance(getattr(m, "has_gate", None), bool) and isinstance(getattr(m, "is_transposed", None), bool)
            and hasattr(type(m), "_apply_gate") and isinstance(getattr(m, "down_proj", None), torch.Tensor)
            and not getattr(m, "_is_expert_parallel", False))


def _each_expert(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, transposed: bool) -> torch.Tensor:
    """``x [E, T, in]`` through each expert's linear layer ``w [E, out, in]`` (``[E, in, out]``
    when ``transposed``), plus its bias ``b [E, out]``: ``[E, T, out]``."""
    y = torch.matmul(x, w if transposed else w.transpose(1, 2))
    return y if b is None else y + b.unsqueeze(1)


def dense_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                  top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts module's forward, every token through every expert (module docstring):
    ``hidden_states [T, H]``, ``top_k_index`` / ``top_k_weights [T, k]`` -> ``[T, H]``."""
    up = self.gate_up_proj if self.has_gate else self.up_proj
    up_bias = getattr(self, "gate_up_proj_bias" if self.has_gate else "up_proj_bias", None) if self.has_bias else None
    experts = up.shape[0]
    x = hidden_states.unsqueeze(0).expand(experts, *hidden_states.shape)
    h = _each_expert(x, up, up_bias, self.is_transposed)
    h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
    y = _each_expert(h, self.down_proj, getattr(self, "down_proj_bias", None) if self.has_bias else None,
                     self.is_transposed)
    if getattr(self, "has_post_expert_norm", False):
        y = self.post_expert_norm(y)
    routed = torch.nn.functional.one_hot(top_k_index, experts).to(top_k_weights.dtype)  # [T, k, E]
    weights = (routed * top_k_weights.unsqueeze(-1)).sum(1)  # [T, E]: 0 where not routed
    out = (y * weights.transpose(0, 1).unsqueeze(-1)).sum(0)
    return out.to(hidden_states.dtype)


@contextmanager
def dense_experts(module: torch.nn.Module) -> Iterator[int]:
    """Inside the block, each experts module of ``module`` (``is_experts_module``) runs
    ``dense_forward``; the block gets how many there are.  Each module's ``forward`` is put
    back afterwards."""
    swapped = [m for m in module.modules() if is_experts_module(m)]
    before = [m.__dict__.get("forward") for m in swapped]
    for m in swapped:
        m.forward = dense_forward.__get__(m)
    try:
        yield len(swapped)
    finally:
        for m, f in zip(swapped, before):
            if f is None:
                del m.forward
            else:
                m.forward = f
