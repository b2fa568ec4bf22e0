"""Step attributes of the fused linear loss ops (``ir.ops.linear_loss``): which gradient a
``linear_sumexp_grad`` step forms."""

from __future__ import annotations

from typing import Any

from ...ir.fusion import Fusion, Op
from .registry import step_attrs


@step_attrs("linear_sumexp_grad")
def linear_sumexp_grad(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"wrt": op.attrs["wrt"]}
