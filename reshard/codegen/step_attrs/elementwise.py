"""Step attributes of the elementwise ops (``ir.ops.elementwise``, ``ir.ops.select``,
``ir.ops.complex_pairs``): the function, factor, dtype or flag each step applies."""

from __future__ import annotations

from typing import Any

from ...ir.fusion import Fusion, Op
from .registry import step_attrs


@step_attrs("unary", "binary")
def function(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    """The function's name (``UNARY_FNS``, ``BINARY_FNS``)."""
    return {"fn": op.attrs["fn"]}


@step_attrs("scale")
def scale(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"factor": op.attrs["factor"]}


@step_attrs("cast")
def cast(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    """The result's dtype."""
    return {"dtype": fusion.tensors[op.output].dtype}


@step_attrs("masked")
def masked(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"keep": op.attrs["keep"]}


@step_attrs("complex_mul")
def complex_mul(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"conj": op.attrs["conj"]}
