"""Ops that cut, pad or join along one dim: ``slice``, ``pad``, ``cat``.

Linear: Partial sums and maxes stay Partial (every device pads with zeros, and the sum or the
max of zeros is zero).  Index maps: every dim reads itself except the
cut / padded / joined one, which has no image as a whole.

**Whole parts** (``part_map``; Megatron's fused QKV).  Write ``res(x, e, g)`` for the index
``i mod g`` of a dim of extent ``e`` (``Inner(Root(d, e), e / g)``, or ``Root(d, e)`` when
``g = e``): the position inside a part when the dim is cut into parts of length ``g``.

* slice ``[s, s + n)`` of a dim of extent ``E``, ``g = gcd(s, n, E) > 1``: the range is a run
  of whole parts, and result index ``i' = i - s`` has ``i' mod g = i mod g``, so
  ``Tr(res(x, E, g)) = res(x', n, g)``.  E.g. q = ``[0, H)`` of a fused ``[q | k | v]`` of
  ``3H``: ``Tr(Inner(Root(d, 3H), 3)) = Root(d', H)``, and a sharding of the heads inside each
  part, ``Outer(Inner(Root(d, 3H), 3), p)``, transports to ``Outer(Root(d', H), p)``.
* cat of extents ``A`` and ``B``, ``g = gcd(A, B) > 1``: the result index is ``i`` (first
  operand) or ``A + i`` (second), the same modulo ``g``, so ``Tr(res(x, A, g)) =
  Tr(res(x, B, g)) = res(x', A + B, g)`` (three head-sharded parts cat back to the fused layout).
* pad of a dim of extent ``n`` by ``lo`` and ``hi``, ``g = gcd(lo, n, hi) > 1``: the padding is
  whole parts of zeros, and result index ``i' = lo + i`` has ``i' mod g = i mod g``, so
  ``Tr(res(x, n, g)) = res(x', lo + n + hi, g)`` (the gradient of a slice of whole parts is such a
  pad: a head-sharded q's gradient pads back to the fused layout).

Local step: a device holds the same positions ``P`` (``|P| = g_l``) of every part, in global
order, so its dim is ``E / g`` runs of ``g_l``; the slice of whole parts ``[s, s + n)`` is its
local range ``[s g_l / g, (s + n) g_l / g)`` = ``[s n_l / n, (s + n) n_l / n)`` with ``n_l`` the
result's local extent (``= n`` when the dim is not sharded: the range itself), the cat of
two such locals is their cat, and the pad of whole parts pads its local by ``lo E_l / E`` and
``hi E_l / E`` (``E_l``: the result's local extent of its extent ``E``): the step attributes
``codegen.step_attrs.slicing`` gives.

Gradients (``OpKind.vjp``, ``g`` the result's gradient): a slice's is ``g`` padded with zeros
back to the operand's extent; a pad's is the slice of ``g`` the operand fills; a cat's are the
slices of ``g`` each operand fills.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ReshardError
from ..ids import ID, Inner, Root
from .registry import Image, OpKind, PartImage, StepLike, identity_map, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None


def slice_(f: Fusion, t: Tensor, dim: int, start: int, stop: int, *, name: Name = None) -> Tensor:
    """``t[..., start:stop, ...]`` along ``dim`` (a non-empty range)."""
    f._check(t, "slice")
    d = f._dim(t, dim, "slice")
    start, stop = f._ints((start, stop), "slice", "start and stop")
    if not 0 <= start < stop <= t.shape[d]:
        raise ReshardError(f"slice of {t!r}: [{start}:{stop}) is not a non-empty range inside dim {d} "
                           f"of size {t.shape[d]}")
    shape = list(t.shape)
    shape[d] = stop - start
    return f._op("slice", [t], f._new(shape, t.dtype, t.mesh, name), dim=d, start=start, stop=stop)


slice_.__name__ = slice_.__qualname__ = "slice"


def pad(f: Fusion, t: Tensor, dim: int, lo: int, hi: int, *, name: Name = None) -> Tensor:
    """Zero-pad dim ``dim`` by ``lo`` before and ``hi`` after."""
    f._check(t, "pad")
    d = f._dim(t, dim, "pad")
    lo, hi = f._ints((lo, hi), "pad", "lo and hi")
    if lo < 0 or hi < 0:
        raise ReshardError(f"pad of {t!r}: negative padding ({lo}, {hi})")
    shape = list(t.shape)
    shape[d] += lo + hi
    return f._op("pad", [t], f._new(shape, t.dtype, t.mesh, name), dim=d, lo=lo, hi=hi)


def cat(f: Fusion, ts: Sequence[Tensor], dim: int, *, name: Name = None) -> Tensor:
    """Concatenation, built as a chain of two-operand cats (``name``: the last one's result; one
    operand is returned as it is)."""
    if not isinstance(ts, (list, tuple)):
        raise ReshardError(f"cat: operands must be a list of tensors, got {ts!r}")
    if len(ts) < 1:
        raise ReshardError("cat: no operands")
    for t in ts:
        f._check(t, "cat")
    out = ts[0]
    for k, t in enumerate(ts[1:], start=2):
        d = f._dim(out, dim, "cat")
        if len(t.shape) != len(out.shape) or any(a != b for i, (a, b) in enumerate(zip(out.shape, t.shape))
                                                 if i != d):
            raise ReshardError(f"cat along dim {d}: shapes {out!r} and {t!r} differ off that dim")
        if t.dtype != out.dtype:
            raise ReshardError(f"cat: dtypes differ: {out!r} vs {t!r}")
        mesh = f._same_mesh("cat", out, t)
        shape = list(out.shape)
        shape[d] += t.shape[d]
        out = f._op("cat", [out, t], f._new(shape, out.dtype, mesh, name if k == len(ts) else None), dim=d)
    return out


def residue(dim: int, extent: int, g: int) -> ID:
    """``i mod g`` of dim ``dim`` of ``extent`` (``g | extent``): the position inside a part of length g."""
    return Root(dim, extent) if g == extent else Inner(Root(dim, extent), extent // g)


def whole_parts(dim: int, g: int, operand: int, result: int) -> list[PartImage]:
    """The law of the module docstring: ``res(operand, g) -> res(result, g)`` when ``g > 1``."""
    return [(residue(dim, operand, g), residue(dim, result, g))] if g > 1 else []


class _AlongDim(OpKind):
    """An op along ``attrs["dim"]``: that dim has no image, the others read themselves."""

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        return identity_map(fusion.tensors[op.inputs[slot]].shape, (op.attrs["dim"],))

    def keeps(self, op: Op) -> tuple[str, ...]:
        return ("sum", "max")


@register("slice")
class Slice(_AlongDim):
    builders = {"slice": slice_}

    def ignores_padding(self, fusion: Fusion, op: Op, slot: int) -> tuple[int, ...]:
        """The sliced dim: ``[start, stop)`` lies inside the true extent."""
        return (op.attrs["dim"],)

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return xs[0].narrow(a["dim"], a["start"], a["stop"] - a["start"]).contiguous()

    def shares_operand(self, step: StepLike, ins: list[tuple[tuple[int, ...], str]]) -> int | None:
        """The narrowed view is contiguous, so ``contiguous()`` keeps it, when it is the whole
        dim, every dim before it has extent 1, or it has no elements."""
        shape, d = ins[0][0], step.attr("dim") % len(ins[0][0])
        n = step.attr("stop") - step.attr("start")
        return 0 if n == shape[d] or all(e == 1 for e in shape[:d]) or n == 0 or 0 in shape else None

    def part_map(self, fusion: Fusion, op: Op, slot: int) -> list[PartImage]:
        """A slice of whole parts of length ``gcd(start, n, E)`` (module docstring)."""
        d, s, t = op.attrs["dim"], op.attrs["start"], op.attrs["stop"]
        e = fusion.tensors[op.inputs[0]].shape[d]
        return whole_parts(d, math.gcd(s, t - s, e), e, t - s)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        d = op.attrs["dim"]
        return [f.pad(g, d, op.attrs["start"], xs[0].shape[d] - op.attrs["stop"])]


@register("pad")
class Pad(_AlongDim):
    builders = {"pad": pad}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        x = xs[0]
        return torch.nn.functional.pad(x, [0, 0] * (x.dim() - 1 - a["dim"]) + [a["lo"], a["hi"]])

    def part_map(self, fusion: Fusion, op: Op, slot: int) -> list[PartImage]:
        """A pad by whole parts of length ``gcd(lo, n, hi)`` (module docstring)."""
        d, lo, hi = op.attrs["dim"], op.attrs["lo"], op.attrs["hi"]
        n = fusion.tensors[op.inputs[0]].shape[d]
        return whole_parts(d, math.gcd(lo, n, hi), n, lo + n + hi)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        d, lo = op.attrs["dim"], op.attrs["lo"]
        return [f.slice(g, d, lo, lo + xs[0].shape[d])]


@register("cat")
class Cat(_AlongDim):
    builders = {"cat": cat}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return torch.cat(xs, a["dim"])

    def part_map(self, fusion: Fusion, op: Op, slot: int) -> list[PartImage]:
        """A cat of whole parts of length ``gcd(A, B)`` (module docstring)."""
        d = op.attrs["dim"]
        a, b = (fusion.tensors[i].shape[d] for i in op.inputs)
        return whole_parts(d, math.gcd(a, b), (a, b)[slot], a + b)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        d = op.attrs["dim"]
        a = xs[0].shape[d]
        return [f.slice(g, d, 0, a), f.slice(g, d, a, out.shape[d])]
