"""IterDomains: index functions of a tensor's global index, built by split and merge.

An IterDomain (ID) is a term over a tensor's root dims that denotes an integer-valued
function of the global index ``i = (i_0, ..., i_{k-1})`` with a known extent:

=================  ===========================  =========================
term               value at index i             extent
=================  ===========================  =========================
``Root(d, e)``     ``i_d``                       ``e``
``Outer(x, p)``    ``x(i) // (ext(x) / p)``      ``p``
``Inner(x, p)``    ``x(i) %  (ext(x) / p)``      ``ext(x) / p``
``Merge(x, y)``    ``x(i) * ext(y) + y(i)``      ``ext(x) * ext(y)``
=================  ===========================  =========================

``Outer(x, p)`` / ``Inner(x, p)`` require ``p | ext(x)``.  A mesh axis of size n bound to
an ID of extent n selects, on the device with coordinate c, the elements where the ID
equals c.  ``Shard(d)`` on that axis is ``Outer(Root(d, e), n)``; cyclic sharding is
``Inner(Root(d, e), e // n)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from .errors import ReshardError


@dataclass(frozen=True)
class Root:
    dim: int
    extent: int

    def __str__(self) -> str:
        return f"i{self.dim}[{self.extent}]"


@dataclass(frozen=True)
class Outer:
    x: "ID"
    parts: int

    def __str__(self) -> str:
        return f"outer({self.x},{self.parts})"


@dataclass(frozen=True)
class Inner:
    x: "ID"
    parts: int

    def __str__(self) -> str:
        return f"inner({self.x},{self.parts})"


@dataclass(frozen=True)
class Merge:
    x: "ID"
    y: "ID"

    def __str__(self) -> str:
        return f"merge({self.x},{self.y})"


ID = Union[Root, Outer, Inner, Merge]


def extent(x: ID) -> int:
    """Extent of an ID; raises ReshardError when a split does not divide its input."""
    if isinstance(x, Root):
        return x.extent
    if isinstance(x, (Outer, Inner)):
        e = extent(x.x)
        if x.parts <= 0 or e % x.parts:
            raise ReshardError(f"IterDomain {x}: {x.parts} parts do not divide extent {e} of {x.x}")
        return x.parts if isinstance(x, Outer) else e // x.parts
    if isinstance(x, Merge):
        return extent(x.x) * extent(x.y)
    raise ReshardError(f"not an IterDomain: {x!r}")


def root_dims(x: ID) -> frozenset[int]:
    """The tensor dims an ID reads."""
    if isinstance(x, Root):
        return frozenset({x.dim})
    if isinstance(x, (Outer, Inner)):
        return root_dims(x.x)
    return root_dims(x.x) | root_dims(x.y)


def check_roots(x: ID, shape: tuple[int, ...], where: object) -> None:
    """Every Root in ``x`` must name a dim of ``shape`` with its true extent (``where``: what
    an error message names, formatted only then)."""
    if isinstance(x, Root):
        if not 0 <= x.dim < len(shape) or shape[x.dim] != x.extent:
            raise ReshardError(f"{where}: IterDomain {x} does not match tensor shape {shape}")
        return
    if isinstance(x, (Outer, Inner)):
        check_roots(x.x, shape, where)
    else:
        check_roots(x.x, shape, where)
        check_roots(x.y, shape, where)
    extent(x)


def evaluate(x: ID, index: list[torch.Tensor]) -> torch.Tensor:
    """The ID's value at the (broadcastable) per-dim index tensors ``index``."""
    if isinstance(x, Root):
        return index[x.dim]
    if isinstance(x, Outer):
        return torch.div(evaluate(x.x, index), extent(x.x) // x.parts, rounding_mode="floor")
    if isinstance(x, Inner):
        return torch.remainder(evaluate(x.x, index), extent(x.x) // x.parts)
    return evaluate(x.x, index) * extent(x.y) + evaluate(x.y, index)
