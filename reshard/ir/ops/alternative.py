"""``alternative``: a value computed another way, declared equal to a value of the same Fusion.

``f.alternative(x, of)`` is ``x`` (the identity: linear for sum and max, a view, the operand's
buffer as its local step), where ``x`` is known to equal ``of`` elementwise (the same shape
and dtype): ``rules.attention`` builds the decomposed form of an ``attention`` op from its
operands and declares it equal to the op's result.  The law ``alternative(x, of) = of`` is what
lets the e-graph take the other way as an implementation of ``of``: its nodes join ``of``'s
e-classes (``stands_for``, read by ``search.encode``), so extraction chooses between the two by
cost.  It appears only in Fusions that such a pass built (after ``joint``), so it has no gradient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ReshardError
from .gradient import Identity
from .registry import register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor


def stand_in(f: Fusion, kind: str, x: Tensor, of: Tensor, fits: bool, why: str, name: str | None,
             **attrs: object) -> Tensor:
    """Op ``kind`` of ``x`` with ``of``'s shape, dtype and mesh, declared equal to ``of``
    (attribute ``of``, read by its ``stands_for``); ``fits``: whether ``x`` can hold ``of``
    (else a ``ReshardError`` saying ``why``)."""
    f._check(x, kind)
    f._check(of, kind, "value")
    f._same_mesh(kind, x, of)
    if not fits:
        raise ReshardError(f"{kind}: {x!r} cannot hold {of!r} ({why})")
    return f._op(kind, [x], f._new(of.shape, of.dtype, of.mesh, name), of=of.id, **attrs)


def alternative(f: Fusion, x: Tensor, of: Tensor, *, name: str | None = None) -> Tensor:
    """``x``, declared equal to ``of`` (module docstring)."""
    return stand_in(f, "alternative", x, of, x.shape == of.shape and x.dtype == of.dtype, "shape or dtype differ",
                    name)


@register("alternative")
class Alternative(Identity):
    """The identity whose result stands for the value ``of`` (module docstring)."""

    builders = {"alternative": alternative}

    def stands_for(self, op: Op) -> int:
        """The value the result equals: its e-classes are that value's."""
        return int(op.attrs["of"])
