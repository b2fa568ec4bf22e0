"""The affine form of a ``remap`` step's index: what decides whether the step is a view, a
strided copy or an index gather (lowering's allocation plan asks whether it is a view; the
runtime's ``remap_fast`` runs it accordingly).

A remap (:mod:`reshard.codegen.remap_index`) moves the elements of a local buffer to the
positions another sharding (or a collective's send/receive layout) wants; its general form is
a gather with an index ``pos`` of the destination size.  Between block shardings, and for
most loop-domain shardings, that index is *affine*:

    pos[c_0, ..., c_k] = offset + sum_i c_i * stride_i   over some shape (d_0, ..., d_k)

so the remap is ``flat.as_strided(shape, strides, offset)``: a view when that view is a
contiguous range, else one strided copy of exactly the bytes the result needs.

:func:`strided_form` recovers (shape, strides, offset) from the index itself, innermost dim
first (the run of equal steps at each level), and accepts it only after rebuilding the whole
index from it and comparing it element by element with ``pos``: the fast path computes the
same function as the gather by construction.  Indices with no such form (uneven pieces, a
negative step, more than :data:`MAX_DIMS` levels) have none (``None``: the gather).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ..ir.sharding import TensorSharding
from .remap_analytic import analytic_form
from .remap_index import StridedMap, remap_index

__all__ = ["StridedMap", "strided_form", "remap_form", "remap_is_view", "MAX_DIMS"]

#: Most dims a recovered strided form may have (deeper nests take the index gather).
MAX_DIMS = 12


def _largest_divisor_at_most(n: int, cap: int) -> int:
    for m in range(min(n, cap), 0, -1):
        if n % m == 0:
            return m
    return 1


def strided_form(pos: torch.Tensor) -> StridedMap | None:
    """The affine form of the flat gather index ``pos`` (int64, 1-D), or None if it has none.

    Level by level from the innermost: the block starts ``pos[::size]`` advance by a common
    step for a run of ``m`` blocks (``m`` the largest divisor of the remaining count within
    the run); that is one dim (m, step).  The candidate is checked against every element of
    ``pos`` before it is returned.
    """
    pos = pos.reshape(-1).to(torch.long)
    n = pos.numel()
    if n == 0:
        return StridedMap((0,), (1,), 0)
    off = int(pos[0])
    dims: list[tuple[int, int]] = []  # innermost first
    size = 1
    while size < n:
        if len(dims) >= MAX_DIMS:
            return None
        starts = pos[::size]
        count = n // size
        step = int(starts[1] - starts[0])
        if step < 0:
            return None
        bad = (starts[1:] - starts[:-1] != step).nonzero()
        run = int(bad[0, 0]) + 1 if bad.numel() else count
        m = _largest_divisor_at_most(count, run)
        if m < 2:
            return None
        dims.append((m, step))
        size *= m
    if off < 0:
        return None
    sm = StridedMap(tuple(m for m, _ in reversed(dims)) or (1,), tuple(s for _, s in reversed(dims)) or (1,), off)
    return sm if torch.equal(sm.index(), pos) else None


@lru_cache(maxsize=4096)
def remap_form(mode: str, src: TensorSharding, dst: TensorSharding, axis: int,
               coords: tuple[int, ...]) -> StridedMap | None:
    """The affine form of ``remap_index(mode, src, dst, axis, coords)`` (cached): derived from
    block ranges without building the index when src and dst are block shardings
    (:func:`reshard.codegen.remap_analytic.analytic_form`, O(dims * team size)), else
    :func:`strided_form` of the index (verified element by element)."""
    sm = analytic_form(mode, src, dst, axis, coords)
    if sm is not None:
        return sm
    return strided_form(remap_index(mode, src, dst, axis, coords))


@lru_cache(maxsize=16384)
def remap_is_view(mode: str, src: TensorSharding, dst: TensorSharding, axis: int, coords: tuple[int, ...]) -> bool:
    """Does the remap's result share its operand's storage (cached: the allocation plan asks
    for every rank, three times per lowering)?  Law: exactly when its block form
    (``analytic_form``, O(dims * team size), no index built) is one contiguous range; the
    runtime copies the result of any other remap, a range found on the index path included
    (``runtime.remap_fast``), so the allocation plan decides this at planning time without
    building an index over the tensor."""
    form = analytic_form(mode, src, dst, axis, coords)
    return form is not None and form.is_range
