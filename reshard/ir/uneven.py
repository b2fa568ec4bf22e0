"""Uneven layouts: where DTensor's ``torch.chunk`` pieces of one dim sit in its padded extent.

A dim of true extent ``n`` sharded by mesh axes of sizes ``p_0, ..., p_k`` (outer to inner,
``P`` their product) is chunked by DTensor in nesting order: ``torch.chunk(n, p_0)``, then each
piece by ``p_1``, and so on (chunk size ``ceil(len / p)``, trailing pieces smaller or empty).
reshard pads the dim to ``N = P * c``, ``c = ceil(n / P)`` (``= ceil(ceil(n / p_0) / p_1 ...)``,
so the first block, the largest, fills ``c``): block ``b`` (the axes' coordinates in mixed
radix, ``p_0`` most significant) is the padded range ``[b*c, (b+1)*c)`` and holds its piece
as a prefix, the rest padding.  With one axis, or when every piece but the last is full, the
true indices are ``[0, n)`` (a **tail** layout); otherwise padding sits between pieces
(``5`` rows on 2x2: pieces 2, 1, 1, 1 -> ``[0, 1 | 2, _ | 3, _ | 4, _]``).

A layout is its **runs**: ``(position, count)`` pairs, in order, of padded positions holding
consecutive true indices (the true index of a run's first element is the sum of the counts
before it), adjacent runs merged, empty ones dropped; a tail layout is ``((0, n),)``.

Laws: ``compact(embed(x, d, runs, N), d, runs) == x``; ``embed`` writes zeros at padding;
``chunk_lengths(n, sizes)`` are DTensor's local extents (``_compute_local_shape_and_global_offset``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

#: (padded position, count) of the runs of true indices of one dim
Runs = tuple[tuple[int, int], ...]


def chunk_lengths(n: int, sizes: Sequence[int]) -> list[int]:
    """DTensor's piece length per block (mixed radix of ``sizes``, the first most significant)
    for ``n`` indices chunked along each size in turn (``torch.chunk``)."""
    lengths = [n]
    for p in sizes:
        nxt = []
        for length in lengths:
            c = -(-length // p)
            nxt += [max(0, min(c, length - i * c)) for i in range(p)]
        lengths = nxt
    return lengths


def nested_runs(n: int, sizes: Sequence[int]) -> Runs:
    """The runs of ``n`` indices chunked along ``sizes`` in blocks of ``ceil(n / prod(sizes))``."""
    c = -(-n // math.prod(sizes))
    return merged((b * c, length) for b, length in enumerate(chunk_lengths(n, sizes)))


def tail(n: int) -> Runs:
    """The layout whose true indices are ``[0, n)``."""
    return ((0, n),)


def merged(runs) -> Runs:  # noqa: ANN001  (an iterable of (position, count))
    """``runs`` with empty ones dropped and adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for pos, count in runs:
        if count == 0:
            continue
        if out and out[-1][0] + out[-1][1] == pos:
            out[-1] = (out[-1][0], out[-1][1] + count)
        else:
            out.append((pos, count))
    return tuple(out)


def held(runs: Runs, start: int, length: int) -> int:
    """How many true indices the padded range ``[start, start + length)`` holds."""
    return sum(max(0, min(pos + count, start + length) - max(pos, start)) for pos, count in runs)


def valid_mask(runs: Runs, big: int) -> torch.Tensor:
    """``[big]`` bool: true at the padded positions holding true indices."""
    mask = torch.zeros(big, dtype=torch.bool)
    for pos, count in runs:
        mask[pos:pos + count] = True
    return mask


def describe(runs: Runs) -> str:
    """A layout for notes: its runs as slices of the padded dim (``0:3, 4:5, 6:7``)."""
    return ", ".join(f"{pos}:{pos + count}" for pos, count in runs)


def embed(x: torch.Tensor, d: int, runs: Runs, big: int) -> torch.Tensor:
    """``x`` (true extent along ``d``) laid out in ``big`` padded positions: zeros at padding."""
    shape = list(x.shape)
    shape[d] = big
    out = x.new_zeros(shape)
    at = 0
    for pos, count in runs:
        out.narrow(d, pos, count).copy_(x.narrow(d, at, count))
        at += count
    return out


def compact(x: torch.Tensor, d: int, runs: Runs) -> torch.Tensor:
    """The true indices of ``x``'s dim ``d`` in order (the inverse of ``embed``)."""
    return torch.cat([x.narrow(d, pos, count) for pos, count in runs], d)
