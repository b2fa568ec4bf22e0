"""Tests of reshard.runtime.collectives (against independent formulations) and the simulator."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard.codegen.program import Program, Step
from reshard.ir.errors import ReshardError
from reshard.runtime import collectives as C
from reshard.runtime.simulator import simulate

FAST = settings(max_examples=40, deadline=None)


# ---- independent reference formulations (index arithmetic, no torch.chunk/cat) ----------
def ref_cat(xs: list[torch.Tensor], dim: int) -> torch.Tensor:
    """cat via narrow + copy into a preallocated tensor."""
    shape = list(xs[0].shape)
    shape[dim] = sum(x.shape[dim] for x in xs)
    out = torch.empty(shape, dtype=xs[0].dtype)
    off = 0
    for x in xs:
        out.narrow(dim, off, x.shape[dim]).copy_(x)
        off += x.shape[dim]
    return out


def ref_chunk(x: torch.Tensor, n: int, i: int, dim: int) -> torch.Tensor:
    """chunk i of n along dim via index_select of explicit indices."""
    size = x.shape[dim] // n
    return x.index_select(dim, torch.arange(i * size, (i + 1) * size))


def ref_reduce(xs: list[torch.Tensor], op: str) -> torch.Tensor:
    st_ = torch.stack(xs)
    return st_.sum(0).to(xs[0].dtype) if op == "sum" else st_.max(0).values


def assert_fresh(outs, xs) -> None:
    """Outputs are contiguous and share storage with no input and no other output."""
    ptrs = [x.untyped_storage().data_ptr() for x in xs]
    seen = []
    for o in outs:
        if o is None:
            continue
        assert o.is_contiguous()
        p = o.untyped_storage().data_ptr()
        if o.numel() > 0:
            assert p not in ptrs and p not in seen
            seen.append(p)


@st.composite
def team_inputs(draw, chunk_dim: bool = True, dtype_choices=(torch.float64, torch.int64)):
    """(xs, dim): n in 1..4 random tensors of equal shape; if chunk_dim, shape[dim] % n == 0."""
    n = draw(st.integers(1, 4))
    ndim = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 3)) for _ in range(ndim)]
    dim = draw(st.integers(0, ndim - 1))
    if chunk_dim:
        shape[dim] *= n
    if draw(st.booleans()):
        dim -= ndim  # negative dims too
    dtype = draw(st.sampled_from(dtype_choices))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        xs = [torch.randn(shape, generator=g, dtype=dtype) for _ in range(n)]
    else:
        xs = [torch.randint(-50, 50, shape, generator=g, dtype=dtype) for _ in range(n)]
    return xs, dim


# ---- collectives vs definitions ---------------------------------------------------------
@FAST
@given(team_inputs(chunk_dim=False))
def test_allgather(case):
    xs, dim = case
    outs = C.allgather(xs, dim)
    exp = ref_cat(xs, dim % xs[0].dim())
    assert len(outs) == len(xs)
    for o in outs:
        assert torch.equal(o, exp)
    assert_fresh(outs, xs)


@FAST
@given(team_inputs(), st.sampled_from(["sum", "max"]))
def test_reduce_scatter(case, op):
    xs, dim = case
    n = len(xs)
    d = dim % xs[0].dim()
    outs = C.reduce_scatter(xs, dim, op)
    red = ref_reduce(xs, op)
    for i, o in enumerate(outs):
        torch.testing.assert_close(o, ref_chunk(red, n, i, d))
    assert_fresh(outs, xs)


@FAST
@given(team_inputs(chunk_dim=False), st.sampled_from(["sum", "max"]))
def test_allreduce(case, op):
    xs, _ = case
    outs = C.allreduce(xs, op)
    red = ref_reduce(xs, op)
    for o in outs:
        torch.testing.assert_close(o, red)
        assert o.dtype == xs[0].dtype
    assert_fresh(outs, xs)


@FAST
@given(team_inputs(), st.data())
def test_all_to_all(case, data):
    xs, split_dim = case
    n, nd = len(xs), xs[0].dim()
    cat_dim = data.draw(st.integers(-nd, nd - 1))
    outs = C.all_to_all(xs, split_dim, cat_dim)
    for i, o in enumerate(outs):
        exp = ref_cat([ref_chunk(xs[j], n, i, split_dim % nd) for j in range(n)], cat_dim % nd)
        assert torch.equal(o, exp)
    assert_fresh(outs, xs)


def test_all_to_all_is_transpose_of_blocks():
    # 2 members, x_j = [[j*10 + 0, j*10 + 1]] split along dim 1, cat along dim 0
    xs = [torch.tensor([[0, 1]]), torch.tensor([[10, 11]])]
    outs = C.all_to_all(xs, split_dim=1, cat_dim=0)
    assert outs[0].tolist() == [[0], [10]]
    assert outs[1].tolist() == [[1], [11]]


@FAST
@given(team_inputs(chunk_dim=False), st.data())
def test_broadcast(case, data):
    xs, _ = case
    root = data.draw(st.integers(0, len(xs) - 1))
    outs = C.broadcast(xs, root)
    for o in outs:
        assert torch.equal(o, xs[root])
    assert_fresh(outs, xs)


@FAST
@given(team_inputs(), st.data())
def test_scatter(case, data):
    xs, dim = case
    n = len(xs)
    root = data.draw(st.integers(0, n - 1))
    outs = C.scatter(xs, root, dim)
    for i, o in enumerate(outs):
        assert torch.equal(o, ref_chunk(xs[root], n, i, dim % xs[0].dim()))
    assert_fresh(outs, xs)


@FAST
@given(team_inputs(chunk_dim=False), st.data())
def test_gather(case, data):
    xs, dim = case
    root = data.draw(st.integers(0, len(xs) - 1))
    outs = C.gather(xs, root, dim)
    for i, o in enumerate(outs):
        if i == root:
            assert torch.equal(o, ref_cat(xs, dim % xs[0].dim()))
        else:
            assert o is None
    assert_fresh(outs, xs)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_reduce_scatter_of_allgather_roundtrip(n):
    # reduce_scatter(sum) of n copies of allgather(x) = n * x_i on member i
    xs = [torch.randn(2, 3) for _ in range(n)]
    gathered = C.allgather(xs, 1)
    outs = C.reduce_scatter(gathered, 1, "sum")
    for x, o in zip(xs, outs):
        torch.testing.assert_close(o, n * x)


def test_noncontiguous_inputs_give_contiguous_outputs():
    xs = [torch.randn(4, 6).t() for _ in range(2)]  # non-contiguous (6, 4)
    for outs in (C.allgather(xs, 0), C.reduce_scatter(xs, 1, "max"), C.allreduce(xs, "sum"),
                 C.all_to_all(xs, 0, 1), C.broadcast(xs, 1), C.scatter(xs, 0, 0), C.gather(xs, 0, 1)):
        assert_fresh(outs, xs)


def test_team_of_one_returns_copies():
    x = torch.randn(3, 2)
    for outs in (C.allgather([x], 0), C.reduce_scatter([x], 1), C.allreduce([x], "max"),
                 C.all_to_all([x], 0, 1), C.broadcast([x], 0), C.scatter([x], 0, 1), C.gather([x], 0, 0)):
        assert torch.equal(outs[0], x)
        assert_fresh(outs, [x])


def test_send_recv():
    xs = {0: torch.tensor([0.0]), 1: torch.tensor([1.0]), 2: torch.tensor([2.0]), 3: torch.tensor([3.0])}
    out = C.send_recv(xs, ((0, 1), (1, 0), (2, 2), (0, 3)))
    assert sorted(out) == [0, 1, 2, 3]
    assert out[1].item() == 0.0 and out[0].item() == 1.0 and out[2].item() == 2.0 and out[3].item() == 0.0
    assert out[2] is not xs[2] and out[2].data_ptr() != xs[2].data_ptr()
    assert C.send_recv(xs, ((3, 0),)).keys() == {0}


# ---- collective errors -------------------------------------------------------------------
def test_collective_errors():
    a, b = torch.zeros(4, 3), torch.zeros(4, 3)
    with pytest.raises(ReshardError, match=r"reduce_scatter: dim 1 of size 3 .* not divisible by the team size 2"):
        C.reduce_scatter([a, b], 1, "sum")
    with pytest.raises(ReshardError, match=r"all_to_all: split_dim 1 of size 3 .*team size 2"):
        C.all_to_all([a, b], 1, 0)
    with pytest.raises(ReshardError, match=r"scatter: dim 1 .*not divisible by the team size 2"):
        C.scatter([a, b], 0, 1)
    with pytest.raises(ReshardError, match=r"allgather: team inputs have mismatched shapes"):
        C.allgather([a, torch.zeros(4, 4)], 0)
    with pytest.raises(ReshardError, match=r"allreduce: team inputs have mismatched dtypes"):
        C.allreduce([a, b.double()], "sum")
    with pytest.raises(ReshardError, match=r"allreduce: unknown reduce op 'prod'"):
        C.allreduce([a, b], "prod")
    with pytest.raises(ReshardError, match=r"broadcast: root=2 is out of range for a team of size 2"):
        C.broadcast([a, b], 2)
    with pytest.raises(ReshardError, match=r"gather: root=-1 is out of range"):
        C.gather([a, b], -1, 0)
    with pytest.raises(ReshardError, match=r"allgather: dim=2 is out of range for a 2-D tensor"):
        C.allgather([a, b], 2)
    with pytest.raises(ReshardError, match=r"allgather: expected a non-empty list"):
        C.allgather([], 0)
    with pytest.raises(ReshardError, match=r"send_recv: source rank 5"):
        C.send_recv({0: a}, ((5, 0),))
    with pytest.raises(ReshardError, match=r"send_recv: rank 1 is the destination of more than one pair"):
        C.send_recv({0: a, 2: b}, ((0, 1), (2, 1)))


# ---- simulator ---------------------------------------------------------------------------
def no_local(step, env, rank):  # pragma: no cover - must not be called
    raise AssertionError("no local steps expected")


def rank_inputs(ranks, shape=(1, 2)):
    return {r: {"a": torch.full(shape, float(r))} for r in ranks}


def program(shape, ranks, steps, inputs=("a",), outputs=("b",)):
    return Program(tuple(shape), tuple(ranks), tuple(inputs), tuple(outputs), tuple(steps))


@pytest.mark.parametrize("axis", ["y", 1])
def test_sim_allgather_along_y_2x2(axis):
    p = program((2, 2), range(4), [Step.make("allgather", "b", ["a"], axis=axis, dim=0)])
    out = simulate(p, rank_inputs(range(4)), no_local)
    for r, team in [(0, (0, 1)), (1, (0, 1)), (2, (2, 3)), (3, (2, 3))]:
        assert out[r]["b"][:, 0].tolist() == [float(t) for t in team]


@pytest.mark.parametrize("axis", ["x", 0])
def test_sim_allgather_along_x_2x2(axis):
    p = program((2, 2), range(4), [Step.make("allgather", "b", ["a"], axis=axis, dim=0)])
    out = simulate(p, rank_inputs(range(4)), no_local)
    for r, team in [(0, (0, 2)), (1, (1, 3)), (2, (0, 2)), (3, (1, 3))]:
        assert out[r]["b"][:, 0].tolist() == [float(t) for t in team]


def test_sim_2x4_mesh_with_permuted_ranks():
    ranks = [7, 6, 5, 4, 3, 2, 1, 0]  # [[7,6,5,4],[3,2,1,0]]
    rows = [[7, 6, 5, 4], [3, 2, 1, 0]]
    p = program((2, 4), ranks, [
        Step.make("allgather", "g", ["a"], axis="y", dim=1),
        Step.make("allreduce", "b", ["a"], axis="x", op="sum"),
    ], outputs=("g", "b"))
    out = simulate(p, rank_inputs(ranks), no_local)
    for i, row in enumerate(rows):
        for j, r in enumerate(row):
            assert out[r]["g"].tolist() == [[float(t) for t in row for _ in range(2)]]
            col = [rows[0][j], rows[1][j]]
            assert out[r]["b"].tolist() == [[float(sum(col))] * 2]


def test_sim_2x4_all_to_all_and_scatter_gather():
    ranks = list(range(8))
    inputs = {r: {"a": torch.arange(8.0).reshape(4, 2) + 100 * r} for r in ranks}
    p = program((2, 4), ranks, [
        Step.make("all_to_all", "t", ["a"], axis="y", split_dim=0, cat_dim=1),
        Step.make("gather", "g", ["a"], axis="y", root=2, dim=0),
        Step.make("scatter", "s", ["a"], axis="x", root=1, dim=1),
        Step.make("broadcast", "bc", ["a"], axis="x", root=0),
    ], outputs=("t", "g", "s", "bc"))
    out = simulate(p, inputs, no_local)
    mesh_rows = [[0, 1, 2, 3], [4, 5, 6, 7]]
    for row in mesh_rows:
        for i, r in enumerate(row):
            exp_t = ref_cat([ref_chunk(inputs[t]["a"], 4, i, 0) for t in row], 1)
            assert torch.equal(out[r]["t"], exp_t)
            if i == 2:
                assert torch.equal(out[r]["g"], ref_cat([inputs[t]["a"] for t in row], 0))
            else:
                assert "g" not in out[r]
    for j in range(4):
        col = [mesh_rows[0][j], mesh_rows[1][j]]
        for i, r in enumerate(col):
            assert torch.equal(out[r]["s"], ref_chunk(inputs[col[1]]["a"], 2, i, 1))
            assert torch.equal(out[r]["bc"], inputs[col[0]]["a"])


def test_sim_multistep_program():
    """allgather along y, local scale by (rank + 1), reduce_scatter(sum) along y; free buffers."""
    ranks = [0, 1, 2, 3]
    inputs = {r: {"a": torch.tensor([[float(r), float(10 * r)]])} for r in ranks}  # shape (1, 2)
    seen_envs = {}

    def local(step, env, rank):
        assert step.attr("op") == "scale"
        seen_envs[rank] = set(env)
        return env[step.ins[0]] * (rank + 1)

    p = program((2, 2), ranks, [
        Step.make("allgather", "g", ["a"], axis="y", dim=0, free=("a",)),
        Step.make("local", "h", ["g"], op="scale", free=("g",)),
        Step.make("reduce_scatter", "b", ["h"], axis="y", dim=0, op="sum"),
    ], outputs=("b", "a", "g"))
    out = simulate(p, inputs, local)
    # team {0,1}: g = [[0,0],[1,10]]; h0 = 1*g, h1 = 2*g; sum = 3*g; rank 0 gets row 0, rank 1 row 1
    # team {2,3}: g = [[2,20],[3,30]]; h2 = 3*g, h3 = 4*g; sum = 7*g
    assert out[0] == {"b": out[0]["b"]} and out[0]["b"].tolist() == [[0.0, 0.0]]
    assert out[1]["b"].tolist() == [[3.0, 30.0]]
    assert out[2]["b"].tolist() == [[14.0, 140.0]]
    assert out[3]["b"].tolist() == [[21.0, 210.0]]
    assert all(set(o) == {"b"} for o in out.values())  # a and g were freed
    assert all(s == {"g"} for s in seen_envs.values())  # a freed before the local step


def test_sim_send_recv():
    p = program((2, 2), range(4), [Step.make("send_recv", "b", ["a"], pairs=((0, 3), (3, 0), (1, 1)))])
    out = simulate(p, rank_inputs(range(4)), no_local)
    assert out[0]["b"][0, 0].item() == 3.0 and out[3]["b"][0, 0].item() == 0.0
    assert out[1]["b"][0, 0].item() == 1.0 and "b" not in out[2]


def test_sim_does_not_mutate_inputs():
    inputs = rank_inputs(range(4))
    before = {r: {k: v.clone() for k, v in d.items()} for r, d in inputs.items()}
    p = program((2, 2), range(4), [Step.make("allreduce", "a", ["a"], axis="x", op="sum")], outputs=("a",))
    out = simulate(p, inputs, no_local)
    assert out[0]["a"].tolist() == [[2.0, 2.0]] and out[1]["a"].tolist() == [[4.0, 4.0]]
    for r in inputs:
        assert torch.equal(inputs[r]["a"], before[r]["a"])


# ---- simulator errors --------------------------------------------------------------------
def test_sim_error_bad_divisibility():
    p = program((2, 2), range(4), [Step.make("reduce_scatter", "b", ["a"], axis="y", dim=1, op="sum")])
    inputs = rank_inputs(range(4), shape=(1, 3))
    with pytest.raises(ReshardError, match=r"step 0 \(reduce_scatter.*team \(0, 1\).*not divisible by the team size 2"):
        simulate(p, inputs, no_local)


def test_sim_error_mismatched_shapes():
    p = program((2, 2), range(4), [Step.make("allgather", "b", ["a"], axis="x", dim=0)])
    inputs = rank_inputs(range(4))
    inputs[3]["a"] = torch.zeros(2, 2)
    with pytest.raises(ReshardError, match=r"step 0 \(allgather.*team \(1, 3\).*mismatched shapes"):
        simulate(p, inputs, no_local)


def test_sim_error_unknown_kind():
    p = program((2, 2), range(4), [
        Step.make("allgather", "g", ["a"], axis="x", dim=0),
        Step.make("teleport", "b", ["g"]),
    ])
    with pytest.raises(ReshardError, match=r"step 1: unknown step kind 'teleport'"):
        simulate(p, rank_inputs(range(4)), no_local)


def test_sim_error_missing_buffer():
    p = program((2, 2), range(4), [
        Step.make("allgather", "g", ["a"], axis="x", dim=0, free=("a",)),
        Step.make("allreduce", "b", ["a"], axis="y", op="sum"),
    ])
    with pytest.raises(ReshardError, match=r"step 1 \(allreduce.*rank 0 has no buffer 'a'"):
        simulate(p, rank_inputs(range(4)), no_local)
    p2 = program((2, 2), range(4), [Step.make("local", "b", ["zz"], op="neg")])
    with pytest.raises(ReshardError, match=r"step 0 \(local.*has no buffer 'zz'"):
        simulate(p2, rank_inputs(range(4)), lambda s, e, r: -e["zz"])


def test_sim_error_missing_input_and_bad_axis_and_attr():
    p = program((2, 2), range(4), [Step.make("allgather", "b", ["a"], axis="x", dim=0)])
    inputs = rank_inputs(range(4))
    del inputs[2]["a"]
    with pytest.raises(ReshardError, match=r"rank 2 is missing program input buffer 'a'"):
        simulate(p, inputs, no_local)
    with pytest.raises(ReshardError, match=r"no inputs for ranks \[3\]"):
        simulate(p, {r: {"a": torch.zeros(1)} for r in range(3)}, no_local)
    p_axis = program((2, 2), range(4), [Step.make("allgather", "b", ["a"], axis="z", dim=0)])
    with pytest.raises(ReshardError, match=r"step 0 \(allgather.*no axis named 'z'"):
        simulate(p_axis, rank_inputs(range(4)), no_local)
    p_attr = program((2, 2), range(4), [Step.make("allgather", "b", ["a"], axis="x")])
    with pytest.raises(ReshardError, match=r"step 0 \(allgather.*missing attribute 'dim'"):
        simulate(p_attr, rank_inputs(range(4)), no_local)
    p_mesh = program((2, 3), range(4), [])
    with pytest.raises(ReshardError, match=r"mesh_shape \(2, 3\) does not fit 4 mesh_ranks"):
        simulate(p_mesh, rank_inputs(range(4)), no_local)


def test_every_collective_kind_has_its_torch_distributed_call():
    """The runtime's table of torch calls (``runtime.distributed.TORCH_CALLS``) covers the
    collective kinds (``ir.collective_kinds``), each a function of ``torch.distributed``."""
    import torch.distributed as dist

    from reshard.ir.collective_kinds import KIND
    from reshard.runtime.distributed import TORCH_CALLS

    assert set(TORCH_CALLS) == set(KIND)
    assert all(callable(getattr(dist, call, None)) for call in TORCH_CALLS.values())
