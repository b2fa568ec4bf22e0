"""Nested uneven shardings: several mesh axes on one dim they do not divide (``[Shard(0), Shard(0)]``
of 5 rows on 2x2), DTensor's ``torch.chunk`` inside ``torch.chunk`` (pieces 2, 1, 1, 1).

Local tensors are compared with DTensor's own: ``_compute_local_shape_and_global_offset`` (a pure
function) for many extents and meshes, and ``distribute_tensor`` on a fake process group, rank by
rank; plans (elementwise, matmul, reductions, reshapes, redistributes from and to nested
layouts, 2x2, 2x3 and 2x2x2 meshes) are simulated against ``run_reference`` on random float64
inputs, and so are random extractions of them.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor as dt

import reshard as rs
from reshard.ir.sharding import TensorSharding, shard, unshard
from reshard.ir.uneven import chunk_lengths, compact, embed, nested_runs
from reshard.plan import Saturated

M2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
M2x3 = rs.DeviceMesh([[0, 1, 2], [3, 4, 5]], ("dp", "tp"))
M3x2 = rs.DeviceMesh([[0, 1], [2, 3], [4, 5]], ("dp", "tp"))
M2x2x2 = rs.DeviceMesh([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], ("pp", "dp", "tp"))
F64 = "float64"
R2 = [rs.Replicate(), rs.Replicate()]
S00 = [rs.Shard(0), rs.Shard(0)]


def _dplace(placements) -> list:
    return [dt.Shard(p.dim) if isinstance(p, rs.Shard) else dt.Replicate() for p in placements]


# ---- layouts -------------------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [(2, 2), (2, 3), (3, 2), (2, 2, 2), (4, 3)], ids=str)
def test_chunk_lengths_are_dtensors_local_extents(sizes):
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    for n in range(1, 3 * len(sizes) * max(sizes)):
        want = [_compute_local_shape_and_global_offset((n,), sizes, list(c), [dt.Shard(0)] * len(sizes))[0][0]
                for c in itertools.product(*map(range, sizes))]
        assert chunk_lengths(n, sizes) == want, n


def test_embed_and_compact_are_inverse_with_zero_padding():
    runs = nested_runs(5, (2, 2))
    assert runs == ((0, 3), (4, 1), (6, 1))  # [0, 1 | 2, _ | 3, _ | 4, _]
    x = torch.randn(5, 3, dtype=torch.float64)
    big = embed(x, 0, runs, 8)
    assert big[[3, 5, 7]].abs().sum() == 0 and torch.equal(big[[0, 1, 2, 4, 6]], x)
    assert torch.equal(compact(big, 0, runs), x)
    assert nested_runs(7, (2, 2)) == ((0, 7),)  # pieces 2, 2, 2, 1: a tail layout


# ---- local tensors: DTensor's -------------------------------------------------------------------
CASES = [
    ((5, 4), M2x2, S00),
    ((6, 4), M2x2, S00),
    ((3, 4), M2x2, S00),
    ((7, 4), M2x3, S00),
    ((5, 4), M2x3, S00),
    ((5, 4), M3x2, S00),
    ((4, 5), M2x2, [rs.Shard(1), rs.Shard(1)]),
    ((5, 6), M2x2x2, [rs.Shard(0), rs.Shard(1), rs.Shard(0)]),  # dim 1 sharded too; axes 0 and 2 nest
    ((5, 7), M2x2x2, [rs.Shard(1), rs.Shard(0), rs.Shard(1)]),
]


@pytest.mark.parametrize("shape,mesh,placements", CASES, ids=str)
def test_shard_gives_dtensors_local_tensors(shape, mesh, placements):
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    g = torch.randn(shape, dtype=torch.float64)
    ts = TensorSharding.from_placements(shape, placements, mesh)
    locals_ = shard(g, ts)
    for r, loc in locals_.items():
        size, offset = _compute_local_shape_and_global_offset(shape, mesh.shape, list(mesh.coords(r)),
                                                              _dplace(placements))
        assert tuple(loc.shape) == tuple(size) == ts.local_extent(mesh.coords(r))
        if loc.numel():
            assert torch.equal(loc, g[tuple(slice(o, o + s) for o, s in zip(offset, size))])
    assert torch.equal(unshard(locals_, ts), g)


def _fake_distribute(g: torch.Tensor, mesh: rs.DeviceMesh, placements) -> dict[int, torch.Tensor]:
    """``distribute_tensor(g, mesh, placements).to_local()`` on every rank of a fake process group
    (each rank takes its own pieces: ``src_data_rank=None``)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    out = {}
    for r in mesh.ranks:
        dist.init_process_group("fake", store=FakeStore(), rank=r, world_size=len(mesh.ranks))
        try:
            dmesh = DeviceMesh("cpu", torch.tensor(mesh.ranks).reshape(mesh.shape))
            out[r] = dt.distribute_tensor(g, dmesh, _dplace(placements), src_data_rank=None).to_local()
        finally:
            dist.destroy_process_group()
    return out


@pytest.mark.parametrize("shape,mesh,placements", CASES[:4] + CASES[-2:-1], ids=str)
def test_plan_shard_inputs_are_distribute_tensors_locals(shape, mesh, placements):
    """``Plan.shard_inputs`` gives every rank ``distribute_tensor``'s local tensor, and ``simulate``
    takes them back."""
    g = torch.randn(shape, dtype=torch.float64)
    want = _fake_distribute(g, mesh, placements)
    f = rs.Fusion()
    x = f.input("x", shape, F64, mesh, placements)
    f.output(f.neg(x), placements)
    plan = rs.optimize(f)
    local = plan.shard_inputs({"x": g})
    for r in mesh.ranks:
        (got,) = local[r].values()
        assert torch.equal(got, want[r]), r
    (y,) = plan.simulate({"x": g})
    assert torch.equal(y, -g)


# ---- plans ---------------------------------------------------------------------------------
def _inputs(f: rs.Fusion, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=gen, dtype=torch.float64) for i in f.inputs}


def _check_plan(plan, f: rs.Fusion, seed: int) -> None:  # noqa: ANN001  (a Plan)
    inputs = _inputs(f, seed)
    outs = plan.simulate(inputs, generator=torch.Generator().manual_seed(seed + 1))
    for o, r in zip(outs, rs.run_reference(f, inputs)):
        torch.testing.assert_close(o, r, rtol=1e-9, atol=1e-9)


def check(f: rs.Fusion, extractions: int = 3) -> rs.Plan:
    """``f``'s plan and ``extractions`` random extractions of its e-graph (random node costs)
    simulated on random float64 inputs (random Partial summands) equal ``run_reference``."""
    plan = rs.optimize(f)
    _check_plan(plan, f, 0)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    for seed in range(extractions):
        _check_plan(sat.plan(perturb=random.Random(seed)), f, seed + 1)
    return plan


def test_elementwise_with_a_replicated_bias_stays_local():
    """5 rows on 2x2 (pieces 2, 1, 1, 1): the bias is laid out in the nested layout locally."""
    f = rs.Fusion()
    x = f.input("x", (5, 4), F64, M2x2, S00)
    y = f.input("y", (5, 4), F64, M2x2, S00)
    b = f.input("b", (5,), F64, M2x2, R2)
    f.output(f.gelu(f.add(f.mul(x, y), f.broadcast(b, (5, 4), (0,)))), S00)
    plan = check(f)
    assert plan.communications == (), plan.explain()
    assert "input x dim 0: 5 padded to 8 for Shard(0) on 4 ranks (mesh axes 'dp', 'tp') (DTensor's nested " \
        "chunks at 0:3, 4:5, 6:7)" in plan.explain(), plan.explain()
    local = plan.shard_inputs(_inputs(f, 0))
    assert [tuple(v.shape)[0] for r in M2x2.ranks for k, v in local[r].items() if "b" not in k] == \
        [2, 2, 1, 1, 1, 1, 1, 1]


def test_matmul_rows_and_contraction_over_a_nested_dim():
    f = rs.Fusion()
    x = f.input("x", (5, 4), F64, M2x2, S00)
    w = f.input("w", (4, 3), F64, M2x2, R2)
    f.output(f.matmul(x, w), S00)                            # rows: local
    a = f.input("a", (3, 6), F64, M2x2, [rs.Shard(1), rs.Shard(1)])
    b = f.input("b", (6, 4), F64, M2x2, S00)
    f.output(f.matmul(f.exp(a), b), R2)                      # over 6 (pieces 2, 1, 2, 1): masked
    plan = check(f)
    assert [c.kind for c in plan.communications] == ["allreduce", "allreduce"], plan.explain()


@pytest.mark.parametrize("fn", ["sum", "max", "mean"])
def test_reductions_over_and_along_a_nested_dim(fn):
    f = rs.Fusion()
    x = f.input("x", (6, 3), F64, M2x2, S00)
    f.output(f.reduce(fn, f.log(f.abs(x)), 0), R2)          # padding's log 0 = -inf masked
    f.output(f.reduce(fn, x, 1), S00)                        # keeps the layout: local
    plan = check(f)
    assert "masked with" in plan.explain()


def test_redistributes_from_a_nested_layout():
    f = rs.Fusion()
    x = f.input("x", (5, 6), F64, M2x2, S00)
    f.output(f.redistribute(x, R2), R2)
    f.output(f.redistribute(f.neg(x), [rs.Shard(1), rs.Replicate()]), [rs.Shard(1), rs.Replicate()])
    f.output(f.redistribute(f.exp(x), [rs.Shard(0), rs.Shard(1)]), [rs.Shard(0), rs.Shard(1)])
    f.output(f.redistribute(f.tanh(x), [rs.Replicate(), rs.Shard(0)]), [rs.Replicate(), rs.Shard(0)])
    check(f)


def test_redistributes_to_a_nested_layout():
    f = rs.Fusion()
    x = f.input("x", (5, 6), F64, M2x2, R2)
    y = f.input("y", (5, 6), F64, M2x2, [rs.Shard(1), rs.Shard(0)])
    f.output(f.redistribute(f.add(x, y), S00), S00)
    f.output(f.neg(x), S00)
    plan = check(f)
    assert not plan.padding.constants  # nothing folded: no mask


def test_nested_and_tail_layouts_of_one_dim_meet_on_a_2x3_mesh():
    """7 rows: pieces 2, 2, 0, 1, 1, 1 on [S(0), S(0)] of 2x3, 4, 3 on [S(0), R]."""
    f = rs.Fusion()
    x = f.input("x", (7, 4), F64, M2x3, S00)
    y = f.input("y", (7, 4), F64, M2x3, [rs.Shard(0), rs.Replicate()])
    z = f.mul(x, y)
    f.output(z, S00)
    f.output(f.sum(z, 0), R2)
    f.output(z, [rs.Replicate(), rs.Shard(0)])
    check(f)


def test_nested_dim_beside_another_sharded_dim_on_a_2x2x2_mesh():
    f = rs.Fusion()
    pl = [rs.Shard(0), rs.Shard(1), rs.Shard(0)]
    x = f.input("x", (5, 6), F64, M2x2x2, pl)
    w = f.input("w", (6, 3), F64, M2x2x2, [rs.Replicate(), rs.Shard(0), rs.Replicate()])
    f.output(f.matmul(x, w), [rs.Shard(0), rs.Replicate(), rs.Shard(0)])
    f.output(f.tanh(x), pl)
    check(f)


def test_reshapes_and_slices_of_a_nested_dim():
    """Merging the nested dim as the outermost factor keeps its layout scaled (local); a slice
    reads true indices, so the layout is taken apart first."""
    f = rs.Fusion()
    x = f.input("x", (5, 4), F64, M2x2, S00)
    f.output(f.reshape(f.exp(x), (20,)), [rs.Shard(0), rs.Replicate()])
    f.output(f.reshape(f.neg(f.reshape(x, (5, 2, 2))), (5, 4)), S00)
    f.output(f.slice(x, 0, 1, 4), R2)
    check(f)


def test_gradients_of_and_through_a_nested_uneven_input():
    """A joint forward and backward program (``passes.autodiff.joint``): the gradient of a nested
    input at its own nested sharding, a replicated weight's summed over the nested rows."""
    from reshard.passes.autodiff import joint
    f = rs.Fusion()
    x = f.input("x", (5, 4), F64, M2x2, S00)
    w = f.input("w", (4, 6), F64, M2x2, R2)
    h = f.gelu(f.matmul(x, w))
    loss = f.sum(f.reshape(f.mul(h, h), (30,)), 0)
    check(joint(f, loss, ["x", "w"], grad_placements={"x": S00, "w": R2}).fusion, extractions=2)


def test_from_torch_mlp_with_a_nested_uneven_batch():
    """A module through from_torch with 5 rows on [Shard(0), Shard(0)] of 2x2: its plan's
    simulation matches the module's eager output."""
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8), torch.nn.Softmax(-1))
    x = torch.randn(5, 8)
    tp = rs.from_torch(m, (x,), S00, [S00], M2x2)
    plan = rs.optimize(tp.fusion)
    assert plan.padding is not None
    with torch.no_grad():
        expected = m(x)
    (y,) = plan.simulate(tp.inputs(x))
    torch.testing.assert_close(y, expected)


# ---- gloo ----------------------------------------------------------------------------------
def _gloo_program() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (5, 4), F64, M2x2, S00)
    w = f.input("w", (4, 6), F64, M2x2, R2)
    y = f.gelu(f.matmul(x, w))
    f.output(y, S00)
    f.output(f.redistribute(y, [rs.Shard(1), rs.Shard(1)]), [rs.Shard(1), rs.Shard(1)])
    return f


def _gloo_rank(rank: int) -> tuple[torch.Tensor, ...]:
    f = _gloo_program()
    plan = rs.optimize(f)
    return plan.run(plan.shard_inputs(_inputs(f, 3))[rank])


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="gloo is not available")
def test_plan_run_on_gloo_gives_distribute_tensors_locals():
    """On 4 gloo processes, each rank's outputs are ``distribute_tensor``'s local tensors of the
    reference outputs (pieces 2, 1, 1, 1 of 5 rows; 2, 1, 2, 1 of 6 columns)."""
    results = rs.launch(_gloo_rank, 4, timeout_s=120)
    f = _gloo_program()
    for k, ref in enumerate(rs.run_reference(f, _inputs(f, 3))):
        want = _fake_distribute(ref, M2x2, f.outputs[k][1].placements)
        for r in M2x2.ranks:
            torch.testing.assert_close(results[r][k], want[r], rtol=1e-9, atol=1e-9)
