"""Segmented saturation (``reshard.search.segments``): the seam law.

A program cut into segments must give the same plans as one e-graph: the optimized plan at
the same cost, every random extraction of the merged snapshot correct against the
reference (a wrongly merged seam would pair a value with the wrong distribution and fail
there), and the report saying how it was cut.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.rules.cost_profile import CostProfile
from reshard.search.segments import MergedSnapshot, _deferred, _saved, cut
from reshard.examples import transformer_stack
from reshard.plan import Saturated
from reshard.testing import fuzz_programs as FP
from reshard.testing import programs as P
from tests.fuzz.test_fuzz import _HEALTH, _unplannable, check_plan, must_be_plannable

PROGRAMS = [P.mlp, P.attention, P.reductions, P.layout_ops, P.open_inputs, P.mesh2d_block, P.transformer_like,
            lambda: transformer_stack(2)]


@pytest.mark.parametrize("build", [*P.ALL, lambda: transformer_stack(3)], ids=lambda b: b.__name__)
@pytest.mark.parametrize("size", [1, 4])
def test_cut_keeps_operands_in_earlier_segments(build, size):
    f = build()
    segs = cut(f, size)
    assert sorted(k for s in segs for k in s) == [op.index for op in f.ops]
    where = {k: s for s, ks in enumerate(segs) for k in ks}
    used = {f.producer[t] for op in f.ops for t in op.inputs}
    for op in f.ops:
        uses = [where[o.index] for o in f.ops if op.output in o.inputs]
        if _deferred(op, used):  # inputs, and transposes a matmul may read as views
            assert where[op.index] == (min(uses) if uses else 0)  # with their first consumer
        for t in op.inputs:
            assert where[f.producer[t]] <= where[op.index]
    for op in f.ops:
        if _saved(op):  # with its operand
            assert where[op.index] == where[f.producer[op.inputs[0]]]
    assert all(sum(not _deferred(f.ops[k], used) and not _saved(f.ops[k]) for k in s) <= size for s in segs)


@pytest.mark.parametrize("build", PROGRAMS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("size", [1, 2])
def test_segmented_plan_equals_one_egraph_and_is_correct(build, size):
    f = build()
    whole = rs.optimize(f)
    seg = rs.optimize(f, limits=rs.Limits(segment_ops=size))
    assert whole.report.segments == 1 and seg.report.segments == len(cut(f, size))
    if size == 1:  # every program here has several compute ops
        assert seg.report.segments > 1 and "segments" in str(seg.report)
    assert seg.cost == pytest.approx(whole.cost, rel=1e-12)
    assert seg.comm_bytes == whole.comm_bytes
    check_plan(seg, f, 0, "segmented plan")


@pytest.mark.parametrize("build", PROGRAMS, ids=lambda b: b.__name__)
def test_random_extractions_of_the_merged_snapshot_are_correct(build):
    f = build()
    sat = Saturated.build(f, CostProfile(), rs.Limits(segment_ops=1))
    assert isinstance(sat.snapshot, MergedSnapshot)
    rng = random.Random(7)
    for i in range(3):
        check_plan(sat.plan(perturb=rng), f, i, f"random plan {i}")


def test_seam_classes_are_merged_not_duplicated():
    """A seam value's fed classes are its producer's classes: the merged snapshot names each
    (value, sharding) once and keeps no consumer copy of a producer's resharding step."""
    f = transformer_stack(2)
    sat = Saturated.build(f, CostProfile(), rs.Limits(segment_ops=4))
    snap = sat.snapshot
    from reshard.extract.dag import collect_enodes
    from reshard.search.snapshot import real_classes
    names = real_classes(snap)  # raises if a class had two names
    ids = snap.id_terms()
    seen: dict[tuple, object] = {}
    for cls, (tid, dcls) in names.items():
        t = f.tensors[tid]
        key = (tid, snap.sharding(dcls, t.mesh, t.shape, ids))
        assert seen.setdefault(key, cls) == cls, f"value {tid} at {key[1]} has two classes"
    nodes = collect_enodes(snap)
    steps = [(n.ctor, n.cls, n.children, tuple(snap.i64(a) for a in n.args[1:2])) for n in nodes
             if n.ctor in ("AllGather", "AllReduce")]
    assert len(steps) == len(set(steps)), "a resharding step appears twice"


@pytest.mark.parametrize("build", [lambda: transformer_stack(2), P.mesh2d_block], ids=["stack", "mesh2d"])
def test_costed_rows_are_the_merged_rows_joined_with_the_merged_costs(build):
    """``MergedSnapshot.costed``'s law: each constructor's rows as ``rows(ctor)`` merges them, in
    that order, each with the cost its ``cost_<ctor>`` row gives once the cost tables are
    merged too (costs joined per segment, the cost tables never merged); the same when read
    again (a second extraction of the snapshot)."""
    from reshard.rules.schema import T_CONSTRUCTORS
    f = build()
    sat = Saturated.build(f, CostProfile(), rs.Limits(segment_ops=1))
    snap = sat.snapshot
    assert isinstance(snap, MergedSnapshot) and len(snap.segs) > 1
    costed = {ctor: list(snap.costed(ctor)) for ctor in T_CONSTRUCTORS}
    assert costed == {ctor: list(snap.costed(ctor)) for ctor in T_CONSTRUCTORS}
    priced = 0
    for ctor in T_CONSTRUCTORS:
        costs = {r.inputs: snap.i64(r.output) for r in snap.rows(f"cost_{ctor}")}
        joined = [(r.inputs, r.output, costs.get(r.inputs)) for r in snap.rows(ctor)]
        assert costed[ctor] == joined, ctor
        priced += sum(c is not None for *_, c in joined)
    assert priced > 0


@pytest.mark.parametrize("build", [lambda: transformer_stack(2), P.mesh2d_block], ids=["stack", "mesh2d"])
def test_a_consumer_builds_no_step_between_fed_dists(build):
    """A value fed complete is not made in its consumer segment (``made``): its fed dists are
    no candidates there, so no resharding step lands in a fed class (its producer holds them);
    the plan is the one of a single e-graph."""
    f = build()
    sat = Saturated.build(f, CostProfile(), rs.Limits(segment_ops=1))
    assert isinstance(sat.snapshot, MergedSnapshot) and len(sat.snapshot.segs) > 1
    steps = ("AllGather", "LocalSlice", "AllReduce", "ReduceScatter", "AllToAll", "MakePartial")
    fed_seen = 0
    for snap in sat.snapshot.segs:
        fed = {row.output for row in snap.rows("Seam")}
        fed_seen += len(fed)
        assert not [ctor for ctor in steps for row in snap.rows(ctor) if row.output in fed]
    assert fed_seen > 0
    assert sat.plan().cost == pytest.approx(rs.optimize(f).cost, rel=1e-12)


def test_time_limit_in_a_later_segment_still_gives_a_correct_plan():
    f = transformer_stack(2)
    plan = rs.optimize(f, limits=rs.Limits(segment_ops=8, time_limit_s=0.05))
    assert plan.report.limit_hit is not None and plan.report.segments > 1
    check_plan(plan, f, 0, "time-limited segmented plan")


def test_segment_ops_is_validated():
    with pytest.raises(rs.ReshardError, match="segment_ops"):
        rs.Limits(segment_ops=0)
    with pytest.raises(rs.ReshardError, match="segment_ops"):
        rs.Limits(segment_ops=2.5)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("RESHARD_SEGMENT_FUZZ_EXAMPLES", "12")), deadline=None, derandomize=True,
          database=None, suppress_health_check=_HEALTH)
@given(f=FP.fusions(), size=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_fuzz_segmented_plans_match_reference(f, size, seed):
    note(FP.fusion_source(f))
    try:
        sat = Saturated.build(f, CostProfile(), rs.Limits(segment_ops=size))
        plans = [sat.plan(), sat.plan(perturb=random.Random(seed))]
    except rs.ReshardError as e:
        if not _unplannable(e) or must_be_plannable(f):
            raise
        return
    for i, plan in enumerate(plans):
        check_plan(plan, f, seed + i, "segmented plan")


def test_progress_names_the_segment(capsys):
    from reshard.cli import _Progress
    f = transformer_stack(2)
    plan = rs.optimize(f, limits=rs.Limits(segment_ops=20), progress=_Progress(every=1), cache=False)
    err = capsys.readouterr().err
    n = plan.report.segments
    assert n > 1 and f"segment 1/{n}," in err and f"segment {n}/{n}," in err
    # then one line when saturation ends, with the whole e-graph's size, and extraction starts
    lines = err.strip().splitlines()
    done = next(i for i, ln in enumerate(lines) if ln.startswith("  saturation done: "))
    assert f"{plan.report.enodes} e-nodes" in lines[done] and "extracting the plan" in lines[done]
    assert plan.report.phase == "saturation" and plan.report.step == ""
    # then each step of extraction as it starts, the last one lowering
    assert all(ln.startswith("  extraction: ") and ln.endswith(" s elapsed)") for ln in lines[done + 1:])
    steps = [ln.removeprefix("  extraction: ").rsplit(" (", 1)[0] for ln in lines[done + 1:]]
    assert steps[0] == "greedy" and steps[-2:] == ["adopting alternatives", "lowering"]
    assert all(s.startswith("sharing search ") for s in steps[1:-2]) and len(steps) > 3
    assert "re-extractions" in steps[1]


def pinned_chain(n: int, seed: int) -> rs.Fusion:
    """``n`` pinned redistributes of one (8, 8) value on a 2x2 mesh, each to random
    Replicate/Shard placements (a pinned redistribute's operand must reach exactly its
    sharding), then a replicated output."""
    rng = random.Random(seed)
    mesh = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))
    choices = [rs.Replicate(), rs.Shard(0), rs.Shard(1)]
    f = rs.Fusion()
    y = f.input("x", (8, 8), "float64", mesh, [rs.Shard(0), rs.Replicate()])
    for _ in range(n):
        y = f.redistribute(y, [rng.choice(choices), rng.choice(choices)], pin=True)
    f.output(y, [rs.Replicate(), rs.Replicate()])
    return f


@pytest.mark.parametrize("n, limits", [(12, dict(segment_ops=8, max_iterations=3)), (65, {})],
                         ids=["12-small-limits", "65-default-limits"])
def test_a_segment_stopped_by_a_limit_still_feeds_its_consumers(n, limits):
    """Issue 18: a limit stopped the first segment once its seam value was reachable at some
    sharding, and the next segment could not reshard it to what its pinned redistribute
    needs ("found no way to ...").  A stopped segment's seam values now come with their
    candidate shardings, and the consumer reshards them; one e-graph with the same limits
    plans the same program."""
    f = pinned_chain(n, seed=1)
    seg = rs.optimize(f, limits=rs.Limits(**limits))
    whole = rs.optimize(f, limits=rs.Limits(**{**limits, "segment_ops": n + 1}))
    assert seg.report.segments > 1 and whole.report.segments == 1
    assert seg.report.limit_hit is not None and "saturation" in seg.report.cut
    check_plan(seg, f, 0, "segmented plan")
    check_plan(whole, f, 0, "one e-graph")
