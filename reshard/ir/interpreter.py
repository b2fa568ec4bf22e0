"""The reference interpreter: runs a Fusion on global tensors.  This is the ground truth: each
op's ``reference`` in the op registry (``reshard.ir.ops``)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .errors import ReshardError
from .fusion import DTYPES, Fusion, Op
from .ops import op_kind

def apply_op(op: Op, args: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
    """Run one non-input op on global torch tensors (its registered ``reference``)."""
    return op_kind(op.kind).reference(op.attrs, args, out_dtype)


def run_reference(fusion: Fusion, inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Evaluate ``fusion`` on global input tensors (by input name); return its outputs in
    the order they were declared."""
    env: dict[int, torch.Tensor] = {}
    for op in fusion.ops:
        t = fusion.tensors[op.output]
        if op.kind == "input":
            if t.name not in inputs:
                raise ReshardError(f"reference: no value for input {t.name!r}")
            v = inputs[t.name]
            if tuple(v.shape) != t.shape:
                raise ReshardError(f"reference: input {t.name!r} has shape {tuple(v.shape)}, expected {t.shape}")
            env[t.id] = v.to(DTYPES[t.dtype])
            continue
        env[t.id] = apply_op(op, [env[i] for i in op.inputs], t.dtype)
    return tuple(env[tid] for tid, _ in fusion.outputs)
