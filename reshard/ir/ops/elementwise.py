"""Elementwise ops: ``unary`` (one function of ``UNARY_FNS``), ``binary`` (``BINARY_FNS``),
``scale`` (times a Python scalar), ``cast``, ``set`` (a copy).

A function is one entry of its table: its torch function (reference and CPU step), the dtype kinds it takes
(``dtypes.KINDS``: float, int, bool), the dtype of its result (None: its operands'; "bool" for
the comparisons ``eq ne lt le gt ge``) and the Partial ops it keeps (linear maps keep
Partial("sum"); none keeps Partial("max") except ``set``; comparisons and logical ops keep
none) and its vector-Jacobian product (``Grad``; None: no gradient, the comparisons and
logical ops).  The builder methods (``f.exp(x)``, ``f.add(a, b)``, ``f.eq(a, b)``, ...) are
generated from the tables.  (``f.where`` is ``ir/ops/select.py``.)  Its CUDA expressions, for
generated pointwise kernels, are codegen's: ``codegen/elementwise_cuda.py``, by name.

Gradients (``OpKind.vjp``; ``g`` the result's gradient, ``y`` the result, forward values read
through ``saved``) follow torch's backward formulas term by term: ``exp``: ``g y``; ``tanh``:
``g - g y y``; ``sigmoid``: ``g y - g y y``; ``sqrt``: ``(g / y) / 2``; ``rsqrt``: ``-g y^3 / 2``;
``log``: ``g / x``; ``log1p``: ``g / (1 + x)`` as ``g exp(-y)``; ``log2``: ``g / (x ln 2)``;
``expm1``: ``g (y + 1)`` as ``g y + g``; ``sin``: ``g cos(x)``; ``cos``: ``-(g sin(x))``; ``sign``,
``floor``, ``ceil``, ``trunc``: zero (torch's zeros: the vjp's None stops the flow, and an input
reached only through them gets zeros, ``autodiff``); ``erf``: ``g 2/sqrt(pi) exp(-x^2)``;
``gelu``: ``g (Phi(x) + x phi(x))``;
``gelu_tanh``: ``g (0.5 (1 + t) + 0.5 x (1 - t^2) b (1 + 3 k x^2))``, ``t = tanh(b (x + k x^3))``;
``silu``: ``g s (1 + x (1 - s))``, ``s = sigmoid(x)``; ``relu``: ``g`` where ``y > 0`` (torch's
threshold rule), else 0; ``abs``: ``g sgn(x)`` (0 at 0); ``mul``: ``g b``, ``g a``; ``div``:
``g / b``, ``-(g a) / (b b)``; ``maximum`` (``minimum``): ``g`` to the larger (smaller) operand,
``g / 2`` to each on a tie (torch's rule); ``atan2``: ``g b / r``, ``-(g a) / r``,
``r = a a + b b``; ``remainder``: ``g``, ``-(g floor(a / b))``; ``fmod``: ``g``, ``-(g trunc(a / b))``;
``pow``: ``g b y / a`` (where ``a != 0``), ``g y log(a)``; the inverse trigonometric and hyperbolic
functions through their result (``acos``: ``-g / sin(y)``, ``asin``: ``g / cos(y)``, ``atan``:
``g cos(y)^2``, ``acosh``: ``g / sinh(y)``, ``asinh``: ``g / cosh(y)``, ``atanh``: ``g cosh(y)^2``),
``sinh``: ``g cosh(x)``, ``cosh``: ``g sinh(x)``, ``tan``: ``g + g y y``, ``log10``:
``g / (x ln 10)``, ``round``: zero; ``bitwise_*``, ``floor_divide``, ``trunc_divide`` (ints
only): none.  The IR has no constants:
``1 - v`` is written ``g - g v``, and a test against zero ``x > 0`` as ``x > -x``.  ``scale``:
``g factor``; ``cast`` float -> float: ``g`` cast back (none to or from int / bool); ``set``: ``g``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import DTYPES, check_kind, dtype_kind, dtype_name
from ..errors import ReshardError
from .registry import OpKind, StepLike, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None
Saved = Callable[["Tensor"], "Tensor"]
#: an elementwise function's vjp: ``(f, g, operands, result, saved) -> operands' gradients``
Grad = Callable[["Fusion", "Tensor", "list[Tensor]", "Tensor", Saved], "list[Tensor | None]"]


def _d_neg(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.neg(g)]


def _d_exp(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.mul(g, saved(y))]


def _d_tanh(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    y = saved(y)
    return [f.sub(g, f.mul(f.mul(g, y), y))]


def _d_gelu(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g (Phi(x) + x phi(x))``: ``g Phi(x) = (g + g erf(x / sqrt 2)) / 2``."""
    x = saved(xs[0])
    cdf = f.scale(f.add(g, f.mul(g, f.erf(f.scale(x, math.sqrt(0.5))))), 0.5)
    pdf = f.scale(f.exp(f.scale(f.mul(x, x), -0.5)), 1.0 / math.sqrt(2.0 * math.pi))
    return [f.add(cdf, f.mul(g, f.mul(x, pdf)))]


_GELU_B, _GELU_K = math.sqrt(2.0 / math.pi), 0.044715


def _d_gelu_tanh(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g (0.5 (1 + t) + 0.5 x (1 - t^2) b (1 + 3 k x^2))``, ``t = tanh(b (x + k x^3))``."""
    x = saved(xs[0])
    xx = f.mul(x, x)
    t = f.tanh(f.scale(f.add(x, f.scale(f.mul(xx, x), _GELU_K)), _GELU_B))
    gt = f.mul(g, t)
    left = f.scale(f.add(g, gt), 0.5)
    h = f.scale(f.mul(f.sub(g, f.mul(gt, t)), x), 0.5 * _GELU_B)
    return [f.add(left, f.add(h, f.scale(f.mul(h, xx), 3.0 * _GELU_K)))]


def _d_relu(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    y = saved(y)
    return [f.masked(g, f.gt(y, f.neg(y)), True)]


def _d_silu(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    x = saved(xs[0])
    s = f.sigmoid(x)
    gs = f.mul(g, s)
    gsx = f.mul(gs, x)
    return [f.add(gs, f.sub(gsx, f.mul(gsx, s)))]


def _d_abs(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    x = saved(xs[0])
    nx = f.neg(x)
    return [f.sub(f.masked(g, f.gt(x, nx), True), f.masked(g, f.lt(x, nx), True))]


def _d_sqrt(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.scale(f.div(g, saved(y)), 0.5)]


def _d_rsqrt(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    y = saved(y)
    return [f.scale(f.mul(g, f.mul(f.mul(y, y), y)), -0.5)]


def _d_sigmoid(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    y = saved(y)
    gy = f.mul(g, y)
    return [f.sub(gy, f.mul(gy, y))]


def _d_log(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.div(g, saved(xs[0]))]


def _d_log1p(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g / (1 + x)``, written ``g exp(-y)`` (the IR has no constant 1)."""
    return [f.mul(g, f.exp(f.neg(saved(y))))]


def _d_zero(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """Zero (a step function: ``sign``, ``floor``, ``ceil``, ``trunc``): None stops the flow."""
    return [None]


def _d_log2(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.div(g, f.scale(saved(xs[0]), math.log(2.0)))]


def _d_expm1(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g (y + 1)``, written ``g y + g`` (the IR has no constant 1)."""
    return [f.add(f.mul(g, saved(y)), g)]


def _d_sin(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.mul(g, f.cos(saved(xs[0])))]


def _d_cos(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.neg(f.mul(g, f.sin(saved(xs[0]))))]


def _d_acos(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``-g / sqrt(1 - x^2)``, written ``-g / sin(y)`` (the IR has no constant 1)."""
    return [f.neg(f.div(g, f.sin(saved(y))))]


def _d_asin(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g / sqrt(1 - x^2)``, written ``g / cos(y)``."""
    return [f.div(g, f.cos(saved(y)))]


def _d_atan(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g / (1 + x^2)``, written ``g cos(y)^2``."""
    c = f.cos(saved(y))
    return [f.mul(f.mul(g, c), c)]


def _d_acosh(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g / sqrt(x^2 - 1)``, written ``g / sinh(y)``."""
    return [f.div(g, f.sinh(saved(y)))]


def _d_asinh(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g / sqrt(x^2 + 1)``, written ``g / cosh(y)``."""
    return [f.div(g, f.cosh(saved(y)))]


def _d_atanh(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g / (1 - x^2)``, written ``g cosh(y)^2``."""
    c = f.cosh(saved(y))
    return [f.mul(f.mul(g, c), c)]


def _d_sinh(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.mul(g, f.cosh(saved(xs[0])))]


def _d_cosh(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.mul(g, f.sinh(saved(xs[0])))]


def _d_tan(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g (1 + y^2)``, written ``g + g y y``."""
    y = saved(y)
    return [f.add(g, f.mul(f.mul(g, y), y))]


def _d_log10(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.div(g, f.scale(saved(xs[0]), math.log(10.0)))]


def _d_erf(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    x = saved(xs[0])
    return [f.mul(g, f.scale(f.exp(f.neg(f.mul(x, x))), 2.0 / math.sqrt(math.pi)))]


def _d_add(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [g, g]


def _d_sub(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [g, f.neg(g)]


def _d_mul(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    return [f.mul(g, saved(xs[1])), f.mul(g, saved(xs[0]))]


def _d_div(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    a, b = saved(xs[0]), saved(xs[1])
    return [f.div(g, b), f.neg(f.div(f.mul(g, a), f.mul(b, b)))]


def _d_maximum(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    a, b = saved(xs[0]), saved(xs[1])
    tie = f.masked(f.scale(g, 0.5), f.eq(a, b), True)
    return [f.add(f.masked(g, f.gt(a, b), True), tie), f.add(f.masked(g, f.lt(a, b), True), tie)]


def _d_minimum(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    a, b = saved(xs[0]), saved(xs[1])
    tie = f.masked(f.scale(g, 0.5), f.eq(a, b), True)
    return [f.add(f.masked(g, f.lt(a, b), True), tie), f.add(f.masked(g, f.gt(a, b), True), tie)]


def _d_atan2(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    a, b = saved(xs[0]), saved(xs[1])
    r = f.add(f.mul(a, a), f.mul(b, b))
    return [f.div(f.mul(g, b), r), f.div(f.neg(f.mul(g, a)), r)]


def _d_remainder(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``a - b floor(a / b)``: ``g``, ``-(g floor(a / b))`` (torch's rule)."""
    return [g, f.neg(f.mul(g, f.floor(f.div(saved(xs[0]), saved(xs[1])))))]


def _d_fmod(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``a - b trunc(a / b)``: ``g``, ``-(g trunc(a / b))`` (torch's rule)."""
    return [g, f.neg(f.mul(g, f.trunc(f.div(saved(xs[0]), saved(xs[1])))))]


def _d_pow(f: Fusion, g: Tensor, xs: list[Tensor], y: Tensor, saved: Saved) -> list[Tensor | None]:
    """``y = a^b``: ``g b y / a`` (torch's ``g b a^(b-1)`` where ``a != 0``; the IR has no constant
    for ``b - 1``), ``g y log(a)``."""
    a, b, y = saved(xs[0]), saved(xs[1]), saved(y)
    return [f.div(f.mul(f.mul(g, b), y), a), f.mul(f.mul(g, y), f.log(a))]


@dataclass(frozen=True)
class Fn:
    """One elementwise function: torch semantics, the Partial ops it keeps, the dtype kinds it
    takes, its result's dtype (None: the operands') and its vjp (None: no gradient).  Its CUDA
    expressions are codegen's (``codegen.elementwise_cuda``, by the function's name)."""

    torch: Callable[..., torch.Tensor]
    keeps: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ("float",)
    result: str | None = None
    grad: Grad | None = None


_NUM = ("float", "int")
_ALL = ("float", "int", "bool")


def _compare(fn: Callable[..., torch.Tensor]) -> Fn:
    """A comparison (a bool result) of two operands of any kind."""
    return Fn(fn, kinds=_ALL, result="bool")


UNARY_FNS: dict[str, Fn] = {
    "neg": Fn(torch.neg, keeps=("sum",), kinds=_NUM, grad=_d_neg),
    "exp": Fn(torch.exp, grad=_d_exp),
    "tanh": Fn(torch.tanh, grad=_d_tanh),
    "gelu": Fn(torch.nn.functional.gelu, grad=_d_gelu),
    "gelu_tanh": Fn(lambda x: torch.nn.functional.gelu(x, approximate="tanh"), grad=_d_gelu_tanh),
    "relu": Fn(torch.relu, grad=_d_relu),
    "silu": Fn(torch.nn.functional.silu, grad=_d_silu),
    "abs": Fn(torch.abs, kinds=_NUM, grad=_d_abs),
    "sqrt": Fn(torch.sqrt, grad=_d_sqrt),
    "rsqrt": Fn(torch.rsqrt, grad=_d_rsqrt),
    "sigmoid": Fn(torch.sigmoid, grad=_d_sigmoid),
    "log": Fn(torch.log, grad=_d_log),
    "erf": Fn(torch.erf, grad=_d_erf),
    "log1p": Fn(torch.log1p, grad=_d_log1p),
    "log2": Fn(torch.log2, grad=_d_log2),
    "expm1": Fn(torch.expm1, grad=_d_expm1),
    "sin": Fn(torch.sin, grad=_d_sin),
    "cos": Fn(torch.cos, grad=_d_cos),
    "tan": Fn(torch.tan, grad=_d_tan),
    "asin": Fn(torch.asin, grad=_d_asin),
    "acos": Fn(torch.acos, grad=_d_acos),
    "atan": Fn(torch.atan, grad=_d_atan),
    "sinh": Fn(torch.sinh, grad=_d_sinh),
    "cosh": Fn(torch.cosh, grad=_d_cosh),
    "asinh": Fn(torch.asinh, grad=_d_asinh),
    "acosh": Fn(torch.acosh, grad=_d_acosh),
    "atanh": Fn(torch.atanh, grad=_d_atanh),
    "log10": Fn(torch.log10, grad=_d_log10),
    # step functions (zero gradient)
    "sign": Fn(torch.sign, kinds=_NUM, grad=_d_zero),
    "floor": Fn(torch.floor, kinds=_NUM, grad=_d_zero),
    "ceil": Fn(torch.ceil, kinds=_NUM, grad=_d_zero),
    "trunc": Fn(torch.trunc, kinds=_NUM, grad=_d_zero),
    "round": Fn(torch.round, kinds=_NUM, grad=_d_zero),
    "bitwise_not": Fn(torch.bitwise_not, kinds=("int",)),
    "logical_not": Fn(torch.logical_not, kinds=("bool",)),
}
BINARY_FNS: dict[str, Fn] = {
    "add": Fn(torch.add, keeps=("sum",), kinds=_NUM, grad=_d_add),
    "sub": Fn(torch.sub, keeps=("sum",), kinds=_NUM, grad=_d_sub),
    "mul": Fn(torch.mul, kinds=_NUM, grad=_d_mul),
    "div": Fn(torch.div, grad=_d_div),
    "maximum": Fn(torch.maximum, kinds=_ALL, grad=_d_maximum),
    "minimum": Fn(torch.minimum, kinds=_ALL, grad=_d_minimum),
    "atan2": Fn(torch.atan2, grad=_d_atan2),
    # torch's floor-mod
    "remainder": Fn(torch.remainder, kinds=_NUM, grad=_d_remainder),
    # C's fmod: the result takes the dividend's sign
    "fmod": Fn(torch.fmod, kinds=_NUM, grad=_d_fmod),
    "pow": Fn(torch.pow, grad=_d_pow),
    # integer quotients (ints only; the float forms are ``floor`` / ``trunc`` of ``div``)
    "floor_divide": Fn(lambda a, b: torch.div(a, b, rounding_mode="floor"), kinds=("int",)),
    "trunc_divide": Fn(lambda a, b: torch.div(a, b, rounding_mode="trunc"), kinds=("int",)),
    # on ints only (on bools: ``logical_*``)
    "bitwise_and": Fn(torch.bitwise_and, kinds=("int",)),
    "bitwise_or": Fn(torch.bitwise_or, kinds=("int",)),
    "bitwise_xor": Fn(torch.bitwise_xor, kinds=("int",)),
    # comparisons (bool results)
    "eq": _compare(torch.eq),
    "ne": _compare(torch.ne),
    "lt": _compare(torch.lt),
    "le": _compare(torch.le),
    "gt": _compare(torch.gt),
    "ge": _compare(torch.ge),
    "logical_and": Fn(torch.logical_and, kinds=("bool",)),
    "logical_or": Fn(torch.logical_or, kinds=("bool",)),
}


def unary(f: Fusion, fn: str, t: Tensor, *, name: Name = None) -> Tensor:
    """``fn(t)`` elementwise, ``fn`` a name of ``UNARY_FNS``."""
    f._check(t, fn)
    if fn not in UNARY_FNS:
        raise ReshardError(f"unary: unknown function {fn!r}; supported: {tuple(UNARY_FNS)}")
    check_kind(fn, t, UNARY_FNS[fn].kinds)
    return f._op("unary", [t], f._new(t.shape, UNARY_FNS[fn].result or t.dtype, t.mesh, name), fn=fn)


def binary(f: Fusion, fn: str, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor:
    """``fn(a, b)`` elementwise, ``fn`` a name of ``BINARY_FNS``; same shapes and dtypes."""
    f._check(a, fn, "lhs")
    f._check(b, fn, "rhs")
    if fn not in BINARY_FNS:
        raise ReshardError(f"binary: unknown function {fn!r}; supported: {tuple(BINARY_FNS)}")
    if a.shape != b.shape:
        raise ReshardError(f"{fn}: operand shapes differ: lhs {a!r} vs rhs {b!r}")
    if a.dtype != b.dtype:
        raise ReshardError(f"{fn}: operand dtypes differ: lhs {a!r} vs rhs {b!r}; cast one first")
    check_kind(fn, a, BINARY_FNS[fn].kinds)
    mesh = f._same_mesh(fn, a, b)
    return f._op("binary", [a, b], f._new(a.shape, BINARY_FNS[fn].result or a.dtype, mesh, name), fn=fn)


def _unary_method(fn: str) -> Callable[..., Any]:
    def method(f: Fusion, t: Tensor, *, name: Name = None) -> Tensor:
        return unary(f, fn, t, name=name)
    method.__name__ = method.__qualname__ = fn
    method.__doc__ = f"``{fn}(t)`` elementwise."
    return method


def _binary_method(fn: str) -> Callable[..., Any]:
    def method(f: Fusion, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor:
        return binary(f, fn, a, b, name=name)
    method.__name__ = method.__qualname__ = fn
    method.__doc__ = f"``{fn}(a, b)`` elementwise."
    return method


def scale(f: Fusion, t: Tensor, factor: float, *, name: Name = None) -> Tensor:
    """``t * factor`` for a Python scalar (linear: keeps Partial sums); float tensors."""
    f._check(t, "scale")
    check_kind("scale", t, ("float",))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise ReshardError(f"scale of {t!r}: factor must be a number, got {factor!r}")
    return f._op("scale", [t], f._new(t.shape, t.dtype, t.mesh, name), factor=float(factor))


def cast(f: Fusion, t: Tensor, dtype: Any, *, name: Name = None) -> Tensor:
    """``t`` converted to ``dtype`` (torch's ``.to``: float -> int truncates toward zero,
    anything -> bool is ``!= 0``, bool -> number is 0 / 1)."""
    f._check(t, "cast")
    return f._op("cast", [t], f._new(t.shape, dtype_name(dtype, f"cast of {t!r}"), t.mesh, name))


def set_(f: Fusion, t: Tensor, *, name: Name = None) -> Tensor:
    """A copy of ``t``."""
    f._check(t, "set")
    return f._op("set", [t], f._new(t.shape, t.dtype, t.mesh, name))


set_.__name__ = set_.__qualname__ = "set"


class Pointwise(OpKind):
    """An elementwise op (``select.Masked`` is one too); its instruction in a pointwise kernel,
    alone or fused, is codegen's (``codegen.pointwise_ops``)."""

    fused_read = True
    fuses_operands = True

    def out_dtype(self, step: StepLike, xs: list[torch.Tensor]) -> torch.dtype:
        """The result's dtype of the step on operands ``xs``."""
        return xs[0].dtype


@register("unary")
class Unary(Pointwise):
    builders = {"unary": unary, **{fn: _unary_method(fn) for fn in UNARY_FNS}}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return UNARY_FNS[a["fn"]].torch(xs[0])

    def keeps(self, op: Op) -> tuple[str, ...]:
        return UNARY_FNS[op.attrs["fn"]].keeps

    def out_dtype(self, step: StepLike, xs: list[torch.Tensor]) -> torch.dtype:
        res = UNARY_FNS[step.attr("fn")].result
        return DTYPES[res] if res else xs[0].dtype

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Saved) -> list[Tensor | None]:
        grad = UNARY_FNS[op.attrs["fn"]].grad
        return grad(f, g, xs, out, saved) if grad else [None]


@register("binary")
class Binary(Pointwise):
    builders = {"binary": binary, **{fn: _binary_method(fn) for fn in BINARY_FNS}}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return BINARY_FNS[a["fn"]].torch(xs[0], xs[1])

    def keeps(self, op: Op) -> tuple[str, ...]:
        return BINARY_FNS[op.attrs["fn"]].keeps

    def out_dtype(self, step: StepLike, xs: list[torch.Tensor]) -> torch.dtype:
        res = BINARY_FNS[step.attr("fn")].result
        return DTYPES[res] if res else torch.result_type(*xs)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Saved) -> list[Tensor | None]:
        grad = BINARY_FNS[op.attrs["fn"]].grad
        return grad(f, g, xs, out, saved) if grad else [None, None]


@register("scale")
class Scale(Pointwise):
    builders = {"scale": scale}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return xs[0] * a["factor"]

    def keeps(self, op: Op) -> tuple[str, ...]:
        return ("sum",)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Saved) -> list[Tensor | None]:
        return [f.scale(g, op.attrs["factor"])]


@register("cast")
class Cast(Pointwise):
    builders = {"cast": cast}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return xs[0].to(DTYPES[out_dtype])

    def shares_operand(self, step: StepLike, ins: list[tuple[tuple[int, ...], str]]) -> int | None:
        """``Tensor.to`` of a tensor already of the dtype is the tensor itself."""
        return 0 if ins[0][1] == step.attr("dtype") else None

    def out_dtype(self, step: StepLike, xs: list[torch.Tensor]) -> torch.dtype:
        return DTYPES[step.attr("dtype")]

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Saved) -> list[Tensor | None]:
        """Float -> float: ``g`` cast back; none to or from ints and bools."""
        floats = dtype_kind(xs[0].dtype) == dtype_kind(out.dtype) == "float"
        return [f.cast(g, xs[0].dtype) if floats else None]


@register("set")
class Set(OpKind):
    builders = {"set": set_}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return xs[0].clone()

    def keeps(self, op: Op) -> tuple[str, ...]:
        return ("sum", "max")

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Saved) -> list[Tensor | None]:
        return [g]
