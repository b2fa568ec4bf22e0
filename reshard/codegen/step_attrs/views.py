"""Step attributes of the layout ops (``ir.ops.views``, ``ir.ops.bucket``): the local shape a
reshape or broadcast builds, the permutation a permute applies."""

from __future__ import annotations

from typing import Any

from ...ir.fusion import Fusion, Op
from .registry import step_attrs


@step_attrs("reshape", "unbucket")
def reshape(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"shape": local_shape}


@step_attrs("permute")
def permute(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"perm": op.attrs["perm"]}


@step_attrs("movedim")
def movedim(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {k: op.attrs[k] for k in ("source", "destination", "perm")}


@step_attrs("broadcast")
def broadcast(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"shape": local_shape, "dims": op.attrs["dims"]}
