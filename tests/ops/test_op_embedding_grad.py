"""The lookups' backward ops, ``f.embedding_grad`` and ``f.unpick`` (``reshard.ir.ops.lookup``):
the reference against torch's own backward (autograd through ``F.embedding`` / ``torch.gather``),
duplicate ids accumulating; builder errors; shapes and dtypes.  Their strategies' plans against
the reference: ``tests/rules/test_lookup_scatter.py``."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard import Replicate
from reshard.testing.scatter_autograd import torch_embedding_grad, torch_unpick

M2 = rs.DeviceMesh([0, 1], ("tp",))


def rep(mesh: rs.DeviceMesh) -> list:
    return [Replicate()] * mesh.ndim


# ---- reference ---------------------------------------------------------------------------------

def test_reference_is_torchs_backward_with_duplicate_ids():
    """Repeated ids accumulate (index_add), as in torch's embedding backward; unpick is gather's."""
    f = rs.Fusion()
    g = f.input("g", (2, 5, 3), "float64", M2)
    ids = f.input("ids", (2, 5), "int64", M2)
    x = f.input("x", (2, 5), "float64", M2)
    f.output(f.embedding_grad(g, ids, 7), rep(M2))
    f.output(f.unpick(x, ids, 7), rep(M2))
    gen = torch.Generator().manual_seed(0)
    ids_v = torch.tensor([[3, 3, 3, 0, 6], [3, 1, 0, 6, 6]])
    inputs = {"g": torch.randn(2, 5, 3, generator=gen, dtype=torch.float64), "ids": ids_v,
              "x": torch.randn(2, 5, generator=gen, dtype=torch.float64)}
    dw, dx = rs.run_reference(f, inputs)
    torch.testing.assert_close(dw, torch_embedding_grad(inputs["g"], ids_v, 7))
    torch.testing.assert_close(dw[3], inputs["g"][ids_v == 3].sum(0))
    torch.testing.assert_close(dx, torch_unpick(inputs["x"], ids_v, 7))


# ---- builder errors ------------------------------------------------------------------------

def test_bad_scatters_raise_errors_naming_the_op():
    f = rs.Fusion()
    g = f.input("g", (3, 4), "float32", M2)
    ids = f.input("ids", (3,), "int64", M2)
    fids = f.input("fids", (3,), "float32", M2)
    with pytest.raises(rs.ReshardError, match="^embedding_grad: ids .* must be int64"):
        f.embedding_grad(g, fids, 8)
    with pytest.raises(rs.ReshardError, match=r"^embedding_grad: g .* must be \[\*I, H\]"):
        f.embedding_grad(g, f.input("i2", (4,), "int64", M2), 8)
    with pytest.raises(rs.ReshardError, match="^embedding_grad: g .* has dtype int64"):
        f.embedding_grad(f.input("gi", (3, 4), "int64", M2), ids, 8)
    with pytest.raises(rs.ReshardError, match="^embedding_grad: the indexed extent must be a positive int"):
        f.embedding_grad(g, ids, 0)
    with pytest.raises(rs.ReshardError, match=r"^embedding_grad: padding_idx must be an int in \[-8, 8\)"):
        f.embedding_grad(g, ids, 8, padding_idx=8)
    with pytest.raises(rs.ReshardError, match=r"^embedding: padding_idx must be an int in \[-8, 8\)"):
        f.embedding(f.input("w", (8, 4), "float32", M2), ids, padding_idx=1.0)
    with pytest.raises(rs.ReshardError, match="^unpick: the indexed extent must be a positive int"):
        f.unpick(fids, ids, 2.0)
    with pytest.raises(rs.ReshardError, match="^unpick: g .* and index .* must have one shape"):
        f.unpick(g, ids, 8)
    with pytest.raises(rs.ReshardError, match="^unpick: .*different meshes"):
        f.unpick(fids, f.input("o", (3,), "int64", rs.DeviceMesh([2, 3], ("tp",))), 8)


def test_shapes_and_dtypes():
    f = rs.Fusion()
    g = f.input("g", (2, 3, 4), "bfloat16", M2)
    ids = f.input("ids", (2, 3), "int64", M2)
    dw = f.embedding_grad(g, ids, 16)
    assert dw.shape == (16, 4) and dw.dtype == "bfloat16"
    dx = f.unpick(f.input("x", (2, 3), "float32", M2), ids, 16)
    assert dx.shape == (2, 3, 16) and dx.dtype == "float32"
