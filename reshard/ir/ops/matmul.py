"""``matmul``: ``a [*batch, m, k] @ b [k, n]`` or ``b [*batch, k, n]``.

Six index maps (transport codes), read off its einsum spec (``einsum_spec``:
``Bmk,kn->Bmn`` or ``Bmk,Bkn->Bmn``; ``registry.einsum_slots``): 0/1 lhs/rhs into the result;
2/3 lhs/rhs into the contraction space (a 1-D space, root 0 = the contracted dim); 4/5 only the
lhs/rhs dims that a shard may keep while the other operand is whole (lhs m, plus lhs batch when
rhs is 2-D and broadcasts; rhs n).  Its strategies are ``propagation``'s ``mm`` rules; its cost
is the roofline law (``cost-matmul``).  The local step (``runtime.cpu_steps.matmul``) reads an
operand marked ``transposed`` (an apply plan node's ``transposed``, ``rules.alias``) as a
transposed view (``operands``); on GPUs it is cuBLAS.

Gradients (``OpKind.vjp``, ``g [*batch, m, n]``): ``a`` gets ``g @ b^T``; a batched ``b`` gets
``a^T @ g``, a 2-D ``b`` (shared by every batch) the sum over the batch, one matmul over the
batch dims merged into the contraction: ``a2^T @ g2`` with ``a2 [batch·m, k]``, ``g2 [batch·m,
n]``.  The transposes are permutes (read as transposed views, ``alias``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import check_kind
from ..errors import ReshardError
from .registry import Image, OpKind, StepLike, einsum_slots, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None


def matmul(f: Fusion, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor:
    """``a [*batch, m, k] @ b [k, n]`` or ``b [*batch, k, n]`` (same batch dims)."""
    f._check(a, "matmul", "lhs")
    f._check(b, "matmul", "rhs")
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ReshardError(f"matmul: operands must be at least 2-D, got {a!r} @ {b!r}")
    if a.shape[-1] != b.shape[-2]:
        raise ReshardError(f"matmul: contraction sizes differ: {a!r} @ {b!r} ({a.shape[-1]} vs {b.shape[-2]})")
    if len(b.shape) > 2 and b.shape[:-2] != a.shape[:-2]:
        raise ReshardError(f"matmul: batch dims differ: {a!r} @ {b!r}")
    if a.dtype != b.dtype:
        raise ReshardError(f"matmul: dtypes differ: {a!r} @ {b!r}")
    check_kind("matmul", a, ("float",), "lhs")
    mesh = f._same_mesh("matmul", a, b)
    return f._op("matmul", [a, b], f._new(a.shape[:-1] + (b.shape[-1],), a.dtype, mesh, name))


def einsum_spec(a: Sequence[int], b: Sequence[int]) -> str:
    """Matmul as an einsum (``ABmk,kn->ABmn``; a batched rhs ``ABmk,ABkn->ABmn``): its transport
    slots (``registry.einsum_slots``)."""
    batch = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:len(a) - 2]
    return f"{batch}mk,{batch if len(b) > 2 else ''}kn->{batch}mn"


@register("matmul")
class Matmul(OpKind):
    builders = {"matmul": matmul}
    strategy = "mm"
    cost = "matmul"

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return torch.matmul(xs[0], xs[1])

    def slots(self, op: Op) -> int:
        return 6

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        """The slots of ``einsum_spec``."""
        shapes = [fusion.tensors[i].shape for i in op.inputs]
        return einsum_slots(einsum_spec(*shapes), shapes)[slot]

    def reduced_dims(self, fusion: Fusion, op: Op, slot: int) -> dict[int, tuple[str, int]]:
        """The contraction: the lhs's last dim and the rhs's second-to-last, summed together."""
        nd = len(fusion.tensors[op.inputs[slot]].shape)
        return {nd - 1 if slot == 0 else nd - 2: ("sum", 0)}

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        a, b = saved(xs[0]), saved(xs[1])
        ga = f.matmul(g, _transposed(f, b))
        if len(b.shape) > 2:
            return [ga, f.matmul(_transposed(f, a), g)]
        if len(a.shape) > 2:
            a, g = f.reshape(a, (-1, a.shape[-1])), f.reshape(g, (-1, g.shape[-1]))
        return [ga, f.matmul(_transposed(f, a), g)]


def operands(step: StepLike, xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A matmul step's operands as it reads them: an operand the step marks ``transposed``
    (``rules.alias``) is the buffer of the permute's operand, read as a transposed view (no copy)."""
    ta, tb = step.attr("transposed", (False, False))
    return xs[0].transpose(-1, -2) if ta else xs[0], xs[1].transpose(-1, -2) if tb else xs[1]


def _transposed(f: Fusion, t: Tensor) -> Tensor:
    """``t`` with its last two dims swapped."""
    n = len(t.shape)
    return f.permute(t, tuple(range(n - 2)) + (n - 1, n - 2))
