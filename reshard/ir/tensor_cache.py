"""Bounded caches: ``BoundedCache``, a dict of at most a given number of entries (the memo
tables of kernels, launches and remap steps), and ``tensor_lru``, a least-recently-used cache of
functions that return tensors, bounded by the bytes it holds as well as by its number of entries.

The runtime caches index tensors per (sharding, coordinates): their size is the local tensor's,
so a count bound alone (``functools.lru_cache(4096)``) can hold gigabytes once tensors are large
(a vocab of 50257 rows, logits of 64 x 131072).  Entries past either bound are dropped oldest
first; a single entry larger than the byte bound is returned but not kept.  The default byte bound
holds a large plan's working set (a 7B layer's remap indices are 134 MB each, several per rank);
below it every step would rebuild its index.

``retained()`` collects what the caches return inside a block: a CUDA graph that captured reads
of cached tensors (``runtime.cuda_graph``) keeps them alive after a cache drops them.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(dict[K, V]):
    """A dict of at most ``limit`` entries: adding one to a full cache first drops the oldest
    entry (insertion order), so a process that keeps meeting new keys holds at most ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: K, value: V) -> None:
        if key not in self and len(self) >= self.limit:
            del self[next(iter(self))]
        super().__setitem__(key, value)


#: default byte bound of one cache
DEFAULT_BYTES = 4 << 30

_CLEARS: list[Callable[[], None]] = []
#: the lists of the open ``retained()`` blocks, innermost last
_RETAINED: list[list[Any]] = []


def clear_tensor_caches() -> None:
    """Empty every ``tensor_lru`` cache of the process."""
    for clear in _CLEARS:
        clear()


@contextmanager
def retained() -> Iterator[list[Any]]:
    """A list that gets every value a ``tensor_lru`` cache returns inside the block (hit or
    miss), so the holder of the list keeps those tensors alive whatever the caches drop later."""
    held: list[Any] = []
    _RETAINED.append(held)
    try:
        yield held
    finally:  # by identity: two lists of tensors do not compare
        del _RETAINED[next(i for i, h in enumerate(_RETAINED) if h is held)]


def _nbytes(v: Any) -> int:
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


def tensor_lru(max_bytes: int = DEFAULT_BYTES, max_entries: int = 4096) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorator: cache ``fn(*args)`` (hashable positional arguments) under both bounds.
    The wrapper has ``cache_clear()`` and ``cache_bytes()``."""
    def deco(fn: Callable[..., T]) -> Callable[..., T]:
        cache: OrderedDict[tuple[Hashable, ...], T] = OrderedDict()
        held = [0]

        @functools.wraps(fn)
        def wrapper(*args: Hashable) -> T:
            if args in cache:
                cache.move_to_end(args)
                value = cache[args]
            else:
                value = _stored(args, fn(*args))
            if _RETAINED:
                _RETAINED[-1].append(value)
            return value

        def _stored(args: tuple[Hashable, ...], value: T) -> T:
            size = _nbytes(value)
            if size > max_bytes:
                return value
            cache[args] = value
            held[0] += size
            while held[0] > max_bytes or len(cache) > max_entries:
                _, old = cache.popitem(last=False)
                held[0] -= _nbytes(old)
            return value

        def cache_clear() -> None:
            cache.clear()
            held[0] = 0

        _CLEARS.append(cache_clear)
        wrapper.cache_clear = cache_clear  # type: ignore[attr-defined]
        wrapper.cache_bytes = lambda: held[0]  # type: ignore[attr-defined]
        return wrapper
    return deco
