"""Autodiff's op kinds (``reshard.ir.ops.gradient``): ``detach`` and ``saved`` are the identity
(linear, free: sharded and Partial operands pass through without communication), ``grad_seed``
is ones shaped like its operand; plans simulate like the reference."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir import ReshardError
from reshard.testing.op_oracle import MESH1, MESH2, check_plan, inputs_of


@pytest.mark.parametrize("kind", ["detach", "saved"])
@pytest.mark.parametrize("mesh,placements,out", [
    (MESH1, [rs.Shard(0)], [rs.Shard(0)]),
    (MESH1, [rs.Partial("sum")], [rs.Partial("sum")]),
    (MESH1, [rs.Partial("max")], [rs.Partial("max")]),
    (MESH2, [rs.Shard(1), rs.Shard(0)], [rs.Shard(1), rs.Shard(0)]),
])
def test_identity_passes_shardings_through_without_communication(kind, mesh, placements, out):
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float32", mesh, placements)
    f.output(getattr(f, kind)(x), out)
    plan = check_plan(f)
    assert plan.communications == ()


@pytest.mark.parametrize("kind", ["detach", "saved"])
def test_identity_inside_a_program_matches_the_reference(kind):
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float32", MESH1, [rs.Shard(1)])
    w = f.input("w", (6, 8), "float32", MESH1, [rs.Shard(0)])
    y = getattr(f, kind)(f.matmul(f.gelu(x), w))
    f.output(f.exp(y), [rs.Replicate()])
    check_plan(f)


@pytest.mark.parametrize("mesh,placements,out", [
    (MESH1, [rs.Shard(0)], [rs.Shard(0)]),
    (MESH1, [rs.Replicate()], [rs.Shard(1)]),
    (MESH1, [rs.Partial("sum")], [rs.Replicate()]),
    (MESH2, [rs.Shard(0), rs.Replicate()], [rs.Replicate(), rs.Shard(1)]),
])
def test_grad_seed_is_ones(mesh, placements, out):
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float32", mesh, placements)
    f.output(f.grad_seed(x), out)
    check_plan(f)
    got = rs.run_reference(f, inputs_of(f, 0))[0]
    assert torch.equal(got, torch.ones(4, 6))


def test_grad_seed_of_a_loss_is_ordered_after_it():
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float64", MESH1, [rs.Shard(0)])
    loss = f.reshape(f.sum(f.reshape(f.mul(x, x), (1, 24)), 1), (1,))
    f.output(loss, [rs.Replicate()])
    f.output(f.grad_seed(loss), [rs.Replicate()])
    check_plan(f)


def test_grad_seed_of_a_non_float_raises():
    f = rs.Fusion()
    x = f.input("x", (4,), "int64", MESH1, [rs.Replicate()])
    with pytest.raises(ReshardError, match="grad_seed"):
        f.grad_seed(x)


@pytest.mark.parametrize("kind", ["detach", "saved", "grad_seed"])
def test_operand_must_belong_to_the_fusion(kind):
    other = rs.Fusion().input("x", (4,), "float32", MESH1, [rs.Replicate()])
    with pytest.raises(ReshardError, match=kind):
        getattr(rs.Fusion(), kind)(other)
