"""The general form of a ``remap`` step (:mod:`reshard.runtime.local_ops`): its gather index.

``remap_index(mode, src, dst, axis, coords)`` is the flat index a remap gathers on the device
at ``coords``, built from the source and destination shardings' element sets
(``TensorSharding.local_indices``); ``_take`` applies one (the reference the fast path of
:mod:`reshard.runtime.remap_fast` is tested against).  ``StridedMap`` is the affine form such
an index has between block shardings (recovered by ``remap_form.strided_form``, derived by
``remap_analytic.analytic_form``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir.errors import ReshardError
from ..ir.sharding import TensorSharding
from ..ir.tensor_cache import tensor_lru


@tensor_lru()
def _local_indices(ts: TensorSharding, coords: tuple[int, ...]) -> torch.Tensor:
    return ts.local_indices(coords).reshape(-1)


def _with(coords: tuple[int, ...], axis: int, j: int) -> tuple[int, ...]:
    c = list(coords)
    c[axis] = j
    return tuple(c)


def positions(pool: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """Index into ``pool`` of every element of ``wanted`` (all must be present)."""
    order = torch.argsort(pool)
    sorted_pool = pool[order]
    idx = torch.searchsorted(sorted_pool, wanted).clamp_(max=max(len(pool) - 1, 0))
    if len(pool) == 0 or not torch.equal(sorted_pool[idx], wanted):
        raise ReshardError("internal: a remap needs elements its source does not hold")
    return order[idx]


def _take(x: torch.Tensor, pos: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    flat = x.reshape(-1)
    n = pos.numel()
    if n and int(pos[-1]) - int(pos[0]) == n - 1 and torch.equal(pos, torch.arange(int(pos[0]), int(pos[0]) + n)):
        return flat[int(pos[0]):int(pos[0]) + n].view(shape)
    return flat[pos.to(flat.device)].view(shape)


@tensor_lru()
def remap_index(mode: str, src: TensorSharding, dst: TensorSharding, axis: int,
                coords: tuple[int, ...]) -> torch.Tensor:
    """The gather index a remap applies on the device at ``coords``."""
    n = src.mesh.shape[axis] if axis >= 0 else 1
    mine = _local_indices(dst, coords)
    if mode == "slice":
        return positions(_local_indices(src, coords), mine)
    if mode == "gather":
        pool = torch.cat([_local_indices(src, _with(coords, axis, j)) for j in range(n)])
        return positions(pool, mine)
    if mode == "scatter":
        have = _local_indices(src, coords)
        return torch.cat([positions(have, _local_indices(dst, _with(coords, axis, j))) for j in range(n)])
    if mode == "pieces":
        have = _local_indices(src, coords)
        pieces = [positions(have, _local_indices(dst, dst.mesh.coords(r))) for r in dst.mesh.ranks]
        return torch.cat([pieces[0]] + pieces)
    if mode in ("a2a_send", "a2a_recv"):
        have = _local_indices(src, coords)
        chunks = []
        for j in range(n):
            if mode == "a2a_send":
                want = _local_indices(dst, _with(coords, axis, j))
                chunks.append(positions(have, want[torch.isin(want, have)]))
            else:
                other = _local_indices(src, _with(coords, axis, j))
                chunks.append(mine[torch.isin(mine, other)])
        sizes = {c.numel() for c in chunks}
        if len(sizes) != 1:
            raise ReshardError(f"internal: all-to-all from {src} to {dst} needs uneven chunks {sorted(sizes)}")
        if mode == "a2a_send":
            return torch.cat(chunks)
        return positions(torch.cat(chunks), mine)
    raise ReshardError(f"unknown remap mode {mode!r}")


@dataclass(frozen=True)
class StridedMap:
    """``out.flatten()[i] = in.flatten()[offset + sum(c_j * strides[j])]`` with ``c`` the
    row-major coordinates of ``i`` in ``shape`` (strides >= 0, in elements)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def is_range(self) -> bool:
        """True when the map reads ``offset .. offset + numel`` in order (a plain slice)."""
        expect = 1
        for s, st in zip(reversed(self.shape), reversed(self.strides)):
            if s != 1 and st != expect:
                return False
            expect *= s
        return True

    def index(self) -> torch.Tensor:
        """The flat int64 gather index this map stands for."""
        idx = torch.full((1,) * len(self.shape), self.offset, dtype=torch.long)
        for j, (s, st) in enumerate(zip(self.shape, self.strides)):
            view = [1] * len(self.shape)
            view[j] = s
            idx = idx + torch.arange(s, dtype=torch.long).view(view) * st
        return idx.expand(self.shape).reshape(-1)
