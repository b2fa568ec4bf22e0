"""Where a training step's GPU time goes: eager, torch.compile and reshard's 1-rank plan.

    python scripts/gpu_profile_step.py [--config llama-L4-h2048-s1024-b4-v32000-bf16] [--no-compile]
    python scripts/gpu_profile_step.py --count [--config ...]   # no GPU needed

One configuration of ``benchmarks/train_step_gpu.py``; each method's step runs 3 times to warm
up, then 5 steps under ``torch.profiler`` (CUDA activities).  Printed per method: the GPU time
per step, summed by kernel family (GEMMs, attention, reshard's generated kernels by kind, Triton
kernels, other torch kernels, copies and fills), and the 15 (``--top N``) costliest kernels (a generated one
with the first line of its source: what made it, the shape, the variant).  Reshard's step is
walked (``simulate`` with ``gpu_local_step``): the kernels a CUDA graph replays are the same.

``--variants``: after the profile, the 6 costliest generated kernels of reshard's step are
launched again on copies of the operands one step gave them, as generated and as edited
variants of their source (``VARIANTS``: the SFU's ``__expf`` for ``expf`` and its ``tanh.approx`` for
``tanhf``, deeper unrolling), each
timed with CUDA events (median of 50 launches): which change would pay off, before making it in
the generator.

``--count``: the CPU proxy of reshard's column.  The 1-rank plan's program is walked on meta
tensors (nothing computed) and every step that takes the generated-kernel path lists its launches
(``gpu_local.step_kernels``' record, launching nothing); printed: the launches by step kind, and
the bytes the elementwise steps (``codegen.fuse.ELEMENTWISE`` and fused ``pointwise`` steps)
read and write, each buffer's local bytes (a broadcast input counts its own bytes).
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from train_step_gpu import CONFIGS, build, reshard_step, torch_step  # noqa: E402

STEPS = 5


def family(name: str) -> str:
    """A kernel's family, by its name."""
    n = name.lower()
    if any(k in n for k in ("gemm", "cutlass", "sm90_xmma", "cublas", "nvjet", "matmul")):
        return "GEMM (cuBLAS)"
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa", "cudnn")):
        return "attention"
    if n.startswith("triton"):
        return "Triton (Inductor)"
    if n.startswith("rs_") or "reshard" in n:
        return "reshard: " + n.split("_")[1] if "_" in n else "reshard"
    if "memcpy" in n or "memset" in n or "copy" in n or "fill" in n:
        return "copies and fills"
    return "other torch kernels"


def profiled(step: Callable[[], object]) -> tuple[float, list[tuple[str, float, int]]]:
    """(GPU ms per step, [(kernel, total ms over the profiled steps, calls)])."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    kernels = [(e.key, e.device_time_total / 1e3, e.count) for e in prof.key_averages()
               if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    total = sum(ms for _, ms, _ in kernels)
    return total / STEPS, sorted(kernels, key=lambda k: -k[1])


#: generated kernel name -> the first line of its source (what made it: kind, shape, variant)
MADE: dict[str, str] = {}


def record_sources() -> None:
    """Remember the first source line of every generated kernel loaded from now on (``MADE``)."""
    from reshard.codegen import nvrtc
    get = nvrtc._get_kernel

    def recorded(ks, index):
        MADE.setdefault(ks.name, ks.source.lstrip().splitlines()[0][:160])
        return get(ks, index)
    nvrtc._get_kernel = recorded


#: kernels listed per method (``--top``)
TOP = [15]


def report(label: str, ms: float, kernels: list[tuple[str, float, int]]) -> None:
    print(f"\n## {label}: {ms:.2f} ms of GPU time per step")
    fam: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for name, t, n in kernels:
        fam[family(name)][0] += t / STEPS
        fam[family(name)][1] += n // STEPS
    for f, (t, n) in sorted(fam.items(), key=lambda kv: -kv[1][0]):
        print(f"  {f:28s} {t:8.2f} ms  {n:5d} launches")
    print("  costliest kernels (ms per step, launches per step):")
    for name, t, n in kernels[:TOP[0]]:
        print(f"    {t / STEPS:7.2f}  {n // STEPS:4d}  {name[:110]}")
        if name in MADE:
            print(f"                   {MADE[name]}")


def count(c: object) -> dict[str, tuple[int, int]]:
    """Step kind -> (generated-kernel launches, bytes read and written) of the 1-rank plan's
    program for configuration ``c`` (module docstring, ``--count``), with a ``total`` row and an
    ``elementwise`` row (the elementwise steps' launches and bytes)."""
    import reshard as rs
    from reshard.codegen.fuse import ELEMENTWISE
    from reshard.runtime.gpu_local import KernelKit, kernel_path, run_kernels
    from reshard.runtime.local_ops import run_local, step_results
    from reshard.runtime.simulator import simulate

    model = build(c)
    ids = torch.randint(0, c.vocab, (c.batch, c.seq), generator=torch.Generator().manual_seed(1))
    plan = rs.plan_training(model, mesh=rs.DeviceMesh([0], ("tp",)), example_kwargs={"input_ids": ids, "labels": ids})
    params = dict(model.named_parameters(remove_duplicate=False))
    values = {**dict(zip(plan.user_inputs, (ids, ids))), **{n: params[n].detach() for n in plan.state_inputs},
              **plan.constants}
    p = plan.plan
    per_rank = {r: {k: v.to("meta") for k, v in p.plan_locals(r, bufs, "count").items()}
                for r, bufs in p._shard_inputs(values, None, "count").items()}
    rows: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])

    def nbytes(*ts: torch.Tensor) -> int:
        return sum(t.numel() * t.element_size() for t in ts)

    def walk(step, env, rank):
        xs = [env[b] for b in step.ins]
        if step.attr("op") != "apply" or not kernel_path(step, xs):
            return run_local(step, env, rank)
        kit = KernelKit(record=[], rank=rank)
        outs = run_kernels(kit, step, xs)
        moved = nbytes(*xs, *step_results(outs))
        kind = step.attr("fop")
        for key in (kind, "total") + (("elementwise",) if kind in ELEMENTWISE | {"pointwise"} else ()):
            rows[key][0] += len(kit.launched)
            rows[key][1] += moved
        return outs

    simulate(p.program, per_rank, walk)
    return {k: (n, b) for k, (n, b) in rows.items()}


def report_count(name: str, rows: dict[str, tuple[int, int]]) -> None:
    print(f"{name}: generated-kernel launches and bytes read + written per step, by step kind (CPU proxy)")
    for k, (n, b) in sorted(rows.items(), key=lambda kv: (kv[0] in ("total", "elementwise"), -kv[1][0])):
        print(f"  {k:16s} {n:6d} launches  {b / 2 ** 20:10.1f} MiB")


#: source edits tried by ``--variants``: name -> (text replaced, replacement)
#: the SFU's tanh (``tanh.approx.f32``, about 2^-11 relative: a bound on what a 16-bit tanh could gain)
_TANH_APPROX = ('__device__ __forceinline__ float rs_tanh_approx(float x) { float y; '
                'asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }\nextern "C"')
#: label -> the source edits of a variant ((old, new), ...), tried where the first old text occurs
VARIANTS = {"__expf": (("expf(", "__expf("),), "unroll 8": (("#pragma unroll 4", "#pragma unroll 8"),),
            "tanh.approx": (("tanhf(", "rs_tanh_approx("), ('extern "C"', _TANH_APPROX))}


def _edited(source: str, edits: tuple[tuple[str, str], ...]) -> str:
    for a, b in edits:
        source = source.replace(a, b)
    return source


def record_launches(names: set[str]) -> dict[str, tuple]:
    """From now on, the first launch of each generated kernel named in ``names``: (its source,
    copies of its operands, grid, block), by name."""
    from reshard.codegen import nvrtc
    got: dict[str, tuple] = {}
    launch = nvrtc.launch

    def recorded(ks, args, grid, block, shared_mem=0):
        if ks.name in names and ks.name not in got:
            got[ks.name] = (ks, [a.clone() if isinstance(a, torch.Tensor) else a for a in args], grid, block)
        return launch(ks, args, grid, block, shared_mem)
    nvrtc.launch = recorded
    return got


def time_variants(launches: dict[str, tuple]) -> None:
    """Each recorded launch timed as generated and as each applicable ``VARIANTS`` edit."""
    from dataclasses import replace

    from reshard.codegen import nvrtc
    print("\nGenerated kernels again, on copies of one step's operands (us, median of 50 launches):")
    for name, (ks, args, grid, block) in launches.items():
        print(f"  {MADE.get(name, name)}")
        tried = [("as generated", ks)] + [
            (v, replace(ks, name=f"{ks.name}_{i}", source=_edited(ks.source, edits).replace(ks.name, f"{ks.name}_{i}")))
            for i, (v, edits) in enumerate(VARIANTS.items()) if edits[0][0] in ks.source]
        for label, k in tried:
            times = []
            for _ in range(50):
                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0.record()
                nvrtc.launch(k, args, grid, block)
                t1.record()
                t1.synchronize()
                times.append(t0.elapsed_time(t1) * 1e3)
            print(f"    {label:14s} {sorted(times)[len(times) // 2]:9.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="llama-L4-h2048-s1024-b4-v32000-bf16", choices=sorted(CONFIGS))
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--variants", action="store_true", help="time source variants of the costliest generated kernels")
    ap.add_argument("--count", action="store_true", help="count the 1-rank plan's kernel launches on the CPU")
    ap.add_argument("--top", type=int, default=15, help="kernels listed per method, costliest first")
    args = ap.parse_args()
    TOP[0] = args.top
    c = CONFIGS[args.config]
    if args.count:
        report_count(c.name, count(c))
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build(c).cuda()
    ids = torch.randint(0, c.vocab, (c.batch, c.seq), generator=torch.Generator().manual_seed(1)).cuda()
    batch = {"input_ids": ids, "labels": ids}
    print(f"{c.name} on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    step, _, _ = torch_step(model, batch)
    report("eager", *profiled(step))
    model.zero_grad(set_to_none=True)
    if not args.no_compile:
        cstep, _, _ = torch_step(torch.compile(model), batch)
        report("torch.compile", *profiled(cstep))
        model.zero_grad(set_to_none=True)
    record_sources()
    rstep, _, _, _, _ = reshard_step(c, model, ids, 1, kernels=True, graph=False)
    ms, kernels = profiled(rstep)
    report("reshard 1 rank (kernels)", ms, kernels)
    if args.variants:
        costly = [k for k, _, _ in kernels if k in MADE][:6]  # (``kernels``: costliest first)
        launches = record_launches(set(costly))
        rstep()
        torch.cuda.synchronize()
        time_variants({k: launches[k] for k in costly if k in launches})
    return 0


if __name__ == "__main__":
    sys.exit(main())
