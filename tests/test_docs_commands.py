"""``scripts/check_docs_commands.py``: it finds the commands of README.md and BENCHMARKS.md
(code-block lines and inline command spans), every one has a kind (a new command in the docs
must be classified there), only the cheap ones run by default, and a command runs in a scratch
copy of the repository and is reported.  Running every cheap command takes minutes: that is
the script's job (``python scripts/check_docs_commands.py``), not this test's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs_commands", ROOT / "scripts" / "check_docs_commands.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_command_is_found_and_classified(script: ModuleType) -> None:
    cmds = {c.text: c for c in script.commands()}
    assert [c.text for c in cmds.values() if c.kind == "unclassified"] == []
    assert cmds["torchrun --standalone --nproc-per-node 2 examples/train_llama.py"].kind == "cheap"  # a code block
    assert cmds["python benchmarks/fused_qkv.py --dp 2 --shapes 4x128 4x512 --check"].kind == "cheap"  # inline
    assert cmds["reshard explain FILE.py [--draw P]"].kind == "template"
    assert cmds[". .venv/bin/activate && python -m pytest -q -n 2 --dist loadfile --durations=15"].kind == "long"
    assert any(c.kind == "gpu" and c.where.startswith("BENCHMARKS.md:") for c in cmds.values())


def test_selection_runs_cheap_by_default_and_gpu_only_with_cuda(script: ModuleType) -> None:
    cmds = script.commands()
    default = {c.kind for c, skip in script.selected(cmds, False, True) if skip is None}
    assert default == {"cheap"}
    every = script.selected(cmds, True, False)
    assert {c.kind for c, skip in every if skip is None} == {"cheap", "long"}
    assert all(skip == "needs a CUDA GPU" for c, skip in every if c.kind == "gpu")
    assert all(skip is not None for c, skip in every if c.kind == "template")


def test_commands_run_in_a_scratch_copy_and_failures_count(script: ModuleType, capsys: pytest.CaptureFixture) -> None:
    ok = script.Command("test -f README.md && touch made-here", "t:1", "cheap", "")
    bad = script.Command("python -c 'raise SystemExit(3)'", "t:2", "cheap", "")
    assert script.run([(ok, None), (bad, None)], timeout_s=60) == 1
    out = capsys.readouterr().out
    assert "ok    t:1" in out and "FAIL  t:2" in out and "exit 3" in out
    assert not (ROOT / "made-here").exists()  # the checkout is untouched
