"""optimize() never hangs (issue 18): programs with IterDomains of extent 1 saturate, and
their plans (the optimized one and random extractions of the e-graph) match the reference.

Size-1 dims (keepdim reductions, unsqueeze-like reshapes), a dim of 2 split by a mesh axis of
2 and merges with a size-1 dim used to make the IterDomain rules grow without bound inside one
egglog run (``id_algebra``: the unit laws, and transports only of indices with an extent).
"""

from __future__ import annotations

import random

import pytest

import reshard as rs
from reshard import Replicate, Shard
from reshard.rules.cost_profile import CostProfile
from reshard.ir.ids import Inner, Merge, Outer, Root
from reshard.ir.sharding import TensorSharding
from reshard.plan import Saturated
from tests.fuzz.test_fuzz import check_plan

MESH_2 = rs.DeviceMesh([0, 1], ("x",))
MESH_3 = rs.DeviceMesh([0, 1, 2], ("x",))
MESH_2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))


def _rep(mesh: rs.DeviceMesh) -> list:
    return [Replicate()] * mesh.ndim


# ---- the issue's four programs --------------------------------------------------------------

def reduce_through_size_one_dims(mesh: rs.DeviceMesh = MESH_2) -> rs.Fusion:
    """(2, 12) -> reshape (12, 2, 1, 1) -> sum over (1, 2) -> mean over 0, all replicated."""
    f = rs.Fusion()
    x = f.input("x", (2, 12), "float64", mesh, _rep(mesh))
    y = f.reduce("mean", f.reduce("sum", f.reshape(x, (12, 2, 1, 1)), (1, 2)), (0,))
    f.output(y, _rep(mesh))
    return f


def _softmax_half(f: rs.Fusion, v0: rs.ir.fusion.Tensor) -> rs.ir.fusion.Tensor:
    v1 = f.reshape(v0, (2, 2))
    v3 = f.broadcast(f.reduce("max", v1, (1,)), (2, 2), (0,))
    return f.reduce("sum", f.binary("sub", v1, v3), (1,))


def softmax_half(mesh: rs.DeviceMesh = MESH_2x2) -> rs.Fusion:
    """(4,) -> (2, 2): the first half of a softmax over dims of 2 on a mesh of 2s, replicated."""
    f = rs.Fusion()
    f.output(_softmax_half(f, f.input("v0", (4,), "float64", mesh, _rep(mesh))), _rep(mesh))
    return f


def merged_with_a_size_one_dim() -> rs.Fusion:
    """x (3, 1) replicated, output as itself sharded by Outer(Merge(i0, i1[1]), 3): no ops."""
    f = rs.Fusion()
    x = f.input("x", (3, 1), "float64", MESH_3, [Replicate()])
    f.output(x, TensorSharding(MESH_3, (3, 1), (Outer(Merge(Root(0, 3), Root(1, 1)), 3),)))
    return f


def softmax_half_and_cyclic_redistribute() -> rs.Fusion:
    """The softmax half on a mesh of 2, plus an unused redistribute of the input to a cyclic
    sharding."""
    f = rs.Fusion()
    v0 = f.input("v0", (4,), "float64", MESH_2, [Replicate()])
    out = _softmax_half(f, v0)
    f.redistribute(v0, TensorSharding(MESH_2, (4,), (Outer(Inner(Root(0, 4), 2), 2),)))
    f.output(out, [Replicate()])
    return f


ISSUE_PROGRAMS = [reduce_through_size_one_dims, softmax_half, merged_with_a_size_one_dim,
                  softmax_half_and_cyclic_redistribute]


@pytest.mark.parametrize("build", ISSUE_PROGRAMS, ids=lambda b: b.__name__)
def test_issue_programs_saturate_small_with_correct_plans(build):
    """Each saturates (no limit hit) in a small e-graph: before the unit laws they grew without
    bound.  (No wall-clock assert: speed lives in benchmarks; they take 0.2-0.5 s.)"""
    f = build()
    plan = rs.optimize(f, limits=rs.Limits(time_limit_s=10))
    assert plan.report.saturated and plan.report.limit_hit is None, plan.report
    assert plan.report.enodes < 20_000, plan.report
    assert not plan.communications  # everything is replicated: nothing to communicate
    check_plan(plan, f, 0, build.__name__)


@pytest.mark.parametrize("shape", [(2, 3), (2, 2)])
def test_reduce_through_size_one_dims_on_other_meshes(shape):
    mesh = rs.DeviceMesh([[r + shape[1] * i for r in range(shape[1])] for i in range(shape[0])], ("x", "y"))
    f = reduce_through_size_one_dims(mesh)
    plan = rs.optimize(f, limits=rs.Limits(time_limit_s=10))
    assert plan.report.saturated, plan.report
    check_plan(plan, f, 1, "plan")


# ---- size-1 dims through the whole optimizer: every extraction is correct -------------------

def keepdim_softmax() -> rs.Fusion:
    """Row softmax with keepdim reductions (reduce, then reshape to (rows, 1), then broadcast),
    rows sharded on a 2x2 mesh's first axis."""
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float64", MESH_2x2, [Shard(0), Replicate()])
    m = f.broadcast(f.reshape(f.reduce("max", x, (1,)), (4, 1)), (4, 6), (0, 1))
    e = f.exp(f.binary("sub", x, m))
    s = f.broadcast(f.reshape(f.reduce("sum", e, (1,)), (4, 1)), (4, 6), (0, 1))
    f.output(f.binary("div", e, s), [Shard(0), Shard(1)])
    return f


def unsqueeze_chain() -> rs.Fusion:
    """(8,) sharded -> (8, 1) -> (1, 8) -> (2, 1, 4) -> tanh, output sharded on dim 2."""
    f = rs.Fusion()
    x = f.input("x", (8,), "float64", MESH_2, [Shard(0)])
    y = f.tanh(f.reshape(f.reshape(f.reshape(x, (8, 1)), (1, 8)), (2, 1, 4)))
    f.output(y, [Shard(2)])
    return f


def size_one_reduction_2d() -> rs.Fusion:
    """(2, 4) [S(0), S(1)] -> (2, 1, 4, 1) -> sum over the size-1 dims -> (2, 4), with a dim of
    2 split by a mesh axis of 2."""
    f = rs.Fusion()
    x = f.input("x", (2, 4), "float64", MESH_2x2, [Shard(0), Shard(1)])
    y = f.reduce("sum", f.reshape(x, (2, 1, 4, 1)), (1, 3))
    f.output(f.binary("mul", y, x), [Shard(0), Replicate()])
    return f


def size_two_dims_split_two_ways() -> rs.Fusion:
    """(2, 3) sharded on dim 0 by 2 -> (6,) -> (3, 2) sharded on dim 1 by 2, then a sum over
    the dim of 2."""
    f = rs.Fusion()
    x = f.input("x", (2, 3), "float64", MESH_2, [Shard(0)])
    y = f.reshape(f.reshape(x, (6,)), (3, 2))
    f.output(y, [Shard(1)])
    f.output(f.reduce("sum", y, (1,)), [Replicate()])
    return f


def merged_unit_sharded() -> rs.Fusion:
    """(3, 1) sharded on dim 0 -> (3,) and -> (1, 3): a merge with a size-1 dim stays local."""
    f = rs.Fusion()
    x = f.input("x", (3, 1), "float64", MESH_3, [Shard(0)])
    f.output(f.reshape(x, (3,)), [Shard(0)])
    f.output(f.reshape(x, (1, 3)), [Shard(1)])
    return f


SIZE_ONE_PROGRAMS = [keepdim_softmax, unsqueeze_chain, size_one_reduction_2d, size_two_dims_split_two_ways,
                     merged_unit_sharded, *ISSUE_PROGRAMS]


@pytest.mark.parametrize("build", SIZE_ONE_PROGRAMS, ids=lambda b: b.__name__)
def test_size_one_programs_every_extraction_is_correct(build):
    """The cheapest plan and random extractions (any implementation of any class) match the
    reference: every class the unit laws merged is sound."""
    f = build()
    sat = Saturated.build(f, CostProfile(), rs.Limits(time_limit_s=10))
    assert sat.report.saturated, sat.report
    check_plan(sat.plan(), f, 0, "optimized plan")
    rng = random.Random(build.__name__)
    for i in range(3):
        check_plan(sat.plan(perturb=rng), f, i + 1, f"random plan {i}")


def test_merge_with_a_size_one_dim_is_local():
    """Merging a sharded dim with a size-1 dim (and back) needs no communication."""
    plan = rs.optimize(merged_unit_sharded())
    assert not plan.communications, plan.explain()


# ---- fork safety -----------------------------------------------------------------------------

def _explained(plan: rs.Plan) -> str:
    """The explanation without its first line (which has the seconds saturation took)."""
    return plan.explain().split("\n", 1)[1]


def _optimize_in_child(conn, layers: int) -> None:
    """A forked child: optimize a program of ``layers`` blocks, send back its digest and cost."""
    from reshard.examples import transformer_stack
    try:
        seen = []
        plan = rs.optimize(transformer_stack(layers), progress=seen.append, cache=False)  # planned here
        conn.send((plan.digest(), plan.cost, len(seen) > 0, plan.report.segments, _explained(plan)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(repr(e))


@pytest.mark.multiproc
def test_optimize_in_a_forked_child_after_the_parent_used_egglog():
    """egglog's thread pool does not survive fork(): a child forked after the parent ran
    optimize() deadlocked on a program over 64 ops (dropping a segment's e-graph waits for the
    pool's threads).  It now runs the optimization in a fresh interpreter and gets the plan
    the parent gets, progress reports and explanation included."""
    from reshard.examples import transformer_stack
    layers = 3  # 3 blocks: more than 64 ops, saturated in segments
    parent = rs.optimize(transformer_stack(layers))
    assert parent.report.segments > 1
    got = _from_forked_child(_optimize_in_child, (layers,), 120,
                             "the forked child did not finish optimize() in 120 s (deadlock)")
    assert got == (parent.digest(), parent.cost, True, parent.report.segments, _explained(parent)), got


def _from_forked_child(target, args: tuple, timeout_s: float, stalled: str):
    """Run ``target(send, *args)`` in a forked child and return what it sends; fail with
    ``stalled`` if nothing comes within ``timeout_s`` (the child is killed either way)."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=target, args=(send, *args))
    child.start()
    try:
        assert recv.poll(timeout_s), stalled
        return recv.recv()
    finally:
        child.kill()
        child.join()


def _saturate_in_child(send) -> None:
    """A forked child: build the e-graph directly (not through optimize()); send back the error."""
    from reshard.rules.cost_profile import CostProfile
    from reshard.examples import transformer_stack
    from reshard.plan import Saturated
    try:
        Saturated.build(transformer_stack(1), CostProfile(), rs.Limits())
        send.send("built")
    except rs.ReshardError as e:
        send.send(str(e))


@pytest.mark.multiproc
def test_building_an_egraph_in_a_forked_child_is_an_error_not_a_deadlock():
    """The guard sits where every e-graph is made (``saturate.new_egraph``), so callers other
    than optimize() get a ReshardError instead of waiting forever."""
    rs.optimize(merged_with_a_size_one_dim())  # the parent uses egglog
    got = _from_forked_child(_saturate_in_child, (), 60,
                             "the forked child neither built the e-graph nor raised in 60 s")
    assert "thread pool does not survive fork()" in got, got


def test_an_error_in_the_fresh_process_is_raised_in_the_caller():
    from reshard.forksafe import optimize_in_fresh_process
    f = rs.Fusion()
    f.input("x", (4,), "float64", MESH_2, [Replicate()])
    with pytest.raises(rs.ReshardError, match="no outputs"):
        optimize_in_fresh_process(f, dict(limits=rs.Limits()), None)
