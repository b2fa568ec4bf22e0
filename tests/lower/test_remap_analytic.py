"""Analytic strided forms of block remaps (``remap_analytic.analytic_form``) and the block
fast path of ``TensorSharding.local_indices``: both exact against the index / mask paths
on random block shardings; remaps outside the analytic domain keep the index path's result."""

from __future__ import annotations

import random

import pytest
import torch

from reshard import DeviceMesh, Partial, Replicate, Shard, TensorSharding
from reshard.ir.errors import ReshardError
from reshard.ir.ids import Inner, Outer, Root
from reshard.codegen import remap_form as RF
from reshard.codegen.remap_index import remap_index
from reshard.codegen.remap_analytic import analytic_form

M2 = DeviceMesh([0, 1], ("x",))
M4 = DeviceMesh([0, 1, 2, 3], ("x",))
M2x2 = DeviceMesh([[0, 1], [2, 3]], ("x", "y"))
MODES = ("slice", "gather", "scatter", "a2a_send", "a2a_recv")


def _random_shape(rng: random.Random) -> tuple[int, ...]:
    return tuple(rng.choice([4, 6, 8]) for _ in range(rng.randint(2, 4)))


def _random_block(rng: random.Random, shape: tuple[int, ...], mesh: DeviceMesh) -> list:
    """DTensor placements; Shard dims may repeat across mesh axes (nested blocks)."""
    out = []
    for _ in range(mesh.ndim):
        u = rng.random()
        out.append(Replicate() if u < 0.25 else Partial() if u < 0.35 else Shard(rng.randrange(len(shape))))
    return out


def _pair(rng: random.Random, mode: str, shape: tuple[int, ...], mesh: DeviceMesh, axis: int) -> tuple[list, list]:
    """A (src, dst) placement pair shaped like what the lowering emits for ``mode`` along
    ``axis`` (other axes equal), or a fully random pair one time in four."""
    a = _random_block(rng, shape, mesh)
    if rng.random() < 0.25:
        return a, _random_block(rng, shape, mesh)
    b = list(a)
    sd = lambda: Shard(rng.randrange(len(shape)))  # noqa: E731
    if mode == "gather":
        a[axis], b[axis] = sd(), Replicate()
    elif mode in ("slice", "scatter"):
        a[axis], b[axis] = (Replicate() if mode == "slice" else rng.choice([Replicate(), Partial()])), sd()
    else:
        a[axis], b[axis] = sd(), sd()
    return a, b


def _old_form(key: tuple):
    """remap_form before the analytic path: strided_form of the index, or the index's error."""
    try:
        return RF.strided_form(remap_index(*key))
    except ReshardError as e:
        return e


def test_local_indices_block_fast_path_equals_the_mask_path():
    rng = random.Random(11)
    checked = 0
    for _ in range(60):
        mesh = rng.choice([M2, M4, M2x2])
        shape = _random_shape(rng)
        try:
            ts = TensorSharding.from_placements(shape, _random_block(rng, shape, mesh), mesh)
        except ReshardError:  # a dim not divisible by its axes
            continue
        assert ts.block_ranges(mesh.coords(mesh.ranks[0])) is not None
        for r in mesh.ranks:
            c = mesh.coords(r)
            fast, slow = ts.local_indices(c), ts._mask_local_indices(c)
            assert fast.dtype == slow.dtype and fast.shape == slow.shape and torch.equal(fast, slow), (str(ts), c)
            checked += 1
    assert checked >= 100


def test_block_ranges_reject_non_block_shardings():
    shape = (8, 12)
    cyclic = TensorSharding(M2, shape, (Inner(Root(0, 8), 4),))
    inner_block = TensorSharding(M2, shape, (Outer(Inner(Root(1, 12), 3), 2),))
    for ts in (cyclic, inner_block):
        assert ts.block_ranges((0,)) is None
        for r in M2.ranks:  # still the mask path's answer
            assert torch.equal(ts.local_indices(M2.coords(r)), ts._mask_local_indices(M2.coords(r)))


@pytest.mark.slow
def test_analytic_forms_equal_the_index_path_on_random_block_remaps():
    """For every mode, on random block shardings, axes and coords: whenever the analytic
    form exists its index equals ``remap_index`` element by element (and the index path did
    not fail); ``remap_form`` returns the analytic form or exactly the old result."""
    rng = random.Random(7)
    hits = {m: 0 for m in MODES}
    keys = 0
    for trial in range(220):
        mesh = rng.choice([M2, M4, M2x2])
        shape = _random_shape(rng)
        mode = MODES[trial % len(MODES)]
        axis = rng.randrange(mesh.ndim)
        pa, pb = _pair(rng, mode, shape, mesh, axis)
        try:
            src = TensorSharding.from_placements(shape, pa, mesh)
            dst = TensorSharding.from_placements(shape, pb, mesh)
        except ReshardError:
            continue
        s, d = src, dst
        for r in mesh.ranks:
            key = (mode, s, d, axis, mesh.coords(r))
            sm = analytic_form(*key)
            old = _old_form(key)
            RF.remap_form.cache_clear()
            try:
                new = RF.remap_form(*key)
            except ReshardError as e:
                new = e
            keys += 1
            if sm is None:
                if isinstance(old, ReshardError):
                    assert isinstance(new, ReshardError) and str(new) == str(old), key
                else:
                    assert new == old, key
                continue
            hits[mode] += 1
            assert not isinstance(old, ReshardError), (key, old)
            assert all(st >= 0 for st in sm.strides) and sm.offset >= 0
            assert torch.equal(sm.index(), remap_index(*key)), (mode, str(src), str(dst), axis, key[-1])
            assert new == sm
            # the view / copy choice is the old one: a plain range stays a view
            assert old is not None and sm.is_range == old.is_range, (key, sm, old)
    assert keys >= 600
    assert all(h >= 20 for h in hits.values()), hits


def test_remap_form_outside_the_domain_is_unchanged():
    """Non-block shardings and ``pieces`` remaps: no analytic form; ``remap_form`` is the
    index path's form (or its error)."""
    shape = (8, 12)
    block = TensorSharding.from_placements(shape, [Shard(0)], M2)
    cyclic = TensorSharding(M2, shape, (Inner(Root(0, 8), 4),))
    rep = TensorSharding.from_placements(shape, [Replicate()], M2)
    b, c, r_ = (block, cyclic, rep)
    for mode, src, dst in (("gather", c, r_), ("slice", r_, c), ("scatter", r_, c),
                           ("a2a_send", b, c), ("a2a_recv", c, b)):
        for rank in M2.ranks:
            key = (mode, src, dst, 0, M2.coords(rank))
            assert analytic_form(*key) is None
            RF.remap_form.cache_clear()
            old = _old_form(key)
            if isinstance(old, ReshardError):
                with pytest.raises(ReshardError):
                    RF.remap_form(*key)
            else:
                assert RF.remap_form(*key) == old
    one, two = DeviceMesh([0], ("x",)), DeviceMesh([1, 2], ("x",))
    src = TensorSharding.from_placements(shape, [Replicate()], one)
    dst = TensorSharding.from_placements(shape, [Shard(1)], two)
    key = ("pieces", src, dst, -1, (0,))
    assert analytic_form(*key) is None and RF.remap_form(*key) is None


def test_remaps_the_index_path_rejects_get_no_analytic_form():
    """A slice to elements the source does not hold, and an all-to-all with uneven chunks,
    raise on the index path; the analytic path must not answer them."""
    shape = (8, 12)
    s0 = TensorSharding.from_placements(shape, [Shard(0)], M2)
    s1 = TensorSharding.from_placements(shape, [Shard(1)], M2)
    key = ("slice", s0, s1, 0, (0,))
    assert isinstance(_old_form(key), ReshardError) and analytic_form(*key) is None
    a = TensorSharding.from_placements(shape, [Shard(0), Shard(1)], M2x2)
    b = TensorSharding.from_placements(shape, [Shard(1), Shard(1)], M2x2)
    key = ("a2a_send", a, b, 0, (0, 0))  # chunks of 4x3 and of no elements
    assert isinstance(_old_form(key), ReshardError) and analytic_form(*key) is None


def test_transformer_scale_forms_need_no_global_work():
    """At seq = hidden = 4096 the block remaps (gather of S(0) activations, a2a S(0) -> S(1)
    of a (4096, 16384) tensor) come out in well under a second, with the index path's form
    checked on a shrunken copy of the same remap."""
    import time

    big, small = (4096, 16384), (16, 64)
    out = {}
    for shape in (big, small):
        s0 = TensorSharding.from_placements(shape, [Shard(0)], M2)
        s1 = TensorSharding.from_placements(shape, [Shard(1)], M2)
        rep = TensorSharding.from_placements(shape, [Replicate()], M2)
        keys = [(m, a, b, 0, (r,)) for r in (0, 1)
                for m, a, b in (("gather", s0, rep), ("a2a_send", s0, s1), ("a2a_recv", s0, s1), ("scatter", rep, s1))]
        RF.remap_form.cache_clear()
        t0 = time.perf_counter()
        out[shape] = [RF.remap_form(*k) for k in keys]
        if shape == big:
            assert time.perf_counter() - t0 < 1.0
        else:
            for k, sm in zip(keys, out[shape]):
                assert torch.equal(sm.index(), remap_index(*k))
    assert all(sm is not None for sm in out[big])
    assert [sm.is_range for sm in out[big]] == [sm.is_range for sm in out[small]]


def test_a_whole_dim_bound_to_an_axis_of_its_size_is_a_block():
    """``Root(d, n)`` bound by an axis of size n (each device holds one index of dim d; the
    e-graph's form of a batch of 2 sharded over dp 2) is the block ``Outer(Root(d, n), n)``:
    the block fast paths take it (a real-size reduce-scatter's send layout built the index
    over 2 x 4096 x 4096 elements before), exact against the index and mask paths."""
    mesh = DeviceMesh([[0, 1, 2, 3], [4, 5, 6, 7]], ("dp", "tp"))
    forms = [(Root(0, 2), Partial()), (Root(0, 2), Replicate()), (Root(0, 2), Outer(Root(1, 8), 4)),
             (Replicate(), Outer(Root(1, 8), 4)), (Root(0, 2), Outer(Root(2, 4), 4))]
    checked = 0
    for src in forms:
        s = TensorSharding(mesh, (2, 8, 4), src)
        assert s.block_ranges((1, 0)) is not None
        for dst in forms:
            d = TensorSharding(mesh, (2, 8, 4), dst)
            for coords in [(0, 0), (1, 3)]:
                assert torch.equal(s.local_indices(coords), s._mask_local_indices(coords))
                for mode in MODES:
                    for axis in (0, 1):
                        try:
                            want = remap_index(mode, s, d, axis, coords)
                        except ReshardError:
                            continue
                        form = analytic_form(mode, s, d, axis, coords)
                        if form is not None:
                            assert torch.equal(form.index(), want), (mode, src, dst, axis, coords)
                            checked += 1
    assert checked > 100
