"""``unbucket``: a member read back out of a gradient bucket (``reshard.passes.buckets``).

``f.unbucket(x, of)`` reshapes ``x`` to the shape of ``of``, a value of the same Fusion that
``x`` is known to equal elementwise once reshaped (the bucket pass builds ``x`` from ``of`` by
flattening, concatenating with other gradients, slicing its range back out and undoing the
flattening: every step linear and exact).  Everything else is a ``reshape``'s: the index map,
linearity for sum and max, the view cost, the local step.

The law it declares, ``unbucket(x, of) = of``, is what lets the e-graph take the bucket's one
collective as an implementation of ``of``: its nodes join ``of``'s e-classes (``stands_for``,
read by ``search.encode``), so extraction chooses, per bucket and by cost, between each
member's own reduction and the bucket's.  It appears only in Fusions that the bucket pass built
(after ``joint``), so it has no gradient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .alternative import stand_in
from .registry import register
from .views import Reshape

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor


def unbucket(f: Fusion, x: Tensor, of: Tensor, *, name: str | None = None) -> Tensor:
    """``x`` reshaped to ``of``'s shape, declared equal to ``of`` (module docstring)."""
    return stand_in(f, "unbucket", x, of, x.numel == of.numel and x.dtype == of.dtype,
                    "element count or dtype differ", name, shape=of.shape)


@register("unbucket")
class Unbucket(Reshape):
    """A reshape whose result stands for the member value ``of`` (module docstring)."""

    builders = {"unbucket": unbucket}
    bucket = True

    def stands_for(self, op: Op) -> int:
        """The member gradient the result equals: its e-classes are that value's."""
        return int(op.attrs["of"])
