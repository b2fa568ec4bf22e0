"""int64 / int32 / bool plans run over gloo (issue 20): two spawned ranks, the runtime's real
collectives (allgather, allreduce and reduce-scatter with sum and max on ints, allgather of
bools), outputs unsharded in the parent equal the reference exactly; all-to-all, allgather
and broadcast of int and bool buffers equal the in-process simulator's."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import reshard as rs
from reshard.codegen.program import Program, Step
from reshard.ir.sharding import unshard
from reshard.runtime.distributed import DistRuntime, launch, run_plan
from reshard.runtime.local_ops import run_local
from reshard.runtime.simulator import simulate

from reshard.testing.op_oracle import MESH1, assert_same, inputs_of, rand

pytestmark = [pytest.mark.multiproc, pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")]


def run_jobs(rank: int, jobs: list[tuple[rs.Plan, dict]], programs: list[tuple[Program, dict]]) -> tuple:
    """Each job's plan, then each program, run on this rank's local inputs."""
    return ([run_plan(plan, locals_by_rank[rank]) for plan, locals_by_rank in jobs],
            [DistRuntime(prog).run(ins[rank]) for prog, ins in programs])


def _all_to_all(dtype: str) -> tuple[Program, dict]:
    """Every collective kind on one buffer of ``dtype`` (sum and max only for ints)."""
    steps = [Step.make("all_to_all", "aa", ["a"], axis=0, split_dim=1, cat_dim=0),
             Step.make("allgather", "ag", ["a"], axis=0, dim=1),
             Step.make("broadcast", "bc", ["a"], axis=0, root=1)]
    gen = torch.Generator().manual_seed(7)
    ins = {r: {"a": rand((4, 8), dtype, gen)} for r in (0, 1)}
    return Program((2,), (0, 1), ("a",), ("aa", "ag", "bc"), tuple(steps)), ins


def _program(dtype: str, src: list, dst: list) -> rs.Fusion:
    f = rs.Fusion()
    f.output(f.input("x", (4, 8), dtype, MESH1, src), dst)
    return f


def _programs() -> list[rs.Fusion]:
    out = []
    for dtype in ("int64", "int32", "bool"):
        out.append(_program(dtype, [rs.Shard(1)], [rs.Replicate()]))   # allgather
    for dtype in ("int64", "int32"):
        for op in ("sum", "max"):
            out.append(_program(dtype, [rs.Partial(op)], [rs.Replicate()]))  # allreduce
            out.append(_program(dtype, [rs.Partial(op)], [rs.Shard(0)]))     # reduce-scatter
    return out


@pytest.mark.slow
def test_int_and_bool_plans_over_gloo():
    fusions = _programs()
    plans = [rs.optimize(f) for f in fusions]
    inputs = [inputs_of(f, k) for k, f in enumerate(fusions)]
    jobs = [(p, p.shard_inputs(x, torch.Generator().manual_seed(k))) for k, (p, x) in enumerate(zip(plans, inputs))]
    kinds = {c.kind for p in plans for c in p.communications}
    assert kinds >= {"allgather", "allreduce", "reduce_scatter"}, kinds
    programs = [_all_to_all(d) for d in ("int64", "int32", "bool")]
    per_rank = launch(run_jobs, 2, jobs, programs, timeout_s=60)
    for k, (f, plan, x) in enumerate(zip(fusions, plans, inputs)):
        for i, (ref, (_, ts)) in enumerate(zip(rs.run_reference(f, x), plan.lowered.outputs)):
            got = unshard({r: per_rank[r][0][k][i] for r in ts.mesh.ranks}, ts)
            assert_same(got, ref)
    for k, (prog, ins) in enumerate(programs):
        want = simulate(prog, ins, run_local)
        for r in (0, 1):
            for name in prog.outputs:
                assert_same(per_rank[r][1][k][name], want[r][name])
