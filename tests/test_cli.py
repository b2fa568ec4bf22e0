"""The README's example and the `reshard` command line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reshard.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_runs_and_its_claims_hold(capsys):
    text = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]  # the Example section
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()[0]
    claimed = re.search(r"print\(\[\(c\.kind, c\.axis\).*?#\s*(\[.*\])", code).group(1)
    assert printed == claimed


def test_demo_explains_and_checks_the_transformer_block(capsys):
    assert main(["demo", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "reshard plan:" in out and "comm reduce_scatter on axis 'tp'" in out
    assert "outputs match the unsharded reference" in out


def test_demo_on_four_ranks(capsys):
    assert main(["demo", "--quiet", "--ranks", "4", "--seq", "8"]) == 0
    assert "(team 4)" in capsys.readouterr().out


def test_demo_stack_in_segments_with_a_profile(capsys):
    """The options reach optimize(): segments in the report, the profile named; the plan
    still checks."""
    assert main(["demo", "-q", "--layers", "2", "--segment-ops", "20", "--profile", "h100x1",
                 "--time-limit", "30"]) == 0
    out = capsys.readouterr().out
    assert "2 transformer blocks" in out and re.search(r"in \d+ segments", out)
    assert "cost profile: 1xH100" in out and "greedy extraction" in out
    assert "outputs match the unsharded reference" in out


@pytest.mark.parametrize("argv,message", [(["--segment-ops", "0"], "segment_ops"), (["--layers", "0"], "--layers"),
                                          (["--profile", "nope"], "cost profile")])
def test_demo_rejects_bad_options_clearly(argv, message, capsys):
    assert main(["demo", "-q", *argv]) == 2
    assert message in capsys.readouterr().err


def test_explain_a_file(tmp_path, capsys):
    p = tmp_path / "prog.py"
    p.write_text("import reshard as rs\n"
                 "def build():\n"
                 "    f = rs.Fusion()\n"
                 "    x = f.input('x', (8, 4), 'float32', rs.DeviceMesh([0, 1]), [rs.Shard(0)])\n"
                 "    f.output(f.exp(x), [rs.Replicate()])\n"
                 "    return f\n")
    assert main(["explain", str(p), "-q"]) == 0
    assert "comm allgather" in capsys.readouterr().out
    assert main(["explain", str(p), "-q", "--extractor", "ilp"]) == 0
    out = capsys.readouterr().out
    assert "ILP extraction proved optimal" in out and "comm allgather" in out


@pytest.mark.parametrize("content,message", [(None, "no such file"), ("x = 1\n", "must define `fusion`")])
def test_explain_errors_are_clear(tmp_path, capsys, content, message):
    p = tmp_path / "prog.py"
    if content is not None:
        p.write_text(content)
    assert main(["explain", str(p)]) == 2
    assert message in capsys.readouterr().err


def test_explain_reports_an_unsupported_torch_op_by_name(tmp_path, capsys):
    """A file whose Fusion comes from ``reshard.from_torch`` of a module with an op the front
    end does not support: exit code 2 and the op named, no traceback."""
    p = tmp_path / "prog.py"
    p.write_text("import torch\nimport reshard as rs\n"
                 "class M(torch.nn.Module):\n"
                 "    def forward(self, x):\n"
                 "        return torch.cumsum(x, 0)\n"
                 "def build():\n"
                 "    mesh = rs.DeviceMesh([0, 1])\n"
                 "    return rs.from_torch(M(), (torch.randn(4, 4),), [rs.Shard(0)], [rs.Shard(0)], mesh).fusion\n")
    assert main(["explain", str(p), "-q"]) == 2
    err = capsys.readouterr().err
    assert "cumsum" in err and "Traceback" not in err
