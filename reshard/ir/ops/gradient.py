"""Autodiff's op kinds (``reshard.passes.autodiff``): ``detach``, ``saved``, ``grad_seed``.

* ``detach(t)``: the identity with no gradient (torch's ``detach``).  The training converter
  reads the max that softmax and logsumexp subtract through it: ``softmax(x - m)`` does not
  depend on ``m``, so the gradient through ``m`` is zero and need not be formed.
* ``saved(t)``: the identity; the forward / backward boundary.  Autodiff reads every forward
  value a vjp needs through it (once per value), so the values a plan keeps across the two
  passes are exactly the ``saved`` results.  Every value downstream of a ``saved`` op or of the
  seed is backward phase, every other one forward phase (structural: no attribute).
* ``grad_seed(loss)``: ones shaped like ``loss`` (d loss / d loss).  It reads ``loss`` only so
  that it is ordered after it; its values do not depend on it.

``detach`` and ``saved`` are linear (a Partial sum or max stays Partial through an identity)
and cost nothing: their local step returns the operand's buffer itself (an alias, like a
reshape's view), so the cost law is ``view``.  ``grad_seed`` keeps no Partial (the ones of a
Partial loss are not a sum of ones) and writes its result (``mem``); on a GPU it is one fill
kernel (``runtime.gpu_steps.gradient``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import check_kind
from .registry import OpKind, StepLike, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None


def detach(f: Fusion, t: Tensor, *, name: Name = None) -> Tensor:
    """``t``, with no gradient flowing back through it (``torch.Tensor.detach``)."""
    f._check(t, "detach")
    return f._op("detach", [t], f._new(t.shape, t.dtype, t.mesh, name))


def saved(f: Fusion, t: Tensor, *, name: Name = None) -> Tensor:
    """``t`` as the backward pass reads it (the forward / backward boundary)."""
    f._check(t, "saved")
    return f._op("saved", [t], f._new(t.shape, t.dtype, t.mesh, name))


def grad_seed(f: Fusion, loss: Tensor, *, name: Name = None) -> Tensor:
    """Ones shaped like ``loss`` (a float tensor): the gradient of the loss by itself."""
    f._check(loss, "grad_seed")
    check_kind("grad_seed", loss, ("float",))
    return f._op("grad_seed", [loss], f._new(loss.shape, loss.dtype, loss.mesh, name))


class Identity(OpKind):
    """The identity: linear for sum and max; the local step is the operand's buffer (free)."""

    cost = "view"

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return xs[0]

    def keeps(self, op: Op) -> tuple[str, ...]:
        return ("sum", "max")

    def shares_operand(self, step: StepLike, ins: list[tuple[tuple[int, ...], str]]) -> int | None:
        """The operand's buffer itself."""
        return 0


@register("detach")
class Detach(Identity):
    builders = {"detach": detach}
    stops_gradient = True

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        """``torch.Tensor.detach`` (the same values, no copy; torch's autograd stops too)."""
        return xs[0].detach()

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """No gradient: ``detach`` cuts the graph."""
        return [None]


@register("saved")
class Saved(Identity):
    builders = {"saved": saved}
    boundary = "saved"
    #: keeping costs the value's read in the backward pass (and its write in the forward pass where
    #: it would otherwise stay in registers, ``ir.fused_values.in_registers``): ``rules.remat``'s
    #: ``cost-keep``, not a view's 0
    cost = "kept"

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """The identity's: ``g``."""
        return [g]


@register("grad_seed")
class GradSeed(OpKind):
    builders = {"grad_seed": grad_seed}
    boundary = "seed"

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return torch.ones_like(xs[0])

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """None: the ones do not depend on the loss's values."""
        return [None]
