"""Comparisons ``eq ne lt le gt ge`` (bool results) and ``logical_not / and / or`` (issue 20):
plans on sharded inputs of every dtype (floats with NaN and inf) simulate like the
reference; comparisons keep no Partial (a Partial operand is reduced first); malformed
operands are ``ReshardError``s naming the op."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.ops import op_kind

from reshard.testing.op_oracle import MESH1, MESH2, check_plan

COMPARISONS = ["eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("fn", COMPARISONS)
@pytest.mark.parametrize("dtype", ["float32", "int64", "int32", "bool"])
def test_comparisons_on_a_2x2_mesh(fn, dtype):
    f = rs.Fusion()
    a = f.input("a", (4, 6), dtype, MESH2, [rs.Shard(0), rs.Shard(1)])
    b = f.input("b", (4, 6), dtype, MESH2, [rs.Replicate(), rs.Shard(0)])
    c = getattr(f, fn)(a, b)
    assert c.dtype == "bool" and c.shape == (4, 6)
    f.output(c, [rs.Shard(1), rs.Replicate()])
    f.output(getattr(f, fn)(a, a), [rs.Replicate(), rs.Replicate()])  # NaN != NaN
    check_plan(f, special=True)


@pytest.mark.parametrize("fn", COMPARISONS)
def test_comparisons_on_a_1d_mesh_with_nan_and_inf(fn):
    f = rs.Fusion()
    a = f.input("a", (8, 6), "float32", MESH1, [rs.Shard(0)])
    b = f.input("b", (8, 6), "float32", MESH1, [rs.Shard(1)])
    f.output(getattr(f, fn)(a, b), [rs.Shard(1)])
    check_plan(f, seeds=(0, 1, 2), special=True)


def test_logical_ops():
    f = rs.Fusion()
    p = f.input("p", (4, 8), "bool", MESH2, [rs.Shard(1), rs.Replicate()])
    q = f.input("q", (4, 8), "bool", MESH2, [rs.Replicate(), rs.Shard(0)])
    x = f.logical_or(f.logical_and(p, f.logical_not(q)), f.eq(p, q))
    assert x.dtype == "bool"
    f.output(x, [rs.Shard(0), rs.Shard(1)])
    f.output(f.logical_not(p), [rs.Replicate(), rs.Replicate()])
    check_plan(f, seeds=(0, 1, 2))


def test_partial_operand_is_reduced_before_a_comparison():
    """(a0 + a1) < b is not (a0 < b) + (a1 < b): the Partial sum is reduced first."""
    f = rs.Fusion()
    a = f.input("a", (4, 8), "int64", MESH1, [rs.Partial("sum")])
    b = f.input("b", (4, 8), "int64", MESH1, [rs.Replicate()])
    c = f.lt(a, b)
    f.output(c, [rs.Shard(0)])
    assert op_kind("binary").keeps(f.ops[f.producer[c.id]]) == ()
    plan = check_plan(f, seeds=(0, 1, 2))
    assert [k.kind for k in plan.communications] in (["allreduce"], ["reduce_scatter"])


@pytest.mark.parametrize("build,message", [
    (lambda f, x, i, b: f.lt(x, i), "lt: operand dtypes differ"),
    (lambda f, x, i, b: f.eq(x, f.slice(x, 0, 0, 2)), "eq: operand shapes differ"),
    (lambda f, x, i, b: f.logical_and(x, x), "logical_and: operand %x"),
    (lambda f, x, i, b: f.logical_or(i, i), "logical_or: operand %i"),
    (lambda f, x, i, b: f.logical_not(i), "logical_not: operand %i"),
])
def test_malformed_operands_are_errors_naming_the_op(build, message):
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float32", MESH1)
    i = f.input("i", (4, 6), "int64", MESH1)
    b = f.input("b", (4, 6), "bool", MESH1)
    with pytest.raises(rs.ReshardError, match=message):
        build(f, x, i, b)


def test_comparisons_join_the_kernels_around_them():
    """A comparison joins the chain around it (a pointwise kernel computes it, its bool result
    stored as one byte, ``tests/kernels/test_kernels_bool.py``), of floats and of ints alike (ints are
    64-bit ints in a kernel, ``tests/kernels/test_kernels_int.py``); both plans match the reference."""
    f = rs.Fusion()
    x = f.input("x", (8, 6), "float32", MESH1, [rs.Shard(0)])
    e = f.exp(x)
    f.output(f.gt(f.neg(e), e), [rs.Shard(0)])
    plan = check_plan(f)
    fused = [s for s in plan.program.steps if s.attr("fop") == "pointwise"]
    assert [[o[0] for o in s.attr("ops")] for s in fused] == [["exp", "neg", "gt"]]  # e's two readers are in the chain
    assert not any(s.attr("fop") == "binary" for s in plan.program.steps)
    f = rs.Fusion()
    i = f.input("i", (8, 6), "int64", MESH1, [rs.Shard(0)])
    f.output(f.logical_not(f.gt(f.neg(i), i)), [rs.Shard(0)])
    plan = check_plan(f)
    assert not any(s.attr("fop") == "binary" for s in plan.program.steps)
    assert [[o[0] for o in s.attr("ops")] for s in plan.program.steps if s.attr("fop") == "pointwise"] == [
        ["neg", "gt", "logical_not"]]
