"""The ``reshard`` command line.

``reshard demo``          optimize the built-in transformer block, explain the plan, run it on
                          CPU-simulated ranks and check it against the unsharded reference.
``reshard explain FILE``  the same for a Python file that defines ``fusion`` (a Fusion) or
                          ``build()`` returning one.
``reshard tune``          measure collectives, copy bandwidth, matmul peak and launch overhead
                          on this machine and write a cost profile (``reshard tune --help``).
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path

import torch

from .egraph_rules.cost import builtin_profiles
from .egraph_rules.saturate import Limits, SaturationReport
from .examples import transformer_block, transformer_stack
from .ir.errors import ReshardError
from .ir.fusion import DTYPES, Fusion
from .ir.interpreter import run_reference
from .ir.mesh import DeviceMesh
from .explain import print_explanation
from .plan import Plan, optimize


class _Progress:
    """Saturation progress on stderr: iterations, e-nodes and elapsed time, every ``every``
    iterations or after ``seconds`` without a line, whichever comes first."""

    def __init__(self, every: int = 3, seconds: float = 2.0) -> None:
        self.every, self.seconds, self.last = every, seconds, 0.0

    def __call__(self, report: SaturationReport) -> None:
        if report.iterations % self.every and report.seconds - self.last < self.seconds:
            return
        self.last = report.seconds
        where = f"segment {report.segment}/{report.segments}, " if report.segments > 1 else ""
        print(f"  saturation: {where}iteration {report.iterations}, {report.enodes} e-nodes, "
              f"{report.seconds:.2f} s elapsed", file=sys.stderr, flush=True)


def random_inputs(fusion: Fusion, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random global inputs for ``fusion`` (scaled so that deep blocks stay well conditioned)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i in fusion.inputs:
        t = fusion.tensors[i]
        scale = t.shape[0] ** -0.5 if len(t.shape) == 2 and t.name != "x" else 1.0
        out[t.name] = (torch.randn(t.shape, generator=gen) * scale).to(DTYPES[t.dtype])
    return out


#: largest relative error accepted by ``check`` per output dtype
CHECK_TOLERANCE = {"bfloat16": 3e-2, "float16": 4e-3, "float32": 1e-4, "float64": 1e-10}


def check(plan: Plan, fusion: Fusion, seed: int = 0, device: str | None = None) -> float:
    """Simulate ``plan`` on random inputs (local steps on ``device``: the CPU, or a GPU's
    NVRTC kernels); return the largest error relative to each output's magnitude; raise
    ReshardError on a mismatch."""
    inputs = random_inputs(fusion, seed)
    outs = plan.simulate(inputs, generator=torch.Generator().manual_seed(seed), device=device)
    refs = run_reference(fusion, inputs)
    worst = 0.0
    for k, (o, r) in enumerate(zip(outs, refs)):
        if o.shape != r.shape:
            raise ReshardError(f"output {k}: plan produced shape {tuple(o.shape)}, reference {tuple(r.shape)}")
        err = ((o.double() - r.double()).abs().max() / r.double().abs().max().clamp_min(1e-30)).item()
        worst = max(worst, err)
    dtypes = {str(r.dtype).removeprefix("torch.") for r in refs}
    # a different summation order (partial sums, then a reduction) rounds differently
    tolerance = max(CHECK_TOLERANCE.get(d, 1e-4) for d in dtypes)
    if worst > tolerance:
        raise ReshardError(f"plan does not match the reference: relative error {worst:.3g} "
                           f"(tolerance {tolerance:g} for {', '.join(sorted(dtypes))})")
    return worst


def _run(fusion: Fusion, title: str, args: argparse.Namespace) -> int:
    quiet, draw = args.quiet, args.draw
    if draw is not None:
        from .draw import check_path
        check_path(draw)  # a bad path fails before the optimization, not after
    limits = Limits(time_limit_s=args.time_limit, segment_ops=args.segment_ops)
    print(f"== {title}: {len(fusion.ops)} ops on mesh {fusion.tensors[fusion.inputs[0]].mesh}")
    t0 = time.perf_counter()
    plan = optimize(fusion, cost_profile=args.profile, limits=limits, extractor=args.extractor,
                    progress=None if quiet else _Progress())
    print(f"optimized in {time.perf_counter() - t0:.2f} s ({plan.report})")
    print(f"cost profile: {plan.profile.name}; {plan.extraction}\n")
    print_explanation(plan)
    if draw is not None:
        print(f"\nplan drawn to {plan.draw(draw)}")
    err = check(plan, fusion)
    print(f"\ncheck: simulated {len(plan.program.mesh_ranks)} ranks on CPU, outputs match the unsharded "
          f"reference (max relative error {err:.2e}); plan digest {plan.digest()[:16]}")
    if torch.cuda.is_available():
        err = check(plan, fusion, device="cuda")
        print(f"check: the same ranks with their local steps as NVRTC kernels on {torch.cuda.get_device_name()}: "
              f"outputs match the reference (max relative error {err:.2e})")
    return 0


def _load_fusion(path: str) -> Fusion:
    p = Path(path)
    if not p.is_file():
        raise ReshardError(f"reshard explain: no such file {path!r}")
    ns = runpy.run_path(str(p))
    fusion = ns.get("fusion")
    if fusion is None and callable(ns.get("build")):
        fusion = ns["build"]()
    if not isinstance(fusion, Fusion):
        raise ReshardError(f"reshard explain: {path} must define `fusion` (a reshard.Fusion) or `build()` returning one")
    return fusion


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="reshard", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="optimize, explain and check the built-in transformer block")
    demo.add_argument("--ranks", type=int, default=2, help="devices in the 1-D mesh (default 2)")
    demo.add_argument("--seq", type=int, default=16)
    demo.add_argument("--hidden", type=int, default=32)
    demo.add_argument("--heads", type=int, default=4)
    demo.add_argument("--layers", type=int, default=1, help="blocks in sequence (default 1)")
    ex = sub.add_parser("explain", help="optimize, explain and check the Fusion a Python file builds")
    ex.add_argument("file")
    for p in (demo, ex):
        p.add_argument("-q", "--quiet", action="store_true", help="no saturation progress")
        p.add_argument("--draw", metavar="PATH", help="also draw the plan to PATH (.png or .svg)")
        p.add_argument("--profile", metavar="NAME|PATH", help="cost profile: a built-in name "
                       f"({', '.join(builtin_profiles())}) or a JSON file (default: the built-in H200 figures)")
        p.add_argument("--extractor", choices=("greedy", "ilp"), default="greedy",
                       help="greedy DAG extraction + sharing search (default), or the exact ILP")
        p.add_argument("--time-limit", type=float, default=Limits.time_limit_s, metavar="S",
                       help=f"saturation time limit in seconds (default {Limits.time_limit_s:g})")
        p.add_argument("--segment-ops", type=int, default=Limits.segment_ops, metavar="N",
                       help=f"saturate programs over N ops in segments of N (default {Limits.segment_ops})")
    from . import tune as _tune
    _tune.add_arguments(sub.add_parser("tune", help="measure this machine and write a calibrated cost profile (JSON)"))
    args = ap.parse_args(argv)
    try:
        if args.cmd == "tune":
            return _tune.run_from_args(args)
        if args.cmd == "demo":
            mesh = DeviceMesh(list(range(args.ranks)), ("tp",))
            if args.layers < 1:
                raise ReshardError(f"reshard demo: --layers must be at least 1, got {args.layers}")
            if args.layers == 1:
                fusion = transformer_block(mesh, args.seq, args.hidden, args.heads)
                title = "transformer block (attention + MLP, sequence/tensor parallel)"
            else:
                fusion = transformer_stack(args.layers, mesh, args.seq, args.hidden, args.heads)
                title = f"{args.layers} transformer blocks (attention + MLP, sequence/tensor parallel)"
            return _run(fusion, title, args)
        return _run(_load_fusion(args.file), args.file, args)
    except ReshardError as e:
        print(f"reshard: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
