"""The Fusion builder, DeviceMesh validation and the reference interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import reshard as rs

MESH = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))


def test_issue_example_builds_and_runs():
    f = rs.Fusion()
    x = f.input("x", (8, 96), torch.float32, MESH, [rs.Replicate(), rs.Shard(1)])
    y = f.reshape(x, (8, 12, 8))
    z = f.gelu(f.add(y, y))
    f.output(z, [rs.Replicate(), rs.Shard(1)])
    g = torch.randn(8, 96)
    (out,) = rs.run_reference(f, {"x": g})
    torch.testing.assert_close(out, F.gelu(2 * g.reshape(8, 12, 8)))
    (sim,) = rs.optimize(f).simulate({"x": g})
    torch.testing.assert_close(sim, out)


def test_reference_interpreter_covers_every_op():
    mesh = rs.DeviceMesh([0, 1])
    f = rs.Fusion()
    a = f.input("a", (4, 6), "float32", mesh, [rs.Shard(0)])
    b = f.input("b", (6, 3), "float32", mesh, [rs.Replicate()])
    outs = {
        "matmul": f.matmul(a, b),
        "permute": f.permute(a, (1, 0)),
        "slice": f.slice(a, 1, 2, 5),
        "pad": f.pad(a, 0, 1, 2),
        "cat": f.cat([a, f.neg(a)], 1),
        "sum": f.sum(a, 1),
        "mean": f.mean(a, 0),
        "max": f.max(a, 0),
        "cast": f.cast(f.exp(a), "float64"),
        "sub_div": f.div(f.sub(a, f.relu(a)), f.add(f.sigmoid(a), f.scale(f.tanh(a), 2.0))),
        "set": f.set(f.silu(a)),
    }
    for t in outs.values():
        f.output(t, [rs.Replicate()])
    ga, gb = torch.randn(4, 6), torch.randn(6, 3)
    got = dict(zip(outs, rs.run_reference(f, {"a": ga, "b": gb})))
    want = {
        "matmul": ga @ gb, "permute": ga.T, "slice": ga[:, 2:5], "pad": F.pad(ga, (0, 0, 1, 2)),
        "cat": torch.cat([ga, -ga], 1), "sum": ga.sum(1), "mean": ga.mean(0), "max": ga.amax(0),
        "cast": ga.exp().double(),
        "sub_div": (ga - ga.relu()) / (ga.sigmoid() + 2 * ga.tanh()), "set": F.silu(ga),
    }
    for k in outs:
        torch.testing.assert_close(got[k], want[k], msg=k)


def _f():
    f = rs.Fusion()
    x = f.input("x", (8, 6), "float32", rs.DeviceMesh([0, 1]), [rs.Shard(0)])
    return f, x


@pytest.mark.parametrize("devices,message", [
    ([0, 0, 1], "duplicate device ids"),
    ([], "empty"),
    ([[0, 1], [2]], "ragged"),
    (3, "got a scalar"),
    ([0, -1], "non-negative"),
])
def test_bad_meshes(devices, message):
    with pytest.raises(rs.ReshardError, match=message):
        rs.DeviceMesh(devices)


@pytest.mark.parametrize("build,message", [
    (lambda f, x: f.permute(x, (0, 0)), "perm"),
    (lambda f, x: f.reshape(x, (5, 10)), "reshape"),
    (lambda f, x: f.slice(x, 1, 4, 9), "slice"),
    (lambda f, x: f.cast(x, "int7"), "unknown dtype"),
    (lambda f, x: f.matmul(x, x), "contraction sizes differ"),
    (lambda f, x: f.sum(x, 2), "dim"),
    (lambda f, x: f.mean(x, ()), "no dims to reduce"),
    (lambda f, x: f.cat([x, f.permute(x, (1, 0))], 0), "cat"),
    (lambda f, x: f.add(x, f.input("y", (8, 6), "float32", rs.DeviceMesh([2, 3]), [rs.Shard(0)])), "mesh"),
    (lambda f, x: f.input("x", (8, 6), "float32", rs.DeviceMesh([0, 1]), [rs.Shard(0)]), "x"),
    (lambda f, x: f.input("w", (8, 6), "bad", rs.DeviceMesh([0, 1]), [rs.Shard(0)]), "unknown dtype"),
    (lambda f, x: f.output(x, [rs.Shard(5)]), "Shard"),
    (lambda f, x: f.add(x, "x"), "add"),
])
def test_malformed_ops_raise_naming_the_problem(build, message):
    f, x = _f()
    with pytest.raises(rs.ReshardError, match=message):
        build(f, x)


def test_missing_input_value_is_reported():
    f, x = _f()
    f.output(f.neg(x), [rs.Shard(0)])
    with pytest.raises(rs.ReshardError, match="x"):
        rs.run_reference(f, {})
