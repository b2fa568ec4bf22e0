"""Indexing by integer tensors, through the lookups (``ir.ops.lookup``): ``index`` (and
``_unsafe_index``) by tensors, ``index_select``, ``gather``, the scatters (``scatter``,
``scatter_add``, ``scatter_reduce`` sum / mean, ``index_put``), ``embedding_dense_backward``,
and ``copy``.

**Laws.**  ``take(x, dims, ids)``: the indexed dims of ``x`` moved first and flattened into
one dim of ``prod(sizes)`` rows, the rest flattened into one, read by ``embedding`` at the
linear index ``sum_j i_j * stride_j`` (negative indices wrapped: ``i + size`` where ``i < 0``);
a row-sharded table is a masked local lookup (Partial), the other dims may stay sharded.

``gather(x, d, index)``: ``x`` (cut to index's extents off ``d``) with ``d`` last, broadcast
along a new dim of index's extent ``k`` along ``d``, ``pick`` at ``index``: out[..., j] =
x[..., index[..., j]].

``scatter_add(x, d, index, src)``: ``x + sum_j unpick(src[..., j], index[..., j], V)`` (the
sum over the new dim ``j``; zero-padded back to x's extents); ``scatter_reduce`` "mean"
divides by the hits (plus one with ``include_self``).  ``index_put(x, indices, values)``: the
indexed dims' linear index as in ``take``, ``embedding_grad`` of the values at it (the rows
of equal linear indices summed), moved back to x's dims; ``+ x`` with ``accumulate``.  With one
bool mask index and one value (``attn[mask] = -inf``): ``where(mask, value, x)`` (``_put_masked``);
several values fill the true places in order, a count that depends on the mask's values
(refused).

``scatter`` (src / value) and ``index_put`` without accumulation write where an index hits
(``where(hits > 0, written, x)``, hits the scatter of ones), and where several elements name
one place the **last** one in order is written (``last_writes``): torch's CPU kernels write in
order (on a GPU torch keeps an unspecified one); the others are zeroed before the scatter's
sum.  Cost: a stable sort of the linear indices (and a scatter back by its permutation) per
such op.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..ir.fusion import Tensor
from ..ir.strides import row_major_strides
from .converter import Converter, op


def _wrapped(cv: Converter, i: Tensor, size: int) -> Tensor:
    """Index ``i`` in ``[0, size)``: a negative one plus ``size``."""
    i = cv.cast(i, "int64")
    f = cv.f
    return f.where(f.lt(i, cv.operand(0, i.shape, "int64")), f.add(i, cv.operand(size, i.shape, "int64")), i)


def linear(cv: Converter, ids: list[Tensor], sizes: list[int]) -> Tensor:
    """``sum_j i_j * stride_j`` of the index tensors ``ids`` (one shape) into dims of extents
    ``sizes`` (row-major strides; negative indices wrapped)."""
    f = cv.f
    lin = None
    for i, size, stride in zip(ids, sizes, row_major_strides(sizes)):
        i = _wrapped(cv, i, size)
        term = i if stride == 1 else f.mul(i, cv.operand(stride, i.shape, "int64"))
        lin = term if lin is None else f.add(lin, term)
    assert lin is not None
    return lin


def take(cv: Converter, x: Tensor, dims: list[int], ids: list[Tensor]) -> Tensor:
    """``x`` read at ``ids`` (one index tensor per dim of ``dims``, all of one shape ``S``):
    ``S + `` the other dims of x (the module docstring's law)."""
    f = cv.f
    rest = [d for d in range(len(x.shape)) if d not in dims]
    sizes = [x.shape[d] for d in dims]
    table = f.permute(x, dims + rest) if dims + rest != list(range(len(x.shape))) else x
    tail = tuple(x.shape[d] for d in rest)
    table = cv.reshape(table, (math.prod(sizes), math.prod(tail)))
    lin = linear(cv, ids, sizes)
    return cv.reshape(f.embedding(table, lin), lin.shape + tail)


def last_writes(cv: Converter, lin: Tensor) -> Tensor:
    """Bool, of ``lin``'s shape: True where no later element of ``lin`` (int64 values >= 0,
    row-major order) holds the same value.  ``lin`` flattened and stably sorted: a sorted
    position is a last write when the next one differs (the final one always); moved back to
    element order by ``embedding_grad`` at the sort's permutation (no two ids alike: nothing is
    summed)."""
    f = cv.f
    n = math.prod(lin.shape)
    flat = cv.reshape(lin, (n,))
    if n == 1:
        return cv.operand(True, lin.shape, "bool")
    ordered, order = f.sort(flat, 0, stable=True), f.argsort(flat, 0, stable=True)
    after = f.cat([f.slice(ordered, 0, 1, n), cv.operand(-1, (1,), "int64")], 0)
    ends = cv.cast(f.ne(ordered, after), "float32")
    back = f.embedding_grad(cv.reshape(ends, (n, 1)), order, n)
    return cv.reshape(f.gt(back, cv.operand(0.5, (n, 1), "float32")), lin.shape)


def _last_only(cv: Converter, lin: Tensor, v: Tensor) -> Tensor:
    """``v`` (``lin``'s shape, or it plus trailing dims) where ``last_writes(lin)``, else 0."""
    keep = last_writes(cv, lin)
    if v.shape != lin.shape:
        keep = cv.f.broadcast(keep, v.shape, tuple(range(len(lin.shape))))
    return cv.f.where(keep, v, cv.operand(0.0, v.shape, v.dtype))


def _integer_indices(cv: Converter, n: Any, ts: list[Tensor]) -> None:
    """Raise naming ``n``'s op unless every index of ``ts`` is an integer tensor: a bool mask
    selects a count of places that depends on its values; another dtype is no index."""
    bad = next((t for t in ts if t.dtype not in ("int64", "int32")), None)
    if bad is not None:
        raise cv.fail(f"unsupported op {n.target} with a bool mask index (its result's shape depends on the values)"
                      if bad.dtype == "bool" else f"{n.target}: index {bad!r} is {bad.dtype}, not an integer tensor")


@op("_unsafe_index")
def index_by_tensors(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x[..., i0, i1, ...]``: integer index tensors (``None``: a whole dim), broadcast together;
    their result dims replace the indexed dims where those are adjacent, else lead (torch's
    rule)."""
    x = cv.tensor(a["self"], "input")
    idxs = list(a["indices"]) + [None] * (len(x.shape) - len(a["indices"]))
    dims = [d for d, i in enumerate(idxs) if i is not None]
    ts = [cv.tensor(idxs[d], "index") for d in dims]
    _integer_indices(cv, n, ts)
    shape = tuple(torch.broadcast_shapes(*(t.shape for t in ts)))
    y = take(cv, x, dims, [cv.f.broadcast_to(t, shape) for t in ts])
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if adjacent and dims[0] > 0:  # the index dims sit where the indexed ones were
        lead = len(shape)
        y = cv.f.movedim(y, list(range(lead)), list(range(dims[0], dims[0] + lead)))
    return cv.reshape(y, cv.out_shape())


@op("index_select")
def _index_select(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x`` read at the 1-D ``index`` along ``dim``, the index's dim in its place."""
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    index = cv.tensor(a["index"], "index")
    y = take(cv, x, [d], [cv.reshape(index, (math.prod(index.shape),))])
    return cv.reshape(cv.f.movedim(y, 0, d) if d else y, cv.out_shape())


def _last(cv: Converter, x: Tensor, d: int) -> Tensor:
    return x if d == len(x.shape) - 1 else cv.f.movedim(x, d, -1)


def _cut(cv: Converter, x: Tensor, shape: tuple[int, ...], skip: int) -> Tensor:
    """``x`` sliced to ``shape`` on every dim but ``skip``."""
    for d, e in enumerate(shape):
        if d != skip and x.shape[d] != e:
            x = cv.f.slice(x, d, 0, e)
    return x


@op("gather")
def _gather(cv: Converter, n: Any, a: dict) -> Tensor:
    """``out[..., j, ...] = x[..., index[..., j, ...], ...]`` along ``dim``: ``pick`` (module
    docstring)."""
    f = cv.f
    x, index = cv.tensor(a["self"], "input"), cv.cast(cv.tensor(a["index"], "index"), "int64")
    d = a["dim"] % len(x.shape)
    x = _last(cv, _cut(cv, x, index.shape, d), d)
    index = _last(cv, _wrapped(cv, index, x.shape[-1]), d)
    k = index.shape[-1]
    if k != 1:  # each of the k picks reads its own copy of the row
        x = f.broadcast(x, index.shape + x.shape[-1:], tuple(range(len(index.shape) - 1)) + (len(index.shape),))
        picked = f.pick(x, index)
    else:
        picked = cv.reshape(f.pick(x, cv.reshape(index, index.shape[:-1])), index.shape)
    return cv.reshape(_back(cv, picked, d), cv.out_shape())


def _back(cv: Converter, y: Tensor, d: int) -> Tensor:
    return y if d == len(y.shape) - 1 else cv.f.movedim(y, -1, d)


def _scattered(cv: Converter, x: Tensor, d: int, index: Tensor, src: Tensor, last: bool = False) -> Tensor:
    """``sum_j unpick(src[..., j], index[..., j], V)`` along ``d``, at x's shape (zeros past the
    index's extents); ``last``: only the last write to each place (``last_writes`` of the
    targets' linear index: row ``r`` of the index's other dims at ``r * V + index``)."""
    f = cv.f
    v = x.shape[d]
    src = _last(cv, _cut(cv, src, index.shape, -1), d)
    index = _last(cv, _wrapped(cv, cv.cast(index, "int64"), v), d)
    if last:
        rows = index.shape[:-1]
        offsets = torch.arange(math.prod(rows), device="meta" if cv.on_meta else "cpu") * v
        lin = index if not rows else f.add(index, f.broadcast_to(
            cv.constant(offsets.reshape(rows + (1,)), ("row offsets", rows, v)), index.shape))
        src = _last_only(cv, lin, src)
    s = f.unpick(src, index, v)  # [*B, k, V]
    s, _ = cv.reduce("sum", s, (len(s.shape) - 2,))
    s = _back(cv, s, d)
    for k, e in enumerate(x.shape):
        if s.shape[k] != e:
            s = f.pad(s, k, 0, e - s.shape[k])
    return s


def _source(cv: Converter, a: dict, index: Tensor, dt: str) -> Tensor:
    """The values a scatter writes: ``src``, or ``value`` at the index's shape."""
    if a.get("src") is not None:
        return cv.cast(cv.tensor(a["src"], "src"), dt)
    return cv.operand(a["value"], index.shape, dt)


@op("scatter", "scatter_add", "scatter_reduce")
def _scatter(cv: Converter, n: Any, a: dict) -> Tensor:
    """``scatter`` (src / value), ``scatter_add``, ``scatter_reduce`` (sum, mean): the module
    docstring's law (float tensors)."""
    f, dt = cv.f, cv.out_dtype()
    x = cv.cast(cv.tensor(a["self"], "input"), dt)
    index = cv.tensor(a["index"], "index")
    d = a["dim"] % len(x.shape)
    name = n.target._schema.name.split("::")[-1]
    reduce = a.get("reduce") or ("sum" if name == "scatter_add" else None)
    if a.get("reduce") is not None and name == "scatter":
        raise cv.fail(f"unsupported op {n.target} with reduce={a['reduce']!r}")
    if reduce not in (None, "sum", "mean") or dt not in ("float32", "float64", "bfloat16", "float16"):
        raise cv.fail(f"unsupported op {n.target} with reduce={reduce!r} on {dt} (sum and mean of floats only)")
    s = _scattered(cv, x, d, index, _source(cv, a, index, dt), last=reduce is None)
    include = a.get("include_self", True)
    if reduce == "sum" and include:
        return f.add(x, s)
    hits = _scattered(cv, x, d, index, cv.operand(1.0, index.shape, dt))
    hit = f.gt(hits, cv.operand(0.0, x.shape, dt))
    if reduce == "mean":
        s = f.div(f.add(s, x), f.add(hits, cv.operand(1.0, x.shape, dt))) if include else f.div(
            s, f.where(hit, hits, cv.operand(1.0, x.shape, dt)))
    return f.where(hit, s, x)


@op("index_put")
def _index_put(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x[..., i0, i1, ...] = values`` (``+=`` with ``accumulate``): integer index tensors
    (``None``: a whole dim), broadcast together; ``values`` broadcast to ``x[indices]``'s shape
    (torch's rule, as ``index_by_tensors``): the module docstring's law."""
    f, dt = cv.f, cv.out_dtype()
    x = cv.cast(cv.tensor(a["self"], "input"), dt)
    idxs = list(a["indices"]) + [None] * (len(x.shape) - len(a["indices"]))
    dims = [d for d, i in enumerate(idxs) if i is not None]
    ts = [cv.tensor(idxs[d], "index") for d in dims]
    if len(ts) == 1 and ts[0].dtype == "bool":
        return _put_masked(cv, n, a, x, ts[0], dims[0])
    if dt not in ("float32", "float64", "bfloat16", "float16"):
        raise cv.fail(f"unsupported op {n.target} on {dt} (floats only)")
    _integer_indices(cv, n, ts)
    shape = tuple(torch.broadcast_shapes(*(t.shape for t in ts)))
    rest = [d for d in range(len(x.shape)) if d not in dims]
    sizes, tail = [x.shape[d] for d in dims], tuple(x.shape[d] for d in rest)
    lin = cv.reshape(linear(cv, [f.broadcast_to(t, shape) for t in ts], sizes), (math.prod(shape),))
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    lead = dims[0] if adjacent else 0  # where x[indices] holds the index dims
    vals = cv.operand(a["values"], tail[:lead] + shape + tail[lead:], dt)
    if lead and shape:
        vals = f.movedim(vals, list(range(lead, lead + len(shape))), list(range(len(shape))))
    vals = cv.reshape(vals, (lin.shape[0], math.prod(tail)))
    perm = dims + rest
    back = sorted(range(len(perm)), key=perm.__getitem__)

    def put(v: Tensor) -> Tensor:
        """``v [n, prod(rest)]`` summed into the places ``lin`` names of a zero ``x``."""
        rows = cv.reshape(f.embedding_grad(v, lin, math.prod(sizes)), tuple(sizes) + tail)
        return f.permute(rows, back) if back != list(range(len(back))) else rows
    if a.get("accumulate"):
        return f.add(x, put(vals))
    hit = f.gt(put(cv.operand(1.0, vals.shape, dt)), cv.operand(0.0, x.shape, dt))
    return f.where(hit, put(_last_only(cv, lin, vals)), x)


def _put_masked(cv: Converter, n: Any, a: dict, x: Tensor, mask: Tensor, d: int) -> Tensor:
    """``x[..., mask] = value`` (``+=`` with ``accumulate``), ``mask`` a bool tensor over ``x``'s
    dims from ``d`` on and ``value`` one element (``attn[mask] = -inf``): ``where(mask, value,
    x)`` (``x + where(mask, value, 0)``), the mask broadcast over the other dims.  A value of
    several elements fills the true places in order: their count depends on the mask's values."""
    v = a["values"]
    size = v.numel() if isinstance(v, torch.Tensor) else math.prod(v.shape) if isinstance(v, Tensor) else 1
    if size != 1:
        raise cv.fail(f"unsupported op {n.target} with a bool mask index and {size} values (one per true place of "
                      "the mask: a count that depends on its values); assign one value, or use torch.where")
    if x.shape[d:d + len(mask.shape)] != mask.shape:
        raise cv.fail(f"{n.target}: mask {mask!r} does not match dims {d}.. of {x!r}")
    f = cv.f
    hit = f.broadcast(mask, x.shape, tuple(range(d, d + len(mask.shape))))
    val = cv.operand(cv.reshape(v, ()) if isinstance(v, Tensor) else v, x.shape, x.dtype)
    if a.get("accumulate"):
        return f.add(x, f.where(hit, val, cv.operand(0, x.shape, x.dtype)))
    return f.where(hit, val, x)


@op("embedding_dense_backward")
def _embedding_backward(cv: Converter, n: Any, a: dict) -> Tensor:
    """The rows of ``grad_output`` summed into the rows ``indices`` name: ``embedding_grad``."""
    if a.get("scale_grad_by_freq"):
        raise cv.fail(f"unsupported op {n.target} with scale_grad_by_freq=True")
    g, ids = cv.tensor(a["grad_output"], "grad_output"), cv.cast(cv.tensor(a["indices"], "indices"), "int64")
    pad = a.get("padding_idx", -1)
    return cv.f.embedding_grad(g, ids, int(a["num_weights"]), padding_idx=None if pad is None or pad < 0 else pad)


@op("copy")
def _copy(cv: Converter, n: Any, a: dict) -> Tensor:
    """``src`` broadcast to ``self``'s shape and cast to its dtype."""
    return cv.operand(a["src"], cv.out_shape(), cv.out_dtype())
