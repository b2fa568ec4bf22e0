"""``f.embedding`` and ``f.pick`` (``reshard.ir.ops.lookup``): builder errors and result shapes
and dtypes.  Their strategies' plans against the reference: ``tests/rules/test_lookup.py``."""

from __future__ import annotations

import pytest
import torch

import reshard as rs

M2 = rs.DeviceMesh([0, 1], ("tp",))


# ---- builder errors ------------------------------------------------------------------------

def test_bad_lookups_raise_errors_naming_the_op():
    f = rs.Fusion()
    w = f.input("w", (16, 4), "float32", M2)
    ids = f.input("ids", (3,), "int64", M2)
    fids = f.input("fids", (3,), "float32", M2)
    x = f.input("x", (3, 16), "float32", M2)
    other = f.input("o", (3,), "int64", rs.DeviceMesh([2, 3], ("tp",)))
    with pytest.raises(rs.ReshardError, match="^embedding: ids .* must be int64"):
        f.embedding(w, fids)
    with pytest.raises(rs.ReshardError, match="^embedding: weight .* must be 2-D"):
        f.embedding(f.input("w3", (2, 2, 2), "float32", M2), ids)
    with pytest.raises(rs.ReshardError, match="^embedding: weight .* has dtype bool; embedding takes"):
        f.embedding(f.input("wb", (16, 4), "bool", M2), ids)
    with pytest.raises(rs.ReshardError, match="^embedding: .*different meshes"):
        f.embedding(w, other)
    with pytest.raises(rs.ReshardError, match="^embedding: ids .* not a tensor of this Fusion"):
        f.embedding(w, torch.zeros(3, dtype=torch.long))
    with pytest.raises(rs.ReshardError, match="^pick: index .* must be int64"):
        f.pick(x, fids)
    with pytest.raises(rs.ReshardError, match=r"^pick: x .* must be \[\*B, V\]"):
        f.pick(x, f.input("i2", (4,), "int64", M2))
    with pytest.raises(rs.ReshardError, match=r"^pick: x .* must be \[\*B, V\]"):
        f.pick(f.input("x1", (16,), "float32", M2), ids)


def test_shapes_and_dtypes():
    f = rs.Fusion()
    w = f.input("w", (16, 4), "bfloat16", M2)
    ids = f.input("ids", (2, 3), "int64", M2)
    e = f.embedding(w, ids)
    assert e.shape == (2, 3, 4) and e.dtype == "bfloat16"
    x = f.input("x", (2, 3, 16), "float32", M2)
    y = f.pick(x, ids)
    assert y.shape == (2, 3) and y.dtype == "float32"
