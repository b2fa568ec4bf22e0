"""The reference interpreter: runs a Fusion on global tensors.  This is the ground truth."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .errors import ReshardError
from .fusion import DTYPES, Fusion, Op

UNARY_FNS = {
    "neg": torch.neg, "exp": torch.exp, "tanh": torch.tanh, "gelu": torch.nn.functional.gelu,
    "relu": torch.relu, "silu": torch.nn.functional.silu, "abs": torch.abs, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid,
}
BINARY_FNS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum}


def broadcast_tensor(x: torch.Tensor, shape: tuple[int, ...], dims: tuple[int, ...]) -> torch.Tensor:
    """``x`` with dim i placed at result dim ``dims[i]``, expanded to ``shape`` (contiguous).
    The same code is the global reference and the local step (``shape`` = local shape)."""
    view = [1] * len(shape)
    for i, d in enumerate(dims):
        view[d] = x.shape[i]
    return x.reshape(view).expand(tuple(shape)).contiguous()


def apply_op(op: Op, args: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
    """Run one non-input op on torch tensors (global or local: the math is the same for
    elementwise ops; layout ops use the shapes in ``op.attrs``)."""
    k, a = op.kind, op.attrs
    if k == "unary":
        return UNARY_FNS[a["fn"]](args[0])
    if k == "binary":
        return BINARY_FNS[a["fn"]](args[0], args[1])
    if k == "scale":
        return args[0] * a["factor"]
    if k == "cast":
        return args[0].to(DTYPES[out_dtype])
    if k == "set":
        return args[0].clone()
    if k == "reshape":
        return args[0].reshape(a["shape"])
    if k == "permute":
        return args[0].permute(a["perm"])
    if k == "slice":
        return args[0].narrow(a["dim"], a["start"], a["stop"] - a["start"])
    if k == "pad":
        x = args[0]
        pad = [0, 0] * (x.dim() - 1 - a["dim"]) + [a["lo"], a["hi"]]
        return torch.nn.functional.pad(x, pad)
    if k == "cat":
        return torch.cat(args, a["dim"])
    if k == "broadcast":
        return broadcast_tensor(args[0], a["shape"], a["dims"])
    if k == "reduce":
        if a["fn"] == "sum":
            return args[0].sum(a["dims"])
        if a["fn"] == "mean":
            return args[0].mean(a["dims"])
        return args[0].amax(a["dims"])
    if k == "matmul":
        return torch.matmul(args[0], args[1])
    if k == "redistribute":
        return args[0]
    raise ReshardError(f"{op!r}: no reference semantics for op kind {k!r}")


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
