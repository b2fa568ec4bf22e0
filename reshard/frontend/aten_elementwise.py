"""Elementwise ATen ops: arithmetic (add, sub, mul, div, maximum, minimum, pow, ...), unary
functions, clamp, leaky_relu and elu (``where`` of comparisons), comparisons, isnan, logical ops,
``where`` / ``masked_fill``.  Operands broadcast like torch's and
are cast to the dtype torch computes in; Python scalars become constant inputs (``* c``,
``/ c``: ``scale``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..ir.fusion import DTYPES, Tensor
from .converter import OPS, Converter, Handler, first, is_num, op, opname


def binary(cv: Converter, fn: str, x: Any, y: Any, alpha: Any = 1) -> Tensor:
    """``x <fn> y``, tensors or Python scalars, broadcast and cast to the result's dtype."""
    shape, dt = cv.out_shape(), cv.out_dtype()
    if alpha not in (None, 1):
        y = y * alpha if is_num(y) else cv.f.scale(cv.cast(cv.tensor(y, "other"), dt), float(alpha))
    if is_num(x) and is_num(y):
        raise cv.fail(f"{fn} of two scalars")
    if fn in ("add", "sub") and is_num(y):
        return cv.add_scalar(cv.operand(x, shape, dt), y if fn == "add" else -y)
    if fn == "add" and is_num(x):
        return cv.add_scalar(cv.operand(y, shape, dt), x)
    if fn == "mul" and (is_num(x) or is_num(y)) and dt not in ("int64", "int32"):
        c, t = (x, y) if is_num(x) else (y, x)
        return cv.f.scale(cv.operand(t, shape, dt), float(c))
    if fn == "div" and is_num(y):
        if y == 0:
            raise cv.fail("division by the scalar 0")
        return cv.f.scale(cv.operand(x, shape, dt), 1.0 / float(y))
    return cv.f.binary(fn, cv.operand(x, shape, dt), cv.operand(y, shape, dt))


@op("add")
def _add(cv: Converter, n: Any, a: dict) -> Tensor:
    return binary(cv, "add", a["self"], a["other"], a.get("alpha", 1))


@op("sub")
def _sub(cv: Converter, n: Any, a: dict) -> Tensor:
    return binary(cv, "sub", a["self"], a["other"], a.get("alpha", 1))


@op("rsub")
def _rsub(cv: Converter, n: Any, a: dict) -> Tensor:
    return binary(cv, "sub", a["other"], a["self"], a.get("alpha", 1))


@op("div")
def _div(cv: Converter, n: Any, a: dict) -> Tensor:
    """``a / b``; ``rounding_mode`` "floor" / "trunc": that rounding of the quotient (of floats:
    ``floor`` / ``trunc`` of ``div``; of ints: ``floor_divide`` / ``trunc_divide``)."""
    mode = a.get("rounding_mode")
    if mode is not None and mode not in ("floor", "trunc"):
        raise cv.fail(f"unsupported op {n.target} (rounding_mode={mode!r})")
    if mode is not None and cv.out_dtype() in ("int64", "int32"):
        return binary(cv, f"{mode}_divide", a["self"], a["other"])
    q = binary(cv, "div", a["self"], a["other"])
    return q if mode is None else cv.f.unary(mode, q)


@op("mul", "maximum", "minimum", "atan2", "remainder", "fmod")
def _binary(cv: Converter, n: Any, a: dict) -> Tensor:
    """The binary function of the op's name (``remainder``: torch's floor-mod, the result takes
    the divisor's sign; ``fmod``: C's, the dividend's)."""
    return binary(cv, opname(n.target), a["self"], a["other"])


@op("clamp", "clamp_min", "clamp_max", "hardtanh")
def _clamp(cv: Converter, n: Any, a: dict) -> Tensor:
    """``clamp(x, lo, hi) = where(x > hi, hi, where(x < lo, lo, x))`` (a bound a scalar or a
    tensor; None: none; hardtanh's ``min_val`` / ``max_val``): NaN stays NaN, ``hi`` wins where
    ``lo > hi``, and the gradient reaches ``x`` where ``lo <= x <= hi`` and a tensor bound where
    it is taken (torch's rule; hardtanh's excludes the bounds: ``<=`` and ``>=`` there)."""
    f, shape, dt = cv.f, cv.out_shape(), cv.out_dtype()
    x = cv.operand(a["self"], shape, dt)
    lo, hi = a.get("min", a.get("min_val")), a.get("max", a.get("max_val"))
    below, above = (f.le, f.ge) if opname(n.target) == "hardtanh" else (f.lt, f.gt)
    if lo is not None:
        lo = cv.operand(lo, shape, dt)
        x = f.where(below(x, lo), lo, x)
    if hi is not None:
        hi = cv.operand(hi, shape, dt)
        x = f.where(above(x, hi), hi, x)
    return x


@op("leaky_relu")
def _leaky_relu(cv: Converter, n: Any, a: dict) -> Tensor:
    """``where(x > 0, x, slope x)``: NaN stays NaN; the gradient is ``g`` where x > 0, else
    ``slope g`` (torch's rule)."""
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    slope = float(a.get("negative_slope", 0.01))
    return cv.f.where(cv.f.gt(x, cv.operand(0.0, x.shape, x.dtype)), x, cv.f.scale(x, slope))


@op("elu")
def _elu(cv: Converter, n: Any, a: dict) -> Tensor:
    """``where(x > 0, scale x, alpha scale expm1(input_scale where(x > 0, 0, x)))`` (celu and selu
    decompose into it): the gradient is ``scale g`` where x > 0, else ``alpha scale input_scale
    g exp(input_scale x)`` (torch's rule); the zeroed operand keeps the untaken branch finite."""
    f = cv.f
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    alpha, scale, input_scale = (float(a.get(k, 1.0)) for k in ("alpha", "scale", "input_scale"))
    zero = cv.operand(0.0, x.shape, x.dtype)
    pos = f.gt(x, zero)
    neg = f.scale(f.expm1(f.scale(f.where(pos, zero, x), input_scale)), alpha * scale)
    return f.where(pos, f.scale(x, scale), neg)


@op("isnan")
def _isnan(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x != x``."""
    x = cv.tensor(a["self"], "input")
    return cv.f.ne(x, x)


@op("isinf")
def _isinf(cv: Converter, n: Any, a: dict) -> Tensor:
    """``abs(x) == inf`` (an int or bool tensor: ``x != x``, never)."""
    x = cv.tensor(a["self"], "input")
    if x.dtype in ("int64", "int32", "bool"):
        return cv.f.ne(x, x)
    return cv.f.eq(cv.f.abs(x), cv.operand(float("inf"), x.shape, x.dtype))


def _unary(fn: str) -> Handler:
    def h(cv: Converter, n: Any, a: dict) -> Tensor:
        return cv.f.unary(fn, cv.cast(cv.tensor(first(a), "input"), cv.out_dtype()))
    return h


for _fn in ("neg", "exp", "tanh", "relu", "silu", "sigmoid", "sqrt", "rsqrt", "abs", "log", "log1p", "erf",
            "log2", "expm1", "sin", "cos", "sign", "floor", "ceil", "trunc", "round", "tan", "asin", "acos", "atan",
            "sinh", "cosh", "asinh", "acosh", "atanh", "log10"):
    OPS[_fn] = _unary(_fn)


@op("gelu")
def _gelu(cv: Converter, n: Any, a: dict) -> Tensor:
    """gelu (erf form) or, with approximate="tanh", GPT-2's tanh form (``gelu_tanh``)."""
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    approximate = a.get("approximate", "none")
    if approximate == "tanh":
        return cv.f.unary("gelu_tanh", x)
    if approximate != "none":
        raise cv.fail(f"unsupported op {n.target} with approximate={approximate!r} (only 'none' and 'tanh')")
    return cv.f.gelu(x)


@op("pow")
def _pow(cv: Converter, n: Any, a: dict) -> Tensor:
    """``x ** e``: a Python exponent 1, 2, 3, 0.5, -0.5, -1 or -2 by products, roots and quotients, any
    other exponent (a tensor, or a tensor exponent of a Python base) by the ``pow`` function."""
    x, e = a["self"], a["exponent"]
    f, shape, dt = cv.f, cv.out_shape(), cv.out_dtype()
    if isinstance(x, Tensor) and is_num(e):
        x = cv.cast(x, dt)
        table: dict[float, Callable[[], Tensor]] = {
            1.0: lambda: x, 2.0: lambda: f.mul(x, x), 3.0: lambda: f.mul(f.mul(x, x), x), 0.5: lambda: f.sqrt(x),
            -0.5: lambda: f.rsqrt(x), -1.0: lambda: f.div(cv.operand(1.0, x.shape, x.dtype), x),
            -2.0: lambda: f.div(cv.operand(1.0, x.shape, x.dtype), f.mul(x, x)),
        }
        if float(e) in table:
            return table[float(e)]()
    if dt not in ("float32", "float64", "bfloat16", "float16"):
        raise cv.fail(f"unsupported op {n.target} on {dt} tensors (float powers only)")
    return f.pow(cv.operand(x, shape, dt), cv.operand(e, shape, dt))


@op("reciprocal")
def _reciprocal(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    return cv.f.div(cv.operand(1.0, x.shape, x.dtype), x)



def _operand_dtype(cv: Converter, x: Any, y: Any) -> str:
    """The dtype torch compares / selects ``x`` and ``y`` in (``torch.result_type``)."""
    def probe(v: Any) -> Any:
        return torch.empty((), dtype=DTYPES[v.dtype]) if isinstance(v, Tensor) else v
    return cv.dtype(torch.result_type(probe(x), probe(y)))


def _compare(fn: str) -> Handler:
    def h(cv: Converter, n: Any, a: dict) -> Tensor:
        x, y = a["self"], a["other"]
        shape, dt = cv.out_shape(), _operand_dtype(cv, x, y)
        return getattr(cv.f, fn)(cv.operand(x, shape, dt), cv.operand(y, shape, dt))
    return h


for _fn in ("eq", "ne", "lt", "le", "gt", "ge"):
    OPS[_fn] = _compare(_fn)


def _logical(fn: str) -> Handler:
    """``logical_<fn>`` / ``bitwise_<fn>`` (and ``&`` / ``|`` / ``^``): on bools (or as bools, for
    ``logical_*``) the logical function (xor: ``!=``), on ints the bitwise one."""
    def h(cv: Converter, n: Any, a: dict) -> Tensor:
        shape, dt = cv.out_shape(), cv.out_dtype()
        if dt != "bool":
            if dt not in ("int64", "int32"):
                raise cv.fail(f"unsupported op {n.target} on {dt} tensors (bitwise ops on ints and bools only)")
            return cv.f.binary(f"bitwise_{fn}", cv.operand(a["self"], shape, dt), cv.operand(a["other"], shape, dt))
        x, y = cv.operand(a["self"], shape, "bool"), cv.operand(a["other"], shape, "bool")
        return cv.f.ne(x, y) if fn == "xor" else cv.f.binary(f"logical_{fn}", x, y)
    return h


for _fn in ("and", "or", "xor"):
    for _name in (f"logical_{_fn}", f"bitwise_{_fn}", f"__{_fn}__"):
        OPS[_name] = _logical(_fn)


@op("logical_not", "bitwise_not")
def _logical_not(cv: Converter, n: Any, a: dict) -> Tensor:
    """On bools (or as bools, for ``logical_not``) the negation, on ints the bitwise one."""
    x, dt = cv.tensor(a["self"], "input"), cv.out_dtype()
    if dt in ("int64", "int32"):
        return cv.f.bitwise_not(cv.cast(x, dt))
    if dt != "bool":
        raise cv.fail(f"unsupported op {n.target} on {dt} tensors (bitwise ops on ints and bools only)")
    return cv.f.logical_not(cv.cast(x, "bool"))


def select(cv: Converter, cond: Any, x: Any, y: Any) -> Tensor:
    """``torch.where(cond, x, y)`` at the result's shape and dtype."""
    shape, dt = cv.out_shape(), cv.out_dtype()
    return cv.f.where(cv.operand(cond, shape, "bool"), cv.operand(x, shape, dt), cv.operand(y, shape, dt))


@op("where")
def _where(cv: Converter, n: Any, a: dict) -> Tensor:
    if a.get("self") is None:
        raise cv.fail(f"unsupported op {n.target} (where(cond) with one argument: data-dependent shape)")
    return select(cv, a["condition"], a["self"], a["other"])


@op("masked_fill")
def _masked_fill(cv: Converter, n: Any, a: dict) -> Tensor:
    return select(cv, a["mask"], a["value"], a["self"])
