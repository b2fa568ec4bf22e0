"""Reductions and the ops built on them: sum / mean / amax / amin / max / min / prod, softmax, log_softmax,
logsumexp, var / std (and var_mean, std_mean), linalg_vector_norm, layer_norm, rms_norm and
group_norm; any / all (max of bools); cumsum (a scan)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..ir.fusion import DTYPES, Tensor
from .aten_along import indices_of_max
from .aten_elementwise import binary
from .converter import OPS, Converter, Handler, op


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
    """The shape of a reduction of ``x`` over ``dims`` ((1,) for no dims left)."""
    if keepdim:
        return tuple(1 if d in dims else e for d, e in enumerate(x.shape))
    return tuple(e for d, e in enumerate(x.shape) if d not in dims) or (1,)


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
    f = cv.f
    x = cv.cast(cv.tensor(a["self" if "self" in a else "input"], "input"), cv.out_dtype())
    p = a.get("ord", a.get("p", 2))
    p = 2.0 if p is None else float(p)
    dims = cv.dims(x, a.get("dim"))
    if p == 2:
        y = f.sqrt(cv.reduce("sum", f.mul(x, x), dims)[0])
    elif p == 1:
        y = cv.reduce("sum", f.abs(x), dims)[0]
    elif p == math.inf:
        y = cv.reduce("max", f.abs(x), dims)[0]
    elif p == 0:
        y = cv.reduce("sum", cv.cast(f.ne(x, cv.operand(0.0, x.shape, x.dtype)), x.dtype), dims)[0]
    else:
        raise cv.fail(f"unsupported op {n.target} with ord={p} (only 0, 1, 2 and inf)")
    return cv.reshape(y, cv.out_shape())


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
    f = cv.f
    dims = tuple(range(len(x.shape) - k, len(x.shape)))
    if center:
        m, at = cv.reduce("mean", x, dims)
        x = f.sub(x, cv.back(m, x, at))
    v, at = cv.reduce("mean", f.mul(x, x), dims)
    return f.mul(x, cv.back(f.rsqrt(cv.add_scalar(v, eps)), x, at))


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
def _native_layer_norm(cv: Converter, n: Any, a: dict) -> tuple[Tensor, None, None]:
    """(normalized, mean, rstd): only the first result is supported."""
    y = _affine(cv, _norm(cv, cv.tensor(a["input"], "input"), len(a["normalized_shape"]), float(a["eps"]), True),
                a["weight"], a["bias"])
    return y, None, None


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
    f = cv.f
    x = cv.tensor(a["input"], "input")
    g = int(a["num_groups" if "num_groups" in a else "group"])
    if len(x.shape) < 2 or x.shape[1] % g:
        raise cv.fail(f"{n.target}: {x!r} has no channel dim of a multiple of {g} groups")
    grouped = cv.reshape(x, (x.shape[0], g, math.prod(x.shape[1:]) // g))
    y = cv.reshape(_norm(cv, grouped, 1, float(a["eps"]), True), x.shape)
    for p, fn in ((a.get("weight"), f.mul), (a.get("bias"), f.add)):
        if p is not None:
            y = fn(y, f.broadcast(cv.cast(cv.tensor(p, "weight"), y.dtype), y.shape, (1,)))
    return y if n.target._schema.name.endswith("::group_norm") else (y, None, None)


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
