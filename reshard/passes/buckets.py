"""Gradient buckets: neighbouring gradients reduced by one collective, where the cost says so.

A training Fusion's gradients (its backward-phase outputs, ``passes.phases``) often leave the
backward pass Partial on a mesh axis (the dp axis sums the batch shards' contributions, a tp
axis those of a replicated parameter), and each reduction pays a collective's launch α.  A
bucket is the alternative that pays it once for several gradients (DDP's buckets):

    bucket = cat(flat(g_1), .., flat(g_k))                      (along the last dim)
    g_i    = unbucket(unflat_i(slice_i(bucket)), of=g_i)

``flat(g)`` reshapes (and permutes) ``g`` so that the blocks its required sharding deals out
come first, one leading dim per mesh axis that shards it (in axis order, ``[n_1, .., n_s, m]``),
so that at that sharding every step is local (the leading dims stay split, the rest is whole);
``unflat_i`` undoes it.  Every step is linear (a Partial sum or max stays Partial) and exact, so
``unbucket(..) = g_i``, which the ``unbucket`` op declares (``ir.ops.bucket``): its e-graph
nodes join g_i's classes.  The e-graph then holds both ways to reduce each gradient, its own
collective or the bucket's one collective (of the bucket's kind: an allreduce, or a
reduce-scatter for gradients sharded over dp) followed by local slices, and extraction chooses
per bucket: the saved α's against the copies (cat, slices, permutes).  Which gradients share a
bucket is structure (below); whether a bucket is used is the extractor's choice.

Groups: the gradient outputs in backward order (production order), of one mesh, dtype and
layout (the mesh axes that deal out blocks and their sizes; and of one layer when a stack's
layers are planned once, ``ir.layers``), consecutive per layout, closed before the local bytes would pass ``BUCKET_CAP_BYTES`` (DDP's 25 MiB); a group of one gets no
bucket.  An output whose sharding is not such a block layout (Partial, FusedShard, nested or
uneven shards) is left alone.  Cats and slices are balanced binary trees, so each element is
copied about log2(k) times each way (a chain of two-operand cats would copy it up to k times).

A Fusion with fewer than two gradients of one group is returned unchanged (the same object),
so every other Fusion's e-graph and plan stay exactly as they were.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ..ir.dtypes import dtype_kind
from ..ir.fusion import Fusion, Tensor
from ..ir.ids import Outer, Root
from ..ir.ops import op_kind
from .phases import backward_values
from ..ir.sharding import Replicate, TensorSharding

#: a bucket's local bytes at most (DDP's default ``bucket_cap_mb``)
BUCKET_CAP_BYTES = 25 * 2 ** 20


@dataclass(frozen=True)
class _Member:
    """A gradient output and its layout: per mesh axis that deals out blocks of it, (axis,
    dim, parts), in axis order."""

    grad: Tensor
    blocks: tuple[tuple[int, int, int], ...]

    @property
    def key(self) -> tuple:
        """What members of one bucket share: mesh, dtype, the sharded axes and their sizes."""
        return (self.grad.mesh, self.grad.dtype, tuple((a, n) for a, _, n in self.blocks))

    @property
    def local_bytes(self) -> int:
        return self.grad.numel * self.grad.itemsize // math.prod(n for _, _, n in self.blocks)


def _blocks(ts: TensorSharding) -> tuple[tuple[int, int, int], ...] | None:
    """(axis, dim, parts) per mesh axis of ``ts`` that deals out blocks of one dim, or None
    when ``ts`` is not a layout of such blocks and replicas (Partial, FusedShard, loop-domain,
    nested or uneven)."""
    if ts.true_shape is not None:
        return None
    out: list[tuple[int, int, int]] = []
    for a, (p, n) in enumerate(zip(ts.axes, ts.mesh.shape)):
        if isinstance(p, Replicate) or n == 1:
            continue  # a team of one holds the whole value (encode writes Replicate there)
        if not (isinstance(p, Outer) and isinstance(p.x, Root) and p.parts == n) or p.x.dim in {d for _, d, _ in out}:
            return None
        out.append((a, p.x.dim, n))
    return tuple(out)


def _members(fusion: Fusion) -> list[_Member]:
    """The gradient outputs that may share buckets, in backward (production) order."""
    backward = backward_values(fusion)
    seen: dict[int, _Member] = {}
    for tid, ts in fusion.outputs:
        t = fusion.tensors[tid]
        blocks = _blocks(ts)
        if tid in backward and dtype_kind(t.dtype) == "float" and blocks is not None and tid not in seen:
            seen[tid] = _Member(t, blocks)
    return [seen[t] for t in sorted(seen)]


def groups(fusion: Fusion, section: Callable[[int], Hashable] | None = None) -> list[list[_Member]]:
    """The buckets (module docstring): groups of two or more members; with ``section`` (value ->
    its section, e.g. its layer of a stack, ``ir.layers``), members of one section only."""
    out: list[list[_Member]] = []
    open_: dict[tuple, list[_Member]] = {}
    for m in _members(fusion):
        key = m.key if section is None else (m.key, section(m.grad.id))
        cur = open_.get(key)
        if cur is not None and sum(x.local_bytes for x in cur) + m.local_bytes > BUCKET_CAP_BYTES:
            out.append(cur)
            cur = None
        if cur is None:
            cur = open_[key] = []
        cur.append(m)
    out += open_.values()
    return [g for g in out if len(g) > 1]


def _layout(m: _Member) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(split shape, permutation, flat shape) of ``flat``: each sharded dim split into (parts,
    rest), the parts dims moved first in axis order, the rest merged into one dim."""
    parts = {d: n for _, d, n in m.blocks}
    split: list[int] = []
    lead: dict[int, int] = {}
    for d, e in enumerate(m.grad.shape):
        if d in parts:
            lead[d] = len(split)
            split.append(parts[d])
            e //= parts[d]
        split.append(e)
    head = [lead[d] for _, d, _ in m.blocks]
    perm = tuple(head + [i for i in range(len(split)) if i not in head])
    n = tuple(p for _, _, p in m.blocks)
    return tuple(split), perm, n + (m.grad.numel // math.prod(n),)


def _flat(f: Fusion, m: _Member) -> Tensor:
    """``m``'s gradient with its blocks in leading dims (module docstring)."""
    split, perm, flat = _layout(m)
    x = m.grad
    if perm != tuple(range(len(perm))):
        x = f.permute(f.reshape(x, split), perm)
    return x if x.shape == flat else f.reshape(x, flat)


def _unflat(f: Fusion, x: Tensor, m: _Member) -> Tensor:
    """The inverse of ``_flat``, as the ``unbucket`` that stands for ``m``'s gradient."""
    split, perm, _ = _layout(m)
    if perm != tuple(range(len(perm))):
        x = f.permute(f.reshape(x, tuple(split[i] for i in perm)), tuple(perm.index(i) for i in range(len(perm))))
    return f.unbucket(x, m.grad)


def _cat_tree(f: Fusion, xs: list[Tensor], dim: int) -> Tensor:
    """A balanced tree of two-operand cats along ``dim``."""
    if len(xs) == 1:
        return xs[0]
    mid = len(xs) // 2
    return f.cat([_cat_tree(f, xs[:mid], dim), _cat_tree(f, xs[mid:], dim)], dim)


def _slice_tree(f: Fusion, x: Tensor, widths: list[int], dim: int) -> list[Tensor]:
    """``x`` cut along ``dim`` into pieces of ``widths``, halving as ``_cat_tree`` joined."""
    if len(widths) == 1:
        return [x]
    mid = len(widths) // 2
    cut = sum(widths[:mid])
    return (_slice_tree(f, f.slice(x, dim, 0, cut), widths[:mid], dim)
            + _slice_tree(f, f.slice(x, dim, cut, x.shape[dim]), widths[mid:], dim))


def bucket_gradients(fusion: Fusion, section: Callable[[int], Hashable] | None = None) -> Fusion:
    """``fusion`` with a bucket per group of gradients (module docstring; ``section``: see
    ``groups``) appended, as a copy; ``fusion`` itself when there is no group."""
    found = groups(fusion, section)
    if not found:
        return fusion
    out = fusion.copy()
    for group in found:
        flats = [_flat(out, m) for m in group]
        dim = len(flats[0].shape) - 1
        pieces = _slice_tree(out, _cat_tree(out, flats, dim), [x.shape[dim] for x in flats], dim)
        for x, m in zip(pieces, group):
            _unflat(out, x, m)
    return out



def bucket_roots(fusion: Fusion) -> frozenset[int]:
    """The buckets: the values the members are sliced out of (above each ``unbucket``, through
    its one-operand slices, permutes and reshapes, the first value a cat made; empty for a
    Fusion without buckets).  Extraction tries sharing their reductions once all other sharing
    is done (``extract.extract.select``): a bucket's one collective pays off only when all
    its members read it, which the greedy, pricing each member on its own, does not see."""
    out: set[int] = set()
    for op in fusion.ops:
        if not op_kind(op.kind).bucket:
            continue
        t = op.inputs[0]
        while len(fusion.ops[fusion.producer[t]].inputs) == 1:
            t = fusion.ops[fusion.producer[t]].inputs[0]
        out.add(t)
    return frozenset(out)


def bucket_values(fusion: Fusion) -> frozenset[int]:
    """The values only buckets read: what ``unbucket`` ops depend on and no output does (the
    flattened members, the buckets, their slices; empty for a Fusion without buckets)."""
    def upstream(roots: list[int]) -> set[int]:
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            t = stack.pop()
            if t not in seen:
                seen.add(t)
                stack.extend(fusion.ops[fusion.producer[t]].inputs)
        return seen

    members = [t for op in fusion.ops if op_kind(op.kind).bucket for t in op.inputs]
    return frozenset(upstream(members) - upstream([t for t, _ in fusion.outputs])) if members else frozenset()
