"""``f.along`` (``ir.ops.along``, issue 30): flip, cumprod, sort / argsort, topk / topk_indices,
argmax / argmin, is_max along one dim.  The dim is gathered when sharded, the other dims stay sharded;
flip keeps Partial sums and maxes, the others keep none; plans simulate like the reference."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.ops.along import ALONG_FNS

from reshard.testing.autodiff_oracle import check_joint, loss_weights, weighted_loss
from reshard.testing.op_oracle import MESH1, MESH2, check_plan, inputs_of

PARAMS = {"sort": {"descending": True}, "argsort": {"stable": True}, "topk": {"k": 3},
          "topk_indices": {"k": 2, "largest": False}}


@pytest.mark.parametrize("fn", list(ALONG_FNS))
@pytest.mark.parametrize("mesh,placements,dim", [
    (MESH1, [rs.Shard(0)], 1), (MESH1, [rs.Shard(1)], 1), (MESH2, [rs.Shard(1), rs.Shard(0)], 0),
])
def test_matches_the_reference(fn, mesh, placements, dim):
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", mesh, placements)
    f.output(f.along(fn, x, dim, **PARAMS.get(fn, {})), [rs.Replicate()] * mesh.ndim)
    check_plan(f, seeds=(0,))


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_flip_keeps_partial(reduce):
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", MESH1, [rs.Partial(reduce)])
    f.output(f.flip(x, 1), [rs.Partial(reduce)])
    assert check_plan(f, seeds=(0, 1)).communications == ()


def test_a_row_wise_op_of_sharded_rows_runs_locally():
    f = rs.Fusion()
    x = f.input("x", (4, 8), "int64", MESH1, [rs.Shard(0)])
    f.output(f.topk(x, 1, k=2), [rs.Shard(0)])
    f.output(f.argmax(x, 1), [rs.Shard(0)])
    assert check_plan(f, seeds=(0,)).communications == ()


@pytest.mark.parametrize("build,message", [
    (lambda f, x, b: f.sort(b, 0), r"sort: operand %b\[4, 8\]:bool has dtype bool"),
    (lambda f, x, b: f.flip(x, 2), "flip of %x.*dim 2 out of range"),
    (lambda f, x, b: f.topk(x, 1, k=9), r"topk of %x.*k must be an int in \[1, 8\], got 9"),
    (lambda f, x, b: f.sort(x, 1, k=2), r"sort of %x.*unknown parameters \['k'\]"),
    (lambda f, x, b: f.along("median", x, 1), "along: unknown function 'median'"),
])
def test_bad_arguments_are_errors_naming_the_op(build, message):
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", MESH1)
    b = f.input("b", (4, 8), "bool", MESH1)
    with pytest.raises(rs.ReshardError, match=message):
        build(f, x, b)


@pytest.mark.parametrize("fn,params", [("sort", {"descending": True}), ("sort", {"stable": True}),
                                       ("topk", {"k": 3}), ("topk", {"k": 1, "largest": False})],
                         ids=["sort-desc", "sort-stable", "topk3", "topk1-smallest"])
@pytest.mark.parametrize("placements,dim", [([rs.Shard(0)], 1), ([rs.Shard(1)], 1), ([rs.Shard(1)], 0)],
                         ids=["rows-along1", "cols-along1", "cols-along0"])
def test_sort_and_topk_gradients_match_autograd(fn, params, placements, dim):
    """The gradient scattered back to where each value came from (``_d_select``), through the
    reference and a plan, against torch.autograd (ties included: a row of equal values)."""
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float64", MESH1, placements)
    v = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    v[2] = 0.5
    check_joint(f, weighted_loss(f, [f.along(fn, x, dim, **params)]), {"x": v, **loss_weights(f, 1)}, plan=True)


@pytest.mark.parametrize("mesh,placements,dim", [
    (MESH1, [rs.Shard(1)], 1), (MESH1, [rs.Shard(0)], 1), (MESH1, [rs.Partial()], 0),
    (MESH2, [rs.Shard(1), rs.Partial()], 1),
], ids=["uneven-along", "uneven-rows", "partial", "2d-partial"])
def test_is_max_marks_every_tie_on_uneven_and_partial_operands(mesh, placements, dim):
    """``is_max`` (max's tie mask) of an operand split unevenly (7 on 2 ranks: the dim gathered,
    or rows of 5 kept split) or Partial (summed first), and of rows that tie entirely (a
    broadcast): the plan equals the reference; the tied rows are all ones."""
    f = rs.Fusion()
    x = f.input("x", (5, 7), "float64", mesh, placements)
    c = f.input("c", (5,), "float64", mesh, [rs.Replicate()] * mesh.ndim)
    f.output(f.is_max(x, dim), [rs.Replicate()] * mesh.ndim)
    f.output(f.is_max(f.add(f.broadcast(c, (5, 7), (0,)), f.scale(f.detach(x), 0.0)), 1), [rs.Replicate()] * mesh.ndim)
    check_plan(f, seeds=(0, 1))
    assert bool((rs.run_reference(f, inputs_of(f, 0))[1] == 1).all())
