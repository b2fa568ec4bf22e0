"""Strided forms of remaps between block shardings, derived from per-dim ranges.

The general way to a remap's affine map, :func:`reshard.codegen.remap_form.remap_form`, reads
it off the gather index (``remap_index``), which is built from element sets over the *global*
tensor: seconds of host time per remap at transformer sizes.  When source and destination are both
block shardings (:meth:`TensorSharding.block_ranges`: every device holds a box, one
contiguous index range per dim), every set a remap touches is a box, and the map follows
from the boxes alone, in O(dims * team size):

* a box ``X`` read out of a local buffer holding box ``P`` (``X`` inside ``P``) is the
  affine map ``shape = len(X)``, ``strides = row-major strides of len(P)``,
  ``offset = sum_d (start(X)_d - start(P)_d) * stride_d``;
* a stack of such reads ``X_0 .. X_{n-1}`` (``scatter``, ``a2a_send``) whose starts advance
  by a common step ``delta`` is one more outer dim ``(n, sum_d delta_d * stride_d)``;
* a box ``D`` located in the concatenation of pieces ``P_0 .. P_{n-1}`` (``gather``,
  ``a2a_recv``), pieces of one shape advancing by ``delta`` along one dim ``e``: either ``D``
  lies inside one piece (a read from it, offset by ``j * numel(P)``), or the pieces abut
  (``delta_e = len(P)_e``) and ``D`` covers whole pieces along ``e``, which splits dim ``e``
  into ``(pieces, piece_len)`` with strides ``(numel(P), stride_e)``.

Anything else (other shardings, ``pieces`` mode, overlapping or gapped pieces, a box that
is not held, uneven chunks) returns None and :func:`remap_form` takes the index path, which
verifies its form element by element (and raises the index path's errors).  The derivations
mirror ``remap_index`` exactly, piece order included; tests/lower/test_remap_analytic.py checks
``analytic_form(...).index()`` against ``remap_index(...)`` on random block shardings.
"""

from __future__ import annotations

import math

from ..ir.sharding import TensorSharding
from ..ir.strides import row_major_strides
from .remap_index import StridedMap, _with

__all__ = ["analytic_form"]

Box = tuple[tuple[int, int], ...]  # per dim (start, length)


def _lengths(b: Box) -> tuple[int, ...]:
    return tuple(n for _, n in b)


def _inside(x: Box, p: Box) -> bool:
    return all(ps <= xs and xs + xn <= ps + pn for (xs, xn), (ps, pn) in zip(x, p))


def _intersect(a: Box, b: Box) -> Box | None:
    out = []
    for (s0, n0), (s1, n1) in zip(a, b):
        lo, hi = max(s0, s1), min(s0 + n0, s1 + n1)
        if hi <= lo:
            return None
        out.append((lo, hi - lo))
    return tuple(out)


def _step(boxes: list[Box]) -> tuple[int, ...] | None:
    """The common per-dim start step of ``boxes`` (all of one shape), or None."""
    if any(_lengths(b) != _lengths(boxes[0]) for b in boxes):
        return None
    if len(boxes) == 1:
        return (0,) * len(boxes[0])
    delta = tuple(s1 - s0 for (s0, _), (s1, _) in zip(boxes[0], boxes[1]))
    for j, b in enumerate(boxes):
        if any(s != s0 + j * dd for (s, _), (s0, _), dd in zip(b, boxes[0], delta)):
            return None
    return delta


def _canonical(dims: list[tuple[int, int]], offset: int) -> StridedMap:
    """StridedMap of ``dims`` (outermost first, (size, stride)): size-1 dims dropped, nested
    dims that read one run merged."""
    merged: list[list[int]] = []
    for size, stride in dims:
        if size == 1:
            continue
        if merged and merged[-1][1] == size * stride:
            merged[-1] = [merged[-1][0] * size, stride]
        else:
            merged.append([size, stride])
    if not merged:
        return StridedMap((1,), (1,), offset)
    return StridedMap(tuple(m[0] for m in merged), tuple(m[1] for m in merged), offset)


def _stacked_reads(pool: Box, boxes: list[Box], stacked: bool) -> StridedMap | None:
    """The map reading ``boxes[0]``, ``boxes[1]``, ... (each row-major) out of the local
    buffer of box ``pool``; ``stacked`` adds the outer dim over the boxes."""
    if not all(_inside(b, pool) for b in boxes):
        return None
    delta = _step(boxes)
    if delta is None:
        return None
    st = row_major_strides(_lengths(pool))
    jstride = sum(dd * s for dd, s in zip(delta, st))
    if jstride < 0:
        return None
    offset = sum((xs - ps) * s for (xs, _), (ps, _), s in zip(boxes[0], pool, st))
    dims = [(len(boxes), jstride)] if stacked else []
    dims += list(zip(_lengths(boxes[0]), st))
    return _canonical(dims, offset)


def _located(mine: Box, pieces: list[Box]) -> StridedMap | None:
    """The map giving, for each element of box ``mine`` (row-major), its position in the
    concatenation of the row-major pieces ``pieces``."""
    if len(pieces) == 1:
        return _stacked_reads(pieces[0], [mine], stacked=False)
    delta = _step(pieces)
    if delta is None:
        return None
    moving = [d for d, dd in enumerate(delta) if dd != 0]
    if len(moving) != 1 or delta[moving[0]] < 0:
        return None
    (e,) = moving
    plen = _lengths(pieces[0])
    if delta[e] < plen[e]:
        return None  # overlapping pieces: the pool holds duplicates
    st = row_major_strides(plen)
    numel = math.prod(plen)
    dims: list[tuple[int, int]] = []
    offset = 0
    for d, ((ms, mn), (ps, pn)) in enumerate(zip(mine, pieces[0])):
        if d != e:
            if not (ps <= ms and ms + mn <= ps + pn):
                return None
            dims.append((mn, st[d]))
            offset += (ms - ps) * st[d]
            continue
        t0 = ms - ps
        if t0 < 0:
            return None
        j0, j1 = t0 // delta[e], (t0 + mn - 1) // delta[e]
        if j1 >= len(pieces):
            return None
        if j0 == j1:
            r0 = t0 - j0 * delta[e]
            if r0 + mn > pn:
                return None
            dims.append((mn, st[d]))
            offset += j0 * numel + r0 * st[d]
        elif delta[e] == pn and t0 % pn == 0 and mn % pn == 0:
            dims += [(mn // pn, numel), (pn, st[d])]
            offset += j0 * numel
        else:
            return None
    return _canonical(dims, offset)


def analytic_form(mode: str, s: TensorSharding, d: TensorSharding, axis: int,
                  coords: tuple[int, ...]) -> StridedMap | None:
    """The StridedMap of ``remap_index(mode, src, dst, axis, coords)`` derived from block
    ranges, or None when the remap is outside that domain (then the caller takes the index
    path).  Exact: ``analytic_form(...).index()`` equals ``remap_index(...)`` element by
    element whenever it is not None."""
    if mode not in ("slice", "gather", "scatter", "a2a_send", "a2a_recv"):
        return None
    coords = tuple(int(c) for c in coords)
    if s.mesh.shape != d.mesh.shape or s.shape != d.shape or len(coords) != s.mesh.ndim:
        return None
    if any(not 0 <= c < n for c, n in zip(coords, s.mesh.shape)):
        return None
    if math.prod(s.local_shape) == 0 or math.prod(d.local_shape) == 0:
        return None
    mine = d.block_ranges(coords)
    have = s.block_ranges(coords)
    if mine is None or have is None:
        return None
    if mode == "slice":
        return _stacked_reads(have, [mine], stacked=False)
    if not 0 <= axis < s.mesh.ndim:
        return None
    n = s.mesh.shape[axis]
    if mode == "gather":
        return _located(mine, [s.block_ranges(_with(coords, axis, j)) for j in range(n)])
    if mode == "scatter":
        return _stacked_reads(have, [d.block_ranges(_with(coords, axis, j)) for j in range(n)], stacked=True)
    if mode == "a2a_send":
        boxes = [_intersect(d.block_ranges(_with(coords, axis, j)), have) for j in range(n)]
        if any(b is None for b in boxes):
            return None
        return _stacked_reads(have, boxes, stacked=True)
    # a2a_recv
    pieces = [_intersect(mine, s.block_ranges(_with(coords, axis, j))) for j in range(n)]
    if any(p is None for p in pieces):
        return None
    return _located(mine, pieces)
