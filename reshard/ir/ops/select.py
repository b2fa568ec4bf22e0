"""``where`` (select by a bool condition), built from the two-operand op ``masked``.

``masked(x, c, keep)`` is ``x`` where ``c == keep`` and zero (``0``, ``False``) elsewhere: an
elementwise op of two operands of the same shape (``c`` bool), so it is an ordinary ``binop``
of the e-graph (both operands transport to the result's distribution).  ``where(c, a, b)`` is

    where(c, a, b) = masked(a, c, True) + masked(b, c, False)      (``logical_or`` for bools)

Law: at every element exactly one term is the selected operand's value and the other is an
exact zero (chosen by ``torch.where``, never multiplied), and ``v + 0 == v`` for every value
``v`` (inf and NaN included; ``-0.0`` becomes ``+0.0``, equal as a value), ``v or False == v``;
so the sum is ``where``'s value whatever the unselected operand holds.  A three-operand op
would need a strategy relation of its own in the e-graph; this decomposition reuses ``binop``
and ``add``, and every step is local.

Partial: ``masked`` keeps none.  (It is linear in ``x`` for a fixed ``c``, but ``c`` is a bool
and bool values are never Partial, and ``binop`` needs both operands at one distribution.)

Gradient (``OpKind.vjp``): ``masked(g, c, keep)`` for ``x`` (the same selection of ``g``), none
for the condition.

Kernel: ``masked`` is elementwise and joins fused pointwise chains (``codegen.fuse``) as the
instruction ``("masked", x, c, keep)``, whose CUDA expression (``codegen.elementwise_cuda``'s
``MASKED_CUDA[keep]``) is over
the values ``{x}`` and ``{c}`` (a bool is the float 0 or 1 in a kernel; an int ``x`` a 64-bit
int) and the zero ``{zero}`` of ``x``'s register type: the kept operand's value as it is (NaN
and inf included), exactly ``0`` elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import check_kind
from ..errors import ReshardError
from .elementwise import Pointwise
from .registry import register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None

def masked_values(x: torch.Tensor, c: torch.Tensor, keep: bool) -> torch.Tensor:
    """``masked``'s semantics on torch tensors: ``x`` where ``c == keep``, zero elsewhere."""
    return torch.where(c if keep else ~c, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked(f: Fusion, x: Tensor, c: Tensor, keep: bool, *, name: Name = None) -> Tensor:
    """``x`` where ``c == keep``, zero elsewhere (``c`` bool, same shape as ``x``)."""
    f._check(x, "masked")
    f._check(c, "masked", "condition")
    check_kind("masked", c, ("bool",), "condition")
    if not isinstance(keep, bool):
        raise ReshardError(f"masked of {x!r}: keep must be a bool, got {keep!r}")
    if x.shape != c.shape:
        raise ReshardError(f"masked: shapes differ: {x!r} vs condition {c!r}")
    mesh = f._same_mesh("masked", x, c)
    return f._op("masked", [x, c], f._new(x.shape, x.dtype, mesh, name), keep=keep)


def where(f: Fusion, cond: Tensor, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor:
    """``a`` where ``cond``, else ``b`` (``torch.where``): ``cond`` bool, ``a`` and ``b`` of one
    dtype, all three of one shape.  Built as ``masked(a, cond, True) + masked(b, cond, False)``
    (module docstring: the law)."""
    f._check(cond, "where", "condition")
    f._check(a, "where", "lhs")
    f._check(b, "where", "rhs")
    check_kind("where", cond, ("bool",), "condition")
    if not a.shape == b.shape == cond.shape:
        raise ReshardError(f"where: shapes differ: condition {cond!r}, lhs {a!r}, rhs {b!r}")
    if a.dtype != b.dtype:
        raise ReshardError(f"where: operand dtypes differ: lhs {a!r} vs rhs {b!r}; cast one first")
    f._same_mesh("where", cond, a, b)
    ta, tb = masked(f, a, cond, True), masked(f, b, cond, False)
    return f.binary("logical_or" if a.dtype == "bool" else "add", ta, tb, name=name)


@register("masked")
class Masked(Pointwise):
    builders = {"masked": masked, "where": where}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return masked_values(xs[0], xs[1], a["keep"])

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        return [masked(f, g, saved(xs[1]), op.attrs["keep"]), None]
