"""int64 / int32 / bool tensors (issue 20): inputs, outputs, casts, views, slicing,
redistribute and reductions plan and simulate like the reference on 1-D and 2x2 meshes;
int Partial sums and maxes (integer summands) reduce exactly; a bool value is never Partial
(not as input, output or redistribute target, and the e-graph never makes one); ops that do
not take a dtype say so."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.ops import op_kind

from reshard.testing.op_oracle import MESH1, MESH2, check_plan

INT_BOOL = ["int64", "int32", "bool"]


@pytest.mark.parametrize("dtype", INT_BOOL)
def test_views_and_slicing_on_a_1d_mesh(dtype):
    f = rs.Fusion()
    x = f.input("x", (4, 6), dtype, MESH1, [rs.Shard(0)])
    y = f.input("y", (2, 6), dtype, MESH1, [rs.Shard(1)])
    r = f.permute(f.reshape(x, (2, 2, 6)), (0, 2, 1))               # [2, 6, 2]
    c = f.cat([f.slice(x, 0, 1, 3), y], 0)                          # [4, 6]
    p = f.pad(c, 1, 1, 2)                                           # [4, 9]
    b = f.broadcast(f.slice(x, 0, 0, 1), (4, 6), (0, 1))            # [4, 6]
    f.output(r, [rs.Shard(1)])
    f.output(p, [rs.Replicate()])
    f.output(b, [rs.Shard(0)])
    f.output(f.redistribute(x, [rs.Shard(1)]), [rs.Replicate()])
    check_plan(f)


@pytest.mark.parametrize("dtype", INT_BOOL)
def test_redistribute_on_a_2x2_mesh(dtype):
    f = rs.Fusion()
    x = f.input("x", (4, 8), dtype, MESH2, [rs.Shard(0), rs.Shard(1)])
    y = f.redistribute(x, [rs.Shard(1), rs.Shard(0)], pin=True)
    f.output(y, [rs.Replicate(), rs.Shard(0)])
    f.output(f.permute(x, (1, 0)), [rs.Shard(0), rs.Replicate()])
    check_plan(f)


@pytest.mark.parametrize("src", ["float32", "int64", "int32", "bool"])
@pytest.mark.parametrize("dst", ["float32", "int64", "int32", "bool"])
def test_cast_between_floats_ints_and_bools(src, dst):
    f = rs.Fusion()
    x = f.input("x", (4, 6), src, MESH2, [rs.Shard(0), rs.Replicate()])
    y = f.cast(x, dst)
    assert y.dtype == dst
    f.output(y, [rs.Replicate(), rs.Shard(1)])
    check_plan(f)


@pytest.mark.parametrize("dtype", ["int64", "int32"])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_partial_int_inputs_reduce_exactly(dtype, op):
    """Random integer summands (or lower bounds) per rank; the plan's all-reduce /
    reduce-scatter gives the reference value exactly."""
    f = rs.Fusion()
    x = f.input("x", (4, 6), dtype, MESH2, [rs.Partial(op), rs.Shard(1)])
    f.output(f.neg(x) if op == "sum" else x, [rs.Shard(0), rs.Replicate()])
    plan = check_plan(f, seeds=(0, 1, 2))
    assert {c.kind for c in plan.communications} & {"allreduce", "reduce_scatter"}


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_int_sum_over_a_sharded_dim_is_a_partial_sum(dtype):
    """sum keeps an int dtype (int32 too: no widening) and its Partial(sum) over the sharded
    reduced dim is reduced like a float one."""
    f = rs.Fusion()
    x = f.input("x", (4, 8), dtype, MESH1, [rs.Shard(1)])
    s = f.sum(x, 1)
    assert s.dtype == dtype
    f.output(s, [rs.Partial("sum")])
    f.output(f.sum(f.mul(x, x), 1), [rs.Replicate()])
    plan = check_plan(f)
    assert op_kind("reduce").reduces(f.ops[f.producer[s.id]]) == "sum"
    assert not any(c.kind == "allgather" for c in plan.communications)


@pytest.mark.parametrize("mesh,placements", [(MESH1, [rs.Shard(1)]), (MESH2, [rs.Shard(1), rs.Shard(0)])])
def test_int_and_bool_max(mesh, placements):
    f = rs.Fusion()
    x = f.input("x", (4, 8), "int32", mesh, placements)
    b = f.input("b", (4, 8), "bool", mesh, placements)
    f.output(f.max(x, 1), [rs.Replicate()] * mesh.ndim)
    f.output(f.max(b, 1), [rs.Replicate()] * mesh.ndim)
    f.output(f.max(b, 0), [rs.Shard(0)] + [rs.Replicate()] * (mesh.ndim - 1))
    check_plan(f)


def test_bool_values_are_never_partial():
    """max over a sharded dim of a bool would leave Partial("max"): the bool max declares no
    reduction op, so the plan gathers the operand first and no value of it is Partial."""
    f = rs.Fusion()
    b = f.input("b", (4, 64), "bool", MESH2, [rs.Shard(1), rs.Shard(1)])
    m = f.max(b, 1)
    f.output(m, [rs.Replicate(), rs.Replicate()])
    assert op_kind("reduce").reduces(f.ops[f.producer[m.id]]) is None
    plan = check_plan(f)
    bools = {t.id for t in f.tensors if t.dtype == "bool"}
    nodes = [n for n in plan.lowered.nodes if n.value in bools]
    assert nodes and all(not n.sharding.partial_axes for n in nodes)
    assert not any(c.kind in ("allreduce", "reduce_scatter") for c in plan.communications)


def test_bool_partial_is_rejected_where_it_is_asked_for():
    f = rs.Fusion()
    with pytest.raises(rs.ReshardError, match="input 'b'.*bool tensor cannot be Partial"):
        f.input("b", (4, 6), "bool", MESH1, [rs.Partial("max")])
    b = f.input("b", (4, 6), "bool", MESH1, [rs.Shard(0)])
    with pytest.raises(rs.ReshardError, match="redistribute.*bool tensor cannot be Partial"):
        f.redistribute(b, [rs.Partial("sum")])
    with pytest.raises(rs.ReshardError, match="output.*bool tensor cannot be Partial"):
        f.output(b, [rs.Partial("sum")])


@pytest.mark.parametrize("build,message", [
    (lambda f, i, b, x: f.exp(i), r"exp: operand %i\[4, 6\]:int64 has dtype int64"),
    (lambda f, i, b, x: f.div(i, i), "div: operand"),
    (lambda f, i, b, x: f.add(b, b), "add: operand %b"),
    (lambda f, i, b, x: f.neg(b), "neg: operand %b"),
    (lambda f, i, b, x: f.scale(i, 2.0), "scale: operand %i"),
    (lambda f, i, b, x: f.mean(i, 1), "mean: operand %i"),
    (lambda f, i, b, x: f.sum(b, 1), "sum: operand %b"),
    (lambda f, i, b, x: f.matmul(i, f.permute(i, (1, 0))), "matmul: lhs %i"),
])
def test_ops_reject_dtypes_they_do_not_take(build, message):
    f = rs.Fusion()
    i = f.input("i", (4, 6), "int64", MESH1)
    b = f.input("b", (4, 6), "bool", MESH1)
    x = f.input("x", (4, 6), "float32", MESH1)
    with pytest.raises(rs.ReshardError, match=message):
        build(f, i, b, x)


@pytest.mark.parametrize("dtype", INT_BOOL)
def test_plan_inputs_are_not_cast(dtype):
    """Plan.simulate takes int and bool inputs of exactly the declared dtype."""
    f = rs.Fusion()
    x = f.input("x", (4, 6), dtype, MESH1, [rs.Shard(0)])
    f.output(x, [rs.Replicate()])
    plan = rs.optimize(f)
    with pytest.raises(rs.ReshardError, match="dtype torch.float32, the plan expects"):
        plan.simulate({"x": torch.zeros(4, 6)})
