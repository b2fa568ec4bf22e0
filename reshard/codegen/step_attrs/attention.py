"""Step attributes of the fused attention ops (``ir.ops.attention``): the scale, ``safe``, and
whether the step may run the causal kernels."""

from __future__ import annotations

from typing import Any

from ...ir.fusion import Fusion, Op
from .registry import step_attrs


@step_attrs("attention")
def attention(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    """``causal_kernel``: causal, and the step holds every q row (q's L dim not sharded)."""
    whole = local_shape[-2] == fusion.tensors[op.output].shape[-2]
    return {"scale": op.attrs["scale"], "safe": op.attrs["safe"],
            "causal_kernel": bool(op.attrs["causal"] and whole)}


@step_attrs("attention_grad")
def attention_grad(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"scale": op.attrs["scale"], "safe": op.attrs["safe"], "causal_kernel": op.attrs["causal"]}
