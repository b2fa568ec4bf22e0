"""What the attention op's tests share (``tests/ops/test_op_attention.py``, the ``attention`` rule
family's ``tests/rules/test_attention.py``): meshes of one and two ranks, the shapes, the masks
(none, causal, an additive float mask, a fully masked row) and random q, k, v."""

from __future__ import annotations

import torch

import reshard as rs
from reshard.ir.ops.attention import causal_mask

ONE = rs.DeviceMesh([0])
TWO = rs.DeviceMesh([0, 1])
B, H, L, DH = 2, 2, 4, 8
MASKS = ["none", "causal", "float", "dead_row"]


def mask(kind: str, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """An additive mask [1, 1, L, L] (or [B, 1, L, L] for ``dead_row``: batch 1's row 2 masked
    entirely); None for ``none``."""
    if kind == "none":
        return None
    if kind == "causal":
        return causal_mask(L, L, dtype).reshape(1, 1, L, L)
    gen = torch.Generator().manual_seed(3)
    if kind == "float":
        return torch.randn(1, 1, L, L, generator=gen).to(dtype)
    m = torch.zeros(B, 1, L, L, dtype=dtype)
    m[1, 0, 2] = float("-inf")
    return m


def values(kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random q, k, v [B, H, L, DH] (seeded), and the mask of ``kind`` where it has one."""
    gen = torch.Generator().manual_seed(seed)
    out = {n: torch.randn(B, H, L, DH, generator=gen) for n in "qkv"}
    m = mask(kind)
    return out if m is None else {**out, "mask": m}


def o_scale(f: rs.Fusion, o: object) -> float:
    """The scale of the attention op computing ``o``."""
    return f.ops[f.producer[o.id]].attrs["scale"]
