"""scripts/gpu_train_multi.py on the CPU (``--cpu``: 2 gloo ranks, tiny GPT-2): it runs as a
subprocess, exits 0, and its table has one row whose DTensor and reshard step times are
positive and whose loss / gradient agreement is within 1e-4 (reshard's plan at DTensor's
placements computes DTensor's step)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = [pytest.mark.multiproc, pytest.mark.hf]

pytest.importorskip("transformers")

from benchmarks.train_dtensor import FUSED_QKV_DTENSOR  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_train_multi.py"


@pytest.mark.slow
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
@pytest.mark.skipif(not FUSED_QKV_DTENSOR, reason="this torch's DTensor cannot run GPT-2's fused qkv (train_dtensor)")
def test_cpu_smoke_gpt2() -> None:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--models", "gpt2", "--warmup", "0", "--steps", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [ln.strip("|").split("|") for ln in proc.stdout.splitlines() if ln.startswith("| gpt2")]
    assert len(rows) == 1, proc.stdout
    _, ranks, dtensor_ms, reshard_ms, _, err = (c.strip() for c in rows[0])
    assert ranks == "2"
    assert float(dtensor_ms) > 0 and float(reshard_ms.split()[0]) > 0
    assert float(err) <= 1e-4
