"""remap_fast: strided views / copies (and device-cached gathers) compute exactly what the
general index gather ``_take(x, remap_index(...), shape)`` computes, on block shardings
(all of which must take the strided path) and random loop-domain shardings."""

from __future__ import annotations

import math
import random

import pytest
import torch

from reshard import DeviceMesh, Replicate, Shard, TensorSharding
from reshard.ir.errors import ReshardError
from reshard.codegen import remap_form as RF
from reshard.runtime import remap_fast
from reshard.codegen.remap_index import _take, remap_index

from reshard.testing.fuzz_programs import id_candidates

M2 = DeviceMesh([0, 1], ("x",))
M4 = DeviceMesh([0, 1, 2, 3], ("x",))
M2x2 = DeviceMesh([[0, 1], [2, 3]], ("x", "y"))


def test_strided_form_recovers_affine_indices():
    x = torch.arange(4 * 6 * 5).view(4, 6, 5)
    for view in (x, x[1:3], x.transpose(0, 1), x[:, ::2, 1:4], x[..., 2:3].expand(4, 6, 3), x.permute(2, 0, 1)):
        pos = view.reshape(-1).clone()
        sm = RF.strided_form(pos)
        assert sm is not None, view.stride()
        assert torch.equal(sm.index(), pos)
    assert RF.strided_form(torch.arange(7, 19)).is_range
    assert not RF.strided_form(x.transpose(0, 1).reshape(-1)).is_range
    assert RF.strided_form(torch.tensor([], dtype=torch.long)).numel == 0


def test_strided_form_rejects_non_affine_indices():
    assert RF.strided_form(torch.tensor([3, 2, 1, 0])) is None  # negative step
    assert RF.strided_form(torch.tensor([0, 1, 2, 4, 5, 7])) is None
    g = torch.Generator().manual_seed(0)
    assert RF.strided_form(torch.randperm(64, generator=g)) is None
    pieces = torch.cat([torch.arange(4), torch.arange(4), torch.arange(4, 8)])  # "pieces": dummy first piece
    assert RF.strided_form(pieces) is None


def _input_numel(mode: str, src: TensorSharding, dst: TensorSharding, axis: int) -> int:
    n_src, n_dst = math.prod(src.local_shape), math.prod(dst.local_shape)
    if mode == "gather":
        return n_src * src.mesh.shape[axis]
    return n_dst if mode == "a2a_recv" else n_src


def _check_remap(mode: str, src: TensorSharding, dst: TensorSharding, axis: int, seed: int) -> bool:
    """Fast path == general gather on every device of the mesh; returns whether every
    device's index was affine (the strided path)."""
    s, d = src, dst
    shape = tuple(dst.local_shape) if mode in ("slice", "gather", "a2a_recv") else (-1,)
    g = torch.Generator().manual_seed(seed)
    strided = True
    for r in src.mesh.ranks:
        coords = src.mesh.coords(r)
        key = (mode, s, d, axis, coords)
        try:
            pos = remap_index(*key)
        except ReshardError:  # e.g. an all-to-all with uneven chunks: never lowered
            return True
        x = torch.randn(_input_numel(mode, src, dst, axis), generator=g)
        got, ref = remap_fast.remap_take(x, key, shape), _take(x, pos, shape)
        assert got.shape == ref.shape and torch.equal(got, ref), (mode, str(src), str(dst), coords)
        strided &= RF.remap_form(*key) is not None
    return strided


def _with_axis(ts: TensorSharding, axis: int, p) -> TensorSharding:
    axes = list(ts.axes)
    axes[axis] = p
    return TensorSharding(ts.mesh, ts.shape, tuple(axes))


BLOCK_CASES = [
    ((8, 12), M2, [Replicate()], [Shard(1)]),
    ((8, 12), M2, [Shard(0)], [Shard(1)]),
    ((4, 6, 8), M4, [Shard(2)], [Shard(0)]),
    ((4, 6, 8), M2x2, [Shard(0), Shard(2)], [Shard(2), Shard(0)]),
    ((4, 6, 8), M2x2, [Shard(1), Replicate()], [Shard(1), Shard(2)]),
    ((8, 4), M2x2, [Shard(0), Shard(0)], [Replicate(), Shard(0)]),
]


@pytest.mark.parametrize("shape,mesh,a,b", BLOCK_CASES)
def test_block_remaps_take_the_strided_path(shape, mesh, a, b):
    """Between block (DTensor) shardings, every remap the lowering emits is affine."""
    sa = TensorSharding.from_placements(shape, a, mesh)
    sb = TensorSharding.from_placements(shape, b, mesh)
    checked = 0
    for axis in range(mesh.ndim):
        if sa.axes[:axis] + sa.axes[axis + 1:] != sb.axes[:axis] + sb.axes[axis + 1:]:
            continue
        pa, pb = sa.axes[axis], sb.axes[axis]
        if isinstance(pa, Replicate) and not isinstance(pb, Replicate):
            modes = ["slice", "scatter"]
        elif isinstance(pb, Replicate) and not isinstance(pa, Replicate):
            modes = ["gather"]
        elif pa != pb:
            modes = ["a2a_send", "a2a_recv"]
        else:
            continue
        for mode in modes:
            assert _check_remap(mode, sa, sb, axis, seed=checked), (mode, str(sa), str(sb))
            checked += 1
    if sa.axes != sb.axes and len([a for a in range(mesh.ndim) if sa.axes[a] != sb.axes[a]]) == 1:
        assert checked


def test_random_loop_domain_remaps_match_the_gather():
    """Random shardings from the fuzzer's IterDomain candidates (block and cyclic splits,
    inner factors, merges): the fast path equals the general gather for every mode."""
    rng = random.Random(5)
    shapes = [(8, 12), (4, 6, 8), (12, 4), (2, 8, 6)]
    done = strided = 0
    for trial in range(120):
        shape = rng.choice(shapes)
        mesh = rng.choice([M2, M4, M2x2])
        base = TensorSharding.from_placements(shape, [Replicate()] * mesh.ndim, mesh)
        axis = rng.randrange(mesh.ndim)
        n = mesh.shape[axis]
        cands = id_candidates(shape, n)
        if not cands:
            continue
        try:
            other = base
            for a in range(mesh.ndim):  # maybe bind the other axes too
                if a != axis and rng.random() < 0.5:
                    c = id_candidates(shape, mesh.shape[a])
                    if c:
                        other = _with_axis(other, a, rng.choice(c))
            s1 = _with_axis(other, axis, rng.choice(cands))
            s2 = _with_axis(other, axis, rng.choice(cands))
            r = _with_axis(other, axis, Replicate())
        except ReshardError:  # overlapping / uneven picks
            continue
        for mode, src, dst in (("slice", r, s1), ("scatter", r, s1), ("gather", s1, r),
                               ("a2a_send", s1, s2), ("a2a_recv", s1, s2)):
            if mode.startswith("a2a") and s1 == s2:
                continue
            strided += _check_remap(mode, src, dst, axis, seed=trial)
            done += 1
    assert done >= 200
    assert strided >= done * 9 // 10  # nearly all loop-domain remaps are affine too


def test_pieces_mode_falls_back_to_the_gather():
    """A cross-mesh scatter's pieces (a dummy first piece) are not affine: the gather runs,
    with its index built once per device."""
    a = DeviceMesh([0], ("x",))
    b = DeviceMesh([1, 2], ("x",))
    src = TensorSharding.from_placements((4, 6), [Replicate()], a)
    dst = TensorSharding.from_placements((4, 6), [Shard(1)], b)
    key = ("pieces", src, dst, -1, (0,))
    x = torch.randn(24)
    assert RF.remap_form(*key) is None
    assert torch.equal(remap_fast.remap_take(x, key, (-1,)), _take(x, remap_index(*key), (-1,)))
    assert remap_fast.device_index(key, x.device) is remap_fast.device_index(key, x.device)


def test_run_local_remap_steps_use_the_fast_path_per_rank():
    """``run_local`` on remap steps (through ``remap_step``, which remembers each step's
    resolution per rank) equals the general gather on every rank, call after call."""
    from reshard.codegen.program import Step
    from reshard.runtime.local_ops import run_local

    src = TensorSharding.from_placements((4, 6, 8), [Shard(2), Shard(0)], M2x2)
    dst = TensorSharding.from_placements((4, 6, 8), [Replicate(), Shard(0)], M2x2)
    s, d = src, dst
    step = Step.make("local", "y", ["x"], op="remap", mode="gather", src=s, dst=d, axis=0)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        for r in M2x2.ranks:
            x = torch.randn(2 * math.prod(src.local_shape), generator=g)
            pos = remap_index("gather", s, d, 0, M2x2.coords(r))
            assert torch.equal(run_local(step, {"x": x}, r), _take(x, pos, tuple(dst.local_shape)))
    assert all(remap_fast._STEPS[(id(step), r)][0] is step for r in M2x2.ranks)
