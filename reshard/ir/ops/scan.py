"""``cumsum``: the inclusive prefix sum along one dim (``torch.cumsum``).

Index map: the scanned dim has no image (every result element reads all the elements before
it along that dim, so a sharded scanned dim must be gathered first); the other dims read
themselves, so they may stay sharded.  Linear: ``cumsum(x_0 + x_1) = cumsum(x_0) +
cumsum(x_1)``, so a Partial sum stays Partial; a Partial max does not (the prefix sums of
lower bounds are not lower bounds whose max is the prefix sum).  Float and int tensors; an
int cumsum keeps its dtype (torch would widen int32 to int64).  No generated kernel: on a
GPU the step runs with torch.

Gradient (``OpKind.vjp``): the suffix sum of ``g``, ``gx_i = sum_{j >= i} g_j``, written with
the prefix sum as ``total - cumsum(g)_i + g_i`` (``total``: ``g`` summed along the dim,
broadcast back); the IR has no flip.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import check_kind
from .reductions import sum_over
from .registry import Image, OpKind, identity_map, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None


def cumsum(f: Fusion, t: Tensor, dim: int, *, name: Name = None) -> Tensor:
    """The inclusive prefix sum of ``t`` along ``dim`` (``torch.cumsum``), in t's dtype."""
    f._check(t, "cumsum")
    check_kind("cumsum", t, ("float", "int"))
    d = f._dim(t, dim, "cumsum")
    return f._op("cumsum", [t], f._new(t.shape, t.dtype, t.mesh, name), dim=d)


@register("cumsum")
class Cumsum(OpKind):
    builders = {"cumsum": cumsum}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return torch.cumsum(xs[0], a["dim"], dtype=xs[0].dtype)

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        return identity_map(fusion.tensors[op.inputs[slot]].shape, (op.attrs["dim"],))

    def keeps(self, op: Op) -> tuple[str, ...]:
        return ("sum",)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        d = op.attrs["dim"]
        kept = tuple(k for k in range(len(g.shape)) if k != d)  # a 1-D g sums to ()
        total = f.broadcast(sum_over(f, g, (d,)), g.shape, kept)
        return [f.add(f.sub(total, cumsum(f, g, d)), g)]
