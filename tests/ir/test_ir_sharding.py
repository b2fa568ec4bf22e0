"""reshard.ir.sharding: shard/unshard round trips, DTensor-compatible local tensors,
loop-domain (IterDomain) shardings, partial reductions and error reporting.

The oracle used here is independent of ``reshard.ir.ids.evaluate``: IterDomain values
are recomputed with plain Python integer arithmetic on every global multi-index, and
Shard(d) local tensors are recomputed with ``torch.chunk`` the way DTensor does.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reshard.ir import (DeviceMesh, Inner, Merge, Outer, Partial, Replicate, ReshardError, Root, Shard,
                        TensorSharding, shard, unshard)

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])

MESH_SHAPES = [(1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,),
               (1, 1), (1, 3), (3, 1), (2, 2), (2, 3), (3, 2), (2, 4), (4, 2), (1, 8), (2, 2, 2)]


# ---- independent oracle ------------------------------------------------------------------
def py_extent(x) -> int:
    if isinstance(x, Root):
        return x.extent
    if isinstance(x, Outer):
        return x.parts
    if isinstance(x, Inner):
        return py_extent(x.x) // x.parts
    return py_extent(x.x) * py_extent(x.y)


def py_value(x, idx: tuple[int, ...]) -> int:
    """The value of IterDomain ``x`` at global multi-index ``idx`` (DESIGN.md table)."""
    if isinstance(x, Root):
        return idx[x.dim]
    if isinstance(x, Outer):
        return py_value(x.x, idx) // (py_extent(x.x) // x.parts)
    if isinstance(x, Inner):
        return py_value(x.x, idx) % (py_extent(x.x) // x.parts)
    return py_value(x.x, idx) * py_extent(x.y) + py_value(x.y, idx)


def expected_local(g: torch.Tensor, ts: TensorSharding, coords: tuple[int, ...]) -> torch.Tensor:
    """Elements of ``g`` whose bound IDs equal ``coords``, in global row-major order, shaped
    per dim by how many distinct indices of that dim are held."""
    bound = [(a, p) for a, p in enumerate(ts.axes) if not isinstance(p, (Replicate, Partial))]
    held = [idx for idx in itertools.product(*[range(s) for s in g.shape])
            if all(py_value(p, idx) == coords[a] for a, p in bound)]
    shape = [len({idx[d] for idx in held}) for d in range(g.dim())]
    assert math.prod(shape) == len(held), "oracle: selection is not rectangular"
    vals = torch.stack([g[idx] for idx in held]) if held else g.new_empty(0)
    return vals.reshape(shape)


def chunk_local(g: torch.Tensor, placements, mesh: DeviceMesh, rank: int) -> torch.Tensor:
    """DTensor's local tensor for Shard/Replicate placements: chunk in mesh-axis order."""
    local = g
    for a, p in enumerate(placements):
        if isinstance(p, Shard):
            local = torch.chunk(local, mesh.shape[a], dim=p.dim)[mesh.coords(rank)[a]]
    return local


def partial_groups(ts: TensorSharding) -> list[list[int]]:
    """Ranks that differ only along Partial axes."""
    groups: dict[tuple, list[int]] = {}
    for r in ts.mesh.ranks:
        c = ts.mesh.coords(r)
        groups.setdefault(tuple(0 if a in ts.partial_axes else x for a, x in enumerate(c)), []).append(r)
    return list(groups.values())


# ---- strategies --------------------------------------------------------------------------
@st.composite
def meshes(draw, shapes=MESH_SHAPES) -> DeviceMesh:
    shape = draw(st.sampled_from(shapes))
    n = math.prod(shape)
    # non-contiguous, permuted rank ids
    ids = draw(st.permutations(range(n)))
    stride = draw(st.sampled_from([1, 3]))
    offset = draw(st.sampled_from([0, 5]))
    flat = [offset + stride * i for i in ids]
    nested: object = flat
    for s in reversed(shape[1:]):
        nested = [nested[i:i + s] for i in range(0, len(nested), s)]  # type: ignore[index]
    return DeviceMesh(nested)


@st.composite
def placement_cases(draw):
    """(mesh, shape, placements) with every sharded dim divisible by the product of the
    mesh axes sharding it; Shard may repeat a dim across axes."""
    mesh = draw(meshes())
    ndim = draw(st.integers(1, 3))
    pop = draw(st.sampled_from(["sum", "max"]))
    placements = []
    for _ in mesh.shape:
        kind = draw(st.sampled_from(["shard", "shard", "replicate", "partial"]))
        if kind == "shard":
            d = draw(st.integers(0, ndim - 1))
            placements.append(Shard(draw(st.sampled_from([d, d - ndim]))))  # also negative dims
        elif kind == "replicate":
            placements.append(Replicate())
        else:
            placements.append(Partial(pop))
    shape = []
    for d in range(ndim):
        need = math.prod(mesh.shape[a] for a, p in enumerate(placements)
                         if isinstance(p, Shard) and p.dim % ndim == d)
        shape.append(need * draw(st.integers(1, 3)))
    return mesh, tuple(shape), placements


@st.composite
def loop_domain_cases(draw):
    """(mesh, shape, TensorSharding) built from IterDomains: block, cyclic, sharded inner
    factor, merged dims, block+cyclic on one dim, plus Replicate/Partial axes."""
    mesh = draw(meshes())
    pop = draw(st.sampled_from(["sum", "max"]))
    sizes: list[int] = []          # dim sizes, in allocation order
    builders = []                  # per mesh axis: fn(dimpos) -> placement
    block_dims: list[int] = []     # slots split by a block Outer(Root, n) only

    def new_dim(size: int) -> int:
        sizes.append(size)
        return len(sizes) - 1

    def root(pos, j):
        return Root(pos[j], sizes[j])

    for a, n in enumerate(mesh.shape):
        kind = draw(st.sampled_from(["block", "cyclic", "inner", "merge", "block_cyclic",
                                     "replicate", "partial"]))
        k = draw(st.integers(1, 3))
        if kind == "block_cyclic" and not block_dims:
            kind = "block"
        if kind == "block":
            j = new_dim(n * k)
            block_dims.append(j)
            builders.append(lambda pos, j=j, n=n: Outer(root(pos, j), n))
        elif kind == "cyclic":
            j = new_dim(n * k)
            builders.append(lambda pos, j=j, n=n: Inner(root(pos, j), sizes[j] // n))
        elif kind == "inner":
            p = draw(st.integers(1, 3))
            j = new_dim(p * n * k)
            builders.append(lambda pos, j=j, n=n, p=p: Outer(Inner(root(pos, j), p), n))
        elif kind == "merge":
            # outer operand of size a0 either divides n (a0 * m == n, inner size m * k) or
            # is a multiple of n; the later dim permutation also makes it the later tensor dim
            divs = [d for d in range(1, n + 1) if n % d == 0]
            if draw(st.booleans()):
                a0 = draw(st.sampled_from(divs))
                b0 = (n // a0) * k
            else:
                a0 = n * k
                b0 = draw(st.integers(1, 3))
            jo, ji = new_dim(a0), new_dim(b0)
            builders.append(lambda pos, jo=jo, ji=ji, n=n: Outer(Merge(root(pos, jo), root(pos, ji)), n))
        elif kind == "block_cyclic":
            # a dim already block-split by an earlier axis (Outer(i, n0)) is also split
            # cyclically by this one (Inner(i, e // n)); grow it so n0 * n divides it
            j = block_dims.pop(draw(st.integers(0, len(block_dims) - 1)))
            sizes[j] *= n
            builders.append(lambda pos, j=j, n=n: Inner(root(pos, j), sizes[j] // n))
        elif kind == "replicate":
            builders.append(lambda pos: Replicate())
        else:
            builders.append(lambda pos: Partial(pop))
    for _ in range(draw(st.integers(0 if sizes else 1, 1))):
        new_dim(draw(st.integers(1, 3)))
    if len(sizes) > 4 or math.prod(sizes) > 1024:
        # keep examples small: fall back to a replicated tensor
        return mesh, (3,), TensorSharding(mesh, (3,), tuple(Replicate() for _ in mesh.shape))
    order = draw(st.permutations(range(len(sizes))))  # tensor dim of allocation slot j
    shape = [0] * len(sizes)
    for j, d in enumerate(order):
        shape[d] = sizes[j]
    axes = tuple(b(order) for b in builders)
    return mesh, tuple(shape), TensorSharding(mesh, tuple(shape), axes)


def _global(shape, seed, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def _check_roundtrip(x: torch.Tensor, ts: TensorSharding, use_generator: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 1) if use_generator else None
    locals_ = shard(x, ts, generator=gen)
    assert sorted(locals_) == sorted(ts.mesh.ranks)
    bound_sizes = math.prod(ts.mesh.shape[a] for a in ts.bound_axes)
    assert math.prod(ts.local_shape) * bound_sizes == x.numel()
    for r, loc in locals_.items():
        assert tuple(loc.shape) == ts.local_shape
        assert loc.dtype == x.dtype
    # every partial group reduces to the oracle's local tensor
    ops = {ts.axes[a].op for a in ts.partial_axes}
    for group in partial_groups(ts):
        exp = expected_local(x, ts, ts.mesh.coords(group[0]))
        vals = torch.stack([locals_[r] for r in group]).double()
        red = vals.sum(0) if ops == {"sum"} else vals.amax(0) if ops == {"max"} else vals[0]
        torch.testing.assert_close(red, exp.double(), rtol=1e-5, atol=1e-5)
        if not use_generator and len(group) > 1:
            first = [r for r in group if all(ts.mesh.coords(r)[a] == 0 for a in ts.partial_axes)]
            assert len(first) == 1
            for r in group:
                if ops == {"max"} or r == first[0]:
                    assert torch.equal(locals_[r], exp)
                else:
                    assert torch.count_nonzero(locals_[r]) == 0
    back = unshard(locals_, ts)
    assert back.shape == x.shape and back.dtype == x.dtype
    if use_generator and ops == {"sum"}:
        torch.testing.assert_close(back, x, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(back, x)


# ---- round-trip properties -----------------------------------------------------------------
@settings(max_examples=120, **SETTINGS)
@given(placement_cases(), st.booleans(), st.integers(0, 2**16), st.sampled_from([torch.float32, torch.float64]))
def test_shard_unshard_identity_placements(case, use_generator, seed, dtype):
    mesh, shape, placements = case
    x = _global(shape, seed, dtype)
    ts = TensorSharding.from_placements(shape, placements, mesh)
    _check_roundtrip(x, ts, use_generator, seed)
    # the placement-list entry points agree with the TensorSharding ones
    gen = torch.Generator().manual_seed(seed + 1) if use_generator else None
    locals_ = shard(x, placements, mesh, generator=gen)
    back = unshard(locals_, placements, mesh, shape=shape)
    torch.testing.assert_close(back, x, rtol=1e-5, atol=1e-5)


@settings(max_examples=120, **SETTINGS)
@given(loop_domain_cases(), st.booleans(), st.integers(0, 2**16))
def test_shard_unshard_identity_loop_domain(case, use_generator, seed):
    mesh, shape, ts = case
    x = _global(shape, seed)
    _check_roundtrip(x, ts, use_generator, seed)


@settings(max_examples=60, **SETTINGS)
@given(placement_cases(), st.integers(0, 2**16))
def test_shard_matches_dtensor_chunks(case, seed):
    mesh, shape, placements = case
    placements = [Replicate() if isinstance(p, Partial) else p for p in placements]
    x = _global(shape, seed)
    locals_ = shard(x, placements, mesh)
    for r in mesh.ranks:
        assert torch.equal(locals_[r], chunk_local(x, placements, mesh, r)), (r, placements)


# ---- DTensor compatibility, explicit cases -------------------------------------------------
def test_two_axes_shard_same_dim_outer_to_inner():
    mesh = DeviceMesh([[0, 1], [2, 3]])
    x = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
    locals_ = shard(x, [Shard(0), Shard(0)], mesh)
    for r in range(4):
        # rank r = coordinates (r // 2, r % 2) holds row block r of 4
        assert torch.equal(locals_[r], x[2 * r:2 * r + 2]), r
    assert torch.equal(locals_[1], torch.chunk(torch.chunk(x, 2, 0)[0], 2, 0)[1])


def test_two_axes_shard_same_dim_with_permuted_ranks():
    mesh = DeviceMesh([[3, 0], [2, 1]])
    x = torch.arange(8, dtype=torch.float32)
    locals_ = shard(x, [Shard(0), Shard(0)], mesh)
    assert torch.equal(locals_[3], x[0:2])
    assert torch.equal(locals_[0], x[2:4])
    assert torch.equal(locals_[2], x[4:6])
    assert torch.equal(locals_[1], x[6:8])


def test_shard_different_dims_2d_mesh():
    mesh = DeviceMesh([[0, 1, 2, 3], [4, 5, 6, 7]])
    x = torch.arange(4 * 8, dtype=torch.float32).view(4, 8)
    locals_ = shard(x, [Shard(1), Shard(0)], mesh)
    # rank 6: coordinates (1, 2): columns block 1 of 2, rows block 2 of 4
    assert torch.equal(locals_[6], x[2:3, 4:8])
    assert tuple(locals_[6].shape) == (1, 4)
    # the sharding printed as placements
    assert str(TensorSharding.from_placements((4, 8), [Shard(1), Shard(0)], mesh)) == "[S(1), S(0)]"


def test_negative_shard_dim():
    mesh = DeviceMesh([0, 1])
    x = torch.arange(12, dtype=torch.float32).view(2, 6)
    locals_ = shard(x, [Shard(-1)], mesh)
    assert torch.equal(locals_[1], x[:, 3:])


# ---- loop-domain shardings, explicit cases -------------------------------------------------
def test_cyclic_sharding():
    mesh = DeviceMesh([0, 1, 2, 3])
    x = torch.arange(8, dtype=torch.float32)
    ts = TensorSharding(mesh, (8,), (Inner(Root(0, 8), 2),))
    locals_ = shard(x, ts)
    for r in range(4):
        assert torch.equal(locals_[r], torch.tensor([r, r + 4], dtype=torch.float32))
    assert torch.equal(unshard(locals_, ts), x)


def test_sharding_inner_factor_of_a_dim():
    # i in [0, 8) viewed as (2, 4); shard the inner 4 over 2 devices -> rank c holds i with
    # (i % 4) // 2 == c
    mesh = DeviceMesh([0, 1])
    x = torch.arange(8, dtype=torch.float32)
    ts = TensorSharding(mesh, (8,), (Outer(Inner(Root(0, 8), 2), 2),))
    locals_ = shard(x, ts)
    assert torch.equal(locals_[0], torch.tensor([0., 1., 4., 5.]))
    assert torch.equal(locals_[1], torch.tensor([2., 3., 6., 7.]))
    # same elements as reshape (2, 4) + Shard(1) then flatten
    assert torch.equal(locals_[1], shard(x.view(2, 4), [Shard(1)], mesh)[1].reshape(-1))


def test_merged_id_sharding():
    mesh = DeviceMesh([0, 1, 2, 3])
    x = torch.arange(8, dtype=torch.float32).view(2, 4)
    ts = TensorSharding(mesh, (2, 4), (Outer(Merge(Root(0, 2), Root(1, 4)), 4),))
    assert ts.local_shape == (1, 2)
    locals_ = shard(x, ts)
    for r in range(4):
        assert torch.equal(locals_[r], x[r // 2:r // 2 + 1, 2 * (r % 2):2 * (r % 2) + 2])
    assert torch.equal(unshard(locals_, ts), x)
    # equals sharding the flattened tensor
    flat = shard(x.reshape(8), [Shard(0)], mesh)
    for r in range(4):
        assert torch.equal(locals_[r].reshape(-1), flat[r])


def test_reversed_merge_is_column_major_blocks():
    mesh = DeviceMesh([0, 1])
    # merge(i1, i0) has value i1 * 2 + i0; its outer half is i1 in {2, 3}
    x = torch.arange(8, dtype=torch.float32).view(2, 4)
    ts = TensorSharding(mesh, (2, 4), (Outer(Merge(Root(1, 4), Root(0, 2)), 2),))
    locals_ = shard(x, ts)
    assert torch.equal(locals_[0], x[:, :2])
    assert torch.equal(locals_[1], x[:, 2:])


def test_block_and_cyclic_on_one_dim():
    mesh = DeviceMesh([[0, 1], [2, 3]])
    x = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
    ts = TensorSharding(mesh, (8, 3), (Outer(Root(0, 8), 2), Inner(Root(0, 8), 4)))
    assert ts.local_shape == (2, 3)
    locals_ = shard(x, ts)
    # rank 3 = (1, 1): rows 4..7 with odd index
    assert torch.equal(locals_[3], x[[5, 7]])
    assert torch.equal(locals_[0], x[[0, 2]])
    assert torch.equal(unshard(locals_, ts), x)


def test_loop_domain_equals_placement_form():
    mesh = DeviceMesh([[0, 1], [2, 3]])
    a = TensorSharding.from_placements((8, 4), [Shard(0), Shard(0)], mesh)
    b = TensorSharding(mesh, (8, 4), (Outer(Root(0, 8), 2), Outer(Inner(Root(0, 8), 2), 2)))
    assert a == b


# ---- local shapes ----------------------------------------------------------------------------
@pytest.mark.parametrize("mesh_devices, shape, placements, local", [
    ([0, 1, 2, 3], (8, 6), [Replicate()], (8, 6)),
    ([0, 1, 2, 3], (8, 6), [Partial("sum")], (8, 6)),
    ([0, 1, 2, 3], (8, 6), [Shard(0)], (2, 6)),
    ([0, 1], (8, 6), [Shard(1)], (8, 3)),
    ([[0, 1, 2, 3], [4, 5, 6, 7]], (8, 12), [Shard(0), Shard(1)], (4, 3)),
    ([[0, 1, 2, 3], [4, 5, 6, 7]], (6, 8), [Shard(1), Shard(1)], (6, 1)),
    ([[0, 1], [2, 3]], (4, 4, 4), [Partial("max"), Shard(2)], (4, 4, 2)),
    ([[0, 1], [2, 3]], (4, 6), [Replicate(), Shard(-1)], (4, 3)),
])
def test_local_shape(mesh_devices, shape, placements, local):
    mesh = DeviceMesh(mesh_devices)
    ts = TensorSharding.from_placements(shape, placements, mesh)
    assert ts.local_shape == local
    locals_ = shard(torch.zeros(shape), ts)
    assert all(tuple(v.shape) == local for v in locals_.values())


def test_partial_and_bound_axes_facts():
    mesh = DeviceMesh([[0, 1], [2, 3]])
    ts = TensorSharding.from_placements((4, 4), [Partial("sum"), Shard(1)], mesh)
    assert ts.partial_axes == (0,)
    assert ts.bound_axes == (1,)
    assert str(ts) == "[P(sum), S(1)]"


# ---- unshard semantics -----------------------------------------------------------------------
def test_unshard_detects_inconsistent_replicas():
    mesh = DeviceMesh([[0, 1], [2, 3]])
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    placements = [Replicate(), Shard(1)]
    locals_ = shard(x, placements, mesh)
    assert torch.equal(unshard(locals_, placements, mesh, shape=(4, 6)), x)
    locals_[2] = locals_[2] + 1.0  # rank 2 = (1, 0) disagrees with its replica rank 0
    with pytest.raises(ReshardError, match="replicas .* disagree"):
        unshard(locals_, placements, mesh, shape=(4, 6))
    # opting out keeps the first replica's values
    out = unshard(locals_, placements, mesh, shape=(4, 6), check_replicas=False)
    assert torch.equal(out, x)


def test_unshard_tolerates_tiny_replica_differences():
    mesh = DeviceMesh([0, 1])
    x = torch.ones(4)
    locals_ = shard(x, [Replicate()], mesh)
    locals_[1] = locals_[1] + 1e-7
    torch.testing.assert_close(unshard(locals_, [Replicate()], mesh, shape=(4,)), x)


def test_unshard_partial_sum_is_sum_of_locals():
    mesh = DeviceMesh([0, 1, 2])
    g = torch.Generator().manual_seed(1)
    locals_ = {r: torch.randn(3, 5, generator=g) for r in mesh.ranks}
    out = unshard(locals_, [Partial("sum")], mesh, shape=(3, 5))
    torch.testing.assert_close(out, locals_[0] + locals_[1] + locals_[2])


def test_unshard_partial_max_is_max_of_locals():
    mesh = DeviceMesh([0, 1, 2, 3])
    g = torch.Generator().manual_seed(2)
    locals_ = {r: torch.randn(2, 3, generator=g) for r in mesh.ranks}
    out = unshard(locals_, [Partial("max")], mesh, shape=(2, 3))
    assert torch.equal(out, torch.stack(list(locals_.values())).amax(0))


def test_unshard_partial_with_shard_axis():
    mesh = DeviceMesh([[0, 1], [2, 3]])
    g = torch.Generator().manual_seed(3)
    locals_ = {r: torch.randn(2, 3, generator=g) for r in mesh.ranks}
    # axis x partial, axis y shards dim 0: column-of-mesh pairs (0,2) and (1,3) are summed
    out = unshard(locals_, [Partial("sum"), Shard(0)], mesh, shape=(4, 3))
    torch.testing.assert_close(out, torch.cat([locals_[0] + locals_[2], locals_[1] + locals_[3]]))


def test_unshard_partial_sum_of_integers_is_exact():
    mesh = DeviceMesh([0, 1])
    locals_ = {0: torch.tensor([1, 2, 3]), 1: torch.tensor([10, 20, 30])}
    out = unshard(locals_, [Partial("sum")], mesh, shape=(3,))
    assert out.dtype == torch.int64 and out.tolist() == [11, 22, 33]


def test_shard_partial_generator_gives_real_partials():
    mesh = DeviceMesh([0, 1, 2, 3])
    x = torch.randn(16, generator=torch.Generator().manual_seed(4))
    s = shard(x, [Partial("sum")], mesh, generator=torch.Generator().manual_seed(5))
    assert not any(torch.allclose(s[r], x) for r in mesh.ranks)
    torch.testing.assert_close(sum(s.values()), x)
    m = shard(x, [Partial("max")], mesh, generator=torch.Generator().manual_seed(6))
    assert any(not torch.equal(m[r], x) for r in mesh.ranks)
    assert all(bool((m[r] <= x).all()) for r in mesh.ranks)
    assert torch.equal(torch.stack(list(m.values())).amax(0), x)


def test_unshard_errors():
    mesh = DeviceMesh([0, 1])
    x = torch.zeros(4, 2)
    locals_ = shard(x, [Shard(0)], mesh)
    with pytest.raises(ReshardError, match=r"no local tensor for ranks \[1\]"):
        unshard({0: locals_[0]}, [Shard(0)], mesh, shape=(4, 2))
    with pytest.raises(ReshardError, match=r"rank 1 local shape \(4, 2\)"):
        unshard({0: locals_[0], 1: torch.zeros(4, 2)}, [Shard(0)], mesh, shape=(4, 2))
    with pytest.raises(ReshardError, match="needs the global shape"):
        unshard(locals_, [Shard(0)], mesh)
    with pytest.raises(ReshardError, match="needs a mesh"):
        shard(x, [Shard(0)])


def test_shard_wrong_global_shape():
    mesh = DeviceMesh([0, 1])
    ts = TensorSharding.from_placements((4, 2), [Shard(0)], mesh)
    with pytest.raises(ReshardError, match=r"shape \(4, 3\)"):
        shard(torch.zeros(4, 3), ts)


def test_shard_mixed_partial_ops_rejected():
    mesh = DeviceMesh([[0, 1], [2, 3]])
    ts = TensorSharding.from_placements((2,), [Partial("sum"), Partial("max")], mesh)
    with pytest.raises(ReshardError, match="mixes Partial ops"):
        shard(torch.zeros(2), ts)
    with pytest.raises(ReshardError, match="mixes Partial ops"):
        unshard({r: torch.zeros(2) for r in mesh.ranks}, ts)


# ---- error cases -----------------------------------------------------------------------------
def test_shard_non_divisible_dim_gives_torch_chunk_pieces():
    """Uneven dims: DTensor's torch.chunk pieces (tests/ir/test_uneven.py checks them in depth)."""
    mesh = DeviceMesh([0, 1, 2, 3])
    x = torch.arange(24.0).reshape(6, 4)
    pieces = shard(x, [Shard(0)], mesh)
    assert [tuple(p.shape) for p in pieces.values()] == [(2, 4), (2, 4), (2, 4), (0, 4)]
    assert torch.equal(unshard(pieces, [Shard(0)], mesh, shape=(6, 4)), x)


def test_shard_non_divisible_second_axis_on_same_dim():
    """4 on [Shard(0), Shard(0)] of 2x4: DTensor's nested chunks (1, 1, 0, 0 per half), not
    the padded blocks clipped (1, 1, 1, 1, 0, ...): padding between the halves."""
    mesh = DeviceMesh([[0, 1, 2, 3], [4, 5, 6, 7]])
    ts = TensorSharding.from_placements((4,), [Shard(0), Shard(0)], mesh)
    assert ts.shape == (8,) and ts.layouts == {0: ((0, 2), (4, 2))}
    x = torch.arange(4.0)
    pieces = shard(x, ts)
    assert [p.tolist() for p in pieces.values()] == [[0.0], [1.0], [], [], [2.0], [3.0], [], []]
    assert torch.equal(unshard(pieces, ts), x)


def test_wrong_number_of_placements():
    mesh = DeviceMesh([[0, 1], [2, 3]])
    with pytest.raises(ReshardError, match=r"1 placements .* for a 2-D mesh"):
        shard(torch.zeros(4), [Shard(0)], mesh)
    with pytest.raises(ReshardError, match=r"3 placements for a 2-D mesh"):
        TensorSharding(mesh, (4,), (Replicate(), Replicate(), Replicate()))


def test_shard_out_of_range_dim():
    mesh = DeviceMesh([0, 1])
    with pytest.raises(ReshardError, match=r"Shard\(2\) on a 2-D tensor of shape \(4, 4\)"):
        shard(torch.zeros(4, 4), [Shard(2)], mesh)
    with pytest.raises(ReshardError, match=r"Shard\(-3\)"):
        shard(torch.zeros(4, 4), [Shard(-3)], mesh)


def test_not_a_placement():
    mesh = DeviceMesh([0, 1])
    with pytest.raises(ReshardError, match="is not a placement"):
        TensorSharding.from_placements((4,), ["shard0"], mesh)
    with pytest.raises(ReshardError, match="is not Replicate/Partial/IterDomain"):
        TensorSharding(mesh, (4,), (Shard(0),))


def test_bound_extent_differs_from_axis_size():
    mesh = DeviceMesh([0, 1])
    with pytest.raises(ReshardError, match=r"extent 4 bound to mesh axis 'x' of size 2"):
        TensorSharding(mesh, (8,), (Outer(Root(0, 8), 4),))
    with pytest.raises(ReshardError, match=r"extent 4 bound to mesh axis 'x' of size 2"):
        TensorSharding(mesh, (8,), (Inner(Root(0, 8), 2),))


def test_overlapping_bound_ids():
    mesh = DeviceMesh([[0, 1], [2, 3]])
    with pytest.raises(ReshardError, match="overlap"):
        TensorSharding(mesh, (8,), (Outer(Root(0, 8), 2), Outer(Root(0, 8), 2)))


def test_non_rectangular_selection():
    mesh = DeviceMesh([0, 1, 2])
    # merge(i0[2], i1[3]) split 3 ways: device 1 holds (0, 2) and (1, 0)
    with pytest.raises(ReshardError, match="not a rectangular block"):
        TensorSharding(mesh, (2, 3), (Outer(Merge(Root(0, 2), Root(1, 3)), 3),))


def test_root_mismatch_and_non_dividing_split():
    mesh = DeviceMesh([0, 1])
    with pytest.raises(ReshardError, match="does not match tensor shape"):
        TensorSharding(mesh, (8,), (Outer(Root(0, 6), 2),))
    with pytest.raises(ReshardError, match="does not match tensor shape"):
        TensorSharding(mesh, (8,), (Outer(Root(1, 8), 2),))
    with pytest.raises(ReshardError, match="do not divide"):
        TensorSharding(mesh, (6,), (Outer(Inner(Root(0, 6), 4), 2),))


def test_partial_unknown_op():
    with pytest.raises(ReshardError, match="reduce op must be 'sum' or 'max', got 'min'"):
        Partial("min")


def test_of_rejects_mismatched_sharding():
    mesh = DeviceMesh([0, 1])
    ts = TensorSharding.from_placements((4,), [Shard(0)], mesh)
    assert TensorSharding.of(ts, (4,), mesh) is ts
    with pytest.raises(ReshardError, match=r"is for shape \(4,\)"):
        TensorSharding.of(ts, (8,), mesh)
    with pytest.raises(ReshardError, match=r"is for shape"):
        TensorSharding.of(ts, (4,), DeviceMesh([1, 0]))


@settings(max_examples=150, **SETTINGS)
@given(placement_cases())
def test_block_local_shape_shortcut_equals_enumeration(case):
    """``local_shape`` of DTensor-style block shardings is computed without enumerating
    elements; it must equal what every device's enumerated element set has."""
    mesh, shape, placements = case
    ts = TensorSharding.from_placements(shape, placements, mesh)
    if ts.bound_axes:
        assert ts._block_local_shape() is not None
    for coords in itertools.product(*(range(n) for n in mesh.shape)):
        assert tuple(ts.local_indices(coords).shape) == ts.local_shape


@st.composite
def split_cases(draw):
    """(shape, IDs): per mesh axis, a chain of Outer/Inner splits of one dim (digits of its
    index, disjoint or overlapping)."""
    shape = tuple(draw(st.lists(st.sampled_from([4, 6, 8, 12]), min_size=1, max_size=2)))
    ids = []
    for _ in range(draw(st.integers(1, 3))):
        d = draw(st.integers(0, len(shape) - 1))
        x = Root(d, shape[d])
        for _ in range(draw(st.integers(0, 3))):
            n = py_extent(x)
            x = draw(st.sampled_from([Outer, Inner]))(x, draw(st.sampled_from([p for p in range(1, n + 1) if n % p == 0])))
        ids.append(x)
    return shape, ids


def _accepted_iff_oracle(shape: tuple[int, ...], ids: list) -> TensorSharding | None:
    """The sharding of ``shape`` by ``ids`` (a mesh axis per ID, of its extent), checked
    against the plain-Python oracle (every index point): accepted, with the oracle's local
    shape, iff every device holds a rectangular block of one shape, else a ``ReshardError``
    (then None)."""
    sizes = [py_extent(x) for x in ids]
    mesh = DeviceMesh(torch.arange(math.prod(sizes)).reshape(sizes).tolist())
    blocks = set()
    for coords in itertools.product(*(range(n) for n in sizes)):
        held = [idx for idx in itertools.product(*map(range, shape))
                if all(py_value(x, idx) == c for x, c in zip(ids, coords))]
        local = tuple(len({idx[d] for idx in held}) for d in range(len(shape)))
        blocks.add((local, math.prod(local) == len(held) == math.prod(shape) // math.prod(sizes)))
    if len(blocks) != 1 or not next(iter(blocks))[1]:
        with pytest.raises(ReshardError):
            TensorSharding(mesh, shape, tuple(ids))
        return None
    ts = TensorSharding(mesh, shape, tuple(ids))
    assert ts.local_shape == next(iter(blocks))[0]
    return ts


@settings(max_examples=300, **SETTINGS)
@given(split_cases())
def test_digit_local_shape_shortcut_equals_oracle(case):
    """Splits of single dims get ``local_shape`` without enumerating elements when their
    digits are disjoint (``_digit_local_shape``): a sharding is accepted, with that local
    shape, iff every device holds a rectangular block of one shape (the oracle)."""
    ts = _accepted_iff_oracle(*case)
    assert ts is None or ts._digit_local_shape() in (None, ts.local_shape)


@st.composite
def merged_cases(draw):
    """(shape, IDs): per mesh axis, a random IterDomain over one or two dims: splits and
    merges nested a few deep (what resharding a reshaped or flattened tensor builds)."""
    shape = tuple(draw(st.lists(st.sampled_from([2, 4, 6, 8]), min_size=1, max_size=2)))

    def term(depth):
        d = draw(st.integers(0, len(shape) - 1))
        x = Root(d, shape[d])
        for _ in range(draw(st.integers(0, 2))):
            kind = draw(st.sampled_from(["outer", "inner", "merge"] if depth < 2 else ["outer", "inner"]))
            n = py_extent(x)
            if kind == "merge":
                y = term(depth + 1)
                x = Merge(x, y) if draw(st.booleans()) else Merge(y, x)
            else:
                x = (Outer if kind == "outer" else Inner)(x, draw(st.sampled_from([p for p in range(1, n + 1) if n % p == 0])))
        return x

    ids = [x for x in (term(0) for _ in range(draw(st.integers(1, 2)))) if 1 < py_extent(x) <= 8]
    return shape, ids or [Outer(Root(0, shape[0]), shape[0])]


@settings(max_examples=300, **SETTINGS)
@given(merged_cases())
def test_local_shape_of_merged_ids_equals_oracle(case):
    """Any IterDomains (merges of splits of several dims included, enumerated on coarse cells:
    ``sharding._cells``): a sharding is accepted, with that local shape, iff every device
    holds a rectangular block of one shape (the oracle, every index point in plain Python);
    the enumeration gives it too where a shortcut (``_block_local_shape``, ``_digit_local_shape``)
    answered first (they answer only valid shardings: what is rejected, the enumeration rejects)."""
    ts = _accepted_iff_oracle(*case)
    assert ts is None or ts._enumerated_local_shape() == ts.local_shape


def test_local_shape_of_a_large_merged_sharding_reads_cells():
    """A ``[4, 4194304]`` gradient sharded through a merge of its dims (planning Llama-2-7B at
    dp 2 x tp 4 builds it): dim 1 is read only through ``i1 // 2097152``, so two cells of it
    are enumerated, not 4M indices.  Device (c0, c1) holds row 2 c0 (c1 < 2) or 2 c0 + 1 and
    the half ``c1 % 2`` of it; with the merge's value halved instead, whole rows."""
    from reshard.ir.sharding import _cells

    x0, x1 = Root(0, 4), Root(1, 4194304)
    axes = (Outer(x0, 2), Inner(Merge(x0, Outer(x1, 2)), 2))
    assert _cells(list(enumerate(axes)), {0: 4, 1: 4194304}) == {0: 1, 1: 2097152}
    assert TensorSharding(DeviceMesh([[0, 1, 2, 3], [4, 5, 6, 7]]), (4, 4194304), axes).local_shape == (1, 2097152)
    halved = (Outer(x0, 2), Outer(Inner(Merge(x0, Outer(x1, 2)), 2), 2))
    assert TensorSharding(DeviceMesh([[0, 1], [2, 3]]), (4, 4194304), halved).local_shape == (1, 4194304)


def test_block_shortcut_leaves_other_shardings_to_enumeration():
    mesh = DeviceMesh([[0, 1], [2, 3]])
    inner_first = TensorSharding(mesh, (8,), (Outer(Inner(Root(0, 8), 2), 2), Outer(Root(0, 8), 2)))
    assert inner_first._block_local_shape() is None and inner_first.local_shape == (2,)
    with pytest.raises(ReshardError, match="holds"):
        TensorSharding(mesh, (8,), (Outer(Root(0, 8), 2), Outer(Root(0, 8), 2)))


def test_placements_round_trip_and_short_names():
    """``ts.placements`` is the placement list ``from_placements`` builds ``ts`` from (every
    combination of R / P / S / FS on a 2x2 mesh, dims sharded twice included), and
    ``str(ts)`` names them (``FS(d,groups)`` for a ``FusedShard``)."""
    from reshard.ir.fused_shard import FusedShard
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2), ("dp", "tp"))
    short = {Replicate(): "R", Partial(): "P(sum)", Shard(0): "S(0)", Shard(1): "S(1)",
             FusedShard(1, 3): "FS(1,3)", FusedShard(0, 2): "FS(0,2)"}
    for pl in itertools.product(short, repeat=2):
        ts = TensorSharding.from_placements((8, 12), list(pl), mesh)
        assert ts.placements == tuple(pl)
        assert TensorSharding.from_placements((8, 12), list(ts.placements), mesh) == ts
        assert str(ts) == "[" + ", ".join(short[p] for p in pl) + "]"


def test_placements_none_for_other_layouts():
    """A cyclic sharding is no placement list: ``placements`` is None and ``str`` shows the ID."""
    mesh = DeviceMesh(torch.arange(2), ("tp",))
    cyclic = TensorSharding(mesh, (8,), (Inner(Root(0, 8), 4),))
    assert cyclic.placements is None
    assert str(cyclic) == "[inner(i0[8],4)]"


def test_placements_of_a_dim_bound_whole():
    """A dim of extent n bound whole to an axis of size n (the e-graph's form of ``Shard`` there,
    ``i0`` for ``outer(i0, 2)``) reads as ``S(0)``, and that placement gives every device the
    same elements."""
    mesh = DeviceMesh(torch.arange(2), ("tp",))
    whole = TensorSharding(mesh, (2, 3), (Root(0, 2),))
    assert whole.placements == (Shard(0),) and str(whole) == "[S(0)]"
    x = torch.randn(2, 3)
    again = TensorSharding.from_placements((2, 3), list(whole.placements), mesh)
    assert all(torch.equal(a, b) for a, b in zip(shard(x, whole).values(), shard(x, again).values()))
