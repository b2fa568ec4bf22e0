"""Layout ops: ``reshape``, ``permute``, ``broadcast`` (and the ``broadcast_to`` / ``expand_as``
builders).  All are linear: a Partial operand (sum or max) stays Partial through them.

Index maps: a reshape factors into merges and splits (``reshape_map``); a permute moves each
root to its new position; a broadcast reads operand dim i at result dim ``dims[i]`` (an
expanded extent-1 dim has no image).  A broadcast's result may still be sharded along
its expanded dims without communication (``expanded_dims``, ``rules.expand``).

Gradients (``OpKind.vjp``, ``g`` the result's gradient): a reshape's is ``g`` reshaped back, a
permute's ``g`` permuted by the inverse, a movedim's ``g`` moved back; a broadcast's is ``g``
summed over the result dims no operand dim maps to at its extent (new and expanded dims), then
reshaped to the operand's shape (each operand element was read by every element of them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ReshardError
from ..ids import ID, Inner, Merge, Outer, Root
from .reductions import sum_over
from .registry import Image, OpKind, StepLike, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """The groups of a reshape from ``src`` to ``dst``: (operand dims, result dims) whose extents
    have equal products, in order, dims of extent 1 left out (each group's lists are non-empty)."""
    out: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while True:
        while i < len(src) and src[i] == 1:
            i += 1
        while j < len(dst) and dst[j] == 1:
            j += 1
        if i >= len(src) or j >= len(dst):
            return out
        gi, gj, pi, pj = [i], [j], src[i], dst[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(i)
                pi *= src[i]
                i += 1
            else:
                gj.append(j)
                pj *= dst[j]
                j += 1
        out.append(([d for d in gi if src[d] != 1], [d for d in gj if dst[d] != 1]))


def reshape_map(src: tuple[int, ...], dst: tuple[int, ...]) -> list[Image]:
    """Each src root as a term over dst roots (size-1 dims map to nothing).  In a group of
    operand dims [e_1..e_p] and result dims whose products agree (``reshape_groups``), with
    M = Merge of the result roots, operand dim t = Outer(Inner(M, e_1..e_{t-1}), e_t)."""
    out: list[Image] = [None] * len(src)
    for gi, gj in reshape_groups(src, dst):
        m: ID = Root(gj[-1], dst[gj[-1]])
        for d in reversed(gj[:-1]):
            m = Merge(Root(d, dst[d]), m)
        before = 1
        for t, d in enumerate(gi):
            x: ID = m if before == 1 else Inner(m, before)
            out[d] = x if t == len(gi) - 1 else Outer(x, src[d])
            before *= src[d]
    return out


def is_transpose_view(perm: tuple[int, ...]) -> bool:
    """Does permute ``perm`` swap the last two dims and keep the others (a matmul can read it
    as a transposed view)?"""
    n = len(perm)
    return n >= 2 and tuple(perm) == tuple(range(n - 2)) + (n - 1, n - 2)


def keeps_last_dim(perm: Sequence[int]) -> bool:
    """Does permute ``perm`` (a dim may be counted from the end) leave the last dim last (its
    result read row by row from its operand: a strided view SDPA and the pointwise kernels read)?"""
    n = len(perm)
    return n > 0 and perm[-1] % n == n - 1


def inverse_permutation(perm: Sequence[int]) -> tuple[int, ...]:
    """The permute undoing ``perm``: its dim k is where ``perm`` put operand dim k."""
    return tuple(list(perm).index(k) for k in range(len(perm)))


def broadcast_tensor(x: torch.Tensor, shape: tuple[int, ...], dims: tuple[int, ...]) -> torch.Tensor:
    """``x`` with dim i placed at result dim ``dims[i]``, expanded to ``shape`` (contiguous).
    The same code is the global reference and the local step (``shape`` = local shape)."""
    view = [1] * len(shape)
    for i, d in enumerate(dims):
        view[d] = x.shape[i]
    return x.reshape(view).expand(tuple(shape)).contiguous()


# ---- builders ------------------------------------------------------------------------

def reshape(f: Fusion, t: Tensor, shape: Sequence[int], *, name: Name = None) -> Tensor:
    """``t`` with shape ``shape`` (one -1 is inferred), elements in row-major order."""
    f._check(t, "reshape")
    shape = list(f._ints(shape, "reshape", "shape"))
    if shape.count(-1) > 1:
        raise ReshardError(f"reshape of {t!r}: more than one -1 in {shape}")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 or t.numel % rest:
            raise ReshardError(f"reshape of {t!r} to {shape}: -1 cannot be inferred")
        shape[shape.index(-1)] = t.numel // rest
    if any(not isinstance(s, int) or s <= 0 for s in shape) or math.prod(shape) != t.numel:
        raise ReshardError(f"reshape of {t!r} to {tuple(shape)}: element count {t.numel} "
                           f"!= {math.prod(shape) if all(isinstance(s, int) for s in shape) else '?'}")
    return f._op("reshape", [t], f._new(shape, t.dtype, t.mesh, name), shape=tuple(shape))


def permute(f: Fusion, t: Tensor, perm: Sequence[int], *, name: Name = None) -> Tensor:
    """``t`` with result dim i = operand dim ``perm[i]``."""
    f._check(t, "permute")
    perm = tuple(p + len(t.shape) if p < 0 else p for p in f._ints(perm, "permute", "perm"))
    if sorted(perm) != list(range(len(t.shape))):
        raise ReshardError(f"permute of {t!r}: {tuple(perm)} is not a permutation of {len(t.shape)} dims")
    return f._op("permute", [t], f._new([t.shape[p] for p in perm], t.dtype, t.mesh, name), perm=perm)


def broadcast(f: Fusion, t: Tensor, shape: Sequence[int], dims: Sequence[int], *, name: Name = None) -> Tensor:
    """``t`` broadcast to ``shape``: operand dim ``i`` becomes result dim ``dims[i]``
    (``dims`` strictly increasing; permute first to reorder) and every other result dim
    is new, its values repeated.  An operand dim's extent equals its result dim's, or is
    1 (expanded, as ``torch.expand`` does).  Linear: keeps Partial sums and maxes.

    >>> b = f.broadcast(bias, (8, 16), (1,))  # bias [16] -> [8, 16]
    """
    f._check(t, "broadcast")
    shape = f._ints(shape, "broadcast", "shape")
    if any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in shape):
        raise ReshardError(f"broadcast of {t!r}: shape must be a tuple of positive ints, got {shape}")
    if not isinstance(dims, (int, list, tuple)):
        raise ReshardError(f"broadcast of {t!r}: dims must be an int or a sequence of ints, got {dims!r}")
    dims = (dims,) if isinstance(dims, int) else tuple(dims)  # each checked below, by name
    if len(dims) != len(t.shape):
        raise ReshardError(f"broadcast of {t!r} to {shape}: dims {dims} must name one result dim per operand "
                           f"dim ({len(t.shape)})")
    if len(shape) < len(t.shape):
        raise ReshardError(f"broadcast of {t!r} to {shape}: the result has fewer dims than the operand")
    norm = []
    for i, d in enumerate(dims):
        if not isinstance(d, int) or isinstance(d, bool) or not -len(shape) <= d < len(shape):
            raise ReshardError(f"broadcast of {t!r} to {shape}: dims[{i}] = {d!r} is not a dim of the result")
        norm.append(d % len(shape))
    if any(a >= b for a, b in zip(norm, norm[1:])):
        raise ReshardError(f"broadcast of {t!r} to {shape}: dims {tuple(norm)} must be strictly increasing "
                           "(f.permute the operand first to reorder its dims)")
    for i, d in enumerate(norm):
        if t.shape[i] not in (shape[d], 1):
            raise ReshardError(f"broadcast of {t!r} to {shape}: operand dim {i} (extent {t.shape[i]}) cannot "
                               f"become result dim {d} (extent {shape[d]}); extents must be equal or 1")
    return f._op("broadcast", [t], f._new(shape, t.dtype, t.mesh, name), shape=shape, dims=tuple(norm))


def broadcast_to(f: Fusion, t: Tensor, shape: Sequence[int], *, name: Name = None) -> Tensor:
    """``t`` broadcast to ``shape`` by torch/NumPy rules (trailing dims aligned; operand
    extents equal or 1); ``t`` itself (``name`` unused) when it already has that shape."""
    f._check(t, "broadcast_to")
    shape = f._ints(shape, "broadcast_to", "shape")
    if shape == t.shape:
        return t
    if len(shape) < len(t.shape):
        raise ReshardError(f"broadcast_to of {t!r}: target {shape} has fewer dims than the operand")
    lead = len(shape) - len(t.shape)
    return broadcast(f, t, shape, tuple(range(lead, len(shape))), name=name)


def expand_as(f: Fusion, t: Tensor, other: Tensor, *, name: Name = None) -> Tensor:
    """``t`` broadcast to ``other``'s shape (``broadcast_to``)."""
    f._check(other, "expand_as", "target")
    return broadcast_to(f, t, other.shape, name=name)


# ---- declarations --------------------------------------------------------------------

class _Linear(OpKind):
    def keeps(self, op: Op) -> tuple[str, ...]:
        return ("sum", "max")


@register("reshape")
class Reshape(_Linear):
    """A view of a contiguous local tensor: costs nothing, no kernel."""

    saved_through = True

    builders = {"reshape": reshape}
    cost = "view"

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return xs[0].reshape(a["shape"])

    def shares_operand(self, step: StepLike, ins: list[tuple[tuple[int, ...], str]]) -> int | None:
        """A reshape of a contiguous buffer is a view of it."""
        return 0

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        return reshape_map(fusion.tensors[op.inputs[0]].shape, fusion.tensors[op.output].shape)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        return [f.reshape(g, xs[0].shape)]


@register("permute")
class Permute(_Linear):
    builders = {"permute": permute}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return xs[0].permute(a["perm"]).contiguous()

    def shares_operand(self, step: StepLike, ins: list[tuple[tuple[int, ...], str]]) -> int | None:
        """``contiguous()`` of the permuted view is the view itself when that is contiguous:
        the dims of extent other than 1 keep their order (or there are no elements)."""
        shape = ins[0][0]
        moved = [p for p in step.attr("perm") if shape[p] != 1]
        return 0 if moved == sorted(moved) or 0 in shape else None

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        inv = {p: j for j, p in enumerate(op.attrs["perm"])}
        return [Root(inv[d], e) for d, e in enumerate(fusion.tensors[op.inputs[0]].shape)]

    def transpose_view(self, op: Op) -> bool:
        return is_transpose_view(op.attrs["perm"])

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        perm = op.attrs["perm"]
        return [f.permute(g, inverse_permutation(perm))]


@register("broadcast")
class Broadcast(_Linear):
    builders = {"broadcast": broadcast, "broadcast_to": broadcast_to, "expand_as": expand_as}
    widens_new_dims = True
    saved_through = True
    fused_read = True

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return broadcast_tensor(xs[0], tuple(a["shape"]), tuple(a["dims"]))

    def shares_operand(self, step: StepLike, ins: list[tuple[tuple[int, ...], str]]) -> int | None:
        """Nothing expanded (as many elements as the operand): ``contiguous()`` of the view is
        the view itself."""
        return 0 if math.prod(step.attr("shape")) == math.prod(ins[0][0]) else None

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        # operand dim d reads result dim dims[d]; an expanded extent-1 dim, like the new
        # result dims, has no image (its result dim can only be unsharded there)
        out, dims = fusion.tensors[op.output].shape, op.attrs["dims"]
        return [Root(dims[d], e) if out[dims[d]] == e else None
                for d, e in enumerate(fusion.tensors[op.inputs[0]].shape)]

    def expanded_dims(self, fusion: Fusion, op: Op) -> tuple[int, ...]:
        # the result dims without an operand dim in ``index_map``: new, or expanded from 1
        mapped = {img.dim for img in self.index_map(fusion, op, 0) if isinstance(img, Root)}
        return tuple(d for d in range(len(fusion.tensors[op.output].shape)) if d not in mapped)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """``g`` summed over the expanded dims, reshaped to the operand's shape."""
        gx = sum_over(f, g, self.expanded_dims(f, op))
        return [gx if gx.shape == xs[0].shape else f.reshape(gx, xs[0].shape)]


def movedim(f: Fusion, t: Tensor, source: int | Sequence[int], destination: int | Sequence[int], *,
            name: Name = None) -> Tensor:
    """``torch.movedim``: operand dims ``source`` become result dims ``destination``, the
    other dims keep their order.  A permute (its index map and linearity)."""
    f._check(t, "movedim")
    src = tuple(f._dim(t, d, "movedim") for d in f._ints(source, "movedim", "source"))
    dst = tuple(f._dim(t, d, "movedim") for d in f._ints(destination, "movedim", "destination"))
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ReshardError(f"movedim of {t!r}: source {source} and destination {destination} must be "
                           "distinct dims, as many of each")
    perm: list[int | None] = [None] * len(t.shape)
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(d for d in range(len(t.shape)) if d not in src)
    perm = [next(rest) if p is None else p for p in perm]
    return f._op("movedim", [t], f._new([t.shape[p] for p in perm], t.dtype, t.mesh, name),
                 source=src, destination=dst, perm=tuple(perm))


@register("movedim")
class Movedim(Permute):
    """A permute written as ``torch.movedim`` (``attrs["perm"]`` is the permutation)."""

    builders = {"movedim": movedim}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return torch.movedim(xs[0], a["source"], a["destination"]).contiguous()

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        return [f.movedim(g, op.attrs["destination"], op.attrs["source"])]
