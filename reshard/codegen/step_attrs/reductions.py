"""Step attributes of the ops that read a whole dim (``ir.ops.reductions``, ``ir.ops.scan``,
``ir.ops.along``): the function and its dims; a mean's global count (its reduced dims may be
sharded: the local sum over the global count)."""

from __future__ import annotations

import math
from typing import Any

from ...ir.fusion import Fusion, Op
from ...ir.ops.along import along_params
from .registry import step_attrs


@step_attrs("reduce")
def reduce(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    src = fusion.tensors[op.inputs[0]]
    return {"fn": op.attrs["fn"], "dims": op.attrs["dims"],
            "count": math.prod(src.shape[d] for d in op.attrs["dims"])}


@step_attrs("cumsum")
def cumsum(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"dim": op.attrs["dim"]}


@step_attrs("along")
def along(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"fn": op.attrs["fn"], "dim": op.attrs["dim"], **along_params(op.attrs)}
