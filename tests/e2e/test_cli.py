"""The README's example and the `reshard` command line."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import reshard as rs
from reshard.cli import main
from reshard.testing.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]


def test_readme_example_runs_and_its_claims_hold(capsys):
    text = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text.split("\n## Example\n", 1)[1], re.S)[0]
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()[0]
    claimed = re.search(r"print\(\[\(c\.kind, c\.axis\).*?#\s*(\[.*\])", code).group(1)
    assert printed == claimed


def test_demo_explains_and_checks_the_transformer_block(capsys):
    """The demo's simplified block planned at real size (seq 4096, hidden 4096, 32 heads, bf16),
    where the fused QKV output moves into heads by one all-to-all (at seq 16 it would be
    gathered), and runs a small instance with the same shardings and the same collectives."""
    assert main(["demo", "--quiet", "--block", "simplified"]) == 0
    out = capsys.readouterr().out
    assert "at seq 4096, hidden 4096, 32 heads, bfloat16" in out
    assert "reshard plan:" in out and "comm reduce_scatter on axis 'tp'" in out
    assert "comm all_to_all on axis 'tp' (team 2) of attn.qkv.heads" in out
    assert "run: the same program at seq 16, hidden 32, 4 heads, float32" in out
    assert "the same 4 collectives on the same values and shardings as the plan above" in out
    assert "outputs match the unsharded reference" in out


def test_demo_on_four_ranks(capsys):
    assert main(["demo", "--quiet", "--ranks", "4", "--seq", "8"]) == 0
    assert "on tp (4 ranks)" in capsys.readouterr().out


def test_demo_stack_in_segments_with_a_profile(capsys):
    """The options reach optimize(): segments in the report, the profile named; the plan
    still checks."""
    assert main(["demo", "-q", "--layers", "2", "--segment-ops", "20", "--profile", "h100x1",
                 "--time-limit", "30"]) == 0
    out = capsys.readouterr().out
    assert "2 Llama-style layers" in out and re.search(r"in \d+ segments", out)
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


@pytest.mark.parametrize("content,message", [(None, "no such file"),
                                             ("x = 1\n", "must define a variable fusion holding a reshard.Fusion, "
                                                         "or a function build()"),
                                             ("def build():\n    return 3\n", "(got int)")])
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
                 "        return torch.lgamma(x)\n"
                 "def build():\n"
                 "    mesh = rs.DeviceMesh([0, 1])\n"
                 "    return rs.from_torch(M(), (torch.randn(4, 4),), [rs.Shard(0)], [rs.Shard(0)], mesh).fusion\n")
    assert main(["explain", str(p), "-q"]) == 2
    err = capsys.readouterr().err
    assert "lgamma" in err and "Traceback" not in err


HEAVY = ("torch", "egglog", "numpy", "scipy", "matplotlib")
REST = re.compile(r"``|`|:(?:func|mod|class|meth|attr|data):")


@pytest.mark.multiproc
def test_help_is_plain_text_and_imports_nothing_heavy():
    """``reshard --help`` (and each command's but tune's) answers without importing torch,
    egglog, numpy, scipy or matplotlib, and prints no reST markup."""
    code = ("import sys\n"
            "from reshard.cli import main\n"
            f"heavy = {HEAVY!r}\n"
            "print('AFTER IMPORT', sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
            "for argv in (['--help'], ['demo', '--help'], ['explain', '--help']):\n"
            "    try:\n"
            "        main(argv)\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print('AFTER HELP', sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=child_env(ROOT))
    assert r.returncode == 0, r.stderr
    assert "AFTER IMPORT []" in r.stdout and "AFTER HELP []" in r.stdout, r.stdout
    assert "usage: reshard" in r.stdout and "usage: reshard demo" in r.stdout and "usage: reshard explain" in r.stdout
    assert not REST.search(r.stdout), REST.search(r.stdout)


def test_tune_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = capsys.readouterr().out
    assert "--nprocs" in out and not REST.search(out)


def test_help_states_the_real_defaults():
    """The defaults ``--help`` states without importing the optimizer are its real ones."""
    from reshard.cli import SEGMENT_OPS, TIME_LIMIT_S, _profile_names
    from reshard.rules.cost_profile import builtin_profiles
    assert (TIME_LIMIT_S, SEGMENT_OPS) == (rs.Limits().time_limit_s, rs.Limits().segment_ops)
    assert _profile_names() == builtin_profiles()


@pytest.mark.multiproc
def test_import_reshard_is_lazy_and_its_api_complete():
    """``import reshard`` imports neither torch nor egglog; every public name still resolves,
    to the object its defining module holds."""
    code = "import sys, reshard\nprint('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'egglog'}))\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=child_env(ROOT))
    assert r.returncode == 0 and "HEAVY []" in r.stdout, r.stdout + r.stderr
    from reshard.ir.sharding import Shard
    from reshard.plan import optimize
    from reshard.runtime.distributed import launch
    assert (rs.Shard, rs.optimize, rs.launch) == (Shard, optimize, launch)
    assert all(getattr(rs, n) is not None for n in rs.__all__) and set(rs.__all__) <= set(dir(rs))
    with pytest.raises(AttributeError, match="no attribute 'optimise'"):
        rs.optimise  # noqa: B018


def _options(cmd: str) -> dict[str, Any]:
    """``reshard cmd``'s options: option string -> its argparse action."""
    from reshard.cli import parser
    sub = next(a for a in parser([cmd])._actions if isinstance(a, argparse._SubParsersAction))
    return {o: a for a in sub.choices[cmd]._actions for o in a.option_strings}


def test_the_readme_states_the_cli_options_the_commands_take():
    """Every ``reshard CMD ... --opt`` the README writes is an option of CMD; the options it
    says ``demo`` and ``explain`` take are theirs, the extractors all of the choices."""
    readme = (ROOT / "README.md").read_text()
    for cmd, rest in re.findall(r"`reshard (demo|explain|tune|rules)([^`]*)`", readme):
        assert set(re.findall(r"--[\w-]+", rest)) <= set(_options(cmd)), (cmd, rest)
    shared = re.search(r"`demo` and `explain` take\s+(.*?)\(`reshard demo --help`\)", readme, re.S).group(1)
    for cmd in ("demo", "explain"):
        assert set(re.findall(r"--[\w-]+", shared)) == {"--profile", "--extractor", "--time-limit", "--segment-ops"}
        assert set(re.findall(r"--[\w-]+", shared)) <= set(_options(cmd))
        assert f"--extractor {'|'.join(_options(cmd)['--extractor'].choices)}" in shared
    assert not {"--profile", "--extractor", "--time-limit", "--segment-ops"} & set(_options("tune"))
