"""The dtypes a Fusion tensor may have, by name."""

from __future__ import annotations

from typing import Any

import torch

from .errors import ReshardError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
}


def dtype_name(dtype: Any, where: str) -> str:
    """The name of ``dtype`` (a name of ``DTYPES`` or a ``torch.dtype``); ``where`` names the
    op in the error for any other."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    for k, v in DTYPES.items():
        if dtype == v:
            return k
    raise ReshardError(f"{where}: unknown dtype {dtype!r}; supported: {sorted(DTYPES)}")
