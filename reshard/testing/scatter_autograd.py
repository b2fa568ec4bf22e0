"""The scatters' meaning by torch.autograd: the gradients of ``F.embedding``'s weight and of
``torch.gather``'s input, which ``f.embedding_grad`` and ``f.unpick`` compute (their tests in
``tests/ops/test_op_embedding_grad.py`` and ``tests/rules/test_lookup_scatter.py``)."""

from __future__ import annotations

import torch


def torch_embedding_grad(g: torch.Tensor, ids: torch.Tensor, num_rows: int, padding_idx: int | None = None
                         ) -> torch.Tensor:
    """d weight of ``F.embedding(ids, weight, padding_idx)`` for the result's gradient ``g``
    (torch.autograd)."""
    w = torch.zeros(num_rows, g.shape[-1], dtype=g.dtype, requires_grad=True)
    torch.nn.functional.embedding(ids, w, padding_idx=padding_idx).backward(g)
    return w.grad


def torch_unpick(g: torch.Tensor, index: torch.Tensor, extent: int) -> torch.Tensor:
    """d x of ``torch.gather(x, -1, index[..., None])[..., 0]`` for its gradient ``g``."""
    x = torch.zeros(*g.shape, extent, dtype=g.dtype, requires_grad=True)
    torch.gather(x, -1, index.unsqueeze(-1)).squeeze(-1).backward(g)
    return x.grad
