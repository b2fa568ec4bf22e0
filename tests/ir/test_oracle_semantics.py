"""The shard/unshard oracle means what DTensor means (issue 18, "Soundness and oracle").

Law: for a sharding with Partial and Replicate axes, the local tensor ``L(c)`` of the device
at mesh coordinates ``c`` does not depend on ``c``'s Replicate coordinates (identical copies,
whatever the other axes hold), and the block chosen by the bound coordinates is the
reduction of ``L(c)`` over the Partial coordinates.  ``shard`` builds locals that satisfy it
(random summands vary along the Partial axes only), ``unshard`` rejects locals that do not,
and NaN/inf compare equal to themselves, so they flow through plans as through the reference.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.ir import Partial, Replicate, ReshardError, Shard, TensorSharding, shard, unshard
from tests.ir.test_ir_sharding import SETTINGS, expected_local, loop_domain_cases, placement_cases

MESH2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))


def _replicate_axes(ts: TensorSharding) -> list[int]:
    return [a for a, p in enumerate(ts.axes) if isinstance(p, Replicate)]


def _first_replica(ts: TensorSharding, r: int) -> int:
    c = ts.mesh.coords(r)
    return ts.mesh.rank_at([0 if a in _replicate_axes(ts) else x for a, x in enumerate(c)])


def _check_law(x: torch.Tensor, ts: TensorSharding, locals_: dict[int, torch.Tensor]) -> None:
    """Replicas identical; each block the reduction of its Partial summands (the independent
    oracle ``expected_local`` of test_ir_sharding gives the block)."""
    for r in ts.mesh.ranks:
        assert torch.equal(locals_[r], locals_[_first_replica(ts, r)]), (ts, r)
    op = {ts.axes[a].op for a in ts.partial_axes}
    blocks: dict[tuple, list[torch.Tensor]] = {}
    for r in ts.mesh.ranks:
        if _first_replica(ts, r) == r:
            c = ts.mesh.coords(r)
            blocks.setdefault(tuple(c[a] for a in ts.bound_axes), []).append(locals_[r])
    for vals in blocks.values():
        assert len(vals) == math.prod(ts.mesh.shape[a] for a in ts.partial_axes)
    for r in ts.mesh.ranks:
        c = ts.mesh.coords(r)
        if _first_replica(ts, r) != r or any(c[a] for a in ts.partial_axes):
            continue
        vals = torch.stack(blocks[tuple(c[a] for a in ts.bound_axes)]).double()
        red = vals.sum(0) if op == {"sum"} else vals.amax(0) if op == {"max"} else vals[0]
        torch.testing.assert_close(red, expected_local(x, ts, c).double(), rtol=1e-6, atol=1e-6)


@st.composite
def partial_and_replicate(draw) -> TensorSharding:
    """A sharding on a 2-D or 3-D mesh with at least one Partial and one Replicate axis (the
    rest Shard, Partial or Replicate), every sharded dim divisible."""
    shape_m = draw(st.sampled_from([(2, 2), (2, 3), (3, 2), (2, 2, 2), (2, 1, 3)]))
    mesh = rs.DeviceMesh(torch.arange(math.prod(shape_m)).reshape(shape_m).tolist())
    op = draw(st.sampled_from(["sum", "max"]))
    rest = draw(st.lists(st.sampled_from("PRS"), min_size=len(shape_m) - 2, max_size=len(shape_m) - 2))
    kinds = draw(st.permutations(["P", "R", *rest]))
    ndim = draw(st.integers(1, 3))
    placements = [Partial(op) if k == "P" else Replicate() if k == "R" else Shard(draw(st.integers(0, ndim - 1)))
                  for k in kinds]
    shape = [math.prod(n for n, p in zip(shape_m, placements) if p == Shard(d)) * draw(st.integers(1, 2))
             for d in range(ndim)]
    return TensorSharding.from_placements(shape, placements, mesh)


def _shard_check_law_unshard(ts: TensorSharding, use_generator: bool, seed: int) -> None:
    x = torch.randn(ts.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    locals_ = shard(x, ts, generator=torch.Generator().manual_seed(seed + 1) if use_generator else None)
    _check_law(x, ts, locals_)
    torch.testing.assert_close(unshard(locals_, ts), x, rtol=1e-6, atol=1e-6)


@settings(max_examples=30, derandomize=True, **SETTINGS)
@given(partial_and_replicate(), st.integers(0, 2**16))
def test_random_summands_vary_along_partial_axes_only(ts, seed):
    _shard_check_law_unshard(ts, True, seed)


@settings(max_examples=40, derandomize=True, **SETTINGS)
@given(st.one_of(placement_cases().map(lambda c: TensorSharding.from_placements(c[1], c[2], c[0])),
                 loop_domain_cases().map(lambda c: c[2])),
       st.booleans(), st.integers(0, 2**16))
def test_shard_satisfies_the_law_for_any_sharding(ts, use_generator, seed):
    _shard_check_law_unshard(ts, use_generator, seed)


def test_random_partial_summands_are_copies_along_replicate_axes_on_2x2():
    """``[P(sum), R]``: L(x, 0) == L(x, 1); L(0, y) + L(1, y) == value; summands are random."""
    x = torch.randn(2, 4, dtype=torch.float64)
    locals_ = shard(x, [Partial("sum"), Replicate()], MESH2x2, generator=torch.Generator().manual_seed(7))
    assert torch.equal(locals_[0], locals_[1]) and torch.equal(locals_[2], locals_[3])
    assert not torch.allclose(locals_[0], x)
    torch.testing.assert_close(locals_[0] + locals_[2], x)
    locals_ = shard(x, [Replicate(), Partial("max")], MESH2x2, generator=torch.Generator().manual_seed(7))
    assert torch.equal(locals_[0], locals_[2]) and torch.equal(locals_[1], locals_[3])
    assert torch.equal(torch.maximum(locals_[0], locals_[1]), x) and not torch.equal(locals_[0], locals_[1])


def test_issue18_partial_replicate_matmul_with_random_summands():
    """Issue 18: a [P(sum), R] (2, 4) @ w [R, P(sum)] (4, 3) on 2x2, output [R, R].  The plan
    (local matmul to [P, P], allreduce on both axes) is right under DTensor's meaning; with
    random summands that differed along the Replicate axis it was off by 6.45."""
    f = rs.Fusion()
    a = f.input("a", (2, 4), "float64", MESH2x2, [Partial("sum"), Replicate()])
    w = f.input("w", (4, 3), "float64", MESH2x2, [Replicate(), Partial("sum")])
    f.output(f.matmul(a, w), [Replicate(), Replicate()])
    plan = rs.optimize(f)
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(2, 4, generator=g, dtype=torch.float64),
              "w": torch.randn(4, 3, generator=g, dtype=torch.float64)}
    (ref,) = rs.run_reference(f, inputs)
    for gen in (None, torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)):
        (out,) = plan.simulate(inputs, generator=gen)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("placements", [[Partial("sum"), Replicate()], [Replicate(), Partial("sum")],
                                        [Partial("max"), Replicate()]])
def test_unshard_rejects_partials_that_differ_along_a_replicate_axis(placements):
    """Locals whose reductions agree but whose copies along the Replicate axis differ are not a
    valid ``[P, R]`` / ``[R, P]`` value (the old oracle accepted them)."""
    x = torch.randn(2, 3, dtype=torch.float64)
    locals_ = shard(x, placements, MESH2x2, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(unshard(locals_, placements, MESH2x2, shape=(2, 3)), x)
    r_axis = placements.index(Replicate())
    other = [r for r in MESH2x2.ranks if MESH2x2.coords(r)[r_axis] == 1]  # the second copy of each summand
    d = torch.full((2, 3), 0.5, dtype=torch.float64)
    if placements[1 - r_axis].op == "sum":  # shift the copy's summands; their sum is unchanged
        locals_[other[0]] = locals_[other[0]] + d
        locals_[other[1]] = locals_[other[1]] - d
    else:  # lower the copy's non-maximal entries; the max is unchanged
        lo = torch.minimum(locals_[other[0]], locals_[other[1]])
        for r in other:
            locals_[r] = torch.where(locals_[r] == lo, lo - 1, locals_[r])
    with pytest.raises(ReshardError, match=r"replicas at mesh coordinates .* disagree.*Replicate axes"):
        unshard(locals_, placements, MESH2x2, shape=(2, 3))


# ---- NaN and inf ----------------------------------------------------------------------------
def test_unshard_treats_nan_and_inf_replicas_as_equal():
    mesh = rs.DeviceMesh([0, 1])
    v = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    out = unshard({0: v.clone(), 1: v.clone()}, [Replicate()], mesh, shape=(4,))
    assert torch.equal(out.isnan(), v.isnan()) and torch.equal(out[1:], v[1:])
    for bad in (torch.tensor([1.0, float("inf"), -float("inf"), 1.0]),   # NaN vs number
                torch.tensor([float("nan"), -float("inf"), -float("inf"), 1.0])):  # inf vs -inf
        with pytest.raises(ReshardError, match="disagree"):
            unshard({0: v.clone(), 1: bad}, [Replicate()], mesh, shape=(4,))


def test_issue18_sqrt_of_negative_input_replicated_output_is_nan_like_the_reference():
    """Issue 18: ``sqrt`` of a negative input gives NaN; the replicated output's copies hold NaN
    at the same places, which ``unshard`` must accept (it reported "replicas disagree")."""
    mesh = rs.DeviceMesh([0, 1])
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float64", mesh, [Shard(0)])
    f.output(f.sqrt(x), [Replicate()])
    plan = rs.optimize(f)
    inputs = {"x": torch.randn(4, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)}
    inputs["x"][0, 0], inputs["x"][3, 5] = float("inf"), float("nan")
    (ref,) = rs.run_reference(f, inputs)
    assert ref.isnan().any() and ref.isinf().any()
    (out,) = plan.simulate(inputs)
    torch.testing.assert_close(out, ref, equal_nan=True)


def test_nan_and_inf_in_partial_inputs_reduce_like_the_reference():
    """A Partial(sum) input holding NaN/inf keeps them in the coordinate-0 summand: the
    allreduced output has NaN/inf exactly where the input has."""
    f = rs.Fusion()
    x = f.input("x", (2, 4), "float64", MESH2x2, [Partial("sum"), Replicate()])
    f.output(f.relu(f.redistribute(x, [Replicate(), Replicate()])), [Replicate(), Replicate()])
    plan = rs.optimize(f)
    v = torch.randn(2, 4, dtype=torch.float64)
    v[0, 1], v[1, 2], v[1, 3] = float("nan"), float("inf"), -float("inf")
    (out,) = plan.simulate({"x": v}, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(out, rs.run_reference(f, {"x": v})[0], equal_nan=True)
