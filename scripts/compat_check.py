#!/usr/bin/env python3
"""Run reshard's model and training tests against the torch and transformers installed here.

    python scripts/compat_check.py [--quick] [-- extra pytest arguments]

reshard is tested on CI with the pinned stack (``pyproject.toml``'s ``test`` extra: torch 2.13,
transformers 5.24); its floor (``torch>=2.11``) is the oldest stack it is also tested on (the GPU
machine's torch 2.11 and transformers 5.17).  This script checks another installed stack: it
prints the versions, then runs the tests that depend most on torch.export and on transformers'
modeling code (Hugging Face models forward and training, the ``from_torch`` frontend, the core ATen
sweep, 0-dim and complex values) with ``pytest``, and exits with pytest's status.  ``--quick``
leaves out the multi-process training tests; ``--jobs N`` runs the files in N pytest processes
at a time (one per file; its summary line printed as each ends; the status: 1 if any failed).

On the GPU machine, run it beside ``scripts/gpu_train_check.py`` (GPU_CHECK.md records both).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the test files whose outcome depends on the installed torch / transformers
TESTS = ["tests/frontend/test_hf_models.py", "tests/train/test_train_hf.py", "tests/train/test_train_frontend.py",
         "tests/train/test_train_wrapper.py", "tests/frontend/test_from_torch.py", "tests/frontend/test_from_torch_ops.py",
         "tests/frontend/test_higher_order.py", "tests/frontend/test_aten_core.py", "tests/ir/test_zero_dim.py", "tests/frontend/test_complex.py"]
#: the multi-process ones (gloo), left out by ``--quick``
MULTIPROCESS = ["tests/train/test_train.py", "tests/train/test_train_torchrun.py"]


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for pkg in ("torch", "transformers", "egglog", "scipy", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="leave out the multi-process training tests")
    ap.add_argument("--jobs", type=int, default=1, help="test files run at a time, one pytest each")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args()
    print("stack:", ", ".join(f"{k} {v}" for k, v in versions().items()), flush=True)
    files = TESTS + ([] if args.quick else MULTIPROCESS)
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if args.jobs <= 1:
        return subprocess.call([*pytest, *files, *args.pytest_args], cwd=ROOT)
    return in_parallel({f: [*pytest, f, *args.pytest_args] for f in files}, args.jobs)


def in_parallel(commands: dict[str, list[str]], jobs: int) -> int:
    """Run ``commands`` (by name) ``jobs`` at a time; print each one's name and last line
    (pytest's summary) as it ends and, when it failed, its FAILED / ERROR lines; 1 if any failed."""
    from concurrent.futures import ThreadPoolExecutor

    def run(name: str) -> int:
        r = subprocess.run(commands[name], cwd=ROOT, capture_output=True, text=True)
        lines = (r.stdout + r.stderr).strip().splitlines() or [""]
        print(f"{name}: {lines[-1]}", flush=True)
        for ln in lines if r.returncode else ():
            if ln.startswith(("FAILED", "ERROR")):
                print("  " + ln, flush=True)
        return r.returncode

    with ThreadPoolExecutor(jobs) as pool:
        return int(any(list(pool.map(run, list(commands)))))


if __name__ == "__main__":
    sys.exit(main())
