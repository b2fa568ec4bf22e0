"""``optimize_symbolic`` on every program of the test suite (and, with ``--hf``, the tiny Hugging
Face models of ``tests/test_hf_models.py``, forward with the loss; with ``--train``, the
training tests' GPT-2 and Llama through ``plan_training``): each program's sizes among
``--sizes`` (1-D meshes; 2-D meshes: ``--sizes-2d`` per axis) that split its fixed dims evenly
(``ir.symbolic.mesh_for``), planned once; at every size the specialized plan must model the same
time as ``optimize()`` of the concrete program, be the same program (digest), and simulate to the
reference (the module's eager output for the models).

    python scripts/symbolic_suite.py [--sizes 2 3 4 8] [--sizes-2d 2 4] [--hf] [--train] [--no-suite]

Prints a line per program: its domain, the e-graphs saturated (size classes), and per size
(cost equal, digest equal, simulation matches); programs refused (a sharding naming concrete
sizes) say why.  Exit status 1 when some size disagrees.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, "..")]

import torch  # noqa: E402

import reshard as rs  # noqa: E402
from reshard.ir.symbolic import mesh_for, on_mesh  # noqa: E402
from reshard.testing import programs as P  # noqa: E402


def suite() -> list[tuple[str, rs.Fusion]]:
    """Every program of ``tests/programs.py`` its function builds without arguments."""
    out = []
    for name in sorted(dir(P)):
        fn = getattr(P, name)
        if callable(fn) and getattr(fn, "__module__", "") == P.__name__ and not name.startswith("_"):
            try:
                f = fn()
            except TypeError:
                continue
            if isinstance(f, rs.Fusion):
                out.append((name, f))
    return out


def check(name: str, f: rs.Fusion, sizes: list[int], sizes_2d: list[int],
          reference: tuple[dict, tuple] | None = None) -> bool:
    """One program through ``optimize_symbolic``, every size checked (module docstring)."""
    axes = f.tensors[0].mesh.axis_names
    try:
        mesh = mesh_for(f, {a: sizes if len(axes) == 1 else sizes_2d for a in axes})
        t0 = time.perf_counter()
        sym = rs.optimize_symbolic(f, mesh)
    except rs.ReshardError as e:
        print(f"{name}: refused: {str(e)[:160]}")
        return True
    good, rows = True, []
    for point in mesh.points():
        concrete_f = on_mesh(f, mesh.at(**point))
        plan, concrete = sym.specialize(**point), rs.optimize(concrete_f, cache=False)
        inputs, want = reference if reference is not None else (P.random_inputs(concrete_f), None)
        got = plan.simulate(inputs, generator=torch.Generator().manual_seed(0))
        want = want if want is not None else rs.run_reference(concrete_f, inputs)
        sim = all(torch.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want))
        same = (plan.cost == concrete.cost, plan.digest() == concrete.digest(), sim)
        good &= same[0] and same[2]
        rows.append(f"{'x'.join(str(n) for n in point.values())}:{''.join('y' if s else 'N' for s in same)}")
    print(f"{name}: {dict(mesh.domain)} {sym.saturations} e-graph(s) for {len(mesh.points())} sizes, "
          f"{time.perf_counter() - t0:.1f} s; size:cost/digest/simulation {' '.join(rows)}", flush=True)
    return good


def hf_models() -> list[tuple[str, rs.Fusion, tuple[dict, tuple]]]:
    """The tiny models of ``tests/test_hf_models.py`` on 2 ranks, traced with their inputs."""
    from reshard.testing.hf_models import MESH2, MODELS, build, megatron, placements
    out = []
    for name in sorted(MODELS):
        module, args = build(name, MESH2)
        ins, outs = placements(name, MESH2)
        tp = rs.from_torch(module, args, ins, outs, MESH2, param_placements=megatron(module, MESH2))
        with torch.no_grad():
            want = module(*args)
        out.append((name, tp.fusion, (tp.inputs(*args), want if isinstance(want, tuple) else (want,))))
    return out


def check_training(name: str, sizes: list[int]) -> bool:
    """The training tests' tiny model ``name`` through ``plan_training`` on a symbolic tp mesh
    (Megatron placements), every size against ``plan_training`` on the concrete mesh (gradients,
    modeled cost, digest) and simulated to the unsharded reference."""
    from reshard.testing.hf_models import megatron
    from reshard.testing.train_models import HEADS, KV_HEADS, batch, build, plan_inputs

    module = build(name)
    ok_sizes = [n for n in sizes if HEADS % n == 0 and KV_HEADS % n == 0]
    params = megatron(module, rs.DeviceMesh([0, 1], ("tp",)))
    shapes = dict(module.named_parameters())
    facts = sorted({KV_HEADS} | {shapes[n].shape[pl[-1].dim] for n, pl in params.items()})  # the split dims
    mesh = rs.SymbolicMesh(("tp",), {"tp": ok_sizes}, {"tp": facts})
    t0 = time.perf_counter()
    sym = rs.plan_training(module, batch(0), mesh, param_placements=params)
    good, rows = True, []
    for n in ok_sizes:
        got = sym.specialize(tp=n)
        concrete = rs.plan_training(module, batch(0), mesh.at(tp=n), param_placements=params, cache=False)
        inputs = plan_inputs(got, module, batch(0))
        sim = all(torch.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(
            got.plan.simulate(inputs, generator=torch.Generator().manual_seed(0)),
            rs.run_reference(got.plan.source, inputs)))
        same = (got.grads == concrete.grads and got.plan.cost == concrete.plan.cost,
                got.plan.digest() == concrete.plan.digest(), sim)
        good &= same[0] and same[2]
        rows.append(f"{n}:{''.join('y' if x else 'N' for x in same)}")
    print(f"{name} training: tp in {ok_sizes}, {time.perf_counter() - t0:.1f} s; "
          f"size:cost/digest/simulation {' '.join(rows)}", flush=True)
    return good


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4, 8])
    ap.add_argument("--sizes-2d", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--hf", action="store_true", help="the tiny Hugging Face models too (needs transformers)")
    ap.add_argument("--train", action="store_true", help="the training tests' GPT-2 and Llama through plan_training")
    ap.add_argument("--no-suite", action="store_true", help="leave out the suite programs")
    a = ap.parse_args()
    good = a.no_suite or all([check(name, f, a.sizes, a.sizes_2d) for name, f in suite()])
    if a.hf:
        good &= all([check(name, f, a.sizes, a.sizes_2d, ref) for name, f, ref in hf_models()])
    if a.train:
        from reshard.testing.train_models import MODELS
        good &= all([check_training(name, a.sizes) for name in sorted(MODELS)])
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
