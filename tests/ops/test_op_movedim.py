"""The ``movedim`` view (added through the op registry, issue 19): a permute written as
``torch.movedim``; sharded dims move with it, so plans keep them sharded and need no
communication, and simulate like the reference."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir import ReshardError

MESH = rs.DeviceMesh([0, 1], ("tp",))
MESH2 = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))


def _x(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("src,dst", [(0, 2), (2, 0), (-1, 1), ((0, 1), (2, 0)), ((2, 0), (0, 1))])
def test_shape_matches_torch(src, dst):
    f = rs.Fusion()
    x = f.input("x", (2, 3, 4), "float32", MESH, [rs.Replicate()])
    y = f.movedim(x, src, dst)
    assert y.shape == tuple(torch.movedim(torch.empty(2, 3, 4), src, dst).shape)


@pytest.mark.parametrize("mesh,placements,src,dst,out", [
    (MESH, [rs.Shard(0)], 0, 2, [rs.Shard(2)]),             # the sharded dim moves last
    (MESH, [rs.Shard(2)], 2, 0, [rs.Shard(0)]),             # ... and first
    (MESH, [rs.Shard(1)], 0, 2, [rs.Shard(0)]),             # another dim moves past it
    (MESH2, [rs.Shard(0), rs.Shard(2)], (0, 2), (1, 0), [rs.Shard(1), rs.Shard(0)]),
])
def test_sharded_dims_move_without_communication(mesh, placements, src, dst, out):
    f = rs.Fusion()
    x = f.input("x", (4, 6, 8), "float32", mesh, placements)
    f.output(f.movedim(x, src, dst), out)
    plan = rs.optimize(f)
    assert plan.communications == ()
    inputs = {"x": _x((4, 6, 8))}
    torch.testing.assert_close(plan.simulate(inputs)[0], rs.run_reference(f, inputs)[0])


@pytest.mark.parametrize("out", [[rs.Replicate()], [rs.Shard(0)], [rs.Shard(1)]])
def test_sharded_then_resharded_matches_the_reference(out):
    f = rs.Fusion()
    x = f.input("x", (4, 6, 8), "float32", MESH, [rs.Shard(0)])
    f.output(f.gelu(f.movedim(x, 0, -1)), out)
    inputs = {"x": _x((4, 6, 8))}
    torch.testing.assert_close(rs.optimize(f).simulate(inputs)[0], rs.run_reference(f, inputs)[0])


def test_partial_operand_stays_partial():
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float32", MESH, [rs.Partial("sum")])
    f.output(f.movedim(x, 0, 1), [rs.Partial("sum")])
    plan = rs.optimize(f)
    assert plan.communications == ()
    inputs = {"x": _x((4, 6))}
    torch.testing.assert_close(plan.simulate(inputs, generator=torch.Generator().manual_seed(1))[0],
                               rs.run_reference(f, inputs)[0])


def test_bad_dims_raise():
    f = rs.Fusion()
    x = f.input("x", (2, 3, 4), "float32", MESH, [rs.Replicate()])
    with pytest.raises(ReshardError, match="movedim"):
        f.movedim(x, (0, 0), (1, 2))
    with pytest.raises(ReshardError, match="movedim"):
        f.movedim(x, 3, 0)


@pytest.mark.gpu
def test_gpu_permute_kernel_matches_the_reference():
    f = rs.Fusion()
    x = f.input("x", (16, 24, 32), "float32", MESH, [rs.Shard(0)])
    f.output(f.movedim(x, 0, 2), [rs.Shard(2)])
    inputs = {"x": _x((16, 24, 32))}
    torch.testing.assert_close(rs.optimize(f).simulate(inputs, device="cuda")[0], rs.run_reference(f, inputs)[0])
