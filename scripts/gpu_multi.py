#!/usr/bin/env python3
"""Multi-GPU check of reshard plans: one process per rank, NCCL on GPUs (gloo on the CPU).

Three parts, each printed by rank 0 as a markdown table as soon as it is done (a header
first: date, device, torch / NCCL versions, world size, the exact command line):

1. **Correctness** (``correctness``): the suite programs of ``benchmarks/suite.py`` whose mesh
   fits the world size N (1-D meshes of N; 2-D meshes 2x(N/2) when N >= 4), mesh-to-mesh
   transfers (``cross_mesh``: the suite's, or 1 -> 1 rank at N = 2; a two-stage pipeline
   N/2 -> N/2; at N = 8 a 2x2 -> 2x2 transfer), the Megatron MLP (bf16) and
   ``reshard.examples.transformer_block`` (bf16 and fp32).  Every rank optimizes the Fusion
   itself; the ranks' program digests are all-gathered and must be equal; every rank runs
   ``plan.run`` (local steps with ``run_local``, and on GPUs once more with
   ``gpu_local_step``, reshard's NVRTC kernels); rank 0 gathers the outputs, unshards them
   (replicas must agree) and compares them with ``reshard.run_reference`` in float64:
   ||out - ref|| / ||ref|| <= tol, tol by the program's least precise dtype as in
   ``scripts/gpu_check.py`` (float32 1e-5, bfloat16 1e-2, float16 5e-3).
2. **Collectives inside the plan vs raw torch.distributed** (``collectives``): large
   realistic plans (bf16 MLP block hidden 8192, seq 8192, batch 1: sequence parallel and
   replicated activations; a 1-D all-to-all; 2-D resharding when N >= 4).  Each plan runs
   in ``TimedRuntime``, a subclass of ``DistRuntime`` that, only while timing, puts a team
   barrier (a 1-element all_reduce + device sync) before each team collective step and
   times (CUDA events; wall clock on the CPU) the whole step (``_team_collective``: staging
   copies, the collective, re-ordering and concatenation) and the communication call inside
   it (``_comm``).  Then the raw ``torch.distributed`` call (all_gather_into_tensor,
   reduce_scatter_tensor, all_reduce, all_to_all_single, broadcast) runs on the same team's
   process group on same-shaped buffers, after the same barrier.  Medians over ``--runs``;
   busbw as nccl-tests (``reshard.rules.cost_profile.bus_factor``); ratio = raw time / plan
   step time (goal >= 95%).  Both are also timed back to back, as nccl-tests times: 10 calls
   after one barrier, the plan's step re-run on its recorded input (host work then overlaps
   the previous call's device work, as inside a program).
3. **End to end vs DTensor eager** (``e2e``): a TP+SP MLP block ``gelu(x @ w1) @ w2`` and an
   attention block (separate q/k/v projections, heads sharded, ``tanh(q k^T / sqrt(d)) v``
   as ``reshard.examples.attention_block``, output projection), x ``[b, s, h]`` sequence
   sharded (``Shard(1)``) in and out, bf16.  reshard: ``DistRuntime.from_plan(plan)`` (what
   ``plan.run`` executes) built once, then ``run`` per iteration, with ``run_local``
   (plan.run's default), with ``check_inputs=False``, and on GPUs with ``gpu_local_step``.
   DTensor: ``parallelize_module`` with ``ColwiseParallel(input_layouts=Shard(1))`` /
   ``RowwiseParallel(output_layouts=Shard(1))`` (MLP), and for attention
   ``PrepareModuleInput(Shard(1) -> Replicate())`` on the block, ``ColwiseParallel`` on
   q/k/v and ``RowwiseParallel(output_layouts=Shard(1))`` on the output projection.  Same
   global inputs and weights on every rank; median of CUDA-event timings (wall clock on
   the CPU) after a world barrier per iteration, variants interleaved; the outputs of both
   are compared (relative norm of the difference over all ranks, tol 2x the dtype's).

A failing case is a row in its table; the script goes on.  Exit status: 0 when every
correctness check passed (part 1 rows, e2e output agreement), 1 otherwise.

Usage::

    python3 scripts/gpu_multi.py                    # all GPUs of the machine, NCCL, real sizes
    python3 scripts/gpu_multi.py --nprocs 4 --parts correctness,e2e
    python3 scripts/gpu_multi.py --tiny --nprocs 2  # CPU (gloo) smoke run, tiny sizes
    torchrun --nproc-per-node 8 scripts/gpu_multi.py   # or under torchrun (env://)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
for _p in (_ROOT, _HERE):  # the package, and plan_check_util beside this script
    if _p not in sys.path:
        sys.path.insert(0, _p)

# NVLink multicast stays off on shared machines (KINDS.md); spawned ranks inherit these
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import reshard as rs  # noqa: E402
from plan_check_util import OUT_TOL, as_float64, as_float64_inputs, low_dtype  # noqa: E402
from benchmarks import suite as S  # noqa: E402
from reshard.cli import random_inputs  # noqa: E402
from reshard.rules.cost_profile import bus_factor  # noqa: E402
from reshard.examples import transformer_block  # noqa: E402
from reshard.ir.fusion import DTYPES  # noqa: E402
from reshard.ir.sharding import shard as shard_global  # noqa: E402
from reshard.ir.sharding import unshard  # noqa: E402
from reshard.runtime.distributed import TORCH_CALLS, DistRuntime, init_from_env  # noqa: E402
from reshard.runtime.local_ops import run_local  # noqa: E402

BACK_TO_BACK = 10  # calls per back-to-back timing (part 2)
REPLICA_TOL = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2, "float64": 1e-8}
PARTS = ("correctness", "collectives", "e2e")


# ==== configuration ==================================================================================
@dataclasses.dataclass
class Cfg:
    """Everything the ranks need (picklable: it travels to spawned processes)."""

    tiny: bool
    parts: tuple[str, ...]
    runs: int
    warmup: int
    hidden: int
    seq: int
    batches: tuple[int, ...]
    heads: int
    dtype: str
    k: int
    profile: str | None
    seed: int
    timeout_s: float
    command: str
    cases: tuple[str, ...] = ()

    def dims(self, n: int) -> tuple[int, int, int]:
        """(seq, hidden, heads) of the part 2/3 blocks on ``n`` ranks."""
        if self.tiny:
            return 16 * n, 32 * n, 2 * n
        return self.seq, self.hidden, self.heads

    def wanted(self, name: str) -> bool:
        return not self.cases or any(c in name for c in self.cases)


@dataclasses.dataclass
class Ctx:
    """This rank's view of the run."""

    rank: int
    world: int
    device: torch.device
    backend: str
    cfg: Cfg
    gpu_step: Callable | None
    gpu_step_note: str

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


# ==== small helpers ==================================================================================
def short(e: BaseException, n: int = 160) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:n]


def md(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def all_gather(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def first_error(errs: list[Any]) -> str | None:
    bad = [(r, e) for r, e in enumerate(errs) if e]
    if not bad:
        return None
    r, e = bad[0]
    return f"rank {r}: {e}" + (f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else "")


def world_sync(ctx: Ctx, group: Any = None) -> None:
    """A barrier that also drains the device: a 1-element all_reduce on ``group``, then a
    device synchronize (every member has reached this point and its GPU is idle)."""
    t = torch.zeros(1, device=ctx.device)
    dist.all_reduce(t, group=group)
    if ctx.cuda:
        torch.cuda.synchronize()


class Timer:
    """CUDA events on the current stream (GPU) or perf_counter (CPU); ``ms()`` after ``stop``."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        if cuda:
            self.a = torch.cuda.Event(enable_timing=True)
            self.b = torch.cuda.Event(enable_timing=True)

    def start(self) -> "Timer":
        if self.cuda:
            self.a.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def stop(self) -> "Timer":
        if self.cuda:
            self.b.record()
        else:
            self.t1 = time.perf_counter()
        return self

    def ms(self) -> float:
        if self.cuda:
            self.b.synchronize()
            return self.a.elapsed_time(self.b)
        return (self.t1 - self.t0) * 1e3


def slowest(values: list[float]) -> float:
    """The largest of the ranks' times (NaN only when all are NaN)."""
    vals = [v for v in values if not math.isnan(v)]
    return max(vals) if vals else float("nan")


def rel_norm(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (inf when out has NaNs that ref has not)."""
    o, r = out.double(), ref.double().to(out.device)
    if torch.isnan(o).any() and not torch.isnan(r).any():
        return float("inf")
    return ((o - r).norm() / r.norm().clamp_min(1e-300)).item() if r.numel() else 0.0


def fmt_comms(plan: rs.Plan) -> str:
    parts = []
    for c in plan.communications:
        parts.append(f"{c.kind}({c.axis})")
    return ", ".join(parts) if parts else "none"


def optimize(ctx: Ctx, f: rs.Fusion) -> rs.Plan:
    return rs.optimize(f, cost_profile=ctx.cfg.profile)


def local_inputs(plan: rs.Plan, inputs: dict[str, torch.Tensor], rank: int, device: torch.device, seed: int,
                 verify: bool = False, exact_partial: bool = True) -> dict[str, torch.Tensor]:
    """This rank's program inputs from the global ``inputs`` (equal on every rank).

    Inputs whose sharding is DTensor placements are cut with ``chunk`` (no index tensors:
    fine at 8192 x 32768); a Partial(sum) axis puts the value on its coordinate 0 and zeros
    elsewhere (Partial(max): the value everywhere), as ``shard`` does without a generator.
    Loop-domain shardings, and Partial inputs when ``exact_partial``, go through
    ``reshard.ir.sharding.shard`` with random summands (a generator seeded per input,
    identical on every rank).  ``verify``: compare chunked shards with ``shard``'s bit for bit."""
    out: dict[str, torch.Tensor] = {}
    for i, (buf, name, ts) in enumerate(plan.lowered.inputs):
        if rank not in ts.mesh.ranks:
            continue
        g = inputs[name]
        try:
            pl = S.to_dtensor_placements(ts)
        except rs.ReshardError:
            pl = None
        gen = torch.Generator().manual_seed(seed * 1000 + i)
        if pl is None or (exact_partial and any(p.is_partial() for p in pl)):
            loc = shard_global(g.cpu(), ts, generator=gen)[rank]
        else:
            coords = ts.mesh.coords(rank)
            loc = g
            for a, p in enumerate(pl):
                if p.is_shard():
                    loc = loc.chunk(ts.mesh.shape[a], p.dim)[coords[a]]
            zero = any(p.is_partial() and getattr(p, "reduce_op", "sum") == "sum" and coords[a] != 0
                       for a, p in enumerate(pl))
            loc = torch.zeros_like(loc) if zero else loc.contiguous()
            if loc.untyped_storage().nbytes() > loc.numel() * loc.element_size():
                loc = loc.clone()  # a view into the global tensor would keep all of it alive
            if verify:
                ref = shard_global(g.cpu(), ts)[rank]
                if not torch.equal(loc.cpu(), ref):
                    raise rs.ReshardError(f"local_inputs: chunked shard of {name!r} differs from reshard's shard()")
        want = tuple(plan.lowered.local_inputs[buf][0])
        if tuple(loc.shape) != want:
            raise rs.ReshardError(f"local_inputs: {name!r} shard is {tuple(loc.shape)}, the plan expects {want}")
        out[buf] = loc.to(device)
    return out


# ==== programs =======================================================================================
def mesh1d(n: int) -> rs.DeviceMesh:
    return rs.DeviceMesh(list(range(n)), ("tp",))


def megatron_mlp(n: int, seq: int, hidden: int, dtype: str = "bfloat16") -> rs.Fusion:
    """examples/megatron_mlp.py on ``n`` ranks: sequence-parallel x, column/row-parallel weights."""
    m = mesh1d(n)
    f = rs.Fusion()
    x = f.input("x", (seq, hidden), dtype, m, [rs.Shard(0)])
    w1 = f.input("w1", (hidden, 4 * hidden), dtype, m, [rs.Shard(1)])
    w2 = f.input("w2", (4 * hidden, hidden), dtype, m, [rs.Shard(0)])
    f.output(f.matmul(f.gelu(f.matmul(x, w1)), w2), [rs.Shard(0)])
    return f


def mlp_replicated(n: int, seq: int, hidden: int, dtype: str = "bfloat16") -> rs.Fusion:
    """Tensor-parallel MLP with replicated activations in and out (an allreduce plan)."""
    m = mesh1d(n)
    f = rs.Fusion()
    x = f.input("x", (seq, hidden), dtype, m, [rs.Replicate()])
    w1 = f.input("w1", (hidden, 4 * hidden), dtype, m, [rs.Shard(1)])
    w2 = f.input("w2", (4 * hidden, hidden), dtype, m, [rs.Shard(0)])
    f.output(f.matmul(f.gelu(f.matmul(x, w1)), w2), [rs.Replicate()])
    return f


def redistribute_prog(mesh: rs.DeviceMesh, shape: tuple[int, int], src: list, dst: list,
                      dtype: str = "bfloat16") -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", shape, dtype, mesh, src)
    f.output(f.redistribute(x, dst), dst)
    return f


def pipeline(n: int, seq: int, hidden: int) -> rs.Fusion:
    """examples/pipeline_cross_mesh.py with stages on ranks [0, n/2) and [n/2, n)."""
    half = n // 2
    st0 = rs.DeviceMesh(list(range(half)), ("tp",))
    st1 = rs.DeviceMesh(list(range(half, n)), ("tp",))
    f = rs.Fusion()
    x = f.input("x", (seq, hidden), "float32", st0, [rs.Shard(0)])
    w0 = f.input("w0", (hidden, hidden), "float32", st0, [rs.Replicate()])
    h1 = f.redistribute(f.gelu(f.matmul(x, w0)), [rs.Replicate()], mesh=st1)
    w1 = f.input("w1", (hidden, hidden), "float32", st1, [rs.Shard(1)])
    f.output(f.matmul(h1, w1), [rs.Shard(1)])
    return f


def cross_mesh_2d(k: int) -> rs.Fusion:
    """A 2x2 -> 2x2 mesh-to-mesh transfer on 8 ranks, [S0, S1] -> [R, S0]."""
    a = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))
    b = rs.DeviceMesh([[4, 5], [6, 7]], ("x", "y"))
    f = rs.Fusion()
    x = f.input("x", (32 * k, 96), "float32", a, [rs.Shard(0), rs.Shard(1)])
    f.output(f.redistribute(x, [rs.Replicate(), rs.Shard(0)], mesh=b), [rs.Replicate(), rs.Shard(0)])
    return f


def mlp_block3(n: int, b: int, s: int, h: int, dtype: str) -> rs.Fusion:
    """TP+SP MLP block on x [b, s, h] Shard(1) (sequence) in and out."""
    m = mesh1d(n)
    f = rs.Fusion()
    x = f.input("x", (b, s, h), dtype, m, [rs.Shard(1)])
    w1 = f.input("w1", (h, 4 * h), dtype, m, [rs.Shard(1)])
    w2 = f.input("w2", (4 * h, h), dtype, m, [rs.Shard(0)])
    f.output(f.matmul(f.gelu(f.matmul(x, w1)), w2), [rs.Shard(1)])
    return f


def attention_block3(n: int, b: int, s: int, h: int, heads: int, dtype: str) -> rs.Fusion:
    """Attention on x [b, s, h] Shard(1): column-parallel wq/wk/wv, heads sharded,
    ``tanh(q k^T / sqrt(d)) v`` (the score mix of ``reshard.examples.attention_block``),
    row-parallel wo, output Shard(1)."""
    m = mesh1d(n)
    hd = h // heads
    f = rs.Fusion()
    x = f.input("x", (b, s, h), dtype, m, [rs.Shard(1)])
    ws = [f.input(nm, (h, h), dtype, m, [rs.Shard(1)]) for nm in ("wq", "wk", "wv")]
    wo = f.input("wo", (h, h), dtype, m, [rs.Shard(0)])
    q, k, v = (f.permute(f.reshape(f.matmul(x, w), (b, s, heads, hd)), (0, 2, 1, 3)) for w in ws)
    scores = f.tanh(f.scale(f.matmul(q, f.permute(k, (0, 1, 3, 2))), hd ** -0.5))
    ctx = f.reshape(f.permute(f.matmul(scores, v), (0, 2, 1, 3)), (b, s, h))
    f.output(f.matmul(ctx, wo), [rs.Shard(1)])
    return f


def correctness_cases(n: int, cfg: Cfg) -> list[tuple[str, str, Callable[[], rs.Fusion]]]:
    """(name, mesh label, builder) of every part-1 case for world size ``n``."""
    k = 1 if cfg.tiny else S.BENCH_K
    cases: list[tuple[str, str, Callable[[], rs.Fusion]]] = []
    for c in S.SUITE:
        if c.world == n and (len(c.mesh_shape) == 1 or c.mesh_shape == (2, n // 2)):
            cases.append((c.name, c.mesh_label, lambda c=c: c.build(S.make_mesh(c.mesh_shape), k)))
    if n == 2:
        cases.append(("cross_mesh", "1->1", lambda: S.cross_mesh(S.make_mesh((2,)), k)))
    if n % 2 == 0:
        seq, hid = (8 * n, 16) if cfg.tiny else (1024, 512)
        cases.append(("pipeline_cross_mesh", f"{n // 2}->{n // 2}", lambda: pipeline(n, seq, hid)))
    if n == 8:
        cases.append(("cross_mesh_2d", "2x2->2x2", lambda: cross_mesh_2d(k)))
    seq, hid = (16 * n, 32) if cfg.tiny else (2048, 1024)
    cases.append(("megatron_mlp bf16", str(n), lambda: megatron_mlp(n, seq, hid)))
    heads = max(4, n) if cfg.tiny else 16
    seq, hid = (8 * n, 8 * heads) if cfg.tiny else (1024, 1024)
    for dt in ("bfloat16", "float32"):
        cases.append((f"transformer_block {'bf16' if dt == 'bfloat16' else 'fp32'}", str(n),
                      lambda dt=dt: transformer_block(mesh1d(n), seq=seq, hidden=hid, heads=heads, dtype=dt)))
    return [c for c in cases if cfg.wanted(c[0])]


def collective_programs(n: int, cfg: Cfg) -> list[tuple[str, str, Callable[[], rs.Fusion]]]:
    """(name, mesh label, builder) of the part-2 plans."""
    s, h, _ = cfg.dims(n)
    dt = cfg.dtype
    progs: list[tuple[str, str, Callable[[], rs.Fusion]]] = [
        (f"mlp_sp s{s} h{h}", str(n), lambda: megatron_mlp(n, s, h, dt)),
        (f"mlp_tp s{s} h{h}", str(n), lambda: mlp_replicated(n, s, h, dt)),
        (f"redistribute [S1]->[S0] {s}x{h}", str(n),
         lambda: redistribute_prog(mesh1d(n), (s, h), [rs.Shard(1)], [rs.Shard(0)], dt)),
    ]
    if n >= 4 and n % 2 == 0:
        shape = (2, n // 2)
        m2 = S.make_mesh(shape)
        label = f"2x{n // 2}"
        progs += [
            (f"redistribute [R,S1]->[R,S0] {s}x{h}", label,
             lambda: redistribute_prog(m2, (s, h), [rs.Replicate(), rs.Shard(1)], [rs.Replicate(), rs.Shard(0)], dt)),
            (f"redistribute [S0,S1]->[S0,R] {s}x{h}", label,
             lambda: redistribute_prog(m2, (s, h), [rs.Shard(0), rs.Shard(1)], [rs.Shard(0), rs.Replicate()], dt)),
            (f"redistribute [P,S1]->[R,S1] {s}x{h}", label,
             lambda: redistribute_prog(m2, (s, h), [rs.Partial(), rs.Shard(1)], [rs.Replicate(), rs.Shard(1)], dt)),
        ]
    return [p for p in progs if cfg.wanted(p[0])]


# ==== part 1: correctness =============================================================================
def run_outputs(ctx: Ctx, plan: rs.Plan, local: dict[str, torch.Tensor], local_step: Callable) -> list:
    outs = plan.run(local, local_step=local_step)
    if not outs:
        outs = tuple(None for _ in plan.lowered.outputs)
    return [None if o is None else o.detach().cpu() for o in outs]


def check_outputs(ctx: Ctx, f: rs.Fusion, plan: rs.Plan, gathered: list[list], refs: list[torch.Tensor]) -> float:
    """Rank 0: unshard the gathered outputs (replicas checked) and return the largest error."""
    dt = low_dtype(f)
    err = 0.0
    for i, ((_, ts), ref) in enumerate(zip(plan.lowered.outputs, refs)):
        locs = {r: gathered[r][i] for r in ts.mesh.ranks}
        missing = [r for r, t in locs.items() if t is None]
        if missing:
            raise rs.ReshardError(f"output {i}: ranks {missing} returned no shard")
        got = unshard(locs, ts, check_replicas=True, rtol=REPLICA_TOL[dt], atol=REPLICA_TOL[dt])
        want_dtype = DTYPES[f.tensors[f.outputs[i][0]].dtype]
        if got.dtype != want_dtype:
            raise rs.ReshardError(f"output {i}: dtype {got.dtype}, expected {want_dtype}")
        err = max(err, rel_norm(got.to(ref.device), ref))
    return err


def correctness_case(ctx: Ctx, name: str, mesh_label: str, build: Callable[[], rs.Fusion]) -> dict:
    row: dict[str, Any] = dict(case=name, mesh=mesh_label, colls="", digests="", err="", tol=float("nan"),
                               ok=False, notes="", seconds=0.0)
    t0 = time.perf_counter()
    plan = f = None
    err: str | None = None
    try:
        f = build()
        plan = optimize(ctx, f)
    except Exception as e:  # noqa: BLE001 - reported in the table
        err = "optimize: " + short(e)
    bad = first_error(all_gather(err))
    if bad:
        row["notes"] = bad
        return row
    assert plan is not None and f is not None
    row["colls"] = fmt_comms(plan)
    digests = all_gather(plan.digest())
    row["digests"] = "equal" if len(set(digests)) == 1 else f"{len(set(digests))} distinct"
    if len(set(digests)) != 1:
        row["notes"] = "ranks planned different programs: " + ", ".join(f"{r}:{d[:10]}" for r, d in enumerate(digests))
        return row
    dt = low_dtype(f)
    row["tol"] = OUT_TOL[dt]
    inputs = random_inputs(f, ctx.cfg.seed)
    executors: list[tuple[str, Callable]] = [("run_local", run_local)]
    if ctx.gpu_step is not None:
        executors.append(("gpu_local_step", ctx.gpu_step))
    refs: list[torch.Tensor] | None = None
    errs_txt, notes, ok = [], [], True
    for label, step_fn in executors:
        gathered_local: Any = None
        err = None
        try:
            small = all(t.numel() <= 1 << 21 for t in inputs.values())
            local = local_inputs(plan, inputs, ctx.rank, ctx.device, ctx.cfg.seed, verify=small)
            gathered_local = run_outputs(ctx, plan, local, step_fn)
            del local
        except Exception as e:  # noqa: BLE001
            err = f"{label}: " + short(e)
        got: list[Any] = [None] * ctx.world if ctx.rank == 0 else None  # type: ignore[assignment]
        dist.gather_object((err, gathered_local), got, dst=0)
        if ctx.rank != 0:
            continue
        bad = first_error([g[0] for g in got])
        if bad:
            ok = False
            notes.append(bad)
            errs_txt.append("-")
            continue
        try:
            if refs is None:
                refs = rs.run_reference(as_float64(f), {k: v.to(ctx.device) for k, v in as_float64_inputs(inputs).items()})
            e = check_outputs(ctx, f, plan, [g[1] for g in got], refs)
            errs_txt.append(f"{e:.2e}")
            if not e <= OUT_TOL[dt]:
                ok = False
                notes.append(f"{label}: rel err {e:.2e} > tol")
        except Exception as e:  # noqa: BLE001
            ok = False
            errs_txt.append("-")
            notes.append(f"{label}: " + short(e))
    row["err"] = " / ".join(errs_txt)
    row["ok"] = ok and ctx.rank == 0
    row["notes"] = "; ".join(notes)
    row["seconds"] = time.perf_counter() - t0
    return row


def part_correctness(ctx: Ctx) -> list[dict]:
    rows = []
    for name, label, build in correctness_cases(ctx.world, ctx.cfg):
        try:
            rows.append(correctness_case(ctx, name, label, build))
        except Exception as e:  # noqa: BLE001 - e.g. a gather failed; keep going
            traceback.print_exc()
            rows.append(dict(case=name, mesh=label, colls="", digests="", err="", tol=float("nan"), ok=False,
                             notes=short(e, 300), seconds=0.0))
        if ctx.cuda:
            torch.cuda.empty_cache()
    return rows


def render_correctness(ctx: Ctx, rows: list[dict]) -> str:
    ex = "run_local / gpu_local_step" if ctx.gpu_step is not None else "run_local"
    out = [f"## 1. Correctness on {ctx.world} ranks ({ctx.backend}): plan.run vs run_reference (float64)\n",
           f"rel err = ||out - ref|| / ||ref|| for each executor of the local steps ({ex}); "
           f"digests: the ranks' independently optimized host programs.\n",
           "| case | mesh | collectives | digests | rel err | tol | ok | s | notes |",
           "|---|---|---|---|---:|---:|---|---:|---|"]
    for r in rows:
        tol = "" if math.isnan(r["tol"]) else f"{r['tol']:.0e}"
        out.append(f"| {md(r['case'])} | {md(r['mesh'])} | {md(r['colls'])} | {r['digests']} | {r['err']} | {tol} | "
                   f"{'ok' if r['ok'] else 'FAIL'} | {r['seconds']:.1f} | {md(r['notes'])} |")
    n_ok = sum(r["ok"] for r in rows)
    out.append(f"\n{n_ok}/{len(rows)} correctness cases ok")
    return "\n".join(out)


# ==== part 2: collectives inside the plan vs raw ======================================================
class TimedRuntime(DistRuntime):
    """``DistRuntime`` that times its team collectives while ``timing`` is on (and behaves
    exactly as ``DistRuntime`` while it is off).

    Timed, per team collective step on a team of >= 2 ranks along a mesh axis: a team
    barrier (1-element all_reduce + device sync) first, then a timer around the whole step
    (``_team_collective``) and one around the communication call inside it (``_comm``)."""

    HOOKS = ("_team_collective", "_comm")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        missing = [m for m in self.HOOKS if not callable(getattr(DistRuntime, m, None))]
        if missing:  # the runtime was refactored: say so instead of timing nothing
            raise rs.ReshardError(f"TimedRuntime: DistRuntime has no {missing}; update scripts/gpu_multi.py")
        super().__init__(*args, **kwargs)
        self.timing = False
        self.records: list[dict] = []
        self._rec: dict | None = None

    def _timed_team(self, step: Any) -> Any:
        if step.attr("ranks") is not None:
            return None
        try:
            return self.teams.get(self.mesh.axis_index(step.attr("axis")))
        except (rs.ReshardError, TypeError):
            return None

    def _team_collective(self, step: Any, idx: int, env: dict[str, torch.Tensor]) -> None:
        team = self._timed_team(step) if self.timing else None
        if team is None:
            return super()._team_collective(step, idx, env)
        x = env.get(step.ins[0])
        sync_t = torch.zeros(1, device=self.device)
        dist.all_reduce(sync_t, group=team.group)
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        rec = dict(idx=idx, kind=step.kind, axis=self.mesh.axis_names[self.mesh.axis_index(step.attr("axis"))],
                   n=team.n, ranks=team.ranks,
                   shape=tuple(x.shape) if x is not None else None, dtype=x.dtype if x is not None else None,
                   op=step.attr("op", "sum"), root=step.attr("root"), step=Timer(cuda), comm=[],
                   step_obj=step, x=x)
        self._rec = rec
        rec["step"].start()
        try:
            super()._team_collective(step, idx, env)
        finally:
            rec["step"].stop()
            self._rec = None
        self.records.append(rec)

    def _comm(self, step: Any, idx: int, fn: Callable[[], Any]) -> Any:
        rec = self._rec
        if rec is None:
            return super()._comm(step, idx, fn)
        t = Timer(self.device.type == "cuda").start()
        try:
            return super()._comm(step, idx, fn)
        finally:
            rec["comm"].append(t.stop())


def raw_collective(ctx: Ctx, rec: dict, group: Any) -> tuple[str, Callable[[], Any]] | None:
    """The plain torch.distributed call for a recorded step, on same-shaped buffers."""
    kind, n, dtype = rec["kind"], rec["n"], rec["dtype"]
    numel = math.prod(rec["shape"])
    dev = ctx.device
    x = torch.randn(numel, device=dev).to(dtype)  # never time on zeros (METHOD.md)
    op = dist.ReduceOp.MAX if rec["op"] == "max" else dist.ReduceOp.SUM
    if kind == "allgather":
        out = torch.empty(n * numel, dtype=dtype, device=dev)
        return TORCH_CALLS[kind], lambda: dist.all_gather_into_tensor(out, x, group=group)
    if kind == "reduce_scatter":
        out = torch.empty(numel // n, dtype=dtype, device=dev)
        return TORCH_CALLS[kind], lambda: dist.reduce_scatter_tensor(out, x, op=op, group=group)
    if kind == "allreduce":
        return TORCH_CALLS[kind], lambda: dist.all_reduce(x, op=op, group=group)
    if kind == "all_to_all":
        out = torch.empty_like(x)
        return TORCH_CALLS[kind], lambda: dist.all_to_all_single(out, x, group=group)
    if kind == "broadcast" and rec["root"] is not None:
        src = rec["ranks"][rec["root"]]
        return TORCH_CALLS[kind], lambda: dist.broadcast(x, src=src, group=group)
    return None


def raw_portable(ctx: Ctx, rec: dict, group: Any) -> tuple[str, Callable[[], Any]] | None:
    """gloo lacks some single-tensor collectives: the list forms the runtime falls back to."""
    kind, n, dtype = rec["kind"], rec["n"], rec["dtype"]
    numel = math.prod(rec["shape"])
    x = torch.randn(numel, device=ctx.device).to(dtype)
    if kind == "allgather":
        parts = [torch.empty_like(x) for _ in range(n)]
        return "all_gather (list)", lambda: dist.all_gather(parts, x, group=group)
    if kind == "reduce_scatter":
        return "all_reduce (+chunk)", lambda: dist.all_reduce(x, group=group)
    if kind == "all_to_all":
        me = dist.get_rank()
        chunks = list(x.chunk(n))
        recv = [torch.empty_like(c) for c in chunks]
        peers = list(rec["ranks"])

        def p2p() -> None:
            ops = []
            for j, p in enumerate(peers):
                if p != me:
                    ops += [dist.P2POp(dist.isend, chunks[j], p), dist.P2POp(dist.irecv, recv[j], p)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return "send/recv pairs", p2p
    return None


def again(rt: "TimedRuntime", rec: dict) -> Callable[[], Any]:
    """The recorded step once more, untimed, on its recorded input (a fresh env each call:
    an in-place allreduce writes into that input, as the raw all_reduce does)."""
    step, idx, x = rec["step_obj"], rec["idx"], rec["x"].clone()  # the recorded input may be a plan output
    return lambda: DistRuntime._team_collective(rt, step, idx, {step.ins[0]: x})


def time_back_to_back(ctx: Ctx, fn: Callable[[], Any], group: Any) -> float:
    """Mean ms per call of ``BACK_TO_BACK`` calls issued back to back after one team barrier
    (as nccl-tests times): host work overlaps the previous call's device work, as in a
    program.  Median over ``--runs``."""
    fn()
    times = []
    for _ in range(ctx.cfg.runs):
        world_sync(ctx, group)
        t = Timer(ctx.cuda).start()
        for _ in range(BACK_TO_BACK):
            fn()
        times.append(t.stop().ms() / BACK_TO_BACK)
    return statistics.median(times)


def time_raw(ctx: Ctx, rec: dict, group: Any) -> tuple[str, float, float]:
    """Median ms of the raw call after the same team barrier as the plan's steps, and its
    back-to-back time (``time_back_to_back``)."""
    made = raw_collective(ctx, rec, group)
    if made is None:
        return "n/a", float("nan"), float("nan")
    label, fn = made
    try:
        fn()
    except (RuntimeError, NotImplementedError, AttributeError) as e:
        msg = str(e).lower()
        portable = raw_portable(ctx, rec, group)
        if ctx.backend != "gloo" or portable is None or not any(
                m in msg for m in ("not supported", "does not support", "not implemented", "unsupported")):
            raise
        label, fn = portable
        fn()
    for _ in range(ctx.cfg.warmup):
        fn()
    times = []
    for _ in range(ctx.cfg.runs):
        world_sync(ctx, group)
        t = Timer(ctx.cuda).start()
        fn()
        times.append(t.stop().ms())
    return label, statistics.median(times), time_back_to_back(ctx, fn, group)


def part_collectives(ctx: Ctx) -> list[dict]:
    rows: list[dict] = []
    for name, label, build in collective_programs(ctx.world, ctx.cfg):
        rt = None
        try:
            err = None
            try:
                f = build()
                plan = optimize(ctx, f)
                g = torch.Generator(device=ctx.device).manual_seed(ctx.cfg.seed)
                inputs = {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=g, device=ctx.device)
                          .to(DTYPES[f.tensors[i].dtype]) for i in f.inputs}
                local = local_inputs(plan, inputs, ctx.rank, ctx.device, ctx.cfg.seed, verify=ctx.cfg.tiny,
                                     exact_partial=False)
                del inputs
            except Exception as e:  # noqa: BLE001
                err = short(e)
            bad = first_error(all_gather(err))
            if bad:
                rows.append(dict(program=name, mesh=label, error=bad))
                continue
            rt = TimedRuntime(plan.program, expected_inputs=plan.lowered.local_inputs,
                              input_names={b: nm for b, nm, _ in plan.lowered.inputs})
            untimed: dict[str, torch.Tensor] = {}
            for _ in range(max(1, ctx.cfg.warmup)):
                untimed = rt.run(local)
            runs: list[list[dict]] = []
            rt.timing = True
            for _ in range(ctx.cfg.runs):
                rt.records = []
                world_sync(ctx)
                timed = rt.run(local)
                runs.append([dict(r, step=r["step"].ms(), comm=sum(t.ms() for t in r["comm"]), x=None)
                             for r in rt.records])
            rt.timing = False
            if not runs[0]:
                rows.append(dict(program=name, mesh=label, error=f"no team collective in the plan ({fmt_comms(plan)})"))
            mine = []  # this rank's medians per step: (step, comm, raw, step back to back, raw back to back)
            raw_labels = []
            for j, rec in enumerate(runs[0]):
                team = rt.teams[rt.mesh.axis_index(rec["axis"])]
                raw_label, raw_ms, raw_b2b = time_raw(ctx, rec, team.group)
                raw_labels.append(raw_label)
                step_b2b = time_back_to_back(ctx, again(rt, rt.records[j]), team.group)
                mine.append((statistics.median(r[j]["step"] for r in runs),
                             statistics.median(r[j]["comm"] for r in runs), raw_ms, step_b2b, raw_b2b))
            rt.records = []
            same = all(torch.equal(untimed[k], timed[k]) for k in untimed) and set(untimed) == set(timed)
            note = "" if all(all_gather(same)) else "outputs of timed and untimed runs differ"
            every = all_gather(mine)
            for j, rec in enumerate(runs[0]):
                step_ms, comm_ms, raw_ms, step_b2b, raw_b2b = (slowest([m[j][c] for m in every]) for c in range(5))
                raw_label = raw_labels[j]
                itemsize = torch.empty((), dtype=rec["dtype"]).element_size()
                nbytes = math.prod(rec["shape"]) * itemsize * (rec["n"] if rec["kind"] == "allgather" else 1)
                moved = nbytes * bus_factor(rec["kind"], rec["n"])
                rows.append(dict(program=name, mesh=label, step=rec["idx"], kind=rec["kind"], axis=rec["axis"],
                                 n=rec["n"], bytes=nbytes, shape=rec["shape"], dtype=str(rec["dtype"])[6:],
                                 step_ms=step_ms, comm_ms=comm_ms, raw=raw_label, raw_ms=raw_ms,
                                 busbw_step=moved / step_ms / 1e6, busbw_comm=moved / comm_ms / 1e6,
                                 busbw_raw=moved / raw_ms / 1e6, ratio=raw_ms / step_ms, step_b2b=step_b2b,
                                 raw_b2b=raw_b2b, busbw_b2b=moved / step_b2b / 1e6, ratio_b2b=raw_b2b / step_b2b,
                                 error="", note=note))
            del local
        except Exception as e:  # noqa: BLE001 - ranks fail alike here, or the group timeout ends the wait
            traceback.print_exc()
            rows.append(dict(program=name, mesh=label, error=short(e, 300)))
        finally:
            if rt is not None:
                rt.close()
            if ctx.cuda:
                torch.cuda.empty_cache()
    return rows


def render_collectives(ctx: Ctx, rows: list[dict]) -> str:
    clock = "CUDA events" if ctx.cuda else "wall clock (perf_counter)"
    out = [f"## 2. Collectives inside plan.run vs raw torch.distributed ({ctx.world} ranks, {ctx.backend})\n",
           f"Median of {ctx.cfg.runs} runs ({ctx.cfg.warmup} warm-up) on each rank, the slowest rank's, {clock}, "
           "a team barrier before each call. "
           "bytes: the collective's buffer (allgather: its result); busbw = bytes x bus factor / time "
           "(nccl-tests). step: the runtime's whole step (staging, collective, re-ordering); comm: the "
           "torch.distributed call inside it; ratio = raw ms / step ms (goal >= 95%). "
           f"back to back: {BACK_TO_BACK} calls issued after one barrier, ms per call (as nccl-tests: "
           "host work overlaps the device work of the call before), the step vs the raw call.\n",
           "| program | mesh | step | collective | team | buffer | step ms | step busbw GB/s | comm ms | "
           "comm busbw GB/s | raw call | raw ms | raw busbw GB/s | ratio | back to back: step ms | raw ms | "
           "step busbw GB/s | ratio | notes |",
           "|---|---|---:|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if r.get("error") and "kind" not in r:
            out.append(f"| {md(r['program'])} | {r['mesh']} |" + " |" * 16 + f" {md(r['error'])} |")
            continue
        buf = f"{r['bytes'] / 2**20:.2f} MiB {r['dtype']} {'x'.join(map(str, r['shape']))}"
        out.append(f"| {md(r['program'])} | {r['mesh']} | {r['step']} | {r['kind']} ({r['axis']}) | {r['n']} | {buf} | "
                   f"{r['step_ms']:.3f} | {r['busbw_step']:.1f} | {r['comm_ms']:.3f} | {r['busbw_comm']:.1f} | "
                   f"{r['raw']} | {r['raw_ms']:.3f} | {r['busbw_raw']:.1f} | {100 * r['ratio']:.0f}% | "
                   f"{r['step_b2b']:.3f} | {r['raw_b2b']:.3f} | {r['busbw_b2b']:.1f} | {100 * r['ratio_b2b']:.0f}% | "
                   f"{md(r.get('note', ''))} |")
    return "\n".join(out)


# ==== part 3: end to end vs DTensor ===================================================================
def dtensor_styles() -> dict[str, Any]:
    """The DTensor parallel styles this torch has (a missing one raises ImportError when used)."""
    import torch.distributed.tensor.parallel as tp
    from torch.distributed.tensor import Replicate, Shard
    return dict(tp=tp, Shard=Shard, Replicate=Replicate)


class _MLP(torch.nn.Module):
    def __init__(self, h: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(h, 4 * h, bias=False, dtype=dtype, device=device)
        self.fc2 = torch.nn.Linear(4 * h, h, bias=False, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class _Attention(torch.nn.Module):
    def __init__(self, h: int, heads: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.hd = h // heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(h, h, bias=False, dtype=dtype, device=device)
                                              for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q, k, v = (w(x).view(b, s, -1, self.hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        scores = torch.tanh((q @ k.transpose(-1, -2)) * self.hd ** -0.5)
        ctx = (scores @ v).transpose(1, 2).reshape(b, s, -1)
        return self.wo(ctx)


def dtensor_model(block: str, h: int, heads: int, dtype: torch.dtype, ctx: Ctx, mesh: Any,
                  weights: dict[str, torch.Tensor]) -> tuple[torch.nn.Module, str]:
    """The block as an nn.Module with the global weights (Linear weight = reshard weight^T),
    parallelized with DTensor's styles."""
    st = dtensor_styles()
    tp, Shard, Replicate = st["tp"], st["Shard"], st["Replicate"]
    if block == "mlp":
        m = _MLP(h, dtype, ctx.device)
        with torch.no_grad():
            m.fc1.weight.copy_(weights["w1"].t())
            m.fc2.weight.copy_(weights["w2"].t())
        plan = {"fc1": tp.ColwiseParallel(input_layouts=Shard(1)),
                "fc2": tp.RowwiseParallel(output_layouts=Shard(1))}
        desc = "fc1 ColwiseParallel(input_layouts=Shard(1)), fc2 RowwiseParallel(output_layouts=Shard(1))"
        return tp.parallelize_module(m, mesh, plan), desc
    m = _Attention(h, heads, dtype, ctx.device)
    with torch.no_grad():
        for nm in ("wq", "wk", "wv", "wo"):
            getattr(m, nm).weight.copy_(weights[nm].t())
    plan = {"": tp.PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "wq": tp.ColwiseParallel(), "wk": tp.ColwiseParallel(), "wv": tp.ColwiseParallel(),
            "wo": tp.RowwiseParallel(output_layouts=Shard(1))}
    desc = ("PrepareModuleInput(Shard(1)->Replicate()), wq/wk/wv ColwiseParallel, "
            "wo RowwiseParallel(output_layouts=Shard(1))")
    # the block itself: parallelize_module with a "" key is not accepted by every torch; apply it directly
    tp.parallelize_module(m, mesh, plan.pop(""))
    return tp.parallelize_module(m, mesh, plan), desc


def waited(t: Any) -> Any:
    """DTensor's functional collectives return ``AsyncCollectiveTensor``s whose collective the
    current stream has not waited for yet: wait, so that the timer's stop event comes after it."""
    try:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
    except ImportError:
        return t
    return t.wait() if isinstance(t, AsyncCollectiveTensor) else t


def dist_rel_diff(ctx: Ctx, a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| over all ranks' local shards."""
    s = torch.tensor([(a.double() - b.double()).pow(2).sum().item(), b.double().pow(2).sum().item()],
                     dtype=torch.float64, device=ctx.device)
    dist.all_reduce(s)
    return math.sqrt(s[0].item() / max(s[1].item(), 1e-300))


def e2e_case(ctx: Ctx, block: str, b: int, mesh: Any) -> dict:
    cfg = ctx.cfg
    s, h, heads = cfg.dims(ctx.world)
    dtype = DTYPES[cfg.dtype]
    name = f"{block} b{b} s{s} h{h}" + (f" a{heads}" if block == "attention" else "")
    row: dict[str, Any] = dict(case=name, colls="", dtensor="", times={}, diff={}, ok=False, notes="")
    err = None
    rt = model = None
    try:
        f = mlp_block3(ctx.world, b, s, h, cfg.dtype) if block == "mlp" else \
            attention_block3(ctx.world, b, s, h, heads, cfg.dtype)
        plan = optimize(ctx, f)
        row["colls"] = fmt_comms(plan)
        g = torch.Generator(device=ctx.device).manual_seed(cfg.seed)
        inputs = {}
        for i in f.inputs:
            t = f.tensors[i]
            x = torch.randn(t.shape, generator=g, device=ctx.device)
            inputs[t.name] = (x if t.name == "x" else x * t.shape[0] ** -0.5).to(dtype)
        local = local_inputs(plan, inputs, ctx.rank, ctx.device, cfg.seed, verify=cfg.tiny)
        x_local = inputs["x"].chunk(ctx.world, 1)[ctx.rank].contiguous()
    except Exception as e:  # noqa: BLE001
        err = "reshard: " + short(e)
    bad = first_error(all_gather(err))
    if bad:
        row["notes"] = bad
        return row
    weights = {k: v for k, v in inputs.items() if k != "x"}
    del inputs
    dt_err = None
    try:
        if mesh is None or isinstance(mesh, str):
            raise RuntimeError(mesh or "no DTensor mesh")
        model, row["dtensor"] = dtensor_model(block, h, heads, dtype, ctx, mesh, weights)
    except Exception as e:  # noqa: BLE001 - a style this torch lacks: say so
        dt_err = short(e, 200)
    del weights
    dt_bad = first_error(all_gather(dt_err))
    if dt_bad:
        row["dtensor"] = f"unavailable: {dt_bad}"
        model = None
    try:
        rt = DistRuntime.from_plan(plan)
        variants: dict[str, Callable[[], Any]] = {}

        def reshard_fn(step_fn: Callable, check: bool) -> Callable[[], torch.Tensor]:
            def go() -> torch.Tensor:
                rt.local_step, rt.check_inputs = step_fn, check
                (buf, _), = plan.lowered.outputs
                return rt.run(local)[buf]
            return go

        variants["reshard"] = reshard_fn(run_local, True)
        variants["reshard_nocheck"] = reshard_fn(run_local, False)
        if ctx.gpu_step is not None:
            variants["reshard_gpu"] = reshard_fn(ctx.gpu_step, True)
        if model is not None:
            fwd_err = None
            try:
                with torch.no_grad():
                    waited(model(x_local))
            except Exception as e:  # noqa: BLE001 - DTensor cannot run this block here: say so
                fwd_err = short(e, 200)
            fwd_bad = first_error(all_gather(fwd_err))
            if fwd_bad:
                row["dtensor"] += f" (forward failed: {fwd_bad})"
            else:
                variants["dtensor"] = lambda: waited(model(x_local))
        last: dict[str, torch.Tensor] = {}
        times: dict[str, list[float]] = {k: [] for k in variants}
        with torch.no_grad():
            for k, fn in variants.items():
                for _ in range(cfg.warmup):
                    last[k] = fn()
            order = list(variants)
            for i in range(cfg.runs):
                for k in (order if i % 2 == 0 else order[::-1]):
                    world_sync(ctx)
                    t = Timer(ctx.cuda).start()
                    last[k] = fn_out = variants[k]()
                    times[k].append(t.stop().ms())
                    del fn_out
        medians = all_gather({k: statistics.median(v) for k, v in times.items()})
        row["times"] = {k: slowest([m[k] for m in medians]) for k in times}
        tol = 2 * OUT_TOL[cfg.dtype]
        ok = True
        if "dtensor" in last:
            ref = last["dtensor"]
            if hasattr(ref, "to_local"):
                ref = ref.to_local()
            for k in ("reshard", "reshard_gpu"):
                if k in last:
                    if tuple(last[k].shape) != tuple(ref.shape):
                        row["diff"][k] = float("inf")
                        row["notes"] += f"{k} shard {tuple(last[k].shape)} vs DTensor {tuple(ref.shape)}; "
                    else:
                        row["diff"][k] = dist_rel_diff(ctx, last[k], ref)
                    ok = ok and row["diff"][k] <= tol
        row["ok"] = ok
        row["tol"] = tol
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        row["notes"] += short(e, 300)
    finally:
        if rt is not None:
            rt.close()
        model = variants = None  # drop the module and its weights before empty_cache
        if ctx.cuda:
            torch.cuda.empty_cache()
    return row


def part_e2e(ctx: Ctx) -> list[dict]:
    mesh: Any
    try:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(ctx.device.type, (ctx.world,), mesh_dim_names=("tp",))
    except Exception as e:  # noqa: BLE001 - reported per row
        mesh = "DeviceMesh unavailable: " + short(e)
    rows = []
    for block in ("mlp", "attention"):
        if not ctx.cfg.wanted(block):
            continue
        for b in ctx.cfg.batches:
            try:
                rows.append(e2e_case(ctx, block, b, mesh))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                rows.append(dict(case=f"{block} b{b}", colls="", dtensor="", times={}, diff={}, ok=False,
                                 notes=short(e, 300)))
    return rows


def render_e2e(ctx: Ctx, rows: list[dict]) -> str:
    clock = "CUDA events" if ctx.cuda else "wall clock (perf_counter)"
    out = [f"## 3. End to end vs DTensor eager ({ctx.world} ranks, {ctx.backend}, {ctx.cfg.dtype})\n",
           f"Median of {ctx.cfg.runs} runs ({ctx.cfg.warmup} warm-up) on each rank, the slowest rank's, {clock}, "
           "a world barrier before each, variants "
           "interleaved. reshard: DistRuntime.from_plan(plan).run (what plan.run executes; local steps run_local, "
           "input checks on); 'no check': check_inputs=False; 'gpu_local': local steps as NVRTC kernels. "
           "speedup = DTensor ms / reshard ms (goal >= 1.3x for the MLP block). diff = ||reshard - DTensor|| / "
           "||DTensor|| over all ranks.\n",
           "| case | reshard plan | DTensor | DTensor ms | reshard ms | speedup | no check ms | gpu_local ms | "
           "gpu_local speedup | diff | ok | notes |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]

    def ms(k: str, r: dict) -> str:
        v = r["times"].get(k)
        return "n/a" if v is None else f"{v:.3f}"

    def sp(k: str, r: dict) -> str:
        a, b = r["times"].get("dtensor"), r["times"].get(k)
        return "n/a" if a is None or b is None else f"{a / b:.2f}x"

    for r in rows:
        diff = " / ".join(f"{v:.1e}" for v in r["diff"].values()) or "n/a"
        out.append(f"| {md(r['case'])} | {md(r['colls'])} | {md(r['dtensor'])} | {ms('dtensor', r)} | "
                   f"{ms('reshard', r)} | {sp('reshard', r)} | {ms('reshard_nocheck', r)} | {ms('reshard_gpu', r)} | "
                   f"{sp('reshard_gpu', r)} | {diff} | {'ok' if r['ok'] else 'FAIL'} | {md(r['notes'])} |")
    return "\n".join(out)


# ==== driver ==========================================================================================
def env_header(ctx: Ctx) -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    if ctx.cuda:
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        device = f"{', '.join(names)} x{torch.cuda.device_count()} visible"
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:  # noqa: BLE001
            nccl = f"unknown ({short(e, 60)})"
    else:
        import platform
        device = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
        nccl = "n/a (gloo)"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip() or "n/a"
    except Exception:  # noqa: BLE001
        commit = "n/a"
    try:
        prof = rs.CostProfile.load(ctx.cfg.profile).name
    except Exception as e:  # noqa: BLE001
        prof = f"unusable ({short(e, 100)})"
    lines = [f"# gpu_multi {now:%Y-%m-%d %H:%M UTC}\n",
             f"- **Date:** {now:%Y-%m-%d %H:%M UTC}",
             f"- **Device:** {device}",
             f"- **torch:** {torch.__version__}; **NCCL:** {nccl}; **backend:** {ctx.backend}; "
             f"**world size:** {ctx.world}",
             f"- **Command:** `{ctx.cfg.command}`",
             f"- **Commit:** {commit}; **cost profile:** {prof}; **sizes:** {'tiny' if ctx.cfg.tiny else 'full'}; "
             f"**gpu_local_step:** {ctx.gpu_step_note}"]
    return "\n".join(lines)


def rank_main(rank: int, cfg: Cfg) -> int:
    """One rank's work; rank 0 prints.  Returns the number of failed correctness checks
    (rank 0's count on every rank)."""
    world = dist.get_world_size()
    backend = str(dist.get_backend())
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
    gpu_step, note = None, "n/a (CPU)"
    if device.type == "cpu":  # ranks share the cores: idle intra-op threads would spin against peers' gloo
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if device.type == "cuda":
        try:
            from reshard.runtime.gpu_local import gpu_local_step
            gpu_step, note = gpu_local_step, "used"
        except Exception as e:  # noqa: BLE001
            note = "unavailable: " + short(e, 100)
    ctx = Ctx(rank, world, device, backend, cfg, gpu_step, note)

    def say(text: str) -> None:
        if rank == 0:
            print(text + "\n", flush=True)

    say(env_header(ctx))
    failed = 0
    parts: dict[str, tuple[Callable, Callable]] = {"correctness": (part_correctness, render_correctness),
                                                   "collectives": (part_collectives, render_collectives),
                                                   "e2e": (part_e2e, render_e2e)}
    for part in cfg.parts:
        run, render = parts[part]
        t0 = time.perf_counter()
        try:
            rows = run(ctx)
        except Exception as e:  # noqa: BLE001 - the other parts still run
            traceback.print_exc()
            say(f"## {part}: FAILED: {md(short(e, 400))}")
            failed += 1
            continue
        if part == "correctness":
            failed += sum(not r["ok"] for r in rows)
        elif part == "e2e":
            failed += sum(not r["ok"] for r in rows)
        say(render(ctx, rows) + f"\n\n({part}: {time.perf_counter() - t0:.1f} s)")
    verdict = all_gather(failed)[0]
    say("all correctness checks passed" if verdict == 0 else f"{verdict} correctness check(s) FAILED")
    return verdict


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, Cfg]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nprocs", type=int, default=None,
                    help="ranks to spawn (default: every GPU; 2 on the CPU); ignored under torchrun")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (CPU smoke test)")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU even when GPUs are present")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {PARTS}")
    ap.add_argument("--cases", default="", help="comma-separated substrings: run only matching cases/programs")
    ap.add_argument("--runs", type=int, default=None, help="timed runs (default 10; 3 with --tiny)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up runs (default 3; 1 with --tiny)")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--batches", default=None, help="e2e batch sizes (default 1,2,4; 1,2 with --tiny)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--profile", default=None, help="cost profile for optimize (default: reshard's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=None,
                    help="process-group timeout, s (default 600; 120 with --tiny)")
    ap.add_argument("--max-time", type=float, default=None,
                    help="terminate the spawned ranks after this many s (default 3600; 600 with --tiny)")
    args = ap.parse_args(argv)
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {unknown}; choose from {PARTS}")
    if args.runs is not None and args.runs < 1:
        ap.error("--runs must be >= 1")
    batches = args.batches or ("1,2" if args.tiny else "1,2,4")
    cfg = Cfg(tiny=args.tiny, parts=parts, runs=args.runs or (3 if args.tiny else 10),
              warmup=args.warmup if args.warmup is not None else (1 if args.tiny else 3),
              hidden=args.hidden, seq=args.seq, batches=tuple(int(b) for b in batches.split(",")),
              heads=args.heads, dtype=args.dtype, k=1 if args.tiny else S.BENCH_K, profile=args.profile,
              seed=args.seed, timeout_s=args.timeout or (120.0 if args.tiny else 600.0),
              command=shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv])),
              cases=tuple(c.strip() for c in args.cases.split(",") if c.strip()))
    return args, cfg


def main(argv: list[str] | None = None) -> int:
    args, cfg = parse(argv)
    try:
        rs.CostProfile.load(cfg.profile)
    except rs.ReshardError as e:
        print(f"--profile: {e}", file=sys.stderr)
        return 2
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or (
        args.nprocs is None and "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ)
    use_cuda = torch.cuda.is_available() and not args.cpu
    if under_torchrun:  # the launcher's own command line is not visible here: say whose this is
        cfg.command = (f"{cfg.command}  (a torchrun worker: WORLD_SIZE={os.environ.get('WORLD_SIZE')}, "
                       f"LOCAL_WORLD_SIZE={os.environ.get('LOCAL_WORLD_SIZE')})")
        init_from_env(backend="nccl" if use_cuda else "gloo", timeout_s=cfg.timeout_s)
        try:
            code = rank_main(dist.get_rank(), cfg)
        finally:
            dist.destroy_process_group()
        return 1 if code else 0
    nprocs = args.nprocs or (torch.cuda.device_count() if use_cuda else 2)
    if use_cuda and nprocs > torch.cuda.device_count():
        print(f"--nprocs {nprocs} > {torch.cuda.device_count()} visible GPUs", file=sys.stderr)
        return 2
    try:
        codes = rs.launch(rank_main, nprocs, cfg, backend="nccl" if use_cuda else "gloo", timeout_s=cfg.timeout_s,
                          join_timeout_s=args.max_time or (600.0 if args.tiny else 3600.0), grace_s=30.0)
    except rs.ReshardError as e:
        print(f"\nlaunch failed:\n{e}", file=sys.stderr, flush=True)
        return 1
    return 1 if codes[0] else 0


if __name__ == "__main__":
    sys.exit(main())
