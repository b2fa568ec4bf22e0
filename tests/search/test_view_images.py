"""View images (``encode.view_image``): on a mesh of several axes, the result of a free reshape
whose every simple placement is the image of one of its operand's (same layout class) gets no
resharding of its own (no ``made`` fact); its dists are the images of the operand's, and a step
it would have taken is the operand's same step carried through the view at cost 0 (law in
``rules.resharding``'s docstring).  Checked: the criterion, no step at an image, plans no
costlier than with the images' own steps (and equal to them here) that simulate to the
reference, and a segment fed the operand making the image."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.fusion import Fusion
from reshard.plan import Saturated
from reshard.rules.collectives import TEAM_CTORS
from reshard.search import encode
from reshard.search.snapshot import real_classes

MESH2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
LOCAL_STEPS = ("LocalSlice", "MakePartial")


def _reshape(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[Fusion, object]:
    f = Fusion()
    x = f.input("x", src, "float32", MESH2x2, [rs.Replicate(), rs.Replicate()])
    y = f.reshape(x, dst)
    f.output(y, [rs.Replicate(), rs.Replicate()])
    return f, f.ops[-1]


@pytest.mark.parametrize("src,dst,image", [
    ((4, 8, 16), (4, 8, 4, 4), False),   # a head split: S(hd) of the result splits an inner part
    ((4, 8, 4, 4), (4, 8, 16), True),    # heads merged back: every block split leads its group
    ((1, 8, 16), (8, 16), False),        # dim 1 becomes dim 0: a step at the result is cheaper
    ((8, 16), (8, 16, 1), True),         # a unit dim added
    ((2, 8), (16,), True),               # merged: S(0) of [16] is S(0) of [2, 8] (2 | 2)
    ((8, 2), (16,), True),
    ((1, 8), (8,), False),
])
def test_view_image_criterion(src, dst, image):
    f, op = _reshape(src, dst)
    assert (encode.view_image(f, op, MESH2x2) is not None) == image
    # on one mesh axis nothing is pruned
    assert encode.view_images(f, rs.DeviceMesh([0, 1, 2, 3], ("x",)), {}, {}) == ({}, {})
    # the other way round: a split's operand's placements are all images of the result's
    assert (encode.view_preimage(f, op, MESH2x2) is not None) == ((src, dst) in PREIMAGES)


PREIMAGES = [((4, 8, 16), (4, 8, 4, 4)), ((8, 16), (8, 16, 1)), ((1, 8, 16), (8, 16)), ((1, 8), (8,))]


def _program(target: list) -> Fusion:
    """x [8, 4, 4] at [S(0), S(1)] -> exp -> reshape [8, 16] (a view image) -> exp -> out at target."""
    f = Fusion()
    x = f.input("x", (8, 4, 4), "float32", MESH2x2, [rs.Shard(0), rs.Shard(1)])
    h = f.reshape(f.exp(x), (8, 16))
    f.output(f.exp(h), target)
    return f


TARGETS = [[rs.Replicate(), rs.Replicate()], [rs.Shard(1), rs.Shard(0)], [rs.Replicate(), rs.Shard(1)],
           [rs.Shard(0), rs.Replicate()], [rs.Partial("sum"), rs.Shard(1)]]


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_view_image_loses_no_plan(target, monkeypatch):
    f = _program(target)
    enc = encode.encode(f, rs.CostProfile())
    image = f.ops[2].output
    assert enc.images == {image: f.ops[1].output}
    _no_steps_at(f, image)
    _loses_nothing(f, monkeypatch)


def _no_steps_at(f: Fusion, image: int) -> None:
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    classes = real_classes(sat.snapshot)
    snap, ids, t = sat.snapshot, sat.snapshot.id_terms(), f.tensors[image]
    simple = {str(ts) for ts in encode.unnested_shardings(t.shape, MESH2x2)}
    targets = [str(snap.sharding(classes[row.output][1], MESH2x2, t.shape, ids))
               for c in (*TEAM_CTORS, *LOCAL_STEPS) for row in snap.rows(c) if classes[row.output][0] == image]
    # none to a simple dist: only to a dim split along both axes (``nesting``'s, where an op reads the
    # dim as a merge: the split's operand), which the value may still take
    assert not simple & set(targets), targets


def _loses_nothing(f: Fusion, monkeypatch) -> None:
    """The plan simulates to the reference and costs no more than with every value's own steps."""
    plan = rs.optimize(f, cache=False)
    g = torch.Generator().manual_seed(0)
    inputs = {"x": torch.randn(*f.tensors[f.inputs[0]].shape, generator=g)}
    (y,) = plan.simulate(inputs)
    torch.testing.assert_close(y, rs.run_reference(f, inputs)[0], rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(encode, "view_images", lambda *a: ({}, {}))
    full = rs.optimize(f, cache=False)
    assert plan.cost <= full.cost


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("src,dst,at", [((8, 16), (8, 4, 4), [rs.Shard(0), rs.Shard(1)]),
                                        ((1, 8, 16), (8, 16), [rs.Shard(1), rs.Shard(2)])])
def test_a_views_operand_loses_no_plan(src, dst, at, target, monkeypatch):
    """x at ``at`` -> exp (u: its only reader is the view) -> reshape (a split, or a leading unit
    dim dropped: u's dim 1 is the result's dim 0, whose steps cost less) -> exp -> out at the
    target: u takes no step, the view's result takes them."""
    f = Fusion()
    x = f.input("x", src, "float32", MESH2x2, at)
    f.output(f.exp(f.reshape(f.exp(x), dst)), target)
    u = f.ops[1].output
    images, pre = encode.view_images(f, MESH2x2, {}, {})
    assert images == {} and pre == {u: f.ops[2].output}
    _no_steps_at(f, u)
    _loses_nothing(f, monkeypatch)


def test_a_segment_fed_the_operand_makes_the_image():
    """Segments of one op each: the reshape's operand is fed from an earlier segment (no steps of
    it there), so the image is made in the reshape's segment and reshards there; the plan equals
    the unsegmented one's cost."""
    f = _program([rs.Shard(1), rs.Shard(0)])
    whole = rs.optimize(f, cache=False)
    cut = rs.optimize(f, cache=False, limits=rs.Limits(segment_ops=1))
    assert cut.report.segments > 1
    assert cut.cost == pytest.approx(whole.cost)
    g = torch.Generator().manual_seed(1)
    inputs = {"x": torch.randn(8, 4, 4, generator=g)}
    (y,) = cut.simulate(inputs)
    torch.testing.assert_close(y, rs.run_reference(f, inputs)[0], rtol=1e-5, atol=1e-6)
