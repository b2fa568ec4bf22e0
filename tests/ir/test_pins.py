"""``passes.pins``: copies of a Fusion with values pinned at given shardings compute the same
outputs, and their plans put the values at those shardings; ``placements_of`` keeps exactly
the shardings DTensor placements express."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.cli import bandwidth_only, plan_placements, random_inputs
from reshard.examples import transformer_block
from reshard.ir.ids import Inner, Outer, Root
from reshard.passes.pins import pin_values, placements_of

S, R, P = rs.Shard, rs.Replicate, rs.Partial


def _mlp(mesh: rs.DeviceMesh) -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (16, 32), "float32", mesh, [S(0)])
    w1 = f.input("w1", (32, 64), "float32", mesh, [S(1)])
    w2 = f.input("w2", (64, 32), "float32", mesh, [S(0)])
    f.output(f.matmul(f.gelu(f.matmul(x, w1, name="fc1"), name="gelu"), w2, name="fc2"), [S(0)])
    return f


def test_pinned_copy_computes_the_same_and_keeps_the_pins():
    """fc2 pinned Partial then Replicate: an allreduce where the free plan reduce-scatters;
    the outputs still match the reference."""
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    f = _mlp(mesh)
    g = pin_values(f, {"fc2": [[P()], [R()]]})
    assert len(g.ops) == len(f.ops) + 2 and [g.tensors[i].name for i in g.inputs] == ["x", "w1", "w2"]
    assert all(op.attrs.get("pin") for op in g.ops if op.kind == "redistribute")
    plan = rs.optimize(g)
    assert [c.kind for c in plan.communications if c.tensor == "fc2"][0] == "allreduce"
    inputs = random_inputs(g)
    (got,) = plan.simulate(inputs)
    torch.testing.assert_close(got, rs.run_reference(f, inputs)[0], rtol=1e-4, atol=1e-4)


def test_placements_of_keeps_what_placements_express():
    mesh = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))
    ts = rs.TensorSharding.of([S(1), P()], (4, 8), mesh)
    assert placements_of(ts) == [S(1), P()]
    assert placements_of(rs.TensorSharding.of([R(), S(0)], (4, 8), mesh)) == [R(), S(0)]
    cyclic = rs.TensorSharding(mesh, (4, 8), (Inner(Root(1, 8), 4), R()))
    fused = rs.TensorSharding(mesh, (4, 12), (Outer(Inner(Root(1, 12), 3), 2), R()))
    assert placements_of(cyclic) is None and placements_of(fused) is None


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_small_instance_replays_the_real_size_plan(ranks):
    """The demo's replay: the block planned at seq 4096 / hidden 4096 / 32 heads, its shardings
    pinned on a seq 16 instance priced by bandwidth alone, give the same collectives (an
    all-to-all into heads, not "gather everything"), and the small plan is correct."""
    mesh = rs.DeviceMesh(list(range(ranks)), ("tp",))
    big = rs.optimize(transformer_block(mesh, 4096, 4096, 32, "bfloat16"))
    small = pin_values(transformer_block(mesh, 16, 8 * 2 * ranks, 2 * ranks), plan_placements(big))
    replay = rs.optimize(small, cost_profile=bandwidth_only(big.profile))
    key = [(c.kind, c.tensor, c.src, c.dst) for c in big.communications]
    assert key == [(c.kind, c.tensor, c.src, c.dst) for c in replay.communications]
    assert "all_to_all" in [k for k, *_ in key]
    inputs = random_inputs(small)
    torch.testing.assert_close(replay.simulate(inputs)[0], rs.run_reference(small, inputs)[0], rtol=1e-4, atol=1e-4)
