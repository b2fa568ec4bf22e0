"""Planning a real-size training step (issue 27): time, memory and plan quality by depth.

    python benchmarks/train_scale.py [--layers 1 2 4 8 16 32] [--mesh tp2 tp4 tp8 dp2xtp4]
                                     [--models llama2-7b gpt2-xl mixtral-8x7b] [--dtype bfloat16]
                                     [--time-limit S] [--extractor greedy|windows] [--profile P] [--json PATH]

For each (model, mesh, layers), in a process of its own (``--one``, so peak RSS is per plan),
the whole ``LlamaForCausalLM`` / ``GPT2LMHeadModel`` at Llama-2-7B / GPT-2 XL's real shapes
(``real_models.MODELS``; ``--layers`` decoder layers; ``mixtral-8x7b``, not run by default:
``MixtralForCausalLM`` at Mixtral-8x7B's shapes, 8 experts, 2 per token, with its
load-balancing loss, ``real_models.TRAINED``) is built on the meta device
(``real_models._whole_model``: input ids and labels to HF's own loss), exported for training
(``from_torch(..., train=True)``: the joint forward + backward program, outputs the loss and
every parameter's gradient at the parameter's placement; what ``reshard.plan_training`` does,
timed in two parts) and optimized (``rs.optimize``, ``--extractor``: greedy by default, as
``optimize()``'s; no memory budget).
GPT-2's dropout is set to 0 (a plan has no random ops; modern pretraining runs without it).

Placements are Megatron's (``real_models.megatron_params``): the embedding and lm head
vocab-parallel (GPT-2's tied), q/k/v/gate/up and ``c_attn``/``c_fc`` column-parallel
(``c_attn`` at the per-head ``[q | k | v]`` layout), o/down/``c_proj`` row-parallel; norms
replicated; a mixture's stacked experts split along the experts (expert parallel).
``--mesh``: ``tpN`` is a 1-D mesh of N ranks, batch 1, ids and labels replicated;
``dpMxtpN`` is the ``dp x tp`` mesh (``fused_qkv.block_mesh``), batch M (one sequence per dp
rank), ids and labels ``[Shard(0), Replicate()]`` and every parameter replicated over dp (the
gradients then come out replicated over dp: the plan includes the data-parallel gradient
all-reduce).  The loss is replicated.

Columns, per plan:

- **ops**: ops of the training Fusion (forward and backward);
- **export s / optimize s / wall s**: ``from_torch(train=True)``, ``optimize()``, and the
  whole planning (building the meta model + export + optimize; the ``import`` of torch and
  transformers is not counted);
- **peak RSS**: the child process's ``ru_maxrss`` (imports and the export included), or, where
  extraction forked (``extract.second_core``: a candidate finished on the second core), the
  peak of the planning process's and its children's proportional set sizes together
  (``PeakMemory``: shared pages counted once), whichever is larger;
- **search**: segments, whether saturation completed (``report.saturated``, else the limit
  hit) and ``report.cut`` (the phases the time limit cut short);
- **collectives**, **MiB / rank** (``plan.comm_bytes``: what each rank receives),
  **modeled ms** (``plan.cost``, kernels included), **saved MiB** (``plan.saved_bytes``);
- **phases** (each row's progress line on stderr, and ``--json``): seconds per step of ``optimize()``
  (``Phases``: saturation, the extraction's steps, lowering), where the time goes;
- **layers planned**: for a stack planned once per layer (``plan.report.layers``), the layers of
  the program that was planned and the one whose plan was repeated;
- **linearity**: per (model, mesh), the two smallest depths measured, a < b, give the bytes of
  one layer ``p = (B(b) - B(a)) / (b - a)`` and of the ends (embedding, final norm, lm head,
  loss and their gradients) ``e = B(a) - a p``; each row shows ``p`` (MiB / layer) and
  ``B(N) / (e + N p) - 1``, how far its bytes are from the straight line through the two
  reference plans (``ref`` on those two; ``n/a`` with a single depth).  A plan that treats
  every layer alike is on the line (0.0%).  A row failing the bytes goal also says where its
  modeled time is against the same line drawn for the modeled time (the planner minimizes
  time, not bytes: a deep stack may buy a faster layer with more bytes);
- **goals** (issue 27: the 32-layer Llama-2-7B step): wall < 30 s, peak RSS < 4 GiB, nothing
  cut and saturation complete, and bytes never more than 1% above the line (a deep plan never
  costlier than its layers planned alone, repeated).  Checked on every row; ``PASS``,
  ``FAIL: <which>``, or ``PASS (linearity n/a)`` without a second depth.  A row more than 1%
  *below* the line passes with a note saying so and, with three depths or more, what a layer
  adds between the two deepest (``deep_per_layer_bytes``) against the line's ``p``: the 1- and
  2-layer programs' layers all border the ends (the embedding before layer 0, the final norm
  and head after the last), while a deep stack's middle layers border layers only and are
  planned once (``extract.layer_reuse``) on a 4-layer program with exact windows, so ``p`` may
  overstate a middle layer (GPT-2 XL at tp 2: 32 layers 21% below the greedy line, 17% below
  the line of ``--extractor windows``, which draws it with the stack's extractor).  Exit
  status 1 when a row fails or errors.

``--time-limit`` (default none: planning is bounded by work, as ``optimize()``'s default) sets a
wall-clock stop; a plan it cut is marked as such.  The plan cache is off (every plan is made).
One plan
alone, its row as JSON: ``python benchmarks/train_scale.py --one llama2-7b tp8 32`` (model,
mesh, layers; the other options as above).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's reshard, also in the --one child processes

import reshard as rs  # noqa: E402
from fused_qkv import block_mesh  # noqa: E402
from real_models import MODELS, TRAINED, _collectives, _mb, _whole_model, megatron_params  # noqa: E402

#: issue 27's goals
WALL_GOAL_S = 30.0
RSS_GOAL_MB = 4 * 1024
LINEAR_GOAL = 0.01


def parse_mesh(spec: str) -> tuple[int, int]:
    """``tp8`` -> (dp 1, tp 8); ``dp2xtp4`` -> (2, 4)."""
    m = re.fullmatch(r"(?:dp(\d+)x)?tp(\d+)", spec)
    if m is None:
        raise argparse.ArgumentTypeError(f"mesh {spec!r}: expected tpN or dpMxtpN")
    return int(m.group(1) or 1), int(m.group(2))


def _mesh_arg(spec: str) -> str:
    parse_mesh(spec)
    return spec


def _no_dropout(module: Any) -> None:
    """Every ``nn.Dropout``'s p set to 0 (HF's attention reads the module's p too)."""
    import torch
    for m in module.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0


class PeakMemory:
    """The peak, over a run, of the proportional set size (``Pss`` of ``/proc/PID/smaps_rollup``)
    of this process and its children together, sampled every ``PERIOD`` s on a thread (Linux;
    elsewhere 0): what a process and the children it forked take, shared pages counted once."""

    PERIOD = 0.25

    def __enter__(self) -> "PeakMemory":
        import threading
        self.peak_kb, self._done = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._done.set()
        self._thread.join()

    @staticmethod
    def _pss_kb(pid: int | str) -> int:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                return next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
        except OSError:
            return 0

    def _sample(self) -> None:
        while not self._done.wait(self.PERIOD):
            kids: list[str] = []
            try:
                for tid in os.listdir("/proc/self/task"):
                    with open(f"/proc/self/task/{tid}/children") as f:
                        kids += f.read().split()
            except OSError:
                return
            self.peak_kb = max(self.peak_kb, self._pss_kb("self") + sum(map(self._pss_kb, kids)))


def step_parts(model: str, mesh_spec: str, layers: int, dtype: Any) -> tuple[Any, list, list, dict, rs.DeviceMesh]:
    """The benchmark's training step before export (module docstring): the meta-device model
    (dropout off), its example inputs and their placements, Megatron's parameter placements
    (replicated over dp) and the mesh."""
    dp, tp = parse_mesh(mesh_spec)
    module, args, in_pl = _whole_model(model, replace(TRAINED[model], batch=dp), layers, dtype)
    _no_dropout(module)
    params = megatron_params(module)
    if dp > 1:
        in_pl = [[rs.Shard(0), rs.Replicate()] for _ in args]
        params = {n: [rs.Replicate(), *p] for n, p in params.items()}
    return module, args, in_pl, params, block_mesh(tp, dp)


def measure_one(model: str, mesh_spec: str, layers: int, dtype_name: str, profile: str | None,
                time_limit: float | None, extractor: str = "greedy") -> dict:
    import torch
    from transformers import GPT2LMHeadModel, LlamaForCausalLM  # noqa: F401  (imported before the clock starts)

    from reshard.frontend.torch_export import from_torch

    dp, tp = parse_mesh(mesh_spec)
    t0 = time.perf_counter()
    module, args, in_pl, params, mesh = step_parts(model, mesh_spec, layers, getattr(torch, dtype_name))
    t1 = time.perf_counter()
    prog = from_torch(module, args, in_pl, None, mesh, param_placements=params, train=True)
    t2 = time.perf_counter()
    phases = Phases()
    with PeakMemory() as mem:
        plan = rs.optimize(prog.fusion, cost_profile=profile, limits=rs.Limits(time_limit_s=time_limit),
                           cache=False, extractor=extractor, progress=phases)
    t3 = time.perf_counter()
    report, comms = plan.report, plan.communications
    planned = "-" if report.layers is None else \
        f"{', '.join(map(str, report.layers[1]))}; {report.layers[1][report.layers[2]]} repeated"
    return {"model": model, "mesh": mesh_spec, "dp": dp, "tp": tp, "layers": layers, "batch": dp,
            "ops": len(prog.fusion.ops), "grads": len(prog.grads), "build_s": t1 - t0, "export_s": t2 - t1,
            "optimize_s": t3 - t2, "wall_s": t3 - t0,
            "peak_rss_mb": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, mem.peak_kb) / 1024,
            "segments": report.segments, "saturated": report.saturated, "limit_hit": report.limit_hit,
            "cut": list(report.cut), "report": str(report), "extraction": str(plan.extraction),
            "extractor": plan.extraction.extractor,
            "collectives": dict(Counter(c.kind for c in comms)), "n_collectives": len(comms),
            "bytes_per_rank": plan.comm_bytes, "modeled_us": plan.cost * 1e6, "saved_bytes": plan.saved_bytes,
            "planned": planned, "digest": plan.digest()[:16], "profile": plan.profile.name,
            "phases": phases.seconds(t3)}


class Phases:
    """Where ``optimize()``'s time goes: its ``progress`` reports (saturation's rounds, then each
    extraction step as it starts) folded into seconds per step, a counted step's counts dropped
    ("exact windows 3/402" and "sharing search releasing 1/2" are "exact windows" and "sharing
    search releasing"; "lowering (layer 2's plan repeated ...)" is "lowering").  A step's
    seconds run from its first report to the next step's; "saturation" from the call (the stack
    found, the program encoded).  The main process's view: a candidate finished in a forked
    child runs beside "exact windows" .. "adopting alternatives" and is waited for in "second
    candidate"."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = [("saturation", time.perf_counter())]

    def __call__(self, report: Any) -> None:
        step = "saturation" if report.phase == "saturation" else report.step or "extraction"
        name = re.sub(r" \(.*| \d+/\d+.*", "", step)
        if self.marks[-1][0] != name:
            self.marks.append((name, time.perf_counter()))

    def seconds(self, end: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for (name, t), after in zip(self.marks, [t for _, t in self.marks[1:]] + [end]):
            out[name] = out.get(name, 0.0) + after - t
        return out


def _run_child(args: argparse.Namespace, model: str, mesh: str, layers: int) -> dict:
    cmd = [sys.executable, __file__, "--one", model, mesh, str(layers), "--dtype", args.dtype] + (
        ["--time-limit", str(args.time_limit)] if args.time_limit is not None else []) + (
        ["--extractor", args.extractor]) + (
        ["--profile", args.profile] if args.profile else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"model": model, "mesh": mesh, "layers": layers, "error": tail[0][:500]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- derived columns -----------------------------------------------------------------------------------------------

def add_linearity(rows: list[dict]) -> None:
    """Per (model, mesh): ``per_layer_bytes``, ``ends_bytes`` from the two smallest depths, and
    each row's ``linear_dev`` (``B(N) / (ends + N per_layer) - 1``; None on the reference rows
    themselves, which are on the line by construction, ``linear_ref``), ``linear_dev_time``
    (the same for the modeled time, the quantity the planner minimizes) and, with three depths
    or more, ``deep_per_layer_bytes``: the bytes per layer between the two deepest."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if "error" not in r:
            groups.setdefault((r["model"], r["mesh"]), []).append(r)
    for group in groups.values():
        depths = sorted({r["layers"] for r in group})
        if len(depths) < 2:
            continue
        a, b = depths[:2]

        def at(d: int, key: str) -> float:
            return next(r[key] for r in group if r["layers"] == d)

        def line(key: str) -> tuple[float, float]:
            """(ends, per layer) of the straight line of ``key`` through depths a and b."""
            p = (at(b, key) - at(a, key)) / (b - a)
            return at(a, key) - a * p, p

        (e, p), (et, pt) = line("bytes_per_rank"), line("modeled_us")
        deep = None
        if len(depths) > 2:
            y, z = depths[-2:]
            deep = (y, z, (at(z, "bytes_per_rank") - at(y, "bytes_per_rank")) / (z - y))
        for r in group:
            r["per_layer_bytes"], r["ends_bytes"], r["line_depths"] = p, e, (a, b)
            if deep is not None:
                r["deep_per_layer_bytes"] = deep
            r["linear_ref"] = r["layers"] in (a, b)
            bytes_line, time_line = e + r["layers"] * p, et + r["layers"] * pt
            r["linear_dev"] = r["bytes_per_rank"] / bytes_line - 1 if bytes_line else None
            r["linear_dev_time"] = r["modeled_us"] / time_line - 1 if time_line else None


def add_goals(rows: list[dict]) -> None:
    """Each row's ``fails`` (the goals it misses), ``notes`` and ``verdict``: bytes more than
    ``LINEAR_GOAL`` above the line fail, more than that below it pass with a note (module
    docstring)."""
    for r in rows:
        if "error" in r:
            r["verdict"] = "ERROR"
            continue
        fails, notes = [], []
        if r["wall_s"] >= WALL_GOAL_S:
            fails.append(f"wall >= {WALL_GOAL_S:.0f} s")
        if r["peak_rss_mb"] >= RSS_GOAL_MB:
            fails.append("peak >= 4 GiB")
        if r["cut"] or not r["saturated"]:
            fails.append("cut" if r["cut"] else "not saturated")
        dev = r.get("linear_dev")
        if dev is not None and dev > LINEAR_GOAL:
            dt = r.get("linear_dev_time")
            fails.append(f"bytes {100 * dev:+.1f}% above linear" + (
                "" if dt is None else f" (modeled time {100 * dt:+.1f}% against its line)"))
        elif dev is not None and dev < -LINEAR_GOAL:
            a, b = r["line_depths"]
            deep = r.get("deep_per_layer_bytes")
            notes.append(f"bytes {100 * dev:+.1f}% below linear" + ("" if deep is None else
                         f": a layer adds {_mb(deep[2])} MiB between {deep[0]} and {deep[1]} layers, "
                         f"{_mb(r['per_layer_bytes'])} between {a} and {b}"))
        if "linear_dev" not in r:
            notes.append("linearity n/a")
        r["fails"], r["notes"] = fails, notes
        r["verdict"] = ("FAIL: " + ", ".join(fails)) if fails else "PASS" + (f" ({'; '.join(notes)})" if notes else "")


def table(rows: list[dict]) -> str:
    lines = ["| model | mesh | layers | ops | export s | optimize s | wall s | peak RSS MB | search | collectives "
             "| MiB / rank | modeled ms | saved MiB | MiB / layer | vs linear | layers planned | goals |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        head = f"| {r['model']} | {r['mesh']} | {r['layers']} "
        if "error" in r:
            lines.append(head + f"| error: {r['error']} ||||||||||||| ERROR |")
            continue
        search = f"{r['segments']} segments, " + (
            "saturated" if r["saturated"] else f"not saturated ({r['limit_hit']})")
        search += f"; cut: {', '.join(r['cut'])}" if r["cut"] else "; nothing cut"
        per_layer = _mb(r["per_layer_bytes"]) if "per_layer_bytes" in r else "n/a"
        dev = "n/a" if "linear_dev" not in r else "ref" if r["linear_ref"] else (
            "?" if r["linear_dev"] is None else f"{100 * r['linear_dev']:+.2f}%")
        lines.append(head + f"| {r['ops']} | {r['export_s']:.1f} | {r['optimize_s']:.1f} | {r['wall_s']:.1f} | "
                     f"{r['peak_rss_mb']:.0f} | {search} | {_collectives(r['collectives'])} | "
                     f"{_mb(r['bytes_per_rank'])} | {r['modeled_us'] / 1e3:.2f} | {_mb(r['saved_bytes'])} | "
                     f"{per_layer} | {dev} | {r['planned']} | {r['verdict']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(TRAINED))
    ap.add_argument("--mesh", nargs="+", type=_mesh_arg, default=["tp2", "tp4", "tp8", "dp2xtp4"],
                    help="tpN (1-D) or dpMxtpN (2-D, batch M sharded over dp)")
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32], help="decoder layers")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--profile", default=None, help="cost profile (default: the built-in one)")
    ap.add_argument("--time-limit", type=float, default=None, help="optimize()'s time limit, seconds (default none)")
    ap.add_argument("--extractor", default="greedy", choices=["greedy", "windows"],
                    help="optimize()'s extractor (default greedy; a stack of 4 layers or more gets windows anyway)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--one", nargs=3, metavar=("MODEL", "MESH", "LAYERS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        model, mesh, layers = args.one
        print(json.dumps(measure_one(model, mesh, int(layers), args.dtype, args.profile, args.time_limit,
                                     args.extractor)))
        return 0
    rows = []
    started = time.perf_counter()
    for model in args.models:
        for mesh in args.mesh:
            for layers in sorted(args.layers):
                rows.append(_run_child(args, model, mesh, layers))
                r = rows[-1]
                print(f"  {model} {mesh} {layers} layers: " + (r.get("error") or f"{r['wall_s']:.1f} s "
                      f"(export {r['export_s']:.1f}, optimize {r['optimize_s']:.1f}), {r['report']}; "
                      f"{r['extraction']}; phases (s): "
                      + ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())), file=sys.stderr, flush=True)
    add_linearity(rows)
    add_goals(rows)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"Training steps (forward, loss, backward) of whole models at real shapes ({args.dtype}; batch 1 on "
          f"tpN, M on dpMxtpN), from the meta device; {when}, {platform.machine()}, {os.cpu_count()} CPUs (load average {load}), Python "
          f"{platform.python_version()}; cost profile {next((r['profile'] for r in rows if 'profile' in r), '?')}; "
          f"extractor {args.extractor}; time limit {'none' if args.time_limit is None else f'{args.time_limit:.0f} s'}; {time.perf_counter() - started:.0f} s in all\n")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 1 if any(r["verdict"] == "ERROR" or r["verdict"].startswith("FAIL") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
