"""``f.where(cond, a, b)`` (issue 20), built as ``masked(a, cond, True) + masked(b, cond,
False)`` (``ir/ops/select.py`` states the law): plans on sharded operands of every dtype
simulate like ``torch.where``, NaN and inf in the unselected operand included; bad operands
are ``ReshardError``s naming ``where``."""

from __future__ import annotations

import pytest
import torch

import reshard as rs

from reshard.testing.op_oracle import MESH1, MESH2, assert_same, check_plan, rand


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "int32", "bool"])
def test_where_on_a_2x2_mesh(dtype):
    f = rs.Fusion()
    c = f.input("c", (4, 8), "bool", MESH2, [rs.Shard(1), rs.Replicate()])
    a = f.input("a", (4, 8), dtype, MESH2, [rs.Shard(0), rs.Shard(1)])
    b = f.input("b", (4, 8), dtype, MESH2, [rs.Replicate(), rs.Replicate()])
    w = f.where(c, a, b, name="w")
    assert w.dtype == dtype and w.shape == (4, 8) and w.name == "w"
    f.output(w, [rs.Shard(0), rs.Replicate()])
    check_plan(f, seeds=(0, 1, 2), special=True)


@pytest.mark.parametrize("placements", [[rs.Shard(0)], [rs.Shard(1)], [rs.Replicate()]])
def test_where_on_a_1d_mesh_with_nan_and_inf(placements):
    """NaN / inf in the unselected operand never leak into the result (selected by
    ``torch.where``, not multiplied by a 0/1 mask)."""
    f = rs.Fusion()
    x = f.input("x", (8, 6), "float32", MESH1, placements)
    y = f.input("y", (8, 6), "float32", MESH1, [rs.Shard(0)])
    f.output(f.where(f.gt(x, y), x, y), [rs.Shard(1)])           # maximum without NaN propagation
    f.output(f.where(f.ne(x, x), y, x), [rs.Replicate()])         # NaN of x replaced by y
    check_plan(f, seeds=(0, 1, 2), special=True)


def test_where_law_on_every_value():
    """The decomposition equals torch.where on values with inf and NaN in both branches."""
    f = rs.Fusion()
    c = f.input("c", (64,), "bool", MESH1)
    a = f.input("a", (64,), "float32", MESH1)
    b = f.input("b", (64,), "float32", MESH1)
    f.output(f.where(c, a, b), [rs.Replicate()])
    gen = torch.Generator().manual_seed(0)
    ins = {"c": rand((64,), "bool", gen), "a": rand((64,), "float32", gen, special=True),
           "b": rand((64,), "float32", gen, special=True)}
    (got,) = rs.run_reference(f, ins)
    assert_same(got, torch.where(ins["c"], ins["a"], ins["b"]))


def test_ignore_index_pattern():
    """labels != ignore -> where(valid, loss, 0) summed: the cross-entropy ignore_index shape."""
    f = rs.Fusion()
    labels = f.input("labels", (4, 8), "int64", MESH2, [rs.Shard(0), rs.Replicate()])
    loss = f.input("loss", (4, 8), "float32", MESH2, [rs.Shard(0), rs.Shard(1)])
    ignore = f.input("ignore", (4, 8), "int64", MESH2, [rs.Replicate(), rs.Replicate()])
    zero = f.input("zero", (4, 8), "float32", MESH2, [rs.Replicate(), rs.Replicate()])
    valid = f.ne(labels, ignore)
    f.output(f.sum(f.where(valid, loss, zero), 1), [rs.Replicate(), rs.Replicate()])
    f.output(f.sum(f.cast(valid, "int64"), 1), [rs.Shard(0), rs.Replicate()])
    check_plan(f)


@pytest.mark.parametrize("build,message", [
    (lambda f, c, x, i: f.where(x, x, x), r"where: condition %x\[4, 6\]:float32 has dtype float32"),
    (lambda f, c, x, i: f.where(i, x, x), "where: condition %i"),
    (lambda f, c, x, i: f.where(c, x, i), "where: operand dtypes differ"),
    (lambda f, c, x, i: f.where(c, x, f.slice(x, 0, 0, 2)), "where: shapes differ"),
    (lambda f, c, x, i: f.where(f.slice(c, 1, 0, 3), f.slice(x, 1, 0, 3), x), "where: shapes differ"),
    (lambda f, c, x, i: f.where(c, "x", x), "where: lhs 'x' is not a tensor"),
])
def test_bad_operands_are_errors_naming_where(build, message):
    f = rs.Fusion()
    c = f.input("c", (4, 6), "bool", MESH1)
    x = f.input("x", (4, 6), "float32", MESH1)
    i = f.input("i", (4, 6), "int64", MESH1)
    with pytest.raises(rs.ReshardError, match=message):
        build(f, c, x, i)
