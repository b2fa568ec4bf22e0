"""The collective staging layouts (``reshard.runtime.staging``): both laws on random tensors,
for every dim and team order, and views exactly when the blocks already lie in place."""

from __future__ import annotations

import itertools

import pytest
import torch

from reshard.runtime.staging import from_blocks, to_blocks

SHAPES = [(6,), (4, 6), (1, 6, 4), (2, 3, 4, 2), (1, 1, 8)]


def _cases():
    for shape in SHAPES:
        for d, ext in enumerate(shape):
            for n in (2, 3):
                if ext % n:
                    continue
                for order in itertools.permutations(range(n)):
                    yield shape, d, n, order


@pytest.mark.parametrize("shape,d,n,order", list(_cases()))
def test_to_blocks_law(shape, d, n, order):
    x = torch.randn(shape)
    buf = to_blocks(x, d, n, order)
    chunks = torch.chunk(x, n, d)
    for g in range(n):
        assert torch.equal(buf.view(n, -1)[g], chunks[order[g]].reshape(-1))
    in_place = all(e == 1 for e in shape[:d]) and list(order) == sorted(order)
    assert (buf.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()) == in_place


@pytest.mark.parametrize("shape,d,n,order", list(_cases()))
def test_from_blocks_law(shape, d, n, order):
    block = list(shape)
    block[d] //= n
    buf = torch.randn(n * torch.Size(block).numel())
    out = from_blocks(buf, block, d, n, order)
    want = torch.cat([buf.view(n, *block)[order[j]] for j in range(n)], d)
    assert torch.equal(out, want) and out.is_contiguous()
    in_place = all(e == 1 for e in block[:d]) and list(order) == sorted(order)
    assert (out.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()) == in_place


def test_round_trip_of_a_non_contiguous_input():
    x = torch.randn(6, 4).t()  # (4, 6), not contiguous
    buf = to_blocks(x, 0, 2, (0, 1))
    assert torch.equal(from_blocks(buf, (2, 6), 0, 2, (0, 1)), x)
