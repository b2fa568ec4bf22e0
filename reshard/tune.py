"""Calibrate the cost model on the machine at hand (``reshard tune``, ``scripts/tune_cost_model.py``).

What is measured, and how:

* **collectives** — for every collective kind of ``ir.collective_kinds`` and every team size ``n``
  (powers of two up to ``nprocs``, and ``nprocs``), the step is executed by the real
  multi-process runtime (``DistRuntime``, the code path a plan runs: NCCL on GPUs, gloo on
  CPU, including the runtime's fallbacks and copies) in ``nprocs`` spawned processes
  (``reshard.launch``, ``file://`` rendezvous).  Team = ranks 0..n-1.  Message sizes are a
  geometric range; each (kind, n, size) gets ``warmup`` untimed runs, then ``reps`` timed runs,
  each started after a team barrier and ended by a device sync; a run's time is the slowest
  member's; the point is the median over runs.  ``send_recv`` is timed between ranks 0 and 1.
* **the fit** — per (kind, n): ``t = α + x/busbw`` with ``x = bytes·f(n)`` (``rules.cost_profile.bus_factor``;
  bytes as the cost rules count them: the allgather/gather result, the operand otherwise,
  the root's whole buffer for scatter), by least squares (``numpy.linalg.lstsq``) with rows
  weighted by 1/t, so that small messages (which set α) count as much as large ones (which set
  busbw); if that gives α < 0 or busbw <= 0 the fit is redone under α, 1/busbw >= 0
  (``scipy.optimize.nnls``).  R² is the plain coefficient of determination of the fitted
  line on the measured times.
* **the device** (in the calling process; ``cuda:0`` with NCCL, else the CPU) — copy
  bandwidth (``dst.copy_(src)``, counting bytes read + written), matmul rate per dtype width
  (``2·N³`` flops of an N×N GEMM), and kernel launch overhead (the time per tiny in-place op
  of a long back-to-back stream).  Medians over ``reps``.

The result is a ``CostProfile`` (per-team-size figures under ``collectives``, the largest
team's figures as the per-kind defaults, the fit table and machine description under
``meta``), written as JSON that ``CostProfile.load`` reads.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .ir.collective_kinds import KIND, KIND_NAMES
from .ir.errors import ReshardError
from .ir.fusion import DTYPES
from .rules.cost_profile import CostProfile, bus_factor

__all__ = ["Fit", "TuneResult", "fit_alpha_beta", "fit_points", "tune", "add_arguments", "run_from_args", "main",
           "parse_bytes"]

#: defaults per device class: message sizes (bytes), points, reps, warmup, copy bytes, matmul N
_DEFAULTS = {
    "cuda": {"min_bytes": 4 << 10, "max_bytes": 256 << 20, "points": 12, "reps": 20, "warmup": 5,
             "copy_bytes": 512 << 20, "matmul_size": 8192},
    "cpu": {"min_bytes": 1 << 10, "max_bytes": 4 << 20, "points": 8, "reps": 10, "warmup": 2,
            "copy_bytes": 64 << 20, "matmul_size": 512},
}
MATMUL_DTYPES = ("bfloat16", "float32", "float64")
#: a busbw the fit cannot resolve (times do not grow with size) is written as this
UNRESOLVED_BUSBW_GBPS = 1e6
#: below this R² a fit's table row gets a warning: the α-β line explains little of its times
POOR_FIT_R2 = 0.9


@dataclass(frozen=True)
class Fit:
    """The α-β fit of one collective kind on teams of ``n``: ``t = alpha + bytes·f(n)/busbw``."""

    kind: str
    n: int
    alpha_us: float
    busbw_gbps: float
    r2: float
    points: int
    nbytes: tuple[int, ...] = ()
    seconds: tuple[float, ...] = ()
    note: str = ""


@dataclass
class TuneResult:
    """What ``tune`` measured: the profile it wrote, the fits, the device figures."""

    profile: CostProfile
    fits: list[Fit]
    device: dict[str, Any]
    path: Path | None = None
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        """The fit-quality table (kind, n, α, busbw, R², points) and the device figures."""
        lines = [f"{'kind':<16}{'n':>3}{'alpha us':>12}{'busbw GB/s':>13}{'R^2':>9}{'points':>8}"]
        for f in self.fits:
            bw = f"{f.busbw_gbps:13.3f}" if f.busbw_gbps < UNRESOLVED_BUSBW_GBPS else f"{'unresolved':>13}"
            lines.append(f"{f.kind:<16}{f.n:>3}{f.alpha_us:12.2f}{bw}{f.r2:9.4f}{f.points:>8}"
                         + (f"  ({f.note})" if f.note else ""))
        poor = [f for f in self.fits if f.r2 < POOR_FIT_R2]
        if poor:
            which = ", ".join(f"{f.kind} n={f.n} (R^2 {f.r2:.2f})" for f in poor)
            lines.append(f"warning: poor fit, R^2 below {POOR_FIT_R2} for {which}: the times do not follow "
                         "alpha + bytes/busbw (noise from other load on the machine, or flat, latency-bound times); "
                         "those alpha and busbw figures are unreliable: re-run on an idle machine with more --reps "
                         "or a wider --sizes range")
        if not self.fits:
            lines.append("(no collectives measured: nprocs = 1)")
        d = self.device
        lines.append(f"device {d['device']}: copy bandwidth {d['hbm_gbps']:.2f} GB/s (read + write), "
                     f"launch overhead {d['launch_us']:.2f} us")
        for width, (dt, tf) in sorted(d["peak_tflops"].items()):
            lines.append(f"  matmul {dt} ({width} B): {tf:.4g} TFLOP/s")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# ---- the fit ------------------------------------------------------------------------------------
def fit_alpha_beta(x: Sequence[float], t: Sequence[float], *, weighted: bool = True) -> tuple[float, float, float]:
    """Least-squares fit of ``t = alpha + beta·x``; returns (alpha, beta, R²).

    Rows are weighted by 1/t (relative error) when ``weighted``; noise-free data are recovered
    exactly either way.  Negative coefficients are refitted under alpha, beta >= 0 (NNLS).
    R² = 1 - SS_res/SS_tot on the unweighted times (1.0 for a perfect fit of constant times)."""
    xa = np.asarray(x, dtype=np.float64)
    ta = np.asarray(t, dtype=np.float64)
    if xa.shape != ta.shape or xa.ndim != 1:
        raise ReshardError(f"fit: x and t must be 1-D of equal length, got {xa.shape} and {ta.shape}")
    if len(np.unique(xa)) < 2:
        raise ReshardError(f"fit: need at least 2 distinct message sizes, got {sorted(set(xa.tolist()))}")
    if not (np.all(np.isfinite(xa)) and np.all(np.isfinite(ta))) or np.any(ta < 0):
        raise ReshardError("fit: sizes and times must be finite and times >= 0")
    a = np.stack([np.ones_like(xa), xa], axis=1)
    w = 1.0 / np.maximum(ta, 1e-12) if weighted else np.ones_like(ta)
    coef, *_ = np.linalg.lstsq(a * w[:, None], ta * w, rcond=None)
    alpha, beta = float(coef[0]), float(coef[1])
    if alpha < 0 or beta < 0:
        from scipy.optimize import nnls
        # scale the size column so that NNLS is well conditioned, then undo it
        scale = float(np.max(np.abs(xa))) or 1.0
        sol, _ = nnls(np.stack([np.ones_like(xa), xa / scale], axis=1) * w[:, None], ta * w)
        alpha, beta = float(sol[0]), float(sol[1]) / scale
    pred = alpha + beta * xa
    ss_res = float(np.sum((ta - pred) ** 2))
    ss_tot = float(np.sum((ta - ta.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-30 else 0.0)
    return alpha, beta, r2


def fit_points(kind: str, n: int, nbytes: Sequence[int], seconds: Sequence[float]) -> Fit:
    """The ``Fit`` of ``kind`` on teams of ``n`` from (bytes, seconds) points."""
    x = [b * bus_factor(kind, n) for b in nbytes]
    alpha, beta, r2 = fit_alpha_beta(x, seconds)
    note = ""
    if beta <= 1.0 / (UNRESOLVED_BUSBW_GBPS * 1e9):
        bw, note = UNRESOLVED_BUSBW_GBPS, "time does not grow with size: busbw unresolved"
    else:
        bw = 1.0 / beta / 1e9
    return Fit(kind, n, alpha * 1e6, bw, r2, len(x), tuple(int(b) for b in nbytes), tuple(float(s) for s in seconds),
               note)


# ---- collectives (one spawned process per rank) ----------------------------------------------
def _sizes(min_bytes: int, max_bytes: int, points: int) -> list[int]:
    if points == 1 or min_bytes == max_bytes:
        return [min_bytes]
    return sorted({int(round(v)) for v in np.geomspace(min_bytes, max_bytes, points)})


def _message(kind: str, n: int, nbytes: int, isz: int) -> tuple[int, int]:
    """(elements of each rank's input, bytes as the cost model counts them) for a message of
    about ``nbytes``: a multiple of n elements in all."""
    total = max(n, int(round(nbytes / isz / n)) * n)
    per_rank = total // n if KIND[kind].law_buffer == "result" else total
    return per_rank, total * isz


def _step(kind: str) -> Any:
    from .codegen.program import Step
    ck = KIND[kind]
    # every dim / root 0, on mesh axis 0; send_recv from rank 0 to 1; reductions sum
    attrs: dict[str, Any] = {a: ((0, 1),) if a == "pairs" else 0 for a in ck.attrs}
    if ck.team:
        attrs["axis"] = 0
    if ck.reduce_ops:
        attrs["op"] = ck.reduce_ops[0]
    return Step.make(kind, f"o_{kind}", ["a"], **attrs)


def _collective_worker(rank: int, cfg: dict[str, Any]) -> list[tuple[str, int, int, float]] | None:
    """Runs on every rank: times every (kind, team size, size); rank 0 returns
    ``[(kind, n, model bytes, median seconds)]``."""
    import torch.distributed as dist

    from .codegen.program import Program
    from .runtime.distributed import DistRuntime

    torch.set_num_threads(cfg["threads"])
    dtype = DTYPES[cfg["dtype"]]
    isz = torch.empty((), dtype=dtype).element_size()
    cuda = cfg["device"] == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    out: list[tuple[str, int, int, float]] = []
    for n in cfg["team_sizes"]:
        kinds = [k for k in cfg["kinds"] if KIND[k].team or n == 2]
        steps = tuple(_step(k) for k in kinds)
        prog = Program((n,), tuple(range(n)), ("a",), tuple(s.out for s in steps), steps)
        rt = DistRuntime(prog, check_inputs=False, device=device)
        try:
            if rank >= n or not steps:
                continue
            group = rt.teams[0].group
            token = torch.zeros(1, device=device)

            def barrier() -> None:
                dist.all_reduce(token, group=group)
                sync()

            keys: list[tuple[str, int]] = []
            times: list[list[float]] = []
            for idx, (kind, step) in enumerate(zip(kinds, steps)):
                seen: set[int] = set()
                for nbytes in cfg["sizes"]:
                    elems, model_bytes = _message(kind, n, nbytes, isz)
                    if model_bytes in seen:
                        continue
                    seen.add(model_bytes)
                    env = {"a": torch.ones(elems, dtype=dtype, device=device)}
                    run = _step_runner(rt, step, idx, env)
                    for _ in range(cfg["warmup"]):
                        run()
                    sync()
                    ts = []
                    for _ in range(cfg["reps"]):
                        barrier()
                        t0 = time.perf_counter()
                        run()
                        sync()
                        ts.append(time.perf_counter() - t0)
                    keys.append((kind, model_bytes))
                    times.append(ts)
                    del env, run
            # a run takes as long as its slowest member
            tt = torch.tensor(times, dtype=torch.float64, device=device)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX, group=group)
            for (kind, model_bytes), ts in zip(keys, tt.cpu().tolist()):
                out.append((kind, n, model_bytes, statistics.median(ts)))
        finally:
            rt.close()
    return out if rank == 0 else None


def _step_runner(rt: Any, step: Any, idx: int, env: dict[str, torch.Tensor]) -> Callable[[], None]:
    """Execute ``step`` (index ``idx`` of ``rt.program``) on ``env`` exactly as ``DistRuntime.run``
    dispatches it, without the per-``run`` input checks."""
    if not KIND[step.kind].team:
        return lambda: rt._send_recv(step, idx, env)
    return lambda: rt._team_collective(step, idx, env)


# ---- the device ---------------------------------------------------------------------------------
def _median_time(fn: Callable[[], Any], sync: Callable[[], None], reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measure_device(device: torch.device, *, copy_bytes: int, matmul_size: int, dtypes: Sequence[str],
                   reps: int, warmup: int, threads: int | None = None) -> dict[str, Any]:
    """Copy bandwidth (GB/s, read + write), launch overhead (us) and matmul rate per dtype width
    (``{"<bytes>": (dtype, TFLOP/s)}``) of ``device``, using ``threads`` CPU threads (default:
    torch's current setting; the caller's setting is restored)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        res = _measure_device(device, copy_bytes, matmul_size, dtypes, reps, warmup)
    finally:
        torch.set_num_threads(before)
    res["threads"] = threads if threads is not None else before
    return res


def _measure_device(device: torch.device, copy_bytes: int, matmul_size: int, dtypes: Sequence[str],
                    reps: int, warmup: int) -> dict[str, Any]:
    cuda = device.type == "cuda"
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine() or "cpu")
    res: dict[str, Any] = {"device": f"{device} ({name})", "notes": []}

    elems = max(1, copy_bytes // 4)
    src = torch.ones(elems, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = _median_time(functools.partial(dst.copy_, src), sync, reps, warmup)
    res["hbm_gbps"] = 2 * elems * 4 / t / 1e9
    del src, dst

    x = torch.zeros(1, device=device)
    burst = 200

    def launches() -> None:
        for _ in range(burst):
            x.add_(1.0)
    res["launch_us"] = _median_time(launches, sync, max(3, reps // 2), 1) / burst * 1e6

    peaks: dict[str, tuple[str, float]] = {}
    for name_dt in dtypes:
        dt = DTYPES[name_dt]
        width = str(torch.empty((), dtype=dt).element_size())
        try:
            a = torch.randn(matmul_size, matmul_size, device=device).to(dt)
            b = torch.randn(matmul_size, matmul_size, device=device).to(dt)
            c = torch.empty(matmul_size, matmul_size, dtype=dt, device=device)
            t = _median_time(lambda: torch.matmul(a, b, out=c), sync, max(3, reps // 2), min(warmup, 2))
        except (RuntimeError, NotImplementedError) as e:  # e.g. a dtype this device cannot multiply
            res["notes"].append(f"matmul {name_dt} on {device} failed ({type(e).__name__}: {e}); keeping the "
                                f"base profile's peak for width {width}")
            continue
        tflops = 2 * matmul_size ** 3 / t / 1e12
        if width not in peaks or tflops > peaks[width][1]:
            peaks[width] = (name_dt, tflops)
    res["peak_tflops"] = peaks
    return res


# ---- driver -------------------------------------------------------------------------------------
def _team_sizes(nprocs: int) -> list[int]:
    sizes = {nprocs} | {2 ** k for k in range(1, nprocs.bit_length()) if 2 ** k <= nprocs}
    return sorted(s for s in sizes if s >= 2)


def _check_int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ReshardError(f"tune: {name} must be an integer >= {lo}, got {v!r}")
    return v


def tune(*, nprocs: int = 2, min_bytes: int | None = None, max_bytes: int | None = None, points: int | None = None,
         reps: int | None = None, warmup: int | None = None, backend: str = "auto", dtype: str = "float32",
         out: str | Path | None = None, kinds: Sequence[str] | None = None, team_sizes: Sequence[int] | None = None,
         copy_bytes: int | None = None, matmul_size: int | None = None,
         matmul_dtypes: Sequence[str] = MATMUL_DTYPES, base: CostProfile | dict | str | None = None,
         name: str | None = None, timeout_s: float = 300.0, threads: int | None = None,
         log: Callable[[str], None] | None = None) -> TuneResult:
    """Measure this machine and fit a ``CostProfile`` (see the module docstring).

    ``backend``: "auto" (NCCL when CUDA is available, else gloo), "gloo" or "nccl".  Sizes,
    ``points``, ``reps``, ``warmup``, ``copy_bytes`` and ``matmul_size`` default per device
    (GPU: 4 KiB..256 MiB, CPU: 1 KiB..4 MiB).  ``kinds`` / ``team_sizes`` restrict what is
    measured (default: every kind; powers of two up to ``nprocs`` and ``nprocs``).  ``threads``:
    CPU threads per process, in the ranks and for the device figures (default: the cores
    divided among the ``nprocs`` ranks, as when they run a plan; on an oversubscribed CPU
    multi-threaded kernels get orders of magnitude slower).  Figures not measured come from
    ``base`` (default: the built-in profile).  Writes the profile to ``out``
    when given.  Raises ``ReshardError`` on bad arguments or a failed measurement."""
    say = log or (lambda s: None)
    if backend not in ("auto", "gloo", "nccl"):
        raise ReshardError(f"tune: backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    nprocs = _check_int("nprocs", nprocs, 1)
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ReshardError("tune: backend 'nccl' needs CUDA, but torch.cuda.is_available() is False "
                               "(use --backend gloo on a CPU-only machine)")
        if nprocs > torch.cuda.device_count():
            raise ReshardError(f"tune: --nprocs {nprocs} with NCCL needs {nprocs} GPUs, this machine has "
                               f"{torch.cuda.device_count()}")
    dev = "cuda" if backend == "nccl" else "cpu"
    d = _DEFAULTS[dev]
    min_bytes = _check_int("min_bytes", d["min_bytes"] if min_bytes is None else min_bytes, 1)
    max_bytes = _check_int("max_bytes", d["max_bytes"] if max_bytes is None else max_bytes, 1)
    if max_bytes <= min_bytes:
        raise ReshardError(f"tune: the largest message size ({max_bytes} B) must exceed the smallest ({min_bytes} B)")
    points = _check_int("points", d["points"] if points is None else points, 2)
    reps = _check_int("reps", d["reps"] if reps is None else reps, 1)
    warmup = _check_int("warmup", d["warmup"] if warmup is None else warmup, 0)
    copy_bytes = _check_int("copy_bytes", d["copy_bytes"] if copy_bytes is None else copy_bytes, 4)
    matmul_size = _check_int("matmul_size", d["matmul_size"] if matmul_size is None else matmul_size, 1)
    if dtype not in DTYPES:
        raise ReshardError(f"tune: dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    bad = [t for t in matmul_dtypes if t not in DTYPES]
    if bad:
        raise ReshardError(f"tune: matmul dtypes {bad} unknown (known: {sorted(DTYPES)})")
    kinds = list(KIND_NAMES if kinds is None else kinds)
    bad = [k for k in kinds if k not in KIND]
    if bad or not kinds:
        raise ReshardError(f"tune: unknown collective kinds {bad} (known: {list(KIND_NAMES)})" if bad
                           else "tune: no collective kinds to measure")
    if team_sizes is None:
        sizes_n = _team_sizes(nprocs)
    else:
        sizes_n = sorted({_check_int("team size", n, 2) for n in team_sizes})
        if sizes_n and sizes_n[-1] > nprocs:
            raise ReshardError(f"tune: team sizes {sizes_n} exceed --nprocs {nprocs}")
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // nprocs)
    threads = _check_int("threads", threads, 1)
    base_prof = CostProfile.load(base)
    msg_sizes = _sizes(min_bytes, max_bytes, points)
    notes: list[str] = []

    fits: list[Fit] = []
    if nprocs >= 2 and sizes_n:
        from .runtime.distributed import launch
        cfg = {"team_sizes": sizes_n, "kinds": kinds, "sizes": msg_sizes, "reps": reps, "warmup": warmup,
               "dtype": dtype, "device": dev, "threads": threads}
        say(f"timing {len(kinds)} collective kinds on team sizes {sizes_n}, {len(msg_sizes)} sizes "
            f"{min_bytes}..{max_bytes} B, {reps} reps ({backend}, {nprocs} processes)")
        t0 = time.perf_counter()
        per_rank = launch(_collective_worker, nprocs, cfg, backend=backend, timeout_s=timeout_s)
        say(f"  collectives timed in {time.perf_counter() - t0:.1f} s")
        points_by: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for kind, n, b, s in per_rank[0]:
            points_by.setdefault((kind, n), []).append((b, s))
        for kind in kinds:
            for n in sizes_n:
                pts = points_by.get((kind, n))
                if not pts:
                    continue
                if len(pts) < 2:
                    notes.append(f"{kind} n={n}: only {len(pts)} distinct size; not fitted")
                    continue
                fits.append(fit_points(kind, n, [b for b, _ in pts], [s for _, s in pts]))
    else:
        notes.append("nprocs = 1: no collectives measured; collective figures are the base profile's")

    device = torch.device("cuda", 0) if dev == "cuda" else torch.device("cpu")
    say(f"measuring {device}: copy bandwidth, launch overhead, matmul {list(matmul_dtypes)} at N={matmul_size}")
    dev_figs = measure_device(device, copy_bytes=copy_bytes, matmul_size=matmul_size, dtypes=matmul_dtypes,
                              reps=reps, warmup=warmup, threads=threads)
    notes += dev_figs.pop("notes")
    profile = _build_profile(base_prof, fits, dev_figs, name=name, meta={
        "source": "reshard tune", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "torch": torch.__version__, "backend": backend, "nprocs": nprocs,
        "dtype": dtype, "threads": threads, "message_bytes": msg_sizes, "reps": reps, "warmup": warmup,
        "tf32": bool(torch.backends.cuda.matmul.allow_tf32) if dev == "cuda" else None,
        "matmul_size": matmul_size, "copy_bytes": copy_bytes, "notes": notes})
    result = TuneResult(profile, fits, dev_figs, None, notes)
    if out is not None:
        result.path = profile.save(out)
    return result


def _build_profile(base: CostProfile, fits: list[Fit], dev: dict[str, Any], *, name: str | None,
                   meta: dict[str, Any]) -> CostProfile:
    collectives: dict[str, dict[str, dict[str, float]]] = {}
    alpha = dict(base.alpha_us)
    bw = dict(base.busbw_gbps)
    for f in sorted(fits, key=lambda f: (f.kind, f.n)):
        collectives.setdefault(f.kind, {})[str(f.n)] = {"alpha_us": f.alpha_us, "busbw_gbps": f.busbw_gbps}
        alpha[f.kind], bw[f.kind] = f.alpha_us, f.busbw_gbps  # the largest team's figures (sorted by n)
    peak = dict(base.peak_tflops)
    peak.update({w: tf for w, (_, tf) in dev["peak_tflops"].items()})
    meta = {**meta, "device": dev["device"],
            "fits": [{k: v for k, v in asdict(f).items()} for f in fits],
            "matmul": {w: {"dtype": dt, "tflops": tf} for w, (dt, tf) in dev["peak_tflops"].items()}}
    prof = replace(base, name=name or f"measured: {dev['device']} x{meta['nprocs']} ({meta['backend']})",
                   alpha_us=alpha, busbw_gbps=bw, collectives=collectives, hbm_gbps=dev["hbm_gbps"],
                   launch_us=dev["launch_us"], peak_tflops=peak, meta=meta)
    return CostProfile.load(prof.to_json())  # validated as any profile file is


# ---- command line -------------------------------------------------------------------------------
def parse_bytes(text: str) -> int:
    """'4096', '4K', '64M', '1G' (binary units) -> bytes."""
    s = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    num = s[:-1] if s[-1:] in ("K", "M", "G") else s
    try:
        v = float(num) * mul
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 4096, 4K, 64M)") from None
    if not math.isfinite(v) or v < 1 or v != int(v):
        raise argparse.ArgumentTypeError(f"not a positive whole byte count: {text!r}")
    return int(v)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``reshard tune`` / ``scripts/tune_cost_model.py``."""
    p.add_argument("--nprocs", type=int, default=2, help="processes (ranks; GPUs with NCCL), default 2")
    p.add_argument("--sizes", nargs=2, type=parse_bytes, metavar=("MIN", "MAX"),
                   help="smallest and largest message in bytes (4K, 64M ...); default GPU 4K 256M, CPU 1K 4M")
    p.add_argument("--points", type=int, help="message sizes, geometric between MIN and MAX (default 12 GPU, 8 CPU)")
    p.add_argument("--reps", type=int, help="timed repetitions per point, median taken (default 20 GPU, 10 CPU)")
    p.add_argument("--warmup", type=int, help="untimed repetitions first (default 5 GPU, 2 CPU)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: NCCL when CUDA is available, else gloo")
    p.add_argument("--dtype", default="float32", help=f"element type of the messages: {sorted(DTYPES)}")
    p.add_argument("--out", default="cost_profile.json", help="profile JSON to write (default cost_profile.json)")
    p.add_argument("--kinds", help=f"comma-separated collective kinds (default all: {','.join(KIND_NAMES)})")
    p.add_argument("--team-sizes", help="comma-separated team sizes (default powers of 2 up to nprocs, and nprocs)")
    p.add_argument("--matmul-size", type=int, help="N of the N x N matmuls (default 8192 GPU, 512 CPU)")
    p.add_argument("--matmul-dtypes", default=",".join(MATMUL_DTYPES), help="comma-separated dtypes to time matmul in")
    p.add_argument("--copy-bytes", type=parse_bytes,
                   help="buffer of the copy-bandwidth test (default 512M GPU, 64M CPU)")
    p.add_argument("--base", help="profile (file or built-in name) for figures not measured (default built-in)")
    p.add_argument("--name", help="profile name (default: describes the device)")
    p.add_argument("--threads", type=int, help="CPU threads per process (default: cores / nprocs)")
    p.add_argument("--timeout", type=float, default=300.0, help="process-group timeout in seconds (default 300)")


def _csv(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def run_from_args(args: argparse.Namespace) -> int:
    """``reshard tune``: measure, write the profile, print the fit table; 0 on success.
    Raises ``ReshardError`` on bad options or a failed measurement."""
    team = _csv(args.team_sizes)
    try:
        team_sizes = None if team is None else [int(t) for t in team]
    except ValueError:
        raise ReshardError(f"tune: --team-sizes must be comma-separated integers, got {args.team_sizes!r}") from None
    res = tune(nprocs=args.nprocs, min_bytes=args.sizes[0] if args.sizes else None,
               max_bytes=args.sizes[1] if args.sizes else None, points=args.points, reps=args.reps,
               warmup=args.warmup, backend=args.backend, dtype=args.dtype, out=args.out, kinds=_csv(args.kinds),
               team_sizes=team_sizes, copy_bytes=args.copy_bytes, matmul_size=args.matmul_size,
               matmul_dtypes=_csv(args.matmul_dtypes) or [], base=args.base, name=args.name, timeout_s=args.timeout,
               threads=args.threads,
               log=lambda s: print(s, file=sys.stderr))
    print(res.table())
    print(f"wrote {res.path} (profile {res.profile.name!r}); use it with "
          f"reshard.optimize(fusion, cost_profile={str(res.path)!r})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python scripts/tune_cost_model.py`` / ``python -m reshard.tune``."""
    ap = argparse.ArgumentParser(prog="tune_cost_model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return run_from_args(args)
    except ReshardError as e:
        print(f"tune_cost_model: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
