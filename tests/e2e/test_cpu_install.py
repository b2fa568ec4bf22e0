"""A CPU install: reshard without its ``gpu`` extra (cuda-python, cuda-core, nvidia-cuda-nvrtc).

The package's required dependencies name no CUDA package (they are the ``gpu`` extra's), and
in an interpreter where every ``cuda`` module is blocked (``sys.modules[name] = None``: each
import of it fails, as when it is not installed) reshard imports, plans, simulates a plan
against the reference and runs its CLI, while compiling a kernel is a ``ReshardError`` that
names the extra.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from reshard.testing.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]

CPU_ONLY = textwrap.dedent("""
    import sys
    for name in ("cuda", "cuda.core", "cuda.bindings", "cuda.pathfinder", "cuda.cuda", "cuda.nvrtc"):
        sys.modules[name] = None  # import cuda... raises ImportError
    import torch
    import reshard as rs
    from reshard import cli
    from reshard.codegen import kernels as K, nvrtc as N

    mesh = rs.DeviceMesh([0, 1], ("tp",))
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", mesh, [rs.Shard(0)])
    w = f.input("w", (16, 32), "float32", mesh, [rs.Shard(1)])
    f.output(f.gelu(f.matmul(x, w)), [rs.Replicate()])
    plan = rs.optimize(f, cache=False)
    inputs = {"x": torch.randn(8, 16), "w": torch.randn(16, 32)}
    (out,) = plan.simulate(inputs)
    torch.testing.assert_close(out, rs.run_reference(f, inputs)[0], rtol=1e-4, atol=1e-4)
    assert "cuda.core" not in sys.modules or sys.modules["cuda.core"] is None
    try:
        N.compile_kernel(K.pointwise_kernel(["float32"], "float32", [("neg", "in0")], (4,)))
    except rs.ReshardError as e:
        assert "reshard[gpu]" in str(e), e
    else:
        raise AssertionError("compiled a kernel without cuda.core")
    print("cpu-only ok")
""")


def test_required_dependencies_name_no_cuda_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    cuda = [d for d in project["dependencies"] if d.lower().startswith(("cuda", "nvidia"))]
    assert cuda == [], f"CUDA packages required by a CPU install: {cuda}"
    assert {d.split(">")[0].split("=")[0] for d in project["optional-dependencies"]["gpu"]} == {
        "cuda-python", "cuda-core", "nvidia-cuda-nvrtc"}


@pytest.mark.multiproc
def test_reshard_plans_and_simulates_without_cuda_modules() -> None:
    env = child_env(ROOT)
    res = subprocess.run([sys.executable, "-c", CPU_ONLY], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and "cpu-only ok" in res.stdout, res.stdout + res.stderr
    help_ = subprocess.run([sys.executable, "-c", "import sys; sys.modules['cuda'] = None; "
                            "from reshard.cli import main; sys.argv = ['reshard', '--help']; main()"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert help_.returncode == 0 and "demo" in help_.stdout, help_.stdout + help_.stderr
