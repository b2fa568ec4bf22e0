"""scripts/gpu_multi.py on the CPU: gloo ranks spawned by ``reshard.launch``, tiny sizes.

The script is the multi-GPU check (NCCL on GPUs); here it runs as a subprocess with
``--tiny --cpu`` and its markdown tables are parsed: every correctness row ok with equal
digests, collective and end-to-end rows with positive times.  A 4-rank run covers the 2x2
mesh cases.  In process, with a 1-rank gloo group, a wrong local-step executor must fail
its correctness row.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from reshard.testing.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_multi.py"

pytestmark = [pytest.mark.multiproc, pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                                         reason="torch.distributed with gloo is not available")]


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = child_env(ROOT, GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--cpu", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _table(out: str, heading: str) -> list[dict[str, str]]:
    """The markdown table under the first line starting with ``heading``, as dicts."""
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(heading))
    while not lines[i].startswith("|"):
        i += 1
    rows = []
    while i < len(lines) and lines[i].startswith("|"):
        rows.append(lines[i])
        i += 1
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in r.strip("|").split("|")))) for r in rows[2:]]


@pytest.mark.slow
def test_two_ranks_all_parts():
    p = _run("--nprocs", "2", "--batches", "1", "--runs", "2")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "**world size:** 2" in out and "--nprocs 2" in out  # header: world size and command line

    corr = _table(out, "## 1.")
    names = {r["case"] for r in corr}
    assert {"mlp_sp", "attention_sp", "cross_mesh", "pipeline_cross_mesh", "megatron_mlp bf16",
            "transformer_block bf16"} <= names
    assert all(r["ok"] == "ok" and r["digests"] == "equal" for r in corr), corr
    assert any("reduce_scatter" in r["collectives"] for r in corr)
    assert "all correctness checks passed" in out

    coll = _table(out, "## 2.")
    timed = [r for r in coll if r["step ms"]]
    assert {r["collective"].split()[0] for r in timed} >= {"allgather", "reduce_scatter", "allreduce"}
    for r in timed:
        assert float(r["step ms"]) > 0 and float(r["comm ms"]) > 0 and float(r["raw ms"]) > 0, r
        assert float(r["comm ms"]) <= float(r["step ms"])  # the call is inside the step

    e2e = _table(out, "## 3.")
    assert [r["case"].split()[0] for r in e2e] == ["mlp", "attention"]
    for r in e2e:
        assert r["ok"] == "ok", r
        assert float(r["DTensor ms"]) > 0 and float(r["reshard ms"]) > 0 and r["speedup"].endswith("x"), r
        assert float(r["diff"]) <= 2e-2


@pytest.mark.slow
def test_four_ranks_2x2_mesh_cases():
    p = _run("--nprocs", "4", "--parts", "correctness,collectives", "--cases", "redist2d_allreduce_x,[P",
             "--runs", "2", timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    corr = _table(p.stdout, "## 1.")
    assert [(r["case"], r["mesh"]) for r in corr] == [("redist2d_allreduce_x", "2x2")]
    assert all(r["ok"] == "ok" and r["digests"] == "equal" for r in corr), corr
    coll = _table(p.stdout, "## 2.")
    assert [(r["mesh"], r["collective"], r["team"]) for r in coll] == [("2x2", "allreduce (x)", "2")]
    assert float(coll[0]["step ms"]) > 0 and float(coll[0]["raw ms"]) > 0


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_multi_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


def test_a_wrong_executor_fails_its_correctness_row(tmp_path):
    gm = _load_script()
    from reshard.runtime.local_ops import run_local

    def off_by_one(step, env, rank):
        out = run_local(step, env, rank)
        return out + 1 if step.attr("op") == "apply" and step.attr("fop") == "matmul" else out

    _, cfg = gm.parse(["--tiny"])
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        build = lambda: gm.megatron_mlp(1, 8, 16, "float32")  # noqa: E731
        good = gm.correctness_case(gm.Ctx(0, 1, torch.device("cpu"), "gloo", cfg, run_local, "test"), "m", "1", build)
        bad = gm.correctness_case(gm.Ctx(0, 1, torch.device("cpu"), "gloo", cfg, off_by_one, "test"), "m", "1", build)
    finally:
        dist.destroy_process_group()
    assert good["ok"] and good["digests"] == "equal", good
    assert not bad["ok"] and "gpu_local_step: rel err" in bad["notes"], bad
