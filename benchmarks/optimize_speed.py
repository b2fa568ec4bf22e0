"""optimize() time, e-nodes and saturation rounds for transformer stacks of growing depth.

    python benchmarks/optimize_speed.py [--layers 1 2 4 ...] [--repeat 3] [--png PATH]

Prints a markdown table (median wall time of ``--repeat`` runs, whole optimize(): encode,
saturate, extract, lower; peak RSS of the process so far, depths run in increasing order)
and, with matplotlib installed, writes a plot of time vs ops.
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
import time
from datetime import date

import reshard as rs
from reshard.examples import transformer_stack


def measure(layers: int, repeat: int) -> dict:
    f = transformer_stack(layers)
    times, plan = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = rs.optimize(f)
        times.append(time.perf_counter() - t0)
    assert plan is not None
    return {"layers": layers, "ops": len(f.ops), "seconds": statistics.median(times), "enodes": plan.report.enodes,
            "rounds": plan.report.iterations, "segments": plan.report.segments, "saturated": plan.report.saturated,
            "saturate_s": plan.report.seconds, "extract_s": plan.extraction.seconds,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "collectives": len(plan.communications), "comm_bytes": plan.comm_bytes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--png", default="benchmarks/optimize_speed.png")
    args = ap.parse_args()
    rows = []
    for n in args.layers:
        rows.append(measure(n, args.repeat))
        print(f"  {n} layers done", file=sys.stderr)
    print(f"optimize() on transformer stacks (hidden 32, 2-device mesh); {date.today()}, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}\n")
    print("| layers | ops | optimize() s | s / layer | ms / op | saturate s | extract s | segments | rounds | e-nodes "
          "| saturated | collectives | peak RSS MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|")
    for r in rows:
        print(f"| {r['layers']} | {r['ops']} | {r['seconds']:.3f} | {r['seconds'] / r['layers']:.3f} | "
              f"{1e3 * r['seconds'] / r['ops']:.2f} | {r['saturate_s']:.2f} | {r['extract_s']:.2f} | {r['segments']} | "
              f"{r['rounds']} | {r['enodes']} | {'yes' if r['saturated'] else 'no'} | {r['collectives']} | "
              f"{r['peak_mb']:.0f} |")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(matplotlib not installed: no plot)", file=sys.stderr)
        return 0
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["ops"] for r in rows], [r["seconds"] for r in rows], "o-")
    ax.set_xlabel("Fusion ops")
    ax.set_ylabel("optimize() seconds")
    ax.set_title("reshard optimize() vs program size")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print(f"\nplot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
