#!/usr/bin/env python3
"""One GPU check of reshard's generated kernels and of plans run with them.

1. The kernel checks of ``scripts/gpu_check_kernels.py`` (every kernel kind x dtype against
   torch, NaN-poisoned outputs; then its bandwidth table unless ``--no-kernel-bench``).
2. Every program of ``reshard.testing.programs.ALL`` (plus the transformer block in bf16 at toy size):
   optimized, simulated on the one GPU with ``gpu_local_step`` (outputs NaN-poisoned; every
   step that runs on kernels is also compared with ``run_local`` on the same inputs), and
   the outputs compared with ``run_reference`` in float64 on the CPU; every ``remap`` step
   (``remap_fast``: views, strided copies) is compared bit-exactly with the general index
   gather it replaces.
3. ``reshard.examples.transformer_block`` at a realistic size (default seq 4096, hidden 4096,
   32 heads, bf16, a 2-rank mesh simulated on the one GPU): the same checks (float64
   reference on the GPU), then its local steps timed with CUDA events around each step,
   ``gpu_local_step`` vs the same plan executed with ``run_local`` (torch ops on the GPU),
   the median over ``--runs`` runs after one warm-up; the remap steps also as they ran
   before ``remap_fast`` (index gathers with a host index per call: "before / after").

Error metric: ||out - ref|| / ||ref|| in float64, against float64 references; tolerances:
float32 1e-5, bfloat16 1e-2, float16 5e-3 (METHOD.md). Per-step comparisons with
``run_local``: data movement must be bit-exact, arithmetic within max|d| / max|ref| of
fp32 1e-5, bf16 1e-2, fp16 1e-3 (4x for sums), as in gpu_check_kernels.py. A 16-bit program whose
output misses its tolerance on an input draw passes when the same plan simulated on the CPU
(``run_local``) misses it as much (within 5%): that is the plan's own rounding, not the GPU's.

Usage: python scripts/gpu_check.py [--seq 4096 --hidden 4096 --heads 32 --dtype bfloat16]
       [--runs 7] [--no-kernel-bench]
Exit status: 0 all checks pass, 1 a check failed, 2 no GPU.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
import traceback
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), _HERE]

import torch  # noqa: E402

import gpu_check_kernels as GK  # noqa: E402
from plan_check_util import OUT_TOL, as_float64, as_float64_inputs, low_dtype  # noqa: E402
import reshard as rs  # noqa: E402
from reshard.examples import transformer_block  # noqa: E402
from reshard.ir.fusion import DTYPES  # noqa: E402
from reshard.ir.sharding import unshard  # noqa: E402
from reshard.runtime.gpu_local import gpu_local_step, kernel_path  # noqa: E402
from reshard.runtime.local_ops import run_local, step_results  # noqa: E402
from reshard.codegen.remap_index import _take, remap_index  # noqa: E402
from reshard.codegen.remap_form import remap_form  # noqa: E402
from reshard.runtime.simulator import simulate  # noqa: E402
from reshard.testing import programs as P  # noqa: E402

STEP_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3, torch.float64: 1e-12}
#: steps whose kernels move bits (lookups and the seed's fill too): bit-exact against run_local
MOVEMENT = {"set", "permute", "slice", "pad", "cat", "embedding", "pick", "grad_seed"}
DEVICE = "cuda"


def rel_norm(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double().to(out.device)
    if torch.isnan(o).any() and not torch.isnan(r).any():
        return float("inf")
    return ((o - r).norm() / r.norm().clamp_min(1e-300)).item() if r.numel() else 0.0


class CheckedStep:
    """gpu_local_step with poisoned outputs; kernel-path steps are compared with run_local."""

    def __init__(self) -> None:
        self.calls, self.kernel_steps, self.max_err, self.failures = 0, 0, 0.0, []

    def __call__(self, step, env, rank):
        self.calls += 1
        out = gpu_local_step(step, env, rank, poison=True)
        xs = [env[n] for n in step.ins]
        if step.attr("op") == "remap":  # fast remap path vs the general index gather: bit-exact
            ref = legacy_local(step, env, rank)
            if out.shape != ref.shape or not torch.equal(out, ref):
                self.failures.append(f"{step.out} remap {step.attr('mode')}: differs from the index gather")
        if kernel_path(step, xs):
            self.kernel_steps += 1
            ref = run_local(step, env, rank)
            for buf, got, want in zip(step.outs, step_results(out), step_results(ref), strict=True):
                self.compare(step, buf, got, want)
        return out

    def compare(self, step, buf: str, out: torch.Tensor, ref: torch.Tensor) -> None:
        """One buffer a kernel-path step wrote against ``run_local``'s."""
        fop = step.attr("fop")
        if out.shape != ref.shape or out.dtype != ref.dtype:
            self.failures.append(f"{buf} {fop}: {tuple(out.shape)} {out.dtype} vs {tuple(ref.shape)} {ref.dtype}")
        elif fop in MOVEMENT or not out.is_floating_point():  # ints and bools: exact too
            if not torch.equal(out, ref):
                self.failures.append(f"{buf} {fop}: not bit-exact")
        else:
            e = GK.rel_err(out, ref)
            scale = 4.0 if fop == "reduce" and step.attr("fn") != "max" else 1.0
            self.max_err = max(self.max_err, e)
            if not e <= STEP_TOL[out.dtype] * scale:
                self.failures.append(f"{buf} {fop}: rel err {e:.2e}")


def simulate_on_gpu(plan: rs.Plan, inputs: dict[str, torch.Tensor], local_step, seed: int) -> list[torch.Tensor]:
    per_rank = plan.shard_inputs(inputs, torch.Generator().manual_seed(seed))
    per_rank = {r: {k: v.to(DEVICE) for k, v in d.items()} for r, d in per_rank.items()}
    outs = simulate(plan.program, per_rank, local_step)
    return [unshard({r: outs[r][buf].cpu() for r in plan.program.mesh_ranks}, ts, check_replicas=False)
            for buf, ts in plan.lowered.outputs]


def check_program(name: str, f: rs.Fusion, seed: int) -> dict:
    plan = rs.optimize(f)
    inputs = {k: v.to(DTYPES[f.tensors[i].dtype])  # rounded as the plan will see them
              for i in f.inputs for k, v in P.random_inputs(f, seed).items() if f.tensors[i].name == k}
    chk = CheckedStep()
    outs = simulate_on_gpu(plan, inputs, chk, seed)
    refs = rs.run_reference(as_float64(f), as_float64_inputs(inputs))
    err = max(rel_norm(o, r) for o, r in zip(outs, refs))
    tol = OUT_TOL[low_dtype(f)]
    notes = list(chk.failures[:3])
    if err > tol:  # the plan's own rounding on this draw? the same plan on the CPU (run_local) sets the bar
        cpu_err = max(rel_norm(o, r) for o, r in zip(plan.simulate(inputs, generator=torch.Generator().manual_seed(seed)),
                                                      refs))
        notes.append(f"the same plan on the CPU: rel err {cpu_err:.2e}")
        tol = max(tol, 1.05 * cpu_err)
    dtype_ok = all(o.dtype == DTYPES[f.tensors[tid].dtype] for o, (tid, _) in zip(outs, f.outputs))
    ok = not chk.failures and err <= tol and dtype_ok and len(outs) == len(refs)
    return dict(name=name, dtype=low_dtype(f), steps=chk.calls,
                kernel_steps=chk.kernel_steps, step_err=chk.max_err, err=err, tol=tol, ok=ok,
                notes="; ".join(notes) + ("" if dtype_ok else " wrong output dtype"))


# ---- the realistic block --------------------------------------------------------------

def category(step) -> str:
    op = step.attr("op")
    return f"apply {step.attr('fop')}" if op == "apply" else op


class TimedStep:
    """Times each local step with CUDA events around it; sums per category."""

    def __init__(self, fn) -> None:
        self.fn, self.events, self.work = fn, [], defaultdict(float)

    def __call__(self, step, env, rank):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = self.fn(step, env, rank)
        b.record()
        xs = [env[n] for n in step.ins]
        c = category(step)
        self.events.append((c, a, b))
        if c == "apply matmul":
            self.work[c] += 2 * out.numel() * xs[0].shape[-1]  # flops
        else:
            self.work[c] += sum(x.numel() * x.element_size() for x in xs) + out.numel() * out.element_size()
        return out

    def totals(self) -> dict[str, float]:
        torch.cuda.synchronize()
        t: dict[str, float] = defaultdict(float)
        for c, a, b in self.events:
            t[c] += a.elapsed_time(b)
        return t


def prefetch_remap_indices(program) -> None:
    """Compute the plan's remap gather indices (host work, cached by ``remap_index``) in
    parallel threads, so the first simulate does not build them one by one."""
    jobs = set()
    for s in program.steps:
        if s.kind == "local" and s.attr("op") == "remap":
            mesh = s.attr("src").mesh
            for r in program.mesh_ranks:
                jobs.add((s.attr("mode"), s.attr("src"), s.attr("dst"), s.attr("axis", -1), mesh.coords(r)))
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda j: remap_index(*j), jobs))
        return list(pool.map(lambda j: remap_form(*j), jobs))


def legacy_local(step, env, rank):
    """run_local with the remap steps done the way they were before ``remap_fast``: the
    general index gather ``_take`` (host index, contiguity test and host-to-device copy per call)."""
    if step.attr("op") != "remap":
        return run_local(step, env, rank)
    src, dst, mode = step.attr("src"), step.attr("dst"), step.attr("mode")
    coords = src.mesh.coords(rank)
    pos = remap_index(mode, src, dst, step.attr("axis", -1), coords)
    shape = tuple(dst.local_shape) if mode in ("slice", "gather", "a2a_recv") else (-1,)
    return _take(env[step.ins[0]], pos, shape)


def block_inputs(f: rs.Fusion, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    out = {}
    for i in f.inputs:
        t = f.tensors[i]
        x = torch.randn(t.shape, device=DEVICE, generator=g)
        if t.name != "x":
            x = x * t.shape[0] ** -0.5  # weights: unit-variance activations
        out[t.name] = x.to(dtype)
    return out


def host_us_per_call(n: int = 1024, calls: int = 300) -> tuple[float, float]:
    """Wall-clock microseconds per call of a small (n-element bf16) binary-add step through
    gpu_local_step and through run_local: the host overhead per kernel step."""
    from reshard.codegen.program import Step

    step = Step.make("local", "o", ["a", "b"], op="apply", fop="binary", fn="add")
    env = {k: torch.randn(n, device=DEVICE).bfloat16() for k in "ab"}
    res = []
    for fn in (gpu_local_step, run_local):
        for _ in range(10):
            fn(step, env, 0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(step, env, 0)
        torch.cuda.synchronize()
        res.append((time.perf_counter() - t0) / calls * 1e6)
    return res[0], res[1]


def run_block(args) -> tuple[dict, list[tuple]]:
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    f = transformer_block(mesh, seq=args.seq, hidden=args.hidden, heads=args.heads, dtype=args.dtype)
    t0 = time.perf_counter()
    plan = rs.optimize(f)
    t_opt = time.perf_counter() - t0
    inputs = block_inputs(f, DTYPES[args.dtype], seed=1234)
    per_rank = plan.shard_inputs(inputs)
    t0 = time.perf_counter()
    forms = prefetch_remap_indices(plan.program)
    t_remap = time.perf_counter() - t0
    n_range = sum(f is not None and f.is_range for f in forms)
    n_strided = sum(f is not None and not f.is_range for f in forms)
    ref = rs.run_reference(as_float64(f), as_float64_inputs(inputs))[0]
    del inputs

    def outputs(local_step) -> torch.Tensor:
        outs = simulate(plan.program, per_rank, local_step)
        (buf, ts), = plan.lowered.outputs
        return unshard({r: outs[r][buf].cpu() for r in plan.program.mesh_ranks}, ts, check_replicas=False)

    chk = CheckedStep()
    got = outputs(chk)
    err = rel_norm(got, ref)
    err_torch = rel_norm(outputs(run_local), ref)
    del got, ref
    tol = OUT_TOL[args.dtype]
    name = f"transformer_block seq{args.seq} h{args.hidden} a{args.heads}"
    row = dict(name=name, dtype=args.dtype, steps=chk.calls,
               kernel_steps=chk.kernel_steps, step_err=chk.max_err, err=err, tol=tol,
               ok=not chk.failures and err <= tol,
               notes=f"run_local err {err_torch:.2e}; optimize {t_opt:.1f}s; remap indices {t_remap:.0f}s; "
               f"remaps (distinct, both ranks): {n_range} views, {n_strided} strided copies, "
               f"{len(forms) - n_range - n_strided} index gathers; " + "; ".join(chk.failures[:3]))

    paths = {"gpu_local": gpu_local_step, "run_local": run_local, "legacy_remap": legacy_local}
    for fn in paths.values():  # warm-up: NVRTC compiles, module loads, cuBLAS handles, remap indices
        outputs(fn)
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in paths}
    work: dict[str, float] = {}
    for i in range(args.runs):
        for k in (list(paths) if i % 2 == 0 else list(reversed(paths))):
            timer = TimedStep(paths[k])
            torch.cuda.synchronize()
            outputs(timer)
            samples[k].append(timer.totals())
            work = dict(timer.work)
    cats = sorted(samples["gpu_local"][0])
    kernel_cats = {c for c in cats if c.startswith("apply") and c not in ("apply matmul", "apply reshape")}
    rows = []

    def med(k: str, sel) -> float:
        return statistics.median(sum(v for c, v in s.items() if sel(c)) for s in samples[k])

    for c in cats:
        rows.append((c, work.get(c, 0.0), med("gpu_local", lambda x: x == c), med("run_local", lambda x: x == c),
                     c in kernel_cats))
    rows.append(("kernel-path steps", sum(work[c] for c in kernel_cats), med("gpu_local", lambda x: x in kernel_cats),
                 med("run_local", lambda x: x in kernel_cats), True))
    row["remap"] = [(label, med(k, lambda x: x == "remap"), med(k, lambda x: True)) for label, k in (
        ("before: general index gather (`_take`, host index per call)", "legacy_remap"),
        ("after: `remap_fast` in run_local", "run_local"),
        ("after: `remap_fast` in gpu_local_step", "gpu_local"))]
    row["remap_bytes"] = work.get("remap", 0.0)
    hg, ht = host_us_per_call()
    rows.append(("host time per small step (1K-element add), us", None, hg / 1e3, ht / 1e3, False))
    rows.append(("all local steps", None, med("gpu_local", lambda x: True), med("run_local", lambda x: True), False))
    return row, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--no-kernel-bench", action="store_true")
    ap.add_argument("--mib", type=int, default=256, help="MiB per operand in the kernel bandwidth table")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: torch.cuda.is_available() is False; nothing to check")
        return 2
    from reshard.codegen import nvrtc as N

    print(f"# gpu_check  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}  "
          f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)

    # 1. kernels
    t0 = time.perf_counter()
    krows: list[tuple[str, str, str, float, bool]] = []
    GK.correctness(krows)
    torch.cuda.synchronize()
    kfail = [r for r in krows if not r[4]]
    print(f"\nkernel checks (gpu_check_kernels.correctness): {len(krows) - len(kfail)}/{len(krows)} passed "
          f"in {time.perf_counter() - t0:.1f}s", flush=True)
    for kind, dt, case, e, _ in kfail:
        print(f"  FAIL {kind} {dt} {case}: {e:.2e}")
    if not args.no_kernel_bench:
        print(f"\nkernel bandwidth ({args.mib} MiB per operand, bytes read+written / time, median of 5 x mean of 20)")
        print(f"{'case':<52} {'ms':>8} {'GB/s':>8} {'% copy':>7}")
        for label, ms, bw, pct in GK.bench(args.mib, 20):
            print(f"{label:<52} {ms:>8.3f} {bw:>8.0f} {pct:>6.1f}%")

    # 2. example programs
    prows = []
    builders = [*P.ALL, lambda: transformer_block(P.MESH1, seq=8, hidden=16, heads=4, dtype="bfloat16")]
    names = [b.__name__ for b in P.ALL] + ["transformer_like bf16"]
    for seed, (name, b) in enumerate(zip(names, builders)):
        try:
            prows.append(check_program(name, b(), seed))
        except Exception as e:  # report and go on: one table of everything
            traceback.print_exc()
            prows.append(dict(name=name, dtype="?", steps=0, kernel_steps=0, step_err=0.0, err=float("nan"),
                              tol=0.0, ok=False, notes=f"{type(e).__name__}: {e}"[:200]))
    # 3. the realistic block
    try:
        brow, trows = run_block(args)
    except Exception as e:
        traceback.print_exc()
        brow, trows = dict(name="transformer_block", dtype=args.dtype, steps=0, kernel_steps=0, step_err=0.0,
                           err=float("nan"), tol=0.0, ok=False, notes=f"{type(e).__name__}: {e}"[:200]), []
    prows.append(brow)

    print(f"\nNVRTC cache: {N.cache_stats()}")
    print("\n## Plans simulated on the GPU with gpu_local_step vs run_reference (float64)\n")
    print("| program | dtype | local step calls | on kernels | max step err vs run_local | rel err vs fp64 | tol | ok | notes |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    for r in prows:
        print(f"| {r['name']} | {r['dtype']} | {r['steps']} | {r['kernel_steps']} | {r['step_err']:.1e} | "
              f"{r['err']:.2e} | {r['tol']:.0e} | {'ok' if r['ok'] else 'FAIL'} | {r['notes']} |")
    if trows:
        print(f"\n## Local steps of {brow['name']} {args.dtype} (2 ranks on one GPU), "
              f"median of {args.runs} runs, CUDA events per step\n")
        print("| steps | gpu_local runs them with | bytes or flops | gpu_local ms | rate | run_local ms | rate | speedup |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for c, w, tg, tt, on_kernels in trows:
            how = ("NVRTC kernels" if on_kernels else "cuBLAS" if c == "apply matmul"
                   else "run_local" if c != "all local steps" else "")
            if w is None or c in ("view", "apply reshape"):  # views move nothing
                amount, rg, rt = "", "", ""
            elif c == "apply matmul":
                amount, rg, rt = f"{w / 1e12:.2f} TFLOP", f"{w / tg / 1e9:.0f} TFLOP/s", f"{w / tt / 1e9:.0f} TFLOP/s"
            else:
                amount, rg, rt = f"{w / 1e9:.2f} GB", f"{w / tg / 1e6:.0f} GB/s", f"{w / tt / 1e6:.0f} GB/s"
            if c.endswith(", us"):
                print(f"| {c[:-4]} | | | {tg * 1e3:.1f} us | | {tt * 1e3:.1f} us | | {tt / tg:.2f}x |")
                continue
            print(f"| {c} | {how} | {amount} | {tg:.3f} | {rg} | {tt:.3f} | {rt} | {tt / tg:.2f}x |")
    if brow.get("remap"):
        print(f"\n## Remap steps of {brow['name']} {args.dtype}: before / after (median of {args.runs} runs)\n")
        print("| remap steps run as | remap ms | remap rate | all local steps ms |")
        print("|---|---:|---:|---:|")
        for label, tr, tall in brow["remap"]:
            print(f"| {label} | {tr:.3f} | {brow['remap_bytes'] / tr / 1e6:.0f} GB/s | {tall:.3f} |")
    failed = len(kfail) + sum(not r["ok"] for r in prows)
    print(f"\n{'all checks passed' if not failed else f'{failed} check(s) FAILED'}: kernels "
          f"{len(krows) - len(kfail)}/{len(krows)}, plans {sum(r['ok'] for r in prows)}/{len(prows)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
