"""Device functions for values that are rounded to a 16-bit float right after they are computed.

A bfloat16 / float16 result keeps 8 / 11 significant bits, so float32 library functions
(``erff``: about 30 instructions per element, many of them selects) spend issue slots on
accuracy the rounding throws away.  On an H200 a bf16 gelu with ``erff`` is bound by
instructions, not bytes (72.8% of copy bandwidth, docs/history/benchmarks-2026-11.md).  The
functions here are accurate to a few 1e-7 relative (before rounding) and use the
special-function unit's approximate ``rcp``/``ex2`` instead, so the kernel is bound by memory
again.

``gelu16(x) = x * Phi(x)`` (the exact erf gelu, torch's default) is evaluated as

    t = |x|,  s = 1 / (1 + GELU16_SCALE * t),  h = s * P(s) * 2^(-x^2 log2(e) / 2)  (= Phi(-t))
    gelu16(x) = x * (1 - h)   if x > 0   else   x * h

``P`` (:data:`GELU16_POLY`, lowest degree first) is a degree-6 fit of
``Phi(-t) exp(t^2/2) / s`` over ``t`` in [0, 14] minimizing the largest *relative* error
(Lawson's iteration; ``scripts/fit_gelu16.py`` reproduces it): 6.2e-7.  Computing the tail
``Phi(-t)`` directly (no ``1 + erf`` cancellation) keeps the relative error small for
negative ``x`` too, where torch's formula loses every digit below ``x = -5.5``.  Evaluated
in float32 over every finite bfloat16 input whose gelu is at least 1e-30 in magnitude, the
result rounds to the correctly rounded bf16 value on all of them; over float16 (normal
results) it is within 1 ulp (11 of 45068 off by one; torch on the CPU: 201, up to 2 ulp; the
kernel on an H200: 14 of 45101, torch there 107, BENCHMARKS.md).
``tests/kernels/test_fast_math.py`` checks that on the CPU, and on a GPU the kernels themselves.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["GELU16_SCALE", "GELU16_POLY", "GELU16_EXP2_SCALE", "gelu16_source", "ROUNDS_TO_16BIT"]

#: ``c`` in ``s = 1 / (1 + c |x|)``.
GELU16_SCALE = 0.265
#: Coefficients of ``P(s)``, lowest degree first.
GELU16_POLY: tuple[float, ...] = (
    0.10559983428929642, 0.10783678473836147, 0.08294657067202207, 0.14249338453208443,
    -0.06636298748922315, 0.19527315315218222, -0.06778705118866307,
)
#: ``-log2(e) / 2``: ``exp(-x^2 / 2) = 2^(x^2 * GELU16_EXP2_SCALE)``.
GELU16_EXP2_SCALE = -0.7213475204444817
#: Dtypes whose rounding leaves room for the functions here.
ROUNDS_TO_16BIT = frozenset({"bfloat16", "float16"})


def _horner(coeffs: Sequence[float], var: str, lit: Callable[[float], str]) -> list[str]:
    """C statements leaving ``P(var)`` in ``p`` (Horner, one fma per coefficient)."""
    *low, top = coeffs
    lines = [f"  float p = {lit(top)};"]
    lines += [f"  p = fmaf(p, {var}, {lit(c)});" for c in reversed(low)]
    return lines


def gelu16_source(lit: Callable[[float], str]) -> str:
    """CUDA C++ for ``rs_ex2``, ``rs_rcp`` and ``rs_gelu16(float) -> float``; ``lit`` writes
    a float32 literal."""
    return "\n".join([
        '__device__ __forceinline__ float rs_ex2(float x) { float y; '
        'asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }',
        '__device__ __forceinline__ float rs_rcp(float x) { float y; '
        'asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }',
        "/* gelu(x) = x Phi(x) for results rounded to 16 bits (reshard.codegen.fast_math) */",
        "__device__ __forceinline__ float rs_gelu16(float x) {",
        f"  const float s = rs_rcp(fmaf({lit(GELU16_SCALE)}, fabsf(x), 1.0f));",
        *_horner(GELU16_POLY, "s", lit),
        f"  const float h = s * p * rs_ex2(x * x * {lit(GELU16_EXP2_SCALE)});  /* Phi(-|x|) */",
        "  return x * (x > 0.0f ? 1.0f - h : h);",
        "}",
        "",
    ])
