"""Shape ATen ops: reshapes (view, reshape, (un)squeeze, flatten, ravel, atleast_*), expand and
broadcast_tensors, permutes (permute, transpose, t, movedim), slices (slice, narrow, select,
split, chunk, unbind), joins (cat, stack), roll, repeat / tile, constant padding."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..ir.fusion import DTYPES, Tensor
from .aten_indexing import index_by_tensors
from .aten_windows import strided
from .converter import FALLBACK, Converter, first, op


@op("view", "reshape", "_unsafe_view", "view_copy", "unsqueeze", "squeeze", "flatten", "unflatten", "view_as",
     "reshape_as", "ravel")
def _reshape(cv: Converter, n: Any, a: dict) -> Tensor:
    return cv.reshape(cv.tensor(first(a), "input"), cv.out_shape())


@op("atleast_1d", "atleast_2d", "atleast_3d")
def _atleast(cv: Converter, n: Any, a: dict) -> Any:
    """A reshape to torch's shape (the ``Sequence`` overload: one per tensor)."""
    x = first(a)
    if isinstance(x, (list, tuple)):
        return tuple(cv.reshape(cv.tensor(t, "input"), tuple(v.shape)) for t, v in zip(x, n.meta["val"]))
    return cv.reshape(cv.tensor(x, "input"), cv.out_shape())


@op("expand", "expand_as", "broadcast_to", "expand_copy")
def _expand(cv: Converter, n: Any, a: dict) -> Tensor:
    return cv.f.broadcast_to(cv.tensor(first(a), "input"), cv.out_shape())


@op("broadcast_tensors")
def _broadcast_tensors(cv: Converter, n: Any, a: dict) -> tuple[Tensor, ...]:
    return tuple(cv.f.broadcast_to(cv.tensor(t, "input"), tuple(v.shape))
                 for t, v in zip(a["tensors"], n.meta["val"]))


@op("permute")
def _permute(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    perm = tuple(d % len(x.shape) for d in a["dims"])
    return x if perm == tuple(range(len(x.shape))) else cv.f.permute(x, perm)


@op("movedim")
def _movedim(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    src, dst = (tuple(d % len(x.shape) for d in ((v,) if isinstance(v, int) else v))
                for v in (a["source"], a["destination"]))
    return x if src == dst else cv.f.movedim(x, src, dst)


@op("transpose")
def _transpose(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    r = len(x.shape)
    d0, d1 = a["dim0"] % r, a["dim1"] % r
    if d0 == d1:
        return x
    perm = list(range(r))
    perm[d0], perm[d1] = d1, d0
    return cv.f.permute(x, perm)


@op("t")
def _t(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    return x if len(x.shape) < 2 else cv.f.permute(x, (1, 0))


@op("numpy_T")
def _numpy_t(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x.T``: every dim reversed (Falcon's ``input @ self.weight.T``)."""
    x = cv.tensor(a["self"], "input")
    return x if len(x.shape) < 2 else cv.f.permute(x, tuple(reversed(range(len(x.shape)))))


@op("mT", "mH", "adjoint")
def _m_t(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x.mT``, and ``x.mH`` / ``x.adjoint()`` of a real ``x`` (the same: no conjugate; a complex
    operand goes through the complex ops, which have none of these): the last two dims swapped."""
    x = cv.tensor(a["self"], "input")
    r = len(x.shape)
    if r < 2:
        raise cv.fail(f"{n.target} of {x!r}: needs at least 2 dims")
    return cv.f.permute(x, (*range(r - 2), r - 1, r - 2))


def _slice(cv: Converter, x: Tensor, dim: int, start: int, stop: int) -> Tensor:
    d = dim % len(x.shape)
    if start == 0 and stop == x.shape[d]:
        return x
    if start >= stop:
        raise cv.fail(f"empty slice [{start}:{stop}) of dim {d} of {x!r}")
    return cv.f.slice(x, d, start, stop)


def _clamp(i: Any, size: int, default: int) -> int:
    if i is None:
        return default
    i = int(i)
    if i < 0:
        i += size
    return min(max(i, 0), size)


@op("slice")
def _slice_op(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x[start:end:step]`` along ``dim``; a step > 1: ``aten_windows.strided``."""
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    size = x.shape[d]
    start, stop = _clamp(a["start"], size, 0), _clamp(a["end"], size, size)
    step = int(a.get("step") or 1)
    return _slice(cv, x, d, start, stop) if step == 1 else strided(cv, x, d, start, max(start, stop), step)


def _scatter_slice(cv: Converter, x: Tensor, src: Tensor, d: int, start: int, stop: int) -> Tensor:
    """``x`` with ``x[start:stop]`` along ``d`` replaced by ``src``: ``cat`` of the part before,
    ``src`` and the part after (each only where it has elements)."""
    parts = [_slice(cv, x, d, 0, start) if start > 0 else None, cv.cast(src, x.dtype),
             _slice(cv, x, d, stop, x.shape[d]) if stop < x.shape[d] else None]
    kept = [p for p in parts if p is not None]
    return kept[0] if len(kept) == 1 else cv.f.cat(kept, d)


@op("slice_scatter")
def _slice_scatter(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x[start:end] = src`` along ``dim`` as a value (what functionalizing a write through a
    slice makes); a step > 1 through torch's decomposition."""
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    size = x.shape[d]
    start, stop = _clamp(a.get("start"), size, 0), _clamp(a.get("end"), size, size)
    if int(a.get("step") or 1) != 1:
        if not FALLBACK:
            raise cv.fail(f"unsupported op {n.target} with a step (no decomposition registered)")
        return FALLBACK[0](cv, n)
    return _scatter_slice(cv, x, cv.tensor(a["src"], "src"), d, start, max(start, stop))


@op("select_scatter")
def _select_scatter(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x[index] = src`` along ``dim`` as a value (a write through ``select``, functionalized)."""
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    i = int(a["index"]) % x.shape[d]
    src = cv.tensor(a["src"], "src")
    return _scatter_slice(cv, x, cv.reshape(src, src.shape[:d] + (1,) + src.shape[d:]), d, i, i + 1)


@op("diagonal")
def _diagonal(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x[..., i, i + offset]`` over ``dim1``, ``dim2`` (moved last), as a new last dim: the two
    dims flattened and every ``C + 1``-th element taken from the first on the diagonal
    (``strided``)."""
    x = cv.tensor(a["self"], "input")
    d1, d2 = a.get("dim1", 0) % len(x.shape), a.get("dim2", 1) % len(x.shape)
    off = int(a.get("offset", 0))
    x = cv.f.movedim(x, [d1, d2], [-2, -1])
    r, c = x.shape[-2:]
    count = max(0, min(r, c - off) if off >= 0 else min(r + off, c))
    if count == 0:
        raise cv.fail(f"unsupported op {n.target}: an empty diagonal")
    start = off if off >= 0 else -off * c
    flat = cv.reshape(x, x.shape[:-2] + (r * c,))
    return cv.reshape(strided(cv, flat, len(flat.shape) - 1, start, start + (count - 1) * (c + 1) + 1, c + 1),
                      cv.out_shape())


@op("narrow")
def _narrow(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    s = _clamp(a["start"], x.shape[d], 0)
    return _slice(cv, x, d, s, s + int(a["length"]))


@op("select")
def _select(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    i = int(a["index"]) % x.shape[d]
    return cv.reshape(_slice(cv, x, d, i, i + 1), cv.out_shape())


def _split_at(cv: Converter, x: Tensor, dim: int, sizes: Sequence[int]) -> tuple[Tensor, ...]:
    d = dim % len(x.shape)
    out, s = [], 0
    for k in sizes:
        out.append(_slice(cv, x, d, s, s + k))
        s += k
    return tuple(out)


@op("split")
def _split(cv: Converter, n: Any, a: dict) -> tuple[Tensor, ...]:
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    k = a["split_size"]
    if isinstance(k, (list, tuple)):
        return _split_at(cv, x, d, k)
    e = x.shape[d]
    return _split_at(cv, x, d, [min(k, e - s) for s in range(0, e, k)])


@op("split_with_sizes")
def _split_sizes(cv: Converter, n: Any, a: dict) -> tuple[Tensor, ...]:
    return _split_at(cv, cv.tensor(a["self"], "input"), a["dim"], a["split_sizes"])


@op("chunk")
def _chunk(cv: Converter, n: Any, a: dict) -> tuple[Tensor, ...]:
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    e = x.shape[d]
    k = math.ceil(e / a["chunks"])
    return _split_at(cv, x, d, [min(k, e - s) for s in range(0, e, k)])


@op("unbind")
def _unbind(cv: Converter, n: Any, a: dict) -> tuple[Tensor, ...]:
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    rest = x.shape[:d] + x.shape[d + 1:]
    return tuple(cv.reshape(s, rest) for s in _split_at(cv, x, d, [1] * x.shape[d]))


@op("cat", "concat")
def _cat(cv: Converter, n: Any, a: dict) -> Tensor:
    """A constant operand with no elements adds none and is dropped (torch also takes a 1-D
    one of size 0 beside operands of any rank: a Hugging Face KV cache's first ``cat``)."""
    dt = cv.out_dtype()
    kept = [t for t in a["tensors"] if not (isinstance(t, torch.Tensor) and t.numel() == 0)]
    ts = [cv.cast(cv.tensor(t, "cat operand"), dt) for t in kept]
    return ts[0] if len(ts) == 1 else cv.f.cat(ts, a["dim"] % len(ts[0].shape))


@op("stack")
def _stack(cv: Converter, n: Any, a: dict) -> Tensor:
    dt = cv.out_dtype()
    ts = [cv.cast(cv.tensor(t, "stack operand"), dt) for t in a["tensors"]]
    d = a["dim"] % (len(ts[0].shape) + 1)
    return cv.f.cat([cv.f.reshape(t, t.shape[:d] + (1,) + t.shape[d:]) for t in ts], d)


@op("roll")
def _roll(cv: Converter, n: Any, a: dict) -> Tensor:
    """``torch.roll``: along each dim, ``cat(x[n - s:], x[:n - s])``; without dims, of x
    flattened."""
    x = cv.tensor(a["self"], "input")
    shifts, dims = list(a["shifts"]), list(a["dims"] or [])
    if not dims:
        flat = _roll_dims(cv, cv.reshape(x, (math.prod(x.shape),)), shifts, [0])
        return cv.reshape(flat, x.shape)
    return _roll_dims(cv, x, shifts, dims)


def _roll_dims(cv: Converter, x: Tensor, shifts: Sequence[int], dims: Sequence[int]) -> Tensor:
    if len(shifts) != len(dims):
        raise cv.fail(f"roll: {len(shifts)} shifts for {len(dims)} dims")
    for s, d in zip(shifts, dims):
        d = d % len(x.shape)
        e = x.shape[d]
        s = int(s) % e
        if s:
            x = cv.f.cat([_slice(cv, x, d, e - s, e), _slice(cv, x, d, 0, e - s)], d)
    return x


def _repeat(cv: Converter, x: Tensor, reps: Sequence[int]) -> Tensor:
    """``x.repeat(*reps)``: each dim d becomes (reps[d], size[d]) -- the copy index outer --
    by a broadcast of x (leading 1-dims where reps has more dims), then a reshape."""
    reps = tuple(int(r) for r in reps)
    if len(reps) < len(x.shape):
        raise cv.fail(f"repeat: {len(reps)} repeats for {len(x.shape)} dims")
    shape = (1,) * (len(reps) - len(x.shape)) + x.shape
    if all(r == 1 for r in reps):
        return cv.reshape(x, shape)
    split = cv.reshape(x, tuple(e for s in shape for e in (1, s)))
    wide = cv.f.broadcast_to(split, tuple(e for r, s in zip(reps, shape) for e in (r, s)))
    return cv.reshape(wide, tuple(r * s for r, s in zip(reps, shape)))


@op("repeat")
def _repeat_op(cv: Converter, n: Any, a: dict) -> Tensor:
    return _repeat(cv, cv.tensor(a["self"], "input"), a["repeats"])


@op("tile")
def _tile(cv: Converter, n: Any, a: dict) -> Tensor:
    """``torch.tile``: ``repeat`` with the repeats left-padded with 1s to the rank."""
    x = cv.tensor(a["self"], "input")
    dims = tuple(a["dims"])
    return _repeat(cv, x, (1,) * (len(x.shape) - len(dims)) + dims)


def _fill(cv: Converter, x: Tensor, d: int, k: int, value: float) -> Tensor:
    """A constant block of ``x``'s shape with ``k`` elements along dim ``d``, all ``value``."""
    shape = x.shape[:d] + (k,) + x.shape[d + 1:]
    block = torch.full(shape, value, dtype=DTYPES[x.dtype], device="meta" if cv.on_meta else "cpu")
    return cv.constant(block, ("fill", shape, x.dtype, float(value)))


@op("pad", "constant_pad_nd")
def _pad(cv: Converter, n: Any, a: dict) -> Tensor:
    """Constant padding, (lo, hi) pairs from the last dim backwards: a negative amount cuts
    (slice); padding with 0 is ``pad``; with another value, ``cat`` with a constant block."""
    x = cv.tensor(a["self"], "input")
    if a.get("mode", "constant") != "constant":
        raise cv.fail(f"unsupported op {n.target} with mode={a['mode']!r} (only 'constant')")
    value = a.get("value") or 0.0
    pads = list(a["pad"])
    for i in range(len(pads) // 2):
        d = len(x.shape) - 1 - i
        lo, hi = int(pads[2 * i]), int(pads[2 * i + 1])
        x = _slice(cv, x, d, max(-lo, 0), x.shape[d] - max(-hi, 0))
        lo, hi = max(lo, 0), max(hi, 0)
        if (lo or hi) and value == 0:
            x = cv.f.pad(x, d, lo, hi)
        elif lo or hi:
            x = cv.f.cat(([_fill(cv, x, d, lo, value)] if lo else []) + [x] +
                         ([_fill(cv, x, d, hi, value)] if hi else []), d)
    return x


def _arange_axis(idx: torch.Tensor, size: int) -> tuple[int | None, int] | None:
    """(the dim ``idx`` counts along, its start) when ``idx`` is ``start + arange`` along one
    dim and constant along the others; (None, value) when it is one value; else None."""
    idx = idx.long() % size
    flat = idx.reshape(-1)
    if bool((flat == flat[0]).all()):
        return None, int(flat[0])
    varying = [d for d in range(idx.dim()) if idx.shape[d] > 1 and not bool((idx.narrow(d, 0, 1) == idx).all())]
    if len(varying) != 1:
        return None
    d = varying[0]
    start = int(flat[0])
    want = start + torch.arange(idx.shape[d]).reshape([-1 if k == d else 1 for k in range(idx.dim())])
    return (d, start) if bool((idx == want).all()) else None


@op("index")
def _index(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x[i0, i1, ...]`` with constant index tensors, each a run of consecutive indices along
    its own result dim (Hugging Face's ``attention_mask[batch_idx, kv_idx]``): slices of the
    indexed dims, a reshape placing them at their result dims, a broadcast; other integer
    indices: a lookup (``aten_indexing.index_by_tensors``)."""
    x = cv.tensor(a["self"], "input")
    idxs = list(a["indices"])
    known = [cv.known(i) for i in idxs]
    if not idxs or any(k is None or k.dtype == torch.bool or k.is_meta for k in known):
        return index_by_tensors(cv, n, a)
    shape = tuple(torch.broadcast_shapes(*(k.shape for k in known)))
    axes = [_arange_axis(k.expand(shape), x.shape[d]) for d, k in enumerate(known)]
    dims = [ax[0] for ax in axes if ax is not None and ax[0] is not None]
    if any(ax is None for ax in axes) or dims != sorted(set(dims)):
        return index_by_tensors(cv, n, a)
    rest = x.shape[len(idxs):]
    for d, (at, start) in enumerate(axes):
        x = _slice(cv, x, d, start, start + (shape[at] if at is not None else 1))
    placed = [1] * len(shape)
    for d, (at, _) in enumerate(axes):
        if at is not None:
            placed[at] = shape[at]
    return cv.f.broadcast_to(cv.reshape(x, tuple(placed) + rest), shape + rest)
