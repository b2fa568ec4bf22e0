"""``tensor_lru``: bounded by bytes and by entries, least recently used dropped first;
``BoundedCache``: bounded by entries, oldest dropped first; ``row_major_strides``."""

from __future__ import annotations

import torch

import pytest

from reshard.ir.strides import row_major_strides
from reshard.ir.tensor_cache import BoundedCache, tensor_lru


def test_bounded_cache_drops_its_oldest_entry_when_full() -> None:
    c: BoundedCache[int, int] = BoundedCache(3)
    for k in range(5):
        c[k] = k * k
    assert list(c.items()) == [(2, 4), (3, 9), (4, 16)]
    c[3] = 0  # an update adds no entry: nothing is dropped
    assert list(c.items()) == [(2, 4), (3, 0), (4, 16)]


@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4), (1, 7, 1, 2)])
def test_row_major_strides_are_a_contiguous_tensors(shape: tuple[int, ...]) -> None:
    assert row_major_strides(shape) == torch.empty(shape).stride()


def test_byte_bound_drops_the_least_recently_used() -> None:
    calls: list[int] = []

    @tensor_lru(max_bytes=3 * 400, max_entries=100)
    def block(i: int) -> torch.Tensor:
        calls.append(i)
        return torch.full((100,), i, dtype=torch.float32)  # 400 bytes

    for i in (0, 1, 2):
        block(i)
    block(0)  # 0 is now the most recent
    block(3)  # over the bound: 1 goes
    assert block.cache_bytes() == 1200
    block(0), block(2), block(3)
    assert calls == [0, 1, 2, 3]
    block(1)
    assert calls == [0, 1, 2, 3, 1]


def test_entry_bound_and_oversized_values() -> None:
    calls: list[int] = []

    @tensor_lru(max_bytes=1000, max_entries=2)
    def make(n: int) -> torch.Tensor:
        calls.append(n)
        return torch.zeros(n, dtype=torch.uint8)

    make(10), make(20), make(30)
    make(10)  # dropped by the entry bound
    assert calls == [10, 20, 30, 10]
    make(5000), make(5000)  # larger than the byte bound: returned, never kept
    assert calls[-2:] == [5000, 5000] and make.cache_bytes() == 40
    make.cache_clear()
    assert make.cache_bytes() == 0


def test_clear_tensor_caches_empties_every_cache() -> None:
    from reshard.ir.tensor_cache import clear_tensor_caches

    @tensor_lru()
    def ones(n: int) -> torch.Tensor:
        return torch.ones(n)

    ones(10)
    assert ones.cache_bytes() == 40
    clear_tensor_caches()
    assert ones.cache_bytes() == 0
