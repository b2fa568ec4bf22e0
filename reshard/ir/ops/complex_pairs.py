"""``complex_mul``: the product of complex tensors held as pairs of reals.

A complex tensor of shape ``S`` is held as a float tensor of shape ``S + (2,)`` (the last dim:
real part, imaginary part; ``torch.view_as_real``'s layout), so every view and every op that is
linear over the reals (add, sub, neg, scale, sums) is the same op on the pairs; the product is
not, and is this op: ``complex_mul(a, b) = (a_re b_re - a_im b_im, a_re b_im + a_im b_re)``
along the pair dim, or ``a * conj(b)`` with ``conj=True``.  Operands of one shape (ending in 2)
and one float dtype; the frontend broadcasts them first (``frontend.aten_complex``).

Why one op and not the frontend's composition of existing ones (two slices of the pair dim per
operand, four ``mul``, ``sub``, ``add``, a ``cat``): one memory-bound step instead of about ten
(slices and cats join no fused pointwise kernel, and each costs a launch and a pass over the
data), one e-graph value instead of ten (planning time), a backward that is itself, and an index
map that states directly that the pair dim is never sharded across the product.

Index map: the pair dim has no image (each result element reads both parts of both operands,
so a pair dim sharded by some mesh axis is gathered first); every other dim reads itself, so
it may stay sharded (heads-sharded rotary embeddings run locally).  Linearity: none (a product,
like ``mul``: two Partial operands would not give a Partial product).  No generated kernel: on
a GPU the step runs with torch.

Gradient (``OpKind.vjp``; a real loss, torch's convention for complex gradients): for ``y = a b``,
``ga = g conj(b)``, ``gb = g conj(a)``; for ``y = a conj(b)``, ``ga = g b``, ``gb = a conj(g)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import check_kind
from ..errors import ReshardError
from .registry import Image, OpKind, identity_map, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None


def complex_mul(f: Fusion, a: Tensor, b: Tensor, *, conj: bool = False, name: Name = None) -> Tensor:
    """``a * b`` (``a * conj(b)`` with ``conj``) of complex tensors held as pairs of reals
    (the last dim, of extent 2: real and imaginary parts); one shape, one float dtype."""
    f._check(a, "complex_mul", "lhs")
    f._check(b, "complex_mul", "rhs")
    if a.shape != b.shape:
        raise ReshardError(f"complex_mul: operand shapes differ: lhs {a!r} vs rhs {b!r}")
    if not a.shape or a.shape[-1] != 2:
        raise ReshardError(f"complex_mul: operands must end in a pair dim of extent 2 (real, imaginary); got {a!r}")
    if a.dtype != b.dtype:
        raise ReshardError(f"complex_mul: operand dtypes differ: lhs {a!r} vs rhs {b!r}; cast one first")
    check_kind("complex_mul", a, ("float",))
    mesh = f._same_mesh("complex_mul", a, b)
    return f._op("complex_mul", [a, b], f._new(a.shape, a.dtype, mesh, name), conj=bool(conj))


def product(a: torch.Tensor, b: torch.Tensor, conj: bool) -> torch.Tensor:
    """The pairs of ``a * b`` (``a * conj(b)``) on torch tensors of pairs."""
    ar, ai = a.unbind(-1)
    br, bi = b.unbind(-1)
    if conj:
        bi = -bi
    return torch.stack((ar * br - ai * bi, ar * bi + ai * br), -1)


@register("complex_mul")
class ComplexMul(OpKind):
    builders = {"complex_mul": complex_mul}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return product(xs[0], xs[1], a["conj"])

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        shape = fusion.tensors[op.inputs[slot]].shape
        return identity_map(shape, (len(shape) - 1,))

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        a, b = saved(xs[0]), saved(xs[1])
        if op.attrs["conj"]:
            return [complex_mul(f, g, b), complex_mul(f, a, g, conj=True)]
        return [complex_mul(f, g, b, conj=True), complex_mul(f, g, a, conj=True)]
