"""Buffer layouts around the single-tensor collectives: what the runtime hands NCCL/gloo.

``all_gather_into_tensor``, ``reduce_scatter_tensor`` and ``all_to_all_single`` move ``n``
equal contiguous blocks of one flat buffer, block ``g`` to or from group rank ``g``.  A team
collective along ``dim`` needs the ``dim`` chunks of a tensor in that form, in group-rank
order (which is team order permuted, see ``distributed._Team``).  The two functions here are
the only staging the runtime does; each is a view when the blocks already lie in place
(every dim before ``dim`` has extent 1, i.e. ``dim`` is outermost in memory, and team order
is group order) and otherwise exactly one copy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

Tensor = torch.Tensor

__all__ = ["to_blocks", "from_blocks"]


def _identity(order: Sequence[int]) -> bool:
    return all(i == j for i, j in enumerate(order))


def to_blocks(x: Tensor, dim: int, n: int, order: Sequence[int]) -> Tensor:
    """The flat send buffer of ``x`` split in ``n`` chunks along ``dim``.

    Law: ``to_blocks(x, d, n, order).view(n, -1)[g] == torch.chunk(x, n, d)[order[g]].reshape(-1)``
    for every ``g`` (``x.shape[d]`` divisible by ``n``).  A view of ``x`` when ``x`` is
    contiguous, ``x.shape[:d]`` are all 1 and ``order`` is the identity; one copy otherwise.
    """
    shape = tuple(x.shape)
    pre, post = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    if pre == 1 and _identity(order) and x.is_contiguous():
        return x.reshape(-1)
    blocks = x.reshape(pre, n, shape[dim] // n, post).transpose(0, 1)  # (n, pre, chunk, post)
    blocks = blocks.contiguous() if _identity(order) else blocks[list(order)]
    return blocks.reshape(-1)


def from_blocks(buf: Tensor, block_shape: Sequence[int], dim: int, n: int, order: Sequence[int]) -> Tensor:
    """The tensor whose ``dim`` chunks are the ``n`` blocks of the flat ``buf``.

    ``buf`` holds ``n`` blocks of ``block_shape`` one after the other (a receive buffer in
    group-rank order); chunk ``j`` of the result is block ``order[j]``.
    Law: ``from_blocks(buf, s, d, n, order) == torch.cat([buf.view(n, *s)[order[j]] for j in range(n)], d)``.
    A view of ``buf`` when ``block_shape[:d]`` are all 1 and ``order`` is the identity; one
    copy otherwise.
    """
    block_shape = tuple(block_shape)
    out_shape = block_shape[:dim] + (block_shape[dim] * n,) + block_shape[dim + 1:]
    pre, post = math.prod(block_shape[:dim]), math.prod(block_shape[dim + 1:])
    if pre == 1 and _identity(order):
        return buf.view(out_shape)
    chunks = buf.view(n, pre, block_shape[dim], post).transpose(0, 1)  # (pre, n, chunk, post)
    chunks = chunks.contiguous() if _identity(order) else chunks[:, list(order)]
    return chunks.view(out_shape)
