"""Every script in examples/ runs (as ``python examples/X.py`` would) and checks its plan
against the unsharded reference (the training examples run under torchrun, in their own tests); every one is explainable (``reshard explain FILE``); the
README's multi-process program is examples/multiprocess_launch.py, verbatim."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import reshard as rs
from reshard.cli import load_fusion, main
from reshard.testing.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]
#: training scripts run under torchrun by their own tests (``tests/train/test_train_hf.py``); they
#: define no Fusion for ``reshard explain``
TORCHRUN = {"train_llama"}
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if p.stem not in TORCHRUN)
#: spawn pickles ``worker`` by reference to ``__main__``, which only a real ``python FILE`` run
#: makes the example: run these in a subprocess
SPAWNING = {"multiprocess_launch"}


def test_there_are_examples():
    assert len(EXAMPLES) >= 4 and SPAWNING <= {p.stem for p in EXAMPLES}
    assert all((ROOT / "examples" / f"{stem}.py").exists() for stem in TORCHRUN)


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_and_matches_the_reference(path, capsys):
    if path.stem in SPAWNING:
        env = child_env(ROOT, GLOO_SOCKET_IFNAME="lo", RESHARD_TIMEOUT_S="60")
        r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env=env)
        code, out = r.returncode, r.stdout + r.stderr[-3000:]
    else:
        code = 0
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr().out
    assert code in (0, None), out
    assert "check:" in out and "match" in out, out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_defines_what_reshard_explain_reads(path):
    fusion, fixed = load_fusion(str(path))
    assert isinstance(fusion, rs.Fusion) and fusion.outputs
    assert set(fixed) <= {fusion.tensors[i].name for i in fusion.inputs}


@pytest.mark.parametrize("stem", ["from_torch_module", "multiprocess_launch"])
def test_reshard_explain_of_the_examples_that_do_not_run_it_themselves(stem, capsys):
    """The other examples' ``__main__`` is ``reshard explain`` of themselves (above)."""
    path = ROOT / "examples" / f"{stem}.py"
    assert 'main(["explain", __file__' not in path.read_text()
    assert main(["explain", str(path), "-q"]) == 0
    out = capsys.readouterr().out
    assert "reshard plan:" in out and "outputs match the unsharded reference" in out


def test_the_readme_multiprocess_program_is_the_example():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### One process per rank"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    example = (ROOT / "examples" / "multiprocess_launch.py").read_text()
    assert example.endswith(block) and block.startswith("import torch\n")
    assert 'if __name__ == "__main__":' in block
