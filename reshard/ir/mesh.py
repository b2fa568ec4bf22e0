"""Device meshes: N-D arrays of distinct ranks with named axes, and the teams along them."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from .errors import ReshardError


def _flatten(devices: Any) -> tuple[tuple[int, ...], list[int]]:
    """Return (shape, row-major flat list) of a nested list of ints; reject ragged input."""
    if hasattr(devices, "tolist"):
        devices = devices.tolist()
    if isinstance(devices, int):
        raise ReshardError("DeviceMesh: devices must be a (nested) list of ints, got a scalar")
    if not isinstance(devices, (list, tuple)):
        raise ReshardError(f"DeviceMesh: devices must be a (nested) list of ints, got {type(devices).__name__}")
    if len(devices) == 0:
        raise ReshardError("DeviceMesh: the mesh is empty")
    if all(isinstance(d, int) and not isinstance(d, bool) for d in devices):
        return (len(devices),), list(devices)
    if any(not isinstance(d, (list, tuple)) for d in devices) and not all(hasattr(d, "tolist") for d in devices):
        raise ReshardError(f"DeviceMesh: ragged or mixed device list {devices!r}")
    subs = [_flatten(d) for d in devices]
    shapes = {s for s, _ in subs}
    if len(shapes) != 1:
        raise ReshardError(f"DeviceMesh: ragged device list {devices!r} (sub-shapes {sorted(shapes)})")
    flat: list[int] = []
    for _, f in subs:
        flat.extend(f)
    return (len(devices),) + subs[0][0], flat


class DeviceMesh:
    """An N-D array of distinct device ids (ranks) with one name per axis.

    ``DeviceMesh([[0, 1], [2, 3]], ("x", "y"))`` has axis "x" of size 2 (rows) and "y" of
    size 2 (columns).  The *team* of rank r along axis a is the ranks that share all of r's
    coordinates except along a, ordered by their coordinate on a.
    """

    def __init__(self, devices: Any, axis_names: Sequence[str] | None = None) -> None:
        shape, flat = _flatten(devices)
        for d in flat:
            if not isinstance(d, int) or isinstance(d, bool) or d < 0:
                raise ReshardError(f"DeviceMesh: device ids must be non-negative ints, got {d!r}")
        dup = sorted({d for d in flat if flat.count(d) > 1})
        if dup:
            raise ReshardError(f"DeviceMesh: duplicate device ids {dup} in {devices!r}")
        if axis_names is None:
            axis_names = tuple("xyzw"[i] if i < 4 else f"a{i}" for i in range(len(shape)))
        axis_names = tuple(axis_names)
        if len(axis_names) != len(shape):
            raise ReshardError(
                f"DeviceMesh: {len(axis_names)} axis names {axis_names} for a {len(shape)}-D mesh of shape {shape}"
            )
        if len(set(axis_names)) != len(axis_names):
            raise ReshardError(f"DeviceMesh: duplicate axis names {axis_names}")
        self.shape: tuple[int, ...] = shape
        self.axis_names: tuple[str, ...] = axis_names
        self.ranks: tuple[int, ...] = tuple(flat)
        self._coords = {r: c for r, c in zip(flat, itertools.product(*[range(s) for s in shape]))}

    @classmethod
    def row_major(cls, shape: Sequence[int], axis_names: Sequence[str] | None = None) -> DeviceMesh:
        """The mesh of ``shape`` whose ranks are 0, 1, ... in row-major order."""
        ranks: Any = list(range(math.prod(shape)))
        for n in reversed(list(shape)[1:]):
            ranks = [ranks[i:i + n] for i in range(0, len(ranks), n)]
        return cls(ranks, axis_names)

    # ---- basic facts -------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return len(self.ranks)

    def __contains__(self, rank: object) -> bool:
        return rank in self._coords

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceMesh) and (self.shape, self.axis_names, self.ranks) == (
            other.shape, other.axis_names, other.ranks)

    def __hash__(self) -> int:
        return hash((self.shape, self.axis_names, self.ranks))

    def __repr__(self) -> str:
        return f"DeviceMesh(shape={self.shape}, axes={self.axis_names}, ranks={list(self.ranks)})"

    def axis_index(self, axis: int | str) -> int:
        """The position of ``axis`` (a name or an index) among the mesh axes."""
        if isinstance(axis, str):
            if axis not in self.axis_names:
                raise ReshardError(f"{self!r} has no axis named {axis!r}")
            return self.axis_names.index(axis)
        if not isinstance(axis, int) or not -self.ndim <= axis < self.ndim:
            raise ReshardError(f"{self!r} has no axis {axis!r}")
        return axis % self.ndim

    def axis_size(self, axis: int | str) -> int:
        return self.shape[self.axis_index(axis)]

    def coords(self, rank: int) -> tuple[int, ...]:
        """Mesh coordinates of ``rank``."""
        if rank not in self._coords:
            raise ReshardError(f"rank {rank} is not in {self!r}")
        return self._coords[rank]

    def rank_at(self, coords: Sequence[int]) -> int:
        idx = 0
        for c, s in zip(coords, self.shape):
            idx = idx * s + c
        return self.ranks[idx]

    # ---- teams -------------------------------------------------------------------
    def team(self, rank: int, axis: int | str) -> tuple[int, ...]:
        """Ranks sharing all of ``rank``'s coordinates except along ``axis``, in axis order."""
        a = self.axis_index(axis)
        c = list(self.coords(rank))
        out = []
        for i in range(self.shape[a]):
            c[a] = i
            out.append(self.rank_at(c))
        return tuple(out)

    def teams(self, axis: int | str) -> list[tuple[int, ...]]:
        """All disjoint teams along ``axis``, in row-major order of their first member."""
        a = self.axis_index(axis)
        seen: list[tuple[int, ...]] = []
        for r in self.ranks:
            if self.coords(r)[a] == 0:
                seen.append(self.team(r, a))
        return seen
