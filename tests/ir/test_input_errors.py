"""Bad input where it enters reshard is a ``ReshardError`` that says what is wrong (issue 18,
"The first hour"): the inputs of ``Plan.simulate`` / ``Plan.shard_inputs`` and the local
inputs of the runtime (one shared check, ``reshard.ir.inputs.check_inputs``), placement
classes and ``torch.distributed.tensor`` placements in the builder, uneven shardings."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.distributed.tensor as dt
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.ir import shard
from reshard.ir.inputs import check_inputs

MESH = rs.DeviceMesh([0, 1])
MESH2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))


@pytest.fixture(scope="module")
def plan() -> rs.Plan:
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float64", MESH, [rs.Shard(0)])
    w = f.input("weight", (6, 2), "float64", MESH, [rs.Replicate()])
    f.output(f.matmul(x, w), [rs.Replicate()])
    return rs.optimize(f)


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(4, 6, generator=g, dtype=torch.float64),
            "weight": torch.randn(6, 2, generator=g, dtype=torch.float64)}


ENTRY_POINTS = {"simulate": lambda p, i: p.simulate(i), "shard_inputs": lambda p, i: p.shard_inputs(i)}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_wrong_dtype_is_named_not_cast(plan, entry):
    inputs = {**_inputs(), "x": _inputs()["x"].float()}
    with pytest.raises(rs.ReshardError, match=r"input 'x' has dtype torch\.float32, the plan expects torch\.float64"):
        ENTRY_POINTS[entry](plan, inputs)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_misspelt_name_is_reported_with_a_suggestion(plan, entry):
    inputs = _inputs()
    inputs["weigth"] = inputs.pop("weight")
    with pytest.raises(rs.ReshardError) as e:
        ENTRY_POINTS[entry](plan, inputs)
    msg = str(e.value)
    assert "unknown input 'weigth' (did you mean 'weight'?)" in msg and "missing input 'weight'" in msg


def test_unknown_and_missing_names(plan):
    with pytest.raises(rs.ReshardError, match=r"unknown input 'bias'.*the plan takes inputs \['weight', 'x'\]"):
        plan.simulate({**_inputs(), "bias": torch.zeros(2, dtype=torch.float64)})
    with pytest.raises(rs.ReshardError, match=r"missing input 'x'"):
        plan.simulate({"weight": _inputs()["weight"]})


def test_wrong_shape(plan):
    with pytest.raises(rs.ReshardError, match=re.escape("input 'weight' has shape (2, 6), the plan expects (6, 2)")):
        plan.simulate({**_inputs(), "weight": _inputs()["weight"].T.contiguous()})


def test_numpy_array_says_pass_a_tensor(plan):
    with pytest.raises(rs.ReshardError, match=r"input 'x' is a NumPy array; pass a torch\.Tensor.*from_numpy"):
        plan.simulate({**_inputs(), "x": _inputs()["x"].numpy()})
    with pytest.raises(rs.ReshardError, match=r"input 'x' is list, not a torch\.Tensor"):
        plan.simulate({**_inputs(), "x": [[0.0] * 6] * 4})
    with pytest.raises(rs.ReshardError, match=r"inputs must be a dict"):
        plan.simulate(list(_inputs().values()))  # type: ignore[arg-type]


def test_all_problems_in_one_message(plan):
    with pytest.raises(rs.ReshardError) as e:
        plan.simulate({"X": _inputs()["x"], "weight": np.zeros((6, 2))})
    msg = str(e.value)
    assert "unknown input 'X' (did you mean 'x'?)" in msg and "missing input 'x'" in msg and "NumPy" in msg


def test_cuda_device_without_cuda(plan, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(rs.ReshardError, match=r"device='cuda'.*no CUDA device"):
        plan.simulate(_inputs(), device="cuda")
    with pytest.raises(rs.ReshardError, match="device must be"):
        plan.simulate(_inputs(), device="not-a-device")


def test_runtime_local_inputs_use_the_same_check(plan):
    """``Plan.run`` / ``DistRuntime`` check each rank's local inputs with ``check_inputs``
    (the multi-process tests cover it in processes; here the function itself, as the
    runtime calls it, on rank 0's buffers)."""
    local = plan.shard_inputs(_inputs())[0]
    spec = dict(plan.lowered.local_inputs)
    names = {buf: name for buf, name, _ in plan.lowered.inputs}
    check_inputs(local, spec, "rank 0", what="local input", labels=names)
    (xbuf,) = [b for b, n in names.items() if n == "x"]
    with pytest.raises(rs.ReshardError, match=rf"unknown local input 'x' \(did you mean '{re.escape(xbuf)}'\?\)"):
        check_inputs({**{k: v for k, v in local.items() if k != xbuf}, "x": local[xbuf]}, spec, "rank 0",
                     what="local input", labels=names)
    with pytest.raises(rs.ReshardError, match=rf"rank 0: local input '{re.escape(xbuf)}' \(input 'x'\) has dtype "
                                              r"torch\.float32, the plan expects torch\.float64"):
        check_inputs({**local, xbuf: local[xbuf].float()}, spec, "rank 0", what="local input", labels=names)


# ---- the builder: placements --------------------------------------------------------------
@pytest.mark.parametrize("cls, example", [(rs.Shard, "Shard(0)"), (rs.Partial, "Partial('sum')"),
                                          (rs.Replicate, "Replicate()"), (dt.Shard, "Shard(0)")])
def test_placement_class_instead_of_instance(cls, example):
    f = rs.Fusion()
    with pytest.raises(rs.ReshardError, match=rf"input 'x': {cls.__name__} is a placement class, not a placement; "
                                              rf"instantiate it, e.g. {re.escape(example)}"):
        f.input("x", (4, 6), "float32", MESH2x2, [cls, rs.Replicate()])
    x = f.input("y", (4, 6), "float32", MESH, [rs.Shard(0)])
    with pytest.raises(rs.ReshardError, match="instantiate it"):
        f.redistribute(x, [cls])
    with pytest.raises(rs.ReshardError, match="instantiate it"):
        f.output(x, cls)


def test_torch_distributed_placements_are_accepted_by_the_builder():
    ref, f = rs.Fusion(), rs.Fusion()
    for g, (S, R, P) in ((ref, (rs.Shard, rs.Replicate, rs.Partial)), (f, (dt.Shard, dt.Replicate, dt.Partial))):
        a = g.input("a", (4, 6), "float64", MESH2x2, [S(0), P()])
        b = g.redistribute(a, [R(), S(-1)])
        g.output(g.tanh(b), [S(1), R()])
        g.output(a, (P("max"), R()))  # a tuple, one placement per axis
    assert [str(t.sharding) for t in f.tensors] == [str(t.sharding) for t in ref.tensors]
    assert [str(s) for _, s in f.outputs] == [str(s) for _, s in ref.outputs] == ["[S(1), R]", "[P(max), R]"]
    assert str(f.tensors[0].sharding) == "[S(0), P(sum)]" and str(f.tensors[1].sharding) == "[R, S(1)]"
    with pytest.raises(rs.ReshardError, match="DTensor Partial"):
        f.input("c", (4,), "float32", MESH, [dt.Partial("avg")])


def test_dtensor_placements_plan_like_reshard_ones():
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float64", MESH, [dt.Shard(0)])
    f.output(f.redistribute(f.gelu(x), [dt.Replicate()]), [dt.Shard(1)])
    plan = rs.optimize(f)
    x_ = torch.randn(4, 6, dtype=torch.float64)
    torch.testing.assert_close(plan.simulate({"x": x_})[0], rs.run_reference(f, {"x": x_})[0])


# ---- uneven shardings ---------------------------------------------------------------------
def test_uneven_and_nested_uneven_shards_are_accepted():
    """Uneven dims are DTensor's torch.chunk pieces (tests/ir/test_uneven.py checks the values),
    nested ones torch.chunk inside torch.chunk (tests/ir/test_nested_uneven.py)."""
    f = rs.Fusion()
    x = f.input("x", (4, 5), "float32", MESH, [rs.Shard(1)])
    assert x.sharding.global_shape == (4, 5) and x.sharding.shape == (4, 6) and x.sharding.local_shape == (4, 3)
    y = f.input("y", (6, 4), "float32", MESH2x2, [rs.Shard(0), rs.Shard(0)])
    assert [y.sharding.local_extent(MESH2x2.coords(r))[0] for r in MESH2x2.ranks] == [2, 1, 2, 1]
    r = f.redistribute(x, [rs.Replicate()])
    z = f.redistribute(f.input("z", (6, 4), "float32", MESH2x2, [rs.Replicate(), rs.Replicate()]),
                       [rs.Shard(0), rs.Shard(0)])
    assert z.sharding == y.sharding
    f.output(r, [dt.Shard(-1)])
    assert [t.shape for t in shard(torch.zeros(3), [rs.Shard(0)], MESH).values()] == [(2,), (1,)]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=3), mesh_shape=st.sampled_from([(2,), (3,), (2, 2), (2, 3)]),
       data=st.data())
def test_any_placement_gives_dtensor_chunks(shape, mesh_shape, data):
    """Property: every placement list is accepted with DTensor's torch.chunk local shapes (each
    axis chunking the piece the axes before it left, in mesh order)."""
    mesh = rs.DeviceMesh(torch.arange(math.prod(mesh_shape)).reshape(mesh_shape).tolist())
    placements = [data.draw(st.sampled_from([rs.Replicate(), *[rs.Shard(d) for d in range(len(shape))]]))
                  for _ in mesh_shape]
    f = rs.Fusion()
    x = f.input("inp", tuple(shape), "float32", mesh, placements)
    g = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    locals_ = shard(g, x.sharding)
    for r, loc in locals_.items():
        want = g
        for a, p in enumerate(placements):
            if isinstance(p, rs.Shard):
                pieces = list(want.chunk(mesh_shape[a], p.dim))
                pieces += [want.narrow(p.dim, 0, 0)] * (mesh_shape[a] - len(pieces))
                want = pieces[mesh.coords(r)[a]]
        assert torch.equal(loc, want), (r, placements)


def test_bare_program_runtime_allows_extra_buffers_but_only_tensors():
    """A runtime of a bare ``Program`` (no Plan) accepts extra buffers, as the simulator does;
    they must still be tensors."""
    t = torch.zeros(2)
    check_inputs({"a": t, "extra": t}, {"a": None}, "rank 0", what="local input", allow_unknown=True)
    with pytest.raises(rs.ReshardError, match=r"^rank 0: local input 'extra' is str, not a torch\.Tensor$"):
        check_inputs({"a": t, "extra": "x"}, {"a": None}, "rank 0", what="local input", allow_unknown=True)
    with pytest.raises(rs.ReshardError, match=r"unknown local input 'extra'"):
        check_inputs({"a": t, "extra": t}, {"a": None}, "rank 0", what="local input")


@pytest.mark.parametrize("build", [
    lambda f, x: f.sum(x, None), lambda f, x: f.permute(x, None), lambda f, x: f.permute(x, ["a", 0]),
    lambda f, x: f.movedim(x, None, 0), lambda f, x: f.broadcast(x, None, (0, 1)),
    lambda f, x: f.broadcast_to(x, None), lambda f, x: f.reshape(x, (2.5, 8)), lambda f, x: f.cat(x, 0),
    lambda f, x: f.scale(x, "a"), lambda f, x: f.slice(x, 0, 0.5, 2), lambda f, x: f.pad(x, 0, 1.0, 0),
    lambda f, x: f.sum(x, True),
], ids=["sum-None", "permute-None", "permute-str", "movedim-None", "broadcast-None", "broadcast_to-None",
        "reshape-float", "cat-not-a-list", "scale-str", "slice-float", "pad-float", "sum-bool"])
def test_builder_arguments_of_the_wrong_type_are_reshard_errors(build):
    """Builder arguments that are not ints / a list of tensors / a number: a ReshardError naming
    the op (was TypeError / ValueError, or a silently accepted float slice bound)."""
    f = rs.Fusion()
    x = f.input("x", (4, 5), "float32", rs.DeviceMesh([0, 1]), [rs.Replicate()])
    with pytest.raises(rs.ReshardError):
        build(f, x)


def test_shard_dim_must_be_an_int():
    with pytest.raises(rs.ReshardError, match="Shard: dim must be an int"):
        rs.Shard("a")
