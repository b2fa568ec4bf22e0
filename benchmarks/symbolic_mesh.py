"""Planning once for every tensor-parallel size: ``optimize_symbolic`` vs ``optimize`` per size.

    python benchmarks/symbolic_mesh.py [--tp 2 4 8 16 32 64] [--seq 4096] [--hidden 8192] [--heads 64]
                                       [--layers 1] [--only concrete|symbolic|table|warm]

The program is ``--layers`` Llama-style decoder layers (``reshard.examples.llama_layers``: RMSNorm,
causal attention with rope, SwiGLU; Megatron's placements, sequence-parallel input and output;
from 4 layers on planned layer by layer, symbolically too) on a
1-D mesh ``tp``; the default dims are Llama-2-70B's without grouped-query attention (hidden
8192, 64 heads, sequence 4096).  Prints, as a markdown table: each size's concrete
``optimize()`` time (no plan cache) and modeled step time; the symbolic planning's time
(``optimize_symbolic``: one saturation per size class) and its time with every size's plan
extracted (``SymbolicPlan.table()``, the decision table); the number of size classes; and
checks that each specialized plan models the same time as the concrete one (and is the same
program: its digest).  A warm-up ``optimize()`` runs first, untimed.  ``--only`` runs one side
(after the warm-up) and prints nothing, for timing whole processes against each other.
"""

from __future__ import annotations

import argparse
import time

import reshard as rs
from reshard.examples import llama_layers
from reshard.ir.symbolic import mesh_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--only", choices=["concrete", "symbolic", "table", "warm"],
                    help="run one side only, for timing the whole process: optimize() per size, "
                         "optimize_symbolic(), optimize_symbolic() with every size extracted, or the warm-up alone")
    a = ap.parse_args()

    def program(mesh: rs.DeviceMesh) -> rs.Fusion:
        return llama_layers(a.layers, mesh, seq=a.seq, hidden=a.hidden, heads=a.heads)

    mesh = mesh_for(program(rs.DeviceMesh([0, 1], ("tp",))), {"tp": a.tp})

    rs.optimize(program(mesh.at(tp=a.tp[0])), cache=False)  # warm-up: imports, first e-graph
    if a.only is not None:
        if a.only == "concrete":
            for n in a.tp:
                rs.optimize(program(mesh.at(tp=n)), cache=False)
        elif a.only != "warm":
            sym = rs.optimize_symbolic(program, mesh)
            if a.only == "table":
                sym.table()
        return
    concrete: dict[int, tuple[float, rs.Plan]] = {}
    for n in a.tp:
        t0 = time.perf_counter()
        plan = rs.optimize(program(mesh.at(tp=n)), cache=False)
        concrete[n] = (time.perf_counter() - t0, plan)

    t0 = time.perf_counter()
    sym = rs.optimize_symbolic(program, mesh)
    t_sym = time.perf_counter() - t0
    table = sym.table()
    t_all = time.perf_counter() - t0

    print(f"llama layer seq={a.seq} hidden={a.hidden} heads={a.heads}; tp in {a.tp}; "
          f"{len(sym.classes)} size classes (saturations {sym.saturations}): "
          + ", ".join("{" + ", ".join(str(s["tp"]) for s in c.sizes) + "}" for c in sym.classes))
    print()
    print("| tp | optimize() s | modeled step us | specialized us | same cost | same digest |")
    print("|---:|---:|---:|---:|:---:|:---:|")
    for n in a.tp:
        spec, (t, plan) = sym.specialize(tp=n), concrete[n]
        print(f"| {n} | {t:.2f} | {plan.cost * 1e6:.1f} | {spec.cost * 1e6:.1f} | "
              f"{'yes' if spec.cost == plan.cost else 'NO'} | {'yes' if spec.digest() == plan.digest() else 'no'} |")
    total = sum(t for t, _ in concrete.values())
    print()
    print(f"sum of concrete optimize(): {total:.2f} s; optimize_symbolic(): {t_sym:.2f} s "
          f"({t_sym / total * len(a.tp):.2f} concrete runs); with every size extracted (decision table, "
          f"{len(table)} ranges): {t_all:.2f} s ({t_all / total * len(a.tp):.2f} concrete runs)")
    print()
    print(sym.explain())


if __name__ == "__main__":
    main()
