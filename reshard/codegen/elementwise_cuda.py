"""The CUDA expressions of the elementwise functions (``ir.ops.elementwise``'s ``UNARY_FNS`` /
``BINARY_FNS``, by name) and of ``masked`` (``ir.ops.select``): what a generated pointwise
kernel (``codegen.kernels``) computes for each instruction.

An expression is over ``{a}`` (``{b}``), computed in float32 registers with a bool as the
value 0 or 1 (loaded from and stored to one byte, ``kernels.POINTWISE_DTYPES``); for a
function that takes ints, its form over 64-bit signed ints (``long long``: torch's integer
semantics, two's complement wrapping, written with unsigned arithmetic where signed overflow
would be undefined in C++); optionally a cheaper form for a value rounded to 16 bits right
away (``codegen.fast_math``).  A function without an entry runs with torch on a GPU and does
not join fused chains.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BINARY_CUDA", "MASKED_CUDA", "UNARY_CUDA", "Expr"]


@dataclass(frozen=True)
class Expr:
    """One function's CUDA forms: over float registers, over 64-bit ints (every function that
    takes ints has one; a comparison's result is the float 0 or 1), for a value rounded to 16
    bits right away."""

    cuda: str
    int64: str | None = None
    f16: str | None = None


#: int forms: wrapping two's complement arithmetic through ``unsigned long long``
_NEG_INT = "((long long)(0ull - (unsigned long long)({a})))"


def _int_arith(op: str) -> str:
    """``a op b`` on 64-bit ints, wrapping (C++'s unsigned arithmetic is modulo 2^64)."""
    return f"((long long)((unsigned long long)({{a}}) {op} (unsigned long long)({{b}})))"


def _int_only(op: str) -> str:
    """The float-held form of an int-only binary ``op`` (its operands are ints held as floats)."""
    return f"((float)(((long long)({{a}})) {op} ((long long)({{b}}))))"


def _compare(op: str) -> Expr:
    """A comparison (a bool result, 0 or 1); C's comparison does the same on floats (NaN
    compares unequal to everything, as in torch and IEEE) and on ints."""
    expr = f"({{a}} {op} {{b}} ? 1.0f : 0.0f)"
    return Expr(expr, int64=expr)


UNARY_CUDA: dict[str, Expr] = {
    "neg": Expr("(-{a})", int64=_NEG_INT),
    "exp": Expr("expf({a})"),
    "tanh": Expr("tanhf({a})"),
    "gelu": Expr("(0.5f * {a} * (1.0f + erff({a} * 0.7071067811865476f)))", f16="rs_gelu16({a})"),
    "gelu_tanh": Expr("(0.5f * {a} * (1.0f + tanhf(0.7978845608028654f * ({a} + 0.044715f * {a} * {a} * {a}))))"),
    "relu": Expr("({a} < 0.0f ? 0.0f : {a})"),  # keeps NaN, like torch
    "silu": Expr("({a} / (1.0f + expf(-{a})))"),
    "abs": Expr("fabsf({a})", int64=f"({{a}} < 0LL ? {_NEG_INT} : {{a}})"),
    "sqrt": Expr("sqrtf({a})"),
    "rsqrt": Expr("rsqrtf({a})"),
    "sigmoid": Expr("(1.0f / (1.0f + expf(-{a})))"),
    "log": Expr("logf({a})"),
    "erf": Expr("erff({a})"),
    "log1p": Expr("log1pf({a})"),
    "log2": Expr("log2f({a})"),
    "expm1": Expr("expm1f({a})"),
    "sin": Expr("sinf({a})"),
    "cos": Expr("cosf({a})"),
    "tan": Expr("tanf({a})"),
    "asin": Expr("asinf({a})"),
    "acos": Expr("acosf({a})"),
    "atan": Expr("atanf({a})"),
    "sinh": Expr("sinhf({a})"),
    "cosh": Expr("coshf({a})"),
    "asinh": Expr("asinhf({a})"),
    "acosh": Expr("acoshf({a})"),
    "atanh": Expr("atanhf({a})"),
    "log10": Expr("log10f({a})"),
    # on ints the identity, and sign the int -1, 0 or 1; sign(NaN) is 0, like torch's
    "sign": Expr("({a} > 0.0f ? 1.0f : ({a} < 0.0f ? -1.0f : 0.0f))",
                 int64="({a} > 0LL ? 1LL : ({a} < 0LL ? -1LL : 0LL))"),
    "floor": Expr("floorf({a})", int64="({a})"),
    "ceil": Expr("ceilf({a})", int64="({a})"),
    "trunc": Expr("truncf({a})", int64="({a})"),
    "round": Expr("rintf({a})", int64="({a})"),  # half to even
    "bitwise_not": Expr("((float)(~(long long)({a})))", int64="(~{a})"),
    "logical_not": Expr("({a} == 0.0f ? 1.0f : 0.0f)"),
}
BINARY_CUDA: dict[str, Expr] = {
    "add": Expr("({a} + {b})", int64=_int_arith("+")),
    "sub": Expr("({a} - {b})", int64=_int_arith("-")),
    "mul": Expr("({a} * {b})", int64=_int_arith("*")),
    "div": Expr("({a} / {b})"),
    "maximum": Expr("(({a} > {b} || {a} != {a}) ? {a} : {b})",  # NaN from either side
                    int64="({a} > {b} ? {a} : {b})"),
    "minimum": Expr("(({a} < {b} || {a} != {a}) ? {a} : {b})", int64="({a} < {b} ? {a} : {b})"),
    "atan2": Expr("atan2f({a}, {b})"),
    # torch's floor-mod: fmod, moved by b where it is nonzero and its sign differs from b's
    "remainder": Expr("((fmodf({a}, {b}) != 0.0f && (fmodf({a}, {b}) < 0.0f) != ({b} < 0.0f))"
                      " ? fmodf({a}, {b}) + {b} : fmodf({a}, {b}))",
                      int64="((({a} % {b}) != 0LL && ((({a} % {b}) < 0LL) != ({b} < 0LL))) ? ({a} % {b}) + {b}"
                            " : ({a} % {b}))"),
    # C's fmod: the result takes the dividend's sign
    "fmod": Expr("fmodf({a}, {b})", int64="({a} % {b})"),
    "pow": Expr("powf({a}, {b})"),
    "floor_divide": Expr("floorf({a} / {b})",
                         int64="({a} / {b} - ((({a} % {b}) != 0LL && (({a} < 0LL) != ({b} < 0LL))) ? 1LL : 0LL))"),
    "trunc_divide": Expr("truncf({a} / {b})", int64="({a} / {b})"),
    "bitwise_and": Expr(_int_only("&"), int64="({a} & {b})"),
    "bitwise_or": Expr(_int_only("|"), int64="({a} | {b})"),
    "bitwise_xor": Expr(_int_only("^"), int64="({a} ^ {b})"),
    "eq": _compare("=="),
    "ne": _compare("!="),
    "lt": _compare("<"),
    "le": _compare("<="),
    "gt": _compare(">"),
    "ge": _compare(">="),
    "logical_and": Expr("(({a} != 0.0f && {b} != 0.0f) ? 1.0f : 0.0f)"),
    "logical_or": Expr("(({a} != 0.0f || {b} != 0.0f) ? 1.0f : 0.0f)"),
}

#: ``masked``'s expression by ``keep``, over ``{x}``, the condition ``{c}`` (the float 0 or 1)
#: and ``{zero}`` (``0.0f``, or ``0LL`` for an int ``x``)
MASKED_CUDA: dict[bool, str] = {True: "({c} != 0.0f ? {x} : {zero})", False: "({c} != 0.0f ? {zero} : {x})"}
