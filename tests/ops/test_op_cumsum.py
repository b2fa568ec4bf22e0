"""``f.cumsum(x, dim)`` (issue 20): a scan, so a sharded scanned dim is gathered first while
the other dims stay sharded; linear, so a Partial sum stays Partial through it; plans on
float and int inputs simulate like ``torch.cumsum``."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.ops import op_kind
from reshard.ir.ops.registry import identity_map

from reshard.testing.op_oracle import MESH1, MESH2, check_plan


@pytest.mark.parametrize("dtype", ["float32", "int64", "int32"])
@pytest.mark.parametrize("mesh,placements,dim,out", [
    (MESH1, [rs.Shard(1)], 1, [rs.Shard(1)]),
    (MESH1, [rs.Shard(0)], 1, [rs.Shard(0)]),
    (MESH2, [rs.Shard(0), rs.Shard(1)], 0, [rs.Replicate(), rs.Shard(1)]),
    (MESH2, [rs.Shard(1), rs.Shard(0)], -1, [rs.Shard(0), rs.Replicate()]),
])
def test_cumsum_matches_the_reference(dtype, mesh, placements, dim, out):
    f = rs.Fusion()
    x = f.input("x", (4, 8), dtype, mesh, placements)
    y = f.cumsum(x, dim)
    assert y.dtype == dtype and y.shape == (4, 8)
    f.output(y, out)
    check_plan(f, seeds=(0, 1))


def test_the_scanned_dim_has_no_image_and_others_stay_sharded():
    """A cumsum along dim 1 of [S(0)] runs locally (no communication); along a sharded dim
    the plan must communicate."""
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", MESH1, [rs.Shard(0)])
    y = f.cumsum(x, 1)
    f.output(y, [rs.Shard(0)])
    op = f.ops[f.producer[y.id]]
    assert op_kind("cumsum").index_map(f, op, 0) == identity_map((4, 8), (1,))
    assert check_plan(f).communications == ()
    g = rs.Fusion()
    x = g.input("x", (4, 8), "float32", MESH1, [rs.Shard(1)])
    g.output(g.cumsum(x, 1), [rs.Shard(1)])
    assert check_plan(g).communications


@pytest.mark.parametrize("dtype", ["float64", "int64"])
def test_partial_sum_stays_partial(dtype):
    """cumsum is linear: random Partial summands scanned locally, then reduced, give the
    reference; the scan runs on the Partial operand (no collective before it)."""
    f = rs.Fusion()
    x = f.input("x", (4, 8), dtype, MESH2, [rs.Partial("sum"), rs.Shard(0)])
    y = f.cumsum(x, 1)
    f.output(y, [rs.Partial("sum"), rs.Shard(0)])
    f.output(f.cumsum(x, 0), [rs.Replicate(), rs.Replicate()])
    assert op_kind("cumsum").keeps(f.ops[f.producer[y.id]]) == ("sum",)
    plan = check_plan(f, seeds=(0, 1, 2))
    (scan,) = [n for n in plan.lowered.nodes if n.head.op is not None and n.value == y.id]
    assert scan.args[0].sharding.partial_axes == (0,)


def test_partial_max_is_reduced_first():
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", MESH1, [rs.Partial("max")])
    f.output(f.cumsum(x, 1), [rs.Shard(0)])
    plan = check_plan(f, seeds=(0, 1))
    assert [c.kind for c in plan.communications] in (["allreduce"], ["reduce_scatter"])


@pytest.mark.parametrize("build,message", [
    (lambda f, x, b: f.cumsum(b, 0), r"cumsum: operand %b\[4, 8\]:bool has dtype bool"),
    (lambda f, x, b: f.cumsum(x, 2), "cumsum of %x.*dim 2 out of range"),
    (lambda f, x, b: f.cumsum(x, None), "cumsum of %x.*dim None out of range"),
])
def test_bad_arguments_are_errors_naming_cumsum(build, message):
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", MESH1)
    b = f.input("b", (4, 8), "bool", MESH1)
    with pytest.raises(rs.ReshardError, match=message):
        build(f, x, b)


@pytest.mark.gpu
def test_cumsum_runs_with_torch_on_the_gpu():
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", MESH1, [rs.Shard(0)])
    f.output(f.cumsum(f.exp(x), 1), [rs.Shard(0)])
    inputs = {"x": torch.randn(4, 8, generator=torch.Generator().manual_seed(0))}
    got = rs.optimize(f).simulate(inputs, device="cuda")[0]
    torch.testing.assert_close(got, rs.run_reference(f, inputs)[0])
