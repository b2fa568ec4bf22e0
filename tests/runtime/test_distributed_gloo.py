"""Multi-process tests of reshard.runtime.distributed over gloo (spawned processes, file:// init).

Plans are optimized in the parent, the global inputs sharded with ``plan.shard_inputs``, each
rank's locals run in its own process with the runtime, and the outputs unsharded in the
parent and compared with ``reshard.run_reference``.  Hand-written programs cover every
collective kind (non-zero dims, axis names, team orders that differ from the process group's
rank order) and are compared with the in-process simulator.  To keep the file fast, one
launch per world size runs many jobs; error scenarios run inside the same launch (every rank
raises alike, so the process group stays usable).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

import reshard as rs
from reshard.codegen.program import Program, Step
from reshard.ir.sharding import unshard
from reshard.runtime.distributed import DistRuntime, launch, run_plan
from reshard.runtime.local_ops import run_local
from reshard.runtime.simulator import simulate
from reshard.testing import programs as P

pytestmark = [pytest.mark.multiproc, pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                                         reason="torch.distributed with gloo is not available")]

TIMEOUT_S = 60


# ---- jobs executed inside the spawned ranks --------------------------------------------------
def _run_job(rank: int, kind: str, payload: tuple) -> Any:
    if kind == "plan":
        plan, locals_by_rank, kw = payload
        return run_plan(plan, locals_by_rank.get(rank, {}), **kw)
    if kind == "program":
        program, inputs_by_rank, kw = payload
        mine = inputs_by_rank.get(rank, {})
        before = {k: v.clone() for k, v in mine.items()}
        rt = DistRuntime(program, **kw)
        try:
            out = rt.run(mine)
        finally:
            rt.close()
        changed = [k for k, v in mine.items() if not torch.equal(v, before[k])]
        if changed:
            raise rs.ReshardError(f"the run wrote into the caller's inputs {changed}")
        return out
    if kind == "programs":  # a different program per rank
        programs_by_rank, inputs_by_rank = payload
        return DistRuntime(programs_by_rank[rank]).run(inputs_by_rank.get(rank, {}))
    raise ValueError(kind)


def jobs_worker(rank: int, jobs: list[tuple[str, str, tuple]]) -> dict[str, tuple[str, Any, float]]:
    """Run every job; return {name: ("ok", result, seconds) | ("error", message, seconds)}."""
    out: dict[str, tuple[str, Any, float]] = {}
    for name, kind, payload in jobs:
        t = time.monotonic()
        try:
            out[name] = ("ok", _run_job(rank, kind, payload), time.monotonic() - t)
        except rs.ReshardError as e:
            out[name] = ("error", str(e), time.monotonic() - t)
    return out


def mismatch_worker(rank: int, programs_by_rank: dict[int, Program]) -> str:
    DistRuntime(programs_by_rank[rank])
    return "constructed"


def failing_worker(rank: int) -> str:
    if rank == 1:
        raise ValueError("boom on rank 1")
    dist.barrier()  # rank 0 waits for a peer that never arrives
    return "unreachable"


# ---- hand-written programs covering every collective kind -------------------------------------
def S(kind: str, out: str, ins: list[str], **attrs: Any) -> Step:
    return Step.make(kind, out, ins, **attrs)


def program_1d() -> Program:
    """Mesh ranks (1, 0): team order is the reverse of the process group's rank order."""
    steps = (
        S("allgather", "ag", ["a"], axis=0, dim=1),
        S("reduce_scatter", "rsm", ["a"], axis=0, dim=1, op="max"),
        S("reduce_scatter", "rss", ["b"], axis=0, dim=0, op="sum"),
        S("allreduce", "ar", ["a"], axis=0, op="sum"),
        S("allreduce", "arm", ["b"], axis="x", op="max"),
        S("all_to_all", "aa", ["a"], axis=0, split_dim=1, cat_dim=0),
        S("broadcast", "bc", ["a"], axis=0, root=1),
        S("scatter", "sc", ["p"], axis=0, root=1, dim=1),
        S("gather", "ga", ["a"], axis=0, root=0, dim=1),
        S("send_recv", "sr", ["a"], pairs=((1, 0), (0, 1))),
        S("send_recv", "sr2", ["b"], pairs=((0, 0),)),
        S("local", "agv", ["ag"], op="view", shape=(-1,), free=("ag",)),
    )
    return Program((2,), (1, 0), ("a", "b", "p"), ("agv", "rsm", "rss", "ar", "arm", "aa", "bc", "sc", "ga", "sr",
                                                   "sr2"), steps)


def program_2d() -> Program:
    """2x2 mesh [[2, 0], [3, 1]]: axis 0 teams (2, 3), (0, 1); axis 1 teams (2, 0), (3, 1)."""
    steps = (
        S("allgather", "ag0", ["a"], axis=0, dim=1),
        S("allgather", "ag1", ["a"], axis="y", dim=0),
        S("reduce_scatter", "rs0", ["a"], axis=0, dim=1, op="sum"),
        S("reduce_scatter", "rs1", ["a"], axis=1, dim=0, op="max"),
        S("allreduce", "ar1", ["a"], axis=1, op="sum"),
        S("all_to_all", "aa0", ["a"], axis=0, split_dim=0, cat_dim=1),
        S("all_to_all", "aa1", ["a"], axis=1, split_dim=1, cat_dim=1),
        S("broadcast", "bc1", ["a"], axis=1, root=0),
        S("scatter", "sc0", ["a"], axis=0, root=1, dim=0),
        S("gather", "ga1", ["a"], axis=1, root=1, dim=0),
        S("send_recv", "sr", ["a"], pairs=((2, 1), (1, 2), (0, 3), (0, 0))),
        S("local", "a", ["ar1"], op="view", shape=(-1,), free=("ar1",)),  # overwrite an input buffer
        S("allgather", "agf", ["a"], axis=0, dim=0),
    )
    return Program((2, 2), (2, 0, 3, 1), ("a",), ("ag0", "ag1", "rs0", "rs1", "aa0", "aa1", "bc1", "sc0", "ga1",
                                                  "sr", "agf"), steps)


def program_reuse() -> Program:
    """In-place allreduce/broadcast candidates: a view of the caller's input, a view of a live
    buffer, and a freed buffer no one else holds (the only one the runtime may write into)."""
    steps = (
        S("local", "c", ["a"], op="view", shape=(-1,)),
        S("allreduce", "r1", ["c"], axis=0, op="sum", free=("c",)),
        S("allgather", "g", ["a"], axis=0, dim=0),
        S("local", "gv", ["g"], op="view", shape=(-1,)),
        S("allreduce", "r2", ["gv"], axis=0, op="sum", free=("gv",)),
        S("allgather", "h", ["a"], axis=0, dim=0),
        S("allreduce", "r3", ["h"], axis=0, op="max", free=("h",)),
        S("allgather", "k", ["a"], axis=0, dim=1),
        S("broadcast", "r4", ["k"], axis=0, root=1, free=("k",)),
        S("broadcast", "r5", ["a"], axis=0, root=0, free=("a",)),
    )
    return Program((2,), (0, 1), ("a",), ("r1", "g", "r2", "r3", "r4", "r5"), steps)


def program_sub() -> Program:
    """A 2-rank mesh (2, 1) inside a 4-rank world: ranks 0 and 3 sit out."""
    steps = (S("allgather", "ag", ["a"], axis=0, dim=0), S("send_recv", "sr", ["a"], pairs=((2, 1),)))
    return Program((2,), (2, 1), ("a",), ("ag", "sr"), steps)


def program_inputs(program: Program, seed: int, scatter_placeholder: bool = False
                   ) -> dict[int, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out: dict[int, dict[str, torch.Tensor]] = {}
    for r in program.mesh_ranks:
        env = {"a": torch.randn(4, 6, generator=g), "b": torch.randint(-50, 50, (4, 6), generator=g)}
        if scatter_placeholder:  # the scatter root (team position 1 = rank 0) holds data, rank 1 a placeholder
            env["p"] = torch.randn(4, 6, generator=g) if r == 0 else torch.empty(0)
        out[r] = {k: v for k, v in env.items() if k in program.inputs}
    return out


# ---- parent-side helpers ----------------------------------------------------------------------
def plan_case(builder: Any, seed: int = 0) -> tuple:
    f = builder()
    plan = rs.optimize(f)
    inputs = P.random_inputs(f, seed)
    locals_by_rank = plan.shard_inputs(inputs, generator=torch.Generator().manual_seed(seed))
    return f, plan, inputs, locals_by_rank


def check_plan_result(res: tuple, f: rs.Fusion, plan: rs.Plan, inputs: dict, nranks: int) -> None:
    per_rank = {}
    for r in range(nranks):
        status, value, _ = res[r]
        assert status == "ok", f"rank {r}: {value}"
        per_rank[r] = value
    refs = rs.run_reference(f, inputs)
    assert len(refs) == len(plan.lowered.outputs)
    for i, ((_, ts), ref) in enumerate(zip(plan.lowered.outputs, refs)):
        got = unshard({r: per_rank[r][i] for r in plan.program.mesh_ranks}, ts)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    for r in range(nranks):
        if r not in plan.program.mesh_ranks:
            assert per_rank[r] == ()


def check_program_result(res: tuple, program: Program, inputs: dict, nranks: int) -> None:
    want = simulate(program, inputs, run_local)
    for r in range(nranks):
        status, got, _ = res[r]
        assert status == "ok", f"rank {r}: {got}"
        if r not in program.mesh_ranks:
            assert got == {}
            continue
        assert sorted(got) == sorted(want[r]), f"rank {r}: buffers {sorted(got)} vs {sorted(want[r])}"
        for k, v in want[r].items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, f"rank {r} {k}"
            assert got[k].is_contiguous()
            torch.testing.assert_close(got[k], v, atol=1e-5, rtol=1e-5, msg=f"rank {r} buffer {k}")


def gather_results(nprocs: int, jobs: list) -> dict[str, tuple]:
    t = time.monotonic()
    per_rank = launch(jobs_worker, nprocs, jobs, timeout_s=TIMEOUT_S)
    print(f"launch of {nprocs} ranks, {len(jobs)} jobs: {time.monotonic() - t:.1f}s")
    return {name: tuple(per_rank[r][name] for r in range(nprocs)) for name, _, _ in jobs}


# ---- 2 ranks ------------------------------------------------------------------------------------
PLANS_2 = {b.__name__: b for b in P.ALL if b().tensors[b().inputs[0]].mesh.size == 2}
FALLBACK_2 = ["mlp", "reductions", "layout_ops", "redistribute_[Shard(0)]_[Shard(1)]",
              "redistribute_[Partial('sum')]_[Shard(0)]"]
PROGRAM_VARIANTS = {"default": {}, "validate": {"validate": True}, "fallback": {"fallback": "always"},
                    "native": {"fallback": "never"}}


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, Any]:
    cases: dict[str, tuple] = {}
    jobs: list = []
    for name, b in PLANS_2.items():
        cases[name] = plan_case(b)
        f, plan, inputs, loc = cases[name]
        jobs.append((name, "plan", (plan, loc, {})))
        if name in FALLBACK_2:
            jobs.append((name + "/fallback", "plan", (plan, loc, {"fallback": "always", "validate": True})))
    prog = program_1d()
    prog_inputs = program_inputs(prog, 1, scatter_placeholder=True)
    for v, kw in PROGRAM_VARIANTS.items():
        jobs.append(("program_1d/" + v, "program", (prog, prog_inputs, kw)))

    reuse = program_reuse()
    jobs.append(("program_reuse", "program", (reuse, program_inputs(reuse, 2), {})))

    # error scenarios (last: every rank raises alike, the group stays usable)
    f, plan, inputs, loc = cases["mlp"]
    bad = {r: dict(v) for r, v in loc.items()}
    buf = next(b for b, n, _ in plan.lowered.inputs if n == "w1")
    bad[0][buf] = torch.zeros(3, 5)
    jobs.append(("err/wrong_shape", "plan", (plan, bad, {})))
    missing = {r: dict(v) for r, v in loc.items()}
    del missing[1][buf]
    jobs.append(("err/missing", "plan", (plan, missing, {})))
    other = Program(prog.mesh_shape, prog.mesh_ranks, prog.inputs, prog.outputs, prog.steps[:-1])
    jobs.append(("err/digest", "programs", ({0: prog, 1: other}, prog_inputs)))
    p4 = rs.optimize(P.redistribute([rs.Shard(1)], [rs.Shard(0)], P.MESH4)())
    jobs.append(("err/world", "program", (p4.program, {}, {})))
    skew = {r: dict(v) for r, v in prog_inputs.items()}
    skew[1]["a"] = torch.randn(4, 8)
    jobs.append(("err/validate_shapes", "program", (prog, skew, {"validate": True})))
    bad_dim = Program((2,), (0, 1), ("a",), ("o",), (S("reduce_scatter", "o", ["a"], axis=0, dim=5),))
    jobs.append(("err/bad_dim", "program", (bad_dim, prog_inputs, {})))
    jobs.append(("after_errors", "program", (prog, prog_inputs, {})))
    return {"cases": cases, "results": gather_results(2, jobs), "prog": prog, "prog_inputs": prog_inputs}


@pytest.mark.parametrize("name", sorted(PLANS_2))
def test_plans_two_ranks(two_ranks: dict, name: str) -> None:
    f, plan, inputs, _ = two_ranks["cases"][name]
    check_plan_result(two_ranks["results"][name], f, plan, inputs, 2)
    if name in FALLBACK_2:
        check_plan_result(two_ranks["results"][name + "/fallback"], f, plan, inputs, 2)


@pytest.mark.parametrize("variant", sorted(PROGRAM_VARIANTS))
def test_all_collectives_1d_match_simulator(two_ranks: dict, variant: str) -> None:
    check_program_result(two_ranks["results"]["program_1d/" + variant], two_ranks["prog"], two_ranks["prog_inputs"], 2)


def test_in_place_collectives_leave_live_buffers_and_inputs_alone(two_ranks: dict) -> None:
    """The run job also fails when the caller's inputs changed; here the live ``g`` and the
    caller's ``a`` share memory with freed allreduce/broadcast inputs."""
    reuse = program_reuse()
    check_program_result(two_ranks["results"]["program_reuse"], reuse, program_inputs(reuse, 2), 2)


def test_reusable_only_for_freed_unshared_memory() -> None:
    rt = object.__new__(DistRuntime)  # _reusable reads only the caller's memory
    a, fresh = torch.randn(4), torch.randn(4)
    rt._caller_memory = {a.untyped_storage().data_ptr()}
    frees = S("allreduce", "o", ["x"], axis=0, free=("x",))
    keeps = S("allreduce", "o", ["x"], axis=0)
    assert rt._reusable({"x": fresh}, frees, "x", fresh)
    assert not rt._reusable({"x": fresh}, keeps, "x", fresh)
    assert not rt._reusable({"x": a.view(2, 2)}, frees, "x", a.view(2, 2))
    assert not rt._reusable({"x": fresh[:2], "y": fresh}, frees, "x", fresh[:2])
    assert not rt._reusable({"x": fresh.view(2, 2).t()}, frees, "x", fresh.view(2, 2).t())


def _errors(res: tuple) -> list[str]:
    assert all(s == "error" for s, _, _ in res), res
    return [m for _, m, _ in res]


def test_wrong_shape_input_raises_naming_the_input(two_ranks: dict) -> None:
    m0, m1 = _errors(two_ranks["results"]["err/wrong_shape"])
    assert "rank 0" in m0 and "w1" in m0 and "(3, 5)" in m0 and "(32, 64)" in m0 and "expects" in m0
    assert "invalid local inputs on rank(s) [0]" in m1 and "w1" in m1


def test_missing_input_raises(two_ranks: dict) -> None:
    m0, m1 = _errors(two_ranks["results"]["err/missing"])
    assert "rank 1" in m1 and "missing local input" in m1 and "w1" in m1
    assert "rank(s) [1]" in m0


def test_digest_mismatch_raises_on_every_rank(two_ranks: dict) -> None:
    for r, (status, msg, secs) in enumerate(two_ranks["results"]["err/digest"]):
        assert status == "error" and "digest mismatch" in msg and "ranks [1]" in msg and f"rank {r}" in msg
        assert secs < 10


def test_world_too_small(two_ranks: dict) -> None:
    for msg in _errors(two_ranks["results"]["err/world"]):
        assert "world size" in msg and "[2, 3]" in msg


def test_validate_reports_mismatched_shapes_on_every_rank(two_ranks: dict) -> None:
    for msg in _errors(two_ranks["results"]["err/validate_shapes"]):
        assert "step 0 (allgather" in msg and "mismatched shapes" in msg


def test_bad_attribute_raises_on_every_rank(two_ranks: dict) -> None:
    for msg in _errors(two_ranks["results"]["err/bad_dim"]):
        assert "step 0 (reduce_scatter" in msg and "dim=5" in msg


def test_group_usable_after_errors(two_ranks: dict) -> None:
    check_program_result(two_ranks["results"]["after_errors"], two_ranks["prog"], two_ranks["prog_inputs"], 2)


# ---- 4 ranks: 1-D MESH4, 2x2 meshes, permuted meshes, a sub-mesh ------------------------------------
PERM2D = rs.DeviceMesh([[3, 1], [0, 2]])
PLANS_4 = {b.__name__ + ("" if b().tensors[b().inputs[0]].mesh in (P.MESH2D, P.MESH4) else "@perm"): b for b in [
    *[b for b in P.ALL if b().tensors[b().inputs[0]].mesh.size == 4],
    P.redistribute([rs.Shard(0)], [rs.Replicate()], P.MESH4),
    P.redistribute([rs.Partial()], [rs.Replicate()], P.MESH4),
    P.redistribute([rs.Partial()], [rs.Shard(0)], P.MESH4),
    P.redistribute([rs.Shard(0)], [rs.Shard(1)], P.MESH4),
    P.redistribute([rs.Partial(), rs.Partial()], [rs.Shard(0), rs.Replicate()], P.MESH2D),
    P.redistribute([rs.Shard(0), rs.Shard(1)], [rs.Shard(1), rs.Shard(0)], PERM2D),
    P.redistribute([rs.Partial(), rs.Shard(1)], [rs.Shard(0), rs.Shard(1)], PERM2D),
    P.redistribute([rs.Shard(1)], [rs.Shard(0)], rs.DeviceMesh([2, 0, 3, 1])),
]}


@pytest.fixture(scope="module")
def four_ranks() -> dict[str, Any]:
    cases: dict[str, tuple] = {}
    jobs: list = []
    for name, b in PLANS_4.items():
        cases[name] = plan_case(b)
        _, plan, _, loc = cases[name]
        jobs.append((name, "plan", (plan, loc, {})))
    jobs.append(("mesh2d_block/fallback", "plan", (cases["mesh2d_block"][1], cases["mesh2d_block"][3],
                                                   {"fallback": "always"})))
    progs = {"program_2d": program_2d(), "program_sub": program_sub()}
    prog_inputs = {k: program_inputs(p, 2) for k, p in progs.items()}
    for k, p in progs.items():
        for v, kw in PROGRAM_VARIANTS.items():
            jobs.append((f"{k}/{v}", "program", (p, prog_inputs[k], kw)))
    # last: rank 1 fails before the first collective, rank 2 times out in it (2 s team-group timeout)
    sub = progs["program_sub"]
    jobs.append(("err/timeout", "program", (sub, {2: prog_inputs["program_sub"][2], 1: {}},
                                            {"check_inputs": False, "timeout_s": 2})))
    return {"cases": cases, "results": gather_results(4, jobs), "progs": progs, "prog_inputs": prog_inputs}


@pytest.mark.parametrize("name", sorted(PLANS_4))
def test_plans_four_ranks(four_ranks: dict, name: str) -> None:
    f, plan, inputs, _ = four_ranks["cases"][name]
    check_plan_result(four_ranks["results"][name], f, plan, inputs, 4)
    if name == "mesh2d_block":
        check_plan_result(four_ranks["results"][name + "/fallback"], f, plan, inputs, 4)


@pytest.mark.parametrize("prog", ["program_2d", "program_sub"])
@pytest.mark.parametrize("variant", sorted(PROGRAM_VARIANTS))
def test_all_collectives_4_ranks_match_simulator(four_ranks: dict, prog: str, variant: str) -> None:
    check_program_result(four_ranks["results"][f"{prog}/{variant}"], four_ranks["progs"][prog],
                         four_ranks["prog_inputs"][prog], 4)


def test_collective_timeout_becomes_reshard_error(four_ranks: dict) -> None:
    res = four_ranks["results"]["err/timeout"]
    assert res[0][:2] == ("ok", {}) and res[3][:2] == ("ok", {})
    assert res[1][0] == "error" and "missing local input 'a'" in res[1][1]
    status, msg, secs = res[2]
    # the 2 s team-group timeout also bounds the group's set-up: on a loaded machine the
    # rendezvous itself can be what times out; either way rank 2 must raise, named, promptly
    in_collective = "rank 2: step 0 (allgather 'a' -> 'ag')" in msg and "failed in torch.distributed (gloo)" in msg
    in_setup = "rank 2: creating the process group over ranks [1, 2] failed" in msg
    assert status == "error" and (in_collective or in_setup), msg
    assert secs < 15


# ---- launch itself --------------------------------------------------------------------------------
def test_launch_reports_digest_mismatch_without_hanging() -> None:
    prog = program_1d()
    other = Program(prog.mesh_shape, prog.mesh_ranks, prog.inputs, prog.outputs, prog.steps[1:])
    t = time.monotonic()
    with pytest.raises(rs.ReshardError) as e:
        launch(mismatch_worker, 2, {0: prog, 1: other}, timeout_s=TIMEOUT_S)
    assert time.monotonic() - t < 30
    msg = str(e.value)
    assert "digest mismatch" in msg and "ranks [1]" in msg and "rank 0 failed" in msg and "rank 1 failed" in msg


def test_launch_reports_failing_rank_and_terminates_waiting_peers() -> None:
    t = time.monotonic()
    with pytest.raises(rs.ReshardError) as e:
        launch(failing_worker, 2, timeout_s=TIMEOUT_S, grace_s=3.0)
    assert time.monotonic() - t < 30
    msg = str(e.value)
    assert msg.index("rank 1 failed") < msg.find("rank 0")
    assert "ValueError: boom on rank 1" in msg


def test_runtime_needs_an_initialized_process_group() -> None:
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(rs.ReshardError, match="not initialized"):
        DistRuntime(program_1d())


def test_single_process_group_in_process(tmp_path: Any) -> None:
    """A 1-rank gloo world in this process: teams of one, and the gloo 'unsupported' fallback."""
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        prog = Program((1,), (0,), ("a",), ("ag", "rs", "sr"), (
            S("allgather", "ag", ["a"], axis=0, dim=1),
            S("reduce_scatter", "rs", ["a"], axis=0, dim=0, op="max"),
            S("send_recv", "sr", ["a"], pairs=((0, 0),)),
        ))
        a = torch.randn(4, 6)
        rt = DistRuntime(prog, validate=True)
        out = rt.run({"a": a})
        want = simulate(prog, {0: {"a": a}}, run_local)[0]
        assert sorted(out) == sorted(want) and all(torch.equal(out[k], want[k]) for k in want)
        with pytest.raises(rs.ReshardError, match="missing local input 'a'"):
            rt.run({})

        def unsupported() -> str:
            raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")
        assert rt._native_or_fallback("reduce_scatter", None, unsupported, lambda: "portable") == "portable"
        assert "reduce_scatter" in rt._use_fallback  # later calls go straight to the portable form
        assert rt._native_or_fallback("reduce_scatter", None, lambda: "native", lambda: "portable") == "portable"

        def broken() -> str:
            raise RuntimeError("connection reset")
        with pytest.raises(RuntimeError, match="connection reset"):
            rt._native_or_fallback("allgather", None, broken, lambda: "portable")
        rt.close()
    finally:
        dist.destroy_process_group()


# ---- the shape-only checks agree with the reference collectives --------------------------------
_CHECK_CASES = [
    ("allgather", {"dim": 1}, [(4, 6), (4, 6)]), ("allgather", {"dim": 2}, [(4, 6), (4, 6)]),
    ("allgather", {"dim": -2}, [(4, 6), (4, 6)]), ("allgather", {}, [(4, 6), (4, 6)]),
    ("allgather", {"dim": 0}, [(4, 6), (4, 5)]), ("allgather", {"dim": 0}, [(4, 6), ("int64", (4, 6))]),
    ("reduce_scatter", {"dim": 1, "op": "max"}, [(4, 6), (4, 6)]), ("reduce_scatter", {"dim": 1}, [(4, 5), (4, 5)]),
    ("reduce_scatter", {"dim": 0, "op": "min"}, [(4, 6), (4, 6)]), ("allreduce", {"op": "avg"}, [(3,), (3,)]),
    ("allreduce", {}, [(3,), (3,)]), ("all_to_all", {"split_dim": 1, "cat_dim": 0}, [(4, 6), (4, 6)]),
    ("all_to_all", {"split_dim": 0, "cat_dim": 3}, [(4, 6), (4, 6)]),
    ("all_to_all", {"split_dim": 1}, [(4, 6), (4, 6)]),
    ("all_to_all", {"split_dim": 0, "cat_dim": 0}, [(3, 6), (3, 6)]), ("broadcast", {"root": 1}, [(2,), (2,)]),
    ("broadcast", {"root": 2}, [(2,), (2,)]), ("broadcast", {"root": True}, [(2,), (2,)]),
    ("scatter", {"root": 0, "dim": 0}, [(4, 6), (0,)]), ("scatter", {"root": 1, "dim": 0}, [(4, 6), (3,)]),
    ("scatter", {"root": 0, "dim": 1}, [(4, 5), (4, 5)]),
    ("scatter", {"root": 0, "dim": 0}, [(4, 6), ("int64", (4, 6))]),
    ("gather", {"root": 0, "dim": 1}, [(4, 6), (4, 6)]), ("gather", {"root": 0}, [(4, 6), (4, 6)]),
    ("gather", {"root": 0, "dim": 0}, [(4, 6), (5, 6)]),
]


@pytest.mark.parametrize("kind,attrs,shapes", _CHECK_CASES)
def test_shape_checks_match_reference(kind: str, attrs: dict, shapes: list) -> None:
    from reshard.runtime.distributed import _Spec, check_team_collective
    from reshard.runtime.simulator import run_team_collective
    specs, xs = [], []
    for s in shapes:
        dtype, shape = (getattr(torch, s[0]), s[1]) if isinstance(s[0], str) else (torch.float32, s)
        specs.append(_Spec(shape, dtype))
        xs.append(torch.zeros(shape, dtype=dtype))
    step = Step.make(kind, "o", ["i"], axis=0, **attrs)
    try:
        run_team_collective(step, 3, xs)
        want = None
    except rs.ReshardError as e:
        want = str(e)
    try:
        check_team_collective(step, 3, specs)
        got = None
    except rs.ReshardError as e:
        got = str(e)
    assert got == want
