"""Cross-mesh transfers (seed 001, issue 4 item 2): ``f.redistribute(t, placements, mesh=B)``.

Every way to move a value from mesh A to mesh B lives in the e-graph (broadcast from any
device of A, parallel send/recv A[i] -> B[i], scatter from one device of A then resharding on
B, resharding on A then a transfer); the cost profile decides.  Each favoured alternative is
checked to be the one extracted, every plan (chosen or random) is simulated against
``reshard.run_reference``, and one plan of each transfer kind runs on 4 gloo processes.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import torch.distributed as dist

import reshard as rs
from reshard.rules.cost_profile import CostProfile
from reshard.extract.dag import collect_enodes
from reshard.extract.plan_node import Tag
from reshard.search.saturate import Limits
from reshard.ir.sharding import unshard
from reshard.plan import Saturated

A1, B1 = rs.DeviceMesh([0, 1]), rs.DeviceMesh([2, 3])
A2, B2 = rs.DeviceMesh([[0, 1], [2, 3]]), rs.DeviceMesh([[4, 5], [6, 7]])
R, S0 = rs.Replicate(), rs.Shard(0)
SHAPE = (64, 256)  # 64 KiB of float32: bandwidth terms matter
FAST, SLOW = (1.0, 1000.0), (200.0, 0.5)  # (alpha_us, busbw_gbps)


def profile(**kinds: tuple[float, float]) -> CostProfile:
    """The default profile with (alpha_us, busbw_gbps) replaced for the given kinds."""
    return CostProfile.load({"name": "test", "alpha_us": {k: a for k, (a, _) in kinds.items()},
                             "busbw_gbps": {k: b for k, (_, b) in kinds.items()}})


def transfer(src: list, dst: list, a: rs.DeviceMesh = A1, b: rs.DeviceMesh = B1, also_on_a: list | None = None
             ) -> rs.Fusion:
    """x on ``a`` at ``src`` -> output on ``b`` at ``dst`` (and x itself output at ``also_on_a``)."""
    f = rs.Fusion()
    x = f.input("x", SHAPE, "float32", a, src)
    f.output(f.redistribute(x, dst, mesh=b), dst)
    if also_on_a is not None:
        f.output(x, also_on_a)
    return f


def pipeline(a: rs.DeviceMesh, b: rs.DeviceMesh) -> rs.Fusion:
    """A 2-stage pipeline: a matmul (+gelu) on mesh a, the activation sent to mesh b, a matmul there."""
    n = a.ndim
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", a, [S0] + [R] * (n - 1))
    w1 = f.input("w1", (16, 16), "float32", a, [R] + [rs.Shard(1)] * (n - 1))
    w2 = f.input("w2", (16, 8), "float32", b, [R] * n)
    h = f.gelu(f.matmul(x, w1))
    y = f.matmul(f.redistribute(h, [R] * n, mesh=b), w2)
    f.output(y, [S0] + [R] * (n - 1))
    return f


def inputs_of(f: rs.Fusion, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=g) for i in f.inputs}


def check(plan: rs.Plan, f: rs.Fusion, seed: int = 0) -> None:
    """The plan's outputs (simulated, partial inputs random) equal the reference's."""
    inputs = inputs_of(f, seed)
    ref = rs.run_reference(f, inputs)
    got = plan.simulate(inputs, generator=torch.Generator().manual_seed(seed))
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def kinds(plan: rs.Plan) -> list[str]:
    return [c.kind for c in plan.communications]


def transfer_nodes(plan: rs.Plan) -> list[Any]:
    return [n for n in plan.lowered.nodes if n.head.tag is Tag.TRANSFER]


# ---- bad inputs ------------------------------------------------------------------------------
def test_other_mesh_shape_is_rejected() -> None:
    f = rs.Fusion()
    x = f.input("x", (4, 4), "float32", A1, [R])
    with pytest.raises(rs.ReshardError, match=r"mesh shape \(2, 2\) differs"):
        f.redistribute(x, [R, R], mesh=rs.DeviceMesh([[2, 3], [4, 5]]))


def test_overlapping_meshes_are_rejected() -> None:
    f = rs.Fusion()
    x = f.input("x", (4, 4), "float32", A1, [R])
    with pytest.raises(rs.ReshardError, match=r"devices \[1\] belong to both meshes"):
        f.redistribute(x, [R], mesh=rs.DeviceMesh([1, 2]))


def test_optimize_rejects_meshes_of_different_shapes_or_shared_devices() -> None:
    f = rs.Fusion()
    f.output(f.input("x", (4, 4), "float32", A1, [R]), [R])
    f.output(f.input("y", (4, 4), "float32", rs.DeviceMesh([[2, 3], [4, 5]]), [R, R]), [R, R])
    with pytest.raises(rs.ReshardError, match="different shapes"):
        rs.optimize(f)
    g = rs.Fusion()
    g.output(g.input("x", (4, 4), "float32", A1, [R]), [R])
    g.output(g.input("y", (4, 4), "float32", rs.DeviceMesh([1, 5]), [R]), [R])
    with pytest.raises(rs.ReshardError, match="share device 1"):
        rs.optimize(g)


def test_ops_across_meshes_need_a_transfer() -> None:
    f = rs.Fusion()
    x = f.input("x", (4, 4), "float32", A1, [R])
    y = f.input("y", (4, 4), "float32", B1, [R])
    with pytest.raises(rs.ReshardError, match="different meshes"):
        f.add(x, y)


# ---- every alternative exists ----------------------------------------------------------------
def test_every_transfer_alternative_is_in_the_egraph() -> None:
    sat = Saturated.build(transfer([R], [R]), CostProfile(), Limits())
    snap = sat.snapshot
    found = {(n.ctor, snap.i64(n.args[2]) if n.ctor in ("Bcast", "Scatter") else None)
             for n in collect_enodes(snap) if n.ctor in ("SendRecv", "Bcast", "Scatter")}
    assert found == {("SendRecv", None), ("Bcast", 0), ("Bcast", 1), ("Scatter", 0), ("Scatter", 1)}


def test_every_crossmesh_rule_fires_and_states_its_law() -> None:
    from reshard.rules import crossmesh
    sat = Saturated.build(pipeline(A1, B1), CostProfile(), Limits())
    names = [r.reported_name for r in crossmesh.rules(1) + crossmesh.cost_rules(CostProfile(), 2)]
    assert set(names) <= {r.reported_name for r in sat.encoding.rules}
    assert [n for n in names if sat.report.rule_matches[n] == 0] == []
    assert all(len(r.law) > 8 for r in crossmesh.rules(1) + crossmesh.cost_rules(CostProfile(), 2))


# ---- the cost model chooses, and the choice flips with the profile -----------------------------
def test_replicated_transfer_flips_between_send_recv_broadcast_and_scatter() -> None:
    f = transfer([R], [R])
    nbytes = SHAPE[0] * SHAPE[1] * 4
    # cheap send/recv latency and bandwidth: parallel pairs A[i] -> B[i]
    p2p = rs.optimize(f, cost_profile=profile(send_recv=FAST, broadcast=SLOW, scatter=SLOW))
    assert kinds(p2p) == ["send_recv"]
    assert [c.moved_bytes for c in p2p.communications] == [nbytes]
    assert [s.attr("pairs") for s in p2p.steps if s.kind == "send_recv"] == [((0, 2), (1, 3))]
    # cheap broadcast: one broadcast from A's device 0 to all of B
    bc = rs.optimize(f, cost_profile=profile(send_recv=SLOW, broadcast=FAST, scatter=SLOW))
    assert kinds(bc) == ["broadcast"]
    assert [n.head.src for n in transfer_nodes(bc)] == [0]
    assert [(s.attr("ranks"), s.attr("root")) for s in bc.steps if s.kind == "broadcast"] == [((0, 2, 3), 0)]
    # cheap scatter and allgather: scatter from one A device to a sharded dist, then allgather on B
    sc = rs.optimize(f, cost_profile=profile(send_recv=SLOW, broadcast=SLOW, scatter=FAST, allgather=FAST))
    assert kinds(sc) == ["scatter", "allgather"]
    assert [c.moved_bytes for c in sc.communications][0] == nbytes // 2
    # α-β costs: broadcast α + bytes/bw; scatter α + |B|·piece/bw; send/recv α + local bytes/bw
    alpha, bw = FAST[0] * 1e-6, FAST[1] * 1e9
    assert p2p.communications[0].cost_s == pytest.approx(alpha + nbytes / bw, rel=1e-6)
    assert bc.communications[0].cost_s == pytest.approx(alpha + nbytes / bw, rel=1e-6)
    assert sc.communications[0].cost_s == pytest.approx(alpha + 2 * (nbytes // 2) / bw, rel=1e-6)
    for plan in (p2p, bc, sc):
        check(plan, f)


def test_latency_versus_bandwidth_profiles_flip_the_choice() -> None:
    """Latency-bound network (huge bandwidths): the kind with the smallest α wins; bandwidth-
    bound (equal α): the kind with the highest bandwidth wins."""
    f = transfer([R], [R])
    huge = 1e6
    lat = profile(send_recv=(1.0, huge), broadcast=(20.0, huge), scatter=(20.0, huge))
    bw = profile(send_recv=(1.0, 1.0), broadcast=(1.0, 500.0), scatter=(1.0, 1.0), allgather=(1.0, 1.0))
    assert kinds(rs.optimize(f, cost_profile=lat)) == ["send_recv"]
    assert kinds(rs.optimize(f, cost_profile=bw)) == ["broadcast"]


def test_sharded_to_sharded_is_parallel_send_recv_of_the_shards() -> None:
    f = transfer([S0], [S0])
    plan = rs.optimize(f)
    assert kinds(plan) == ["send_recv"]
    assert plan.comm_bytes == SHAPE[0] * SHAPE[1] * 4 // 2
    check(plan, f, seed=1)


def test_sharded_to_replicated_send_recv_then_allgather_on_b() -> None:
    f = transfer([S0], [R])
    plan = rs.optimize(f, cost_profile=profile(send_recv=FAST, allgather=FAST, broadcast=SLOW, scatter=SLOW))
    assert kinds(plan) == ["send_recv", "allgather"]
    ag = [n for n in plan.lowered.nodes if n.head.form == "allgather"]
    assert [n.sharding.mesh for n in ag] == [B1]  # gathered on B, after moving half the bytes
    assert plan.communications[0].moved_bytes == SHAPE[0] * SHAPE[1] * 4 // 2
    check(plan, f, seed=2)


def test_sharded_to_replicated_allgather_on_a_then_send_recv() -> None:
    """When the value is needed whole on A as well, the allgather on A is paid anyway and an
    expensive allgather on B is avoided by sending the whole value (a sharing decision: the
    exact extractor sees it, the greedy one prices each output's sub-plan alone)."""
    f = transfer([S0], [R], also_on_a=[R])
    plan = rs.optimize(f, cost_profile=profile(send_recv=FAST, allgather=(1.0, 0.5), broadcast=SLOW, scatter=SLOW),
                       extractor="ilp")
    assert sorted(kinds(plan)) == ["allgather", "send_recv"]
    ag = [n for n in plan.lowered.nodes if n.head.form == "allgather"]
    assert [n.sharding.mesh for n in ag] == [A1]
    assert [n.args[0].sharding.axes for n in transfer_nodes(plan)] == [(R,)]  # the whole value moves
    check(plan, f, seed=3)
    # with a cheap allgather the shards move instead (half the bytes), then gather on B
    cheap = rs.optimize(f, cost_profile=profile(send_recv=(1.0, 0.5), allgather=FAST, broadcast=SLOW, scatter=SLOW))
    assert [n.args[0].sharding.bound_axes for n in transfer_nodes(cheap)] == [(0,)]
    assert sorted(kinds(cheap)) == ["allgather", "allgather", "send_recv"]
    check(cheap, f, seed=3)


def test_2d_scatter_then_allgathers_on_b() -> None:
    f = transfer([R, R], [R, R], A2, B2)
    plan = rs.optimize(f, cost_profile=profile(send_recv=SLOW, broadcast=SLOW, scatter=FAST, allgather=FAST))
    assert kinds(plan)[0] == "scatter" and set(kinds(plan)[1:]) == {"allgather"}
    (node,) = transfer_nodes(plan)
    assert node.sharding.mesh == B2 and len(node.sharding.bound_axes) >= 1
    scatter = [s for s in plan.steps if s.kind == "scatter"]
    assert [s.attr("ranks")[1:] for s in scatter] == [(4, 5, 6, 7)]
    check(plan, f, seed=4)


def test_2d_partial_sends_keep_partial() -> None:
    """A Partial value may move as is (send/recv keeps every placement) and be reduced on B."""
    f = transfer([rs.Partial("sum"), S0], [R, S0], A2, B2)
    plan = rs.optimize(f, cost_profile=profile(send_recv=FAST))
    check(plan, f, seed=5)
    sat = Saturated.build(f, CostProfile(), Limits())
    for s in range(6):
        check(sat.plan(perturb=random.Random(s)), f, seed=s)


def test_simulator_rejects_a_bad_explicit_team() -> None:
    from reshard.codegen.program import Program, Step
    from reshard.runtime.local_ops import run_local
    from reshard.runtime.simulator import simulate
    prog = Program((2, 2), (0, 1, 2, 3), ("x",), ("y",), (Step.make("broadcast", "y", ["x"], ranks=(0, 2, 9), root=0),),
                   2, (0,), (1,))
    x = {r: {"x": torch.ones(2)} for r in (0, 1)} | {2: {}, 3: {}}
    with pytest.raises(rs.ReshardError, match=r"explicit team \(0, 2, 9\)"):
        simulate(prog, x, run_local)
    ok = Program((2, 2), (0, 1, 2, 3), ("x",), ("y",), (Step.make("broadcast", "y", ["x"], ranks=(1, 2, 3), root=0),),
                 2, (0,), (1,))
    out = simulate(ok, x, run_local)
    assert all(torch.equal(out[r]["y"], torch.ones(2)) for r in (1, 2, 3)) and "y" not in out[0]


PLACEMENTS = {"R": R, "S0": S0, "S1": rs.Shard(1), "P": rs.Partial("sum")}
SWEEP_1D = [(a, b) for a in "R S0 S1 P".split() for b in "R S0 S1".split()]
SWEEP_2D = [("R R", "S0 S1"), ("S0 S1", "S1 S0"), ("P S0", "R R"), ("S1 R", "R S1"), ("P P", "S0 R")]


@pytest.mark.parametrize("src,dst", SWEEP_1D + SWEEP_2D, ids=[f"{a}->{b}" for a, b in SWEEP_1D + SWEEP_2D])
def test_placement_sweep_cheapest_and_random_plans_are_correct(src: str, dst: str) -> None:
    """Every source/target placement pair: the chosen plan and random extractions are correct."""
    sp, dp = [PLACEMENTS[p] for p in src.split()], [PLACEMENTS[p] for p in dst.split()]
    a, b = (A1, B1) if len(sp) == 1 else (A2, B2)
    f = rs.Fusion()
    x = f.input("x", (8, 12), "float32", a, sp)
    f.output(f.redistribute(x, dp, mesh=b), dp)
    sat = Saturated.build(f, CostProfile(), Limits())
    check(sat.plan(), f)
    for s in range(5):
        check(sat.plan(perturb=random.Random(s)), f, seed=s)


# ---- random extractions of cross-mesh pipelines are correct -----------------------------------
@pytest.mark.parametrize("meshes", [(A1, B1), (A2, B2)], ids=["1d", "2x2"])
def test_random_plans_of_pipelines_simulate_correctly(meshes: tuple) -> None:
    f = pipeline(*meshes)
    sat = Saturated.build(f, CostProfile(), Limits())
    check(sat.plan(), f)
    seen: set[tuple[str, int | None]] = set()
    for s in range(64):  # random plans until every kind and a broadcast from a later source were drawn
        plan = sat.plan(perturb=random.Random(s))
        check(plan, f, seed=s)
        seen |= {(n.head.form, n.head.src) for n in transfer_nodes(plan)}
        if s >= 11 and {k for k, _ in seen} == {"send_recv", "broadcast", "scatter"} and (
                {src for k, src in seen if k == "broadcast"} - {0}):
            break
    assert {k for k, _ in seen} == {"send_recv", "broadcast", "scatter"}
    assert {src for k, src in seen if k == "broadcast"} - {0}  # broadcasts from other sources than A's first


@pytest.mark.parametrize("third", [A1, rs.DeviceMesh([5, 4])], ids=["back-to-A", "to-C-permuted"])
def test_chains_of_transfers(third: rs.DeviceMesh) -> None:
    """A -> B -> (A | C): values cross meshes twice; C lists its ranks out of order."""
    f = rs.Fusion()
    x = f.input("x", (8, 4), "float32", A1, [rs.Shard(1)])
    v = f.exp(f.redistribute(x, [S0], mesh=B1))
    v = f.exp(f.redistribute(v, [S0], mesh=third))
    f.output(v, [R])
    f.output(x, [S0])
    sat = Saturated.build(f, CostProfile(), Limits())
    plan = sat.plan()
    assert plan.program.meshes == len({A1, B1, third})
    check(plan, f)
    for s in range(8):
        check(sat.plan(perturb=random.Random(s)), f, seed=s)


def test_multi_mesh_program_layout() -> None:
    plan = rs.optimize(pipeline(A1, B1))
    prog = plan.program
    assert prog.meshes == 2 and prog.mesh_shape == (2, 2) and prog.mesh_ranks == (0, 1, 2, 3)
    assert [prog.input_ranks(b) for b in prog.inputs] == [
        (0, 1) if name != "w2" else (2, 3) for _, name, _ in plan.lowered.inputs]
    assert [prog.output_ranks(b) for b in prog.outputs] == [(2, 3)]
    local = [s for s in prog.steps if s.kind == "local"]
    assert local and all(s.attr("on") in (0, 1) or s.attr("ranks") is not None for s in local)
    assert '"meshes":2' in prog.to_json()


# ---- gloo: 4 processes run cross-mesh plans -------------------------------------------------------
def _plans(seeds: list[int | None]) -> tuple[rs.Fusion, list[rs.Plan]]:
    """The pipeline's plans: the cheapest (seed None) and random extractions (SPMD: every rank
    builds the same plans itself; the runtime checks that the digests agree)."""
    f = pipeline(A1, B1)
    sat = Saturated.build(f, CostProfile(), Limits())
    return f, [sat.plan() if s is None else sat.plan(perturb=random.Random(s)) for s in seeds]


def _run_plans(rank: int, seeds: list[int | None]) -> list[tuple]:
    f, plans = _plans(seeds)
    inputs = inputs_of(f, 7)
    return [plan.run(plan.shard_inputs(inputs).get(rank, {}), validate=validate)
            for plan in plans for validate in (False, True)]


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
def test_gloo_runs_cross_mesh_plans() -> None:
    f = pipeline(A1, B1)
    sat = Saturated.build(f, CostProfile(), Limits())
    seeds: list[int | None] = [None]
    for want in ("broadcast", "scatter"):  # one random plan with each rooted transfer
        seeds.append(next(s for s in range(60) if want in kinds(sat.plan(perturb=random.Random(s)))))
    _, plans = _plans(seeds)
    assert {"send_recv", "broadcast", "scatter"} <= {k for p in plans for k in kinds(p)}
    ref = rs.run_reference(f, inputs_of(f, 7))
    per_rank = rs.launch(_run_plans, 4, seeds, timeout_s=60)
    for j, plan in enumerate(p for p in plans for _ in range(2)):  # each plan, then with validate=True
        (buf, ts), = plan.lowered.outputs
        assert all(per_rank[r][j] == (None,) for r in A1.ranks)  # the output lives on B
        got = unshard({r: per_rank[r][j][0] for r in B1.ranks}, ts)
        torch.testing.assert_close(got, ref[0], rtol=1e-4, atol=1e-4)
