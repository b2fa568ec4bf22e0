"""Step attributes of the ops along one dim (``ir.ops.slicing``): a slice's local range and a
pad's local padding (exact: a sharded sliced or padded dim is one of whole parts, the module
docstring of ``ir.ops.slicing``), a cat's dim."""

from __future__ import annotations

from typing import Any

from ...ir.fusion import Fusion, Op
from .registry import step_attrs


@step_attrs("slice")
def slice_(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    """The local range ``[s n_l / n, (s + n) n_l / n)``."""
    d, s, t = op.attrs["dim"], op.attrs["start"], op.attrs["stop"]
    n, nl = t - s, local_shape[d]
    return {"dim": d, "start": s * nl // n, "stop": t * nl // n}


@step_attrs("pad")
def pad(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    """The local padding ``lo E_l / E``, ``hi E_l / E``."""
    d, lo, hi = op.attrs["dim"], op.attrs["lo"], op.attrs["hi"]
    e, el = fusion.tensors[op.output].shape[d], local_shape[d]
    return {"dim": d, "lo": lo * el // e, "hi": hi * el // e}


@step_attrs("cat")
def cat(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"dim": op.attrs["dim"]}
