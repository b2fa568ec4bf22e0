"""Step attributes of the lookups (``ir.ops.lookup``): an embedding gradient's ``padding_idx``
(the rows it leaves out)."""

from __future__ import annotations

from typing import Any

from ...ir.fusion import Fusion, Op
from .registry import step_attrs


@step_attrs("embedding_grad")
def embedding_grad(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {k: v for k, v in op.attrs.items() if k == "padding_idx"}
