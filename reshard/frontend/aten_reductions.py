"""Reductions and the ops built on them: sum / mean / amax / amin / max / min / prod, softmax, log_softmax,
logsumexp, var / std (and var_mean, std_mean), linalg_vector_norm, cdist / pdist, layer_norm,
rms_norm, group_norm and batch norm in evaluation; any / all (max of bools); cumsum (a scan)."""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx

from ..ir.dtypes import dtype_kind
from ..ir.fusion import DTYPES, Tensor
from .aten_along import indices_of_max
from .aten_elementwise import binary
from .converter import OPS, Converter, Handler, op, opname


def _reduction(fn: str) -> Handler:
    def h(cv: Converter, n: Any, a: dict) -> Tensor:
        x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
        dims = cv.dims(x, a.get("dim"))
        y, _ = cv.reduce(fn, x, dims)
        return cv.reshape(y, cv.out_shape())  # keepdim / full reduction shapes
    return h


OPS["sum"] = _reduction("sum")
OPS["mean"] = _reduction("mean")
OPS["amax"] = _reduction("max")


@op("max")
def _max(cv: Converter, n: Any, a: dict) -> Any:
    """max.dim -> (values, indices: argmax); max.default -> full reduction; max.other -> maximum."""
    overload = n.target._overloadname
    if overload == "other":
        return binary(cv, "maximum", a["self"], a["other"])
    if overload not in ("dim", "default"):
        raise cv.fail(f"unsupported op {n.target}")
    x = cv.tensor(a["self"], "input")
    y, _ = cv.reduce("max", x, cv.dims(x, a.get("dim")))
    if overload == "default":
        return cv.reshape(y, cv.out_shape())
    return _with_indices(cv, n, x, y, a, "argmax")


def _with_indices(cv: Converter, n: Any, x: Tensor, y: Tensor, a: dict, fn: str) -> tuple[Tensor, Tensor | None]:
    """max.dim's / min.dim's (values, indices): the indices (``fn``: argmax / argmin) only where read."""
    d = a["dim"] % len(x.shape)
    keep = tuple(1 if k == d else e for k, e in enumerate(x.shape))
    read = {u.args[1] for u in n.users if u in cv.live}
    indices = indices_of_max(cv, x, d, bool(a.get("keepdim")), fn) if 1 in read else None
    return (cv.reshape(y, keep) if a.get("keepdim") else y), indices


@op("min")
def _min(cv: Converter, n: Any, a: dict) -> Any:
    """min.other -> minimum; min.dim / min.default: ``-max(-x)`` (indices: argmin)."""
    overload = n.target._overloadname
    if overload == "other":
        return binary(cv, "minimum", a["self"], a["other"])
    x = cv.tensor(a["self"], "input")
    if overload not in ("dim", "default") or x.dtype == "bool":
        raise cv.fail(f"unsupported op {n.target}" + (" on bool" if x.dtype == "bool" else ""))
    y, _ = cv.reduce("max", cv.f.neg(x), cv.dims(x, a.get("dim")))
    y = cv.f.neg(y)
    if overload == "default":
        return cv.reshape(y, cv.out_shape())
    return _with_indices(cv, n, x, y, a, "argmin")


@op("amin")
def _amin(cv: Converter, n: Any, a: dict) -> Tensor:
    """``-amax(-x)`` over ``dim`` (numbers)."""
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    if x.dtype == "bool":
        raise cv.fail(f"unsupported op {n.target} on bool")
    y, _ = cv.reduce("max", cv.f.neg(x), cv.dims(x, a.get("dim")))
    return cv.reshape(cv.f.neg(y), cv.out_shape())


@op("prod")
def _prod(cv: Converter, n: Any, a: dict) -> Tensor:
    """``prod`` along ``dim`` (an ``along`` op: a sharded dim is gathered); without a dim, of x
    flattened."""
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    if a.get("dim") is None:
        x, d = cv.reshape(x, (math.prod(x.shape),)), 0
    else:
        d = a["dim"] % len(x.shape)
    return cv.reshape(cv.f.prod(x, d), cv.out_shape())


def _kept(x: Tensor, dims: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    """The shape of a reduction of ``x`` over ``dims`` (``()`` for no dims left)."""
    if keepdim:
        return tuple(1 if d in dims else e for d, e in enumerate(x.shape))
    return tuple(e for d, e in enumerate(x.shape) if d not in dims)


@op("var", "std", "var_mean", "std_mean")
def _var(cv: Converter, n: Any, a: dict) -> Any:
    """``sum((x - mean)^2) / (N - correction)`` over ``dim`` (``unbiased``: correction 1 or
    0); std is its sqrt; var_mean / std_mean return (it, mean).  Reductions only, so a
    sharded reduced dim becomes Partial sums."""
    f, name = cv.f, n.target._schema.name.split("::")[-1]
    x = cv.tensor(a["self"], "input")
    dims = cv.dims(x, a.get("dim"))
    correction = a["correction"] if "correction" in a else (1 if a.get("unbiased", True) else 0)
    correction = 1 if correction is None else float(correction)
    count = math.prod(x.shape[d] for d in dims)
    if count - correction <= 0:
        raise cv.fail(f"{n.target}: {count} elements with correction {correction} (a division by zero or less)")
    m, at = cv.reduce("mean", x, dims)
    dev = f.sub(x, cv.back(m, x, at))
    ss, _ = cv.reduce("sum", f.mul(dev, dev), dims)
    v = f.scale(ss, 1.0 / (count - correction))
    if name.startswith("std"):
        v = f.sqrt(v)
    shape = _kept(x, dims, bool(a.get("keepdim")))
    v = cv.reshape(v, shape)
    return (v, cv.reshape(m, shape)) if name.endswith("_mean") else v


@op("logsumexp")
def _logsumexp(cv: Converter, n: Any, a: dict) -> Tensor:
    """``log(sum(exp(x - m))) + m`` over ``dim``, m the max (``Converter.logsumexp``); a row of
    all -inf gives NaN where torch gives -inf."""
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    lse, _ = cv.logsumexp(x, a["dim"])
    return cv.reshape(lse, cv.out_shape())


@op("linalg_vector_norm", "norm")
def _vector_norm(cv: Converter, n: Any, a: dict) -> Tensor:
    """The vector p-norm over ``dim``: p = 2 ``sqrt(sum(x x))``, 1 ``sum(|x|)``, inf ``max(|x|)``,
    0 the count of nonzeros (others: unsupported)."""
    x = cv.cast(cv.tensor(a["self" if "self" in a else "input"], "input"), cv.out_dtype())
    p = a.get("ord", a.get("p", 2))
    p = 2.0 if p is None else float(p)
    return cv.reshape(vector_norm(cv, n, x, p, cv.dims(x, a.get("dim"))), cv.out_shape())


def vector_norm(cv: Converter, n: Any, x: Tensor, p: float, dims: tuple[int, ...]) -> Tensor:
    """The p-norm of ``x`` over ``dims`` (``cv.reduce``'s shape), p = 0, 1, 2 or inf."""
    f = cv.f
    if p == 2:
        return f.sqrt(cv.reduce("sum", f.mul(x, x), dims)[0])
    if p == 1:
        return cv.reduce("sum", f.abs(x), dims)[0]
    if p == math.inf:
        return cv.reduce("max", f.abs(x), dims)[0]
    if p == 0:
        return cv.reduce("sum", cv.cast(f.ne(x, cv.operand(0.0, x.shape, x.dtype)), x.dtype), dims)[0]
    raise cv.fail(f"unsupported op {n.target} with p={p} (only 0, 1, 2 and inf)")


@op("softmax", "_softmax", "_safe_softmax")
def _softmax(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    return cv.softmax(x, a["dim"], safe=n.target._schema.name.endswith("_safe_softmax"))


@op("log_softmax", "_log_softmax")
def _log_softmax(cv: Converter, n: Any, a: dict) -> Tensor:
    """x - logsumexp(x) over ``dim`` (max, sub, exp, sum, log, add, sub)."""
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    lse, at = cv.logsumexp(x, a["dim"])
    return cv.f.sub(x, cv.back(lse, x, at))


def _norm(cv: Converter, x: Tensor, k: int, eps: float, center: bool) -> Tensor:
    """(x - mean) * rsqrt(mean((x - mean)^2) + eps) over the last k dims (no centering for RMS)."""
    return _norm_stats(cv, x, k, eps, center)[0]


def _norm_stats(cv: Converter, x: Tensor, k: int, eps: float, center: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """``_norm``'s result, the mean (None without centering) and the rstd, the last two
    reduced over the last k dims."""
    f = cv.f
    dims = tuple(range(len(x.shape) - k, len(x.shape)))
    m = None
    if center:
        m, at = cv.reduce("mean", x, dims)
        x = f.sub(x, cv.back(m, x, at))
    v, at = cv.reduce("mean", f.mul(x, x), dims)
    r = f.rsqrt(cv.add_scalar(v, eps))
    return f.mul(x, cv.back(r, x, at)), m, r


def _stats_out(cv: Converter, n: Any, y: Tensor, m: Tensor | None, r: Tensor) -> tuple[Tensor, Any, Any]:
    """(y, mean, rstd) of a ``native_*_norm``, the statistics at torch's shapes where read."""
    read = {u.args[1] for u in n.users if u in cv.live}
    shapes = [tuple(v.shape) or (1,) for v in n.meta["val"][1:]]
    return (y, cv.reshape(m, shapes[0]) if 1 in read and m is not None else None,
            cv.reshape(r, shapes[1]) if 2 in read else None)


def _affine(cv: Converter, y: Tensor, w: Any, b: Any) -> Tensor:
    if w is not None:
        y = cv.f.mul(y, cv.operand(w, y.shape, y.dtype))
    if b is not None:
        y = cv.f.add(y, cv.operand(b, y.shape, y.dtype))
    return y


@op("layer_norm")
def _layer_norm(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["input"], "input")
    k = len(a["normalized_shape"])
    return _affine(cv, _norm(cv, x, k, float(a["eps"]), True), a["weight"], a["bias"])


@op("native_layer_norm")
def _native_layer_norm(cv: Converter, n: Any, a: dict) -> tuple[Tensor, Any, Any]:
    """(normalized, mean, rstd), the statistics where read."""
    y, m, r = _norm_stats(cv, cv.tensor(a["input"], "input"), len(a["normalized_shape"]), float(a["eps"]), True)
    return _stats_out(cv, n, _affine(cv, y, a["weight"], a["bias"]), m, r)


@op("rms_norm")
def _rms_norm(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["input"], "input")
    eps = a["eps"] if a["eps"] is not None else torch.finfo(DTYPES[x.dtype]).eps
    return _affine(cv, _norm(cv, x, len(a["normalized_shape"]), float(eps), False), a["weight"], None)


@op("group_norm", "native_group_norm")
def _group_norm(cv: Converter, n: Any, a: dict) -> Any:
    """x [N, C, *] as [N, G, C/G * prod(*)], normalized over its last dim (``_norm``), back to
    x's shape, then ``* weight + bias`` per channel (dim 1); native_group_norm: (that, None,
    None), only the first result."""
    x = cv.tensor(a["input"], "input")
    g = int(a["num_groups" if "num_groups" in a else "group"])
    if len(x.shape) < 2 or x.shape[1] % g:
        raise cv.fail(f"{n.target}: {x!r} has no channel dim of a multiple of {g} groups")
    grouped = cv.reshape(x, (x.shape[0], g, math.prod(x.shape[1:]) // g))
    y, m, r = _norm_stats(cv, grouped, 1, float(a["eps"]), True)
    y = _channels(cv, cv.reshape(y, x.shape), a.get("weight"), a.get("bias"))
    return y if n.target._schema.name.endswith("::group_norm") else _stats_out(cv, n, y, m, r)


def _channels(cv: Converter, y: Tensor, w: Any, b: Any) -> Tensor:
    """``y * w + b``, ``w`` and ``b`` (or None) per channel (dim 1)."""
    f = cv.f
    for p, fn in ((w, f.mul), (b, f.add)):
        if p is not None:
            y = fn(y, f.broadcast(cv.cast(cv.tensor(p, "weight"), y.dtype), y.shape, (1,)))
    return y


@op("_native_batch_norm_legit_no_training")
def _batch_norm_eval(cv: Converter, n: Any, a: dict) -> tuple[Tensor, None, None]:
    """``(x - running_mean) * rsqrt(running_var + eps) * w + b`` per channel (dim 1); the saved
    statistics (empty in evaluation) are not read."""
    f = cv.f
    x = cv.tensor(a["input"], "input")
    mean, var = (cv.cast(cv.tensor(a[k], k), x.dtype) for k in ("running_mean", "running_var"))
    r = f.rsqrt(cv.add_scalar(var, float(a["eps"])))
    y = f.mul(f.sub(x, f.broadcast(mean, x.shape, (1,))), f.broadcast(r, x.shape, (1,)))
    return _channels(cv, y, a.get("weight"), a.get("bias")), None, None


@op("_cdist_forward")
def _cdist(cv: Converter, n: Any, a: dict) -> Tensor:
    """The p-norm distance of each row of ``x1 [*, P, M]`` to each of ``x2 [*, R, M]``: the
    vector norm (``vector_norm``) of ``x1[..., :, None, :] - x2[..., None, :, :]`` over M."""
    f = cv.f
    x1, x2 = (cv.cast(cv.tensor(a[k], k), cv.out_dtype()) for k in ("x1", "x2"))
    lead = len(x1.shape) - 2
    shape = x1.shape[:-1] + x2.shape[-2:-1] + x1.shape[-1:]
    keep = tuple(range(lead))
    d = f.sub(f.broadcast(x1, shape, keep + (lead, lead + 2)), f.broadcast(x2, shape, keep + (lead + 1, lead + 2)))
    return cv.reshape(vector_norm(cv, n, d, float(a["p"]), (lead + 2,)), cv.out_shape())


@op("_pdist_forward")
def _pdist(cv: Converter, n: Any, a: dict) -> Tensor:
    """The p-norm distance of each pair ``i < j`` of the rows of ``x [N, M]``, row-major: rows
    ``i`` and ``j`` read by lookups at constant pair indices, their difference's norm."""
    f = cv.f
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    i, j = torch.triu_indices(x.shape[0], x.shape[0], 1, device="meta" if cv.on_meta else "cpu")
    rows = [f.embedding(x, cv.constant(k.contiguous(), ("pdist", x.shape[0], w))) for w, k in enumerate((i, j))]
    return cv.reshape(vector_norm(cv, n, f.sub(*rows), float(a["p"]), (1,)), cv.out_shape())


@op("histc")
def _histc(cv: Converter, n: Any, a: dict) -> Tensor:
    """Counts of ``x``'s elements in ``bins`` equal bins over ``[min, max]``, in x's dtype: an
    element's bin is torch's ``floor((x - min) * bins / (max - min))``, computed so in x's dtype
    (an integer ``x``, which a GPU takes: in float64, exact for 32-bit values; ``bins - 1`` for
    ``x == max``); elements outside the range (and NaN) are in none.  Each bin's count is a sum
    of comparisons of the elements' bins with a constant arange (a reduction over the
    elements: split elements give Partial counts).  No gradient (torch has none).
    ``min >= max`` (a range read from the values) is refused."""
    f = cv.f
    x = cv.tensor(a["self"], "input")
    bins, lo, hi = int(a.get("bins", 100)), float(a.get("min", 0)), float(a.get("max", 0))
    if not lo < hi:
        raise cv.fail(f"histc with min {lo} >= max {hi} takes its range from the values' min and max; give a "
                      "fixed range (min < max)")
    flat = cv.reshape(x, (math.prod(x.shape),))
    if dtype_kind(x.dtype) != "float":
        flat = cv.cast(flat, "float64")
    shape, dt = flat.shape, flat.dtype
    pos = f.floor(f.div(f.mul(cv.add_scalar(flat, -lo), cv.operand(float(bins), shape, dt)),
                        cv.operand(hi - lo, shape, dt)))
    inside = f.logical_and(f.ge(flat, cv.operand(lo, shape, dt)), f.le(flat, cv.operand(hi, shape, dt)))
    pos = f.where(inside, f.minimum(pos, cv.operand(float(bins - 1), shape, dt)), cv.operand(-1.0, shape, dt))
    return cv.cast(_counts(cv, pos, bins, dt), x.dtype)


def _counts(cv: Converter, values: Tensor, n: int, dt: str, weights: Tensor | None = None) -> Tensor:
    """``[n]``: how often each of ``0 .. n-1`` occurs in the vector ``values`` (with ``weights``:
    their sum there), in ``dt``: the values compared with a constant arange of their dtype,
    summed over the elements (split elements give Partial counts)."""
    f = cv.f
    grid = values.shape + (n,)
    arange = torch.arange(n, dtype=DTYPES[values.dtype])  # (small: real on the meta device too)
    hit = cv.cast(f.eq(f.broadcast(values, grid, (0,)),
                       f.broadcast(cv.constant(arange, ("arange", n, values.dtype)), grid, (1,))), dt)
    if weights is not None:
        hit = f.mul(hit, f.broadcast(cv.cast(weights, dt), grid, (0,)))
    counts, _ = cv.reduce("sum", hit, (0,))
    return counts


#: ops whose result holds an operand's values, as far as a bound on them goes (views, copies)
_SAME_VALUES = ("view", "_unsafe_view", "reshape", "flatten", "squeeze", "unsqueeze", "clone", "contiguous",
                "alias", "detach", "_to_copy", "to", "lift_fresh_copy", "t", "transpose", "permute")


def index_bound(node: Any) -> int | None:
    """An exclusive bound on the values of the graph node ``node`` when it is known from the
    ops that made it: the indices ``topk`` / ``sort`` / ``argsort`` / ``argmax`` / ``argmin``
    return along a dim of size S are below S, through views and copies; else None."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        target = node.target
        if target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            src = node.args[0]
            name = opname(src.target) if src.op == "call_function" else ""
            if name in ("topk", "sort") and node.args[1] == 1:
                x = src.args[0].meta["val"]
                dim = src.args[2] if name == "topk" and len(src.args) > 2 else src.kwargs.get("dim", -1)
                if name == "sort":
                    dim = src.args[1] if len(src.args) > 1 and isinstance(src.args[1], int) else dim
                return int(x.shape[dim]) if x.dim() else 1
            return None
        name = opname(target)
        if name in ("argmax", "argmin", "argsort"):
            x = node.args[0].meta["val"]
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            return int(x.numel()) if dim is None else int(x.shape[dim]) if x.dim() else 1
        if name not in _SAME_VALUES:
            return None
        node = node.args[0]
    return None


@op("bincount", own_dtype=True)
def _bincount(cv: Converter, n: Any, a: dict) -> Tensor:
    """How often each value ``0 .. L-1`` occurs in the int vector ``x`` (with ``weights``: their
    sum at those places), ``L = minlength``: a sum of comparisons with a constant arange, as
    ``histc``.  Its length is ``max(minlength, max(x) + 1)``, a function of the values, so it
    converts only where ``x``'s values are known to lie below ``minlength`` (``index_bound``: a
    mixture's top-k expert ids counted per expert); else refused.  Its dtype is torch's kernels'
    (not the exported node's: torch 2.11's fake kernel says int64 whatever the weights): int64
    counts, a sum of float32 weights in float32, of any other weights in float64."""
    length, bound = int(a.get("minlength", 0)), index_bound(n.args[0])
    if bound is None or bound > length:
        raise cv.fail(f"bincount's length is the largest value + 1, which depends on the values; it converts where "
                      f"the values are indices known to lie below minlength={length} (top-k / sort / argmax indices "
                      "over a dim that long), or count with (x[..., None] == torch.arange(n)).sum(0)")
    weights = None if a.get("weights") is None else cv.tensor(a["weights"], "weights")
    dt = "int64" if weights is None else "float32" if weights.dtype == "float32" else "float64"
    return _counts(cv, cv.cast(cv.tensor(a["self"], "input"), "int64"), length, dt, weights)


@op("cumsum")
def _cumsum(cv: Converter, n: Any, a: dict) -> Tensor:
    """Prefix sum along ``dim`` in the result's dtype (a bool or int32 input sums as int64)."""
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    return cv.f.cumsum(x, a["dim"] % len(x.shape))


@op("any")
def _any(cv: Converter, n: Any, a: dict) -> Tensor:
    """any over ``dim`` (all dims by default): the max of the operand as bool."""
    x = cv.cast(cv.tensor(a["self"], "input"), "bool")
    y, _ = cv.reduce("max", x, cv.dims(x, a.get("dim")))
    return cv.reshape(y, cv.out_shape())


@op("all")
def _all(cv: Converter, n: Any, a: dict) -> Tensor:
    """all = not any(not x)."""
    x = cv.f.logical_not(cv.cast(cv.tensor(a["self"], "input"), "bool"))
    y, _ = cv.reduce("max", x, cv.dims(x, a.get("dim")))
    return cv.f.logical_not(cv.reshape(y, cv.out_shape()))
