"""Every script in examples/ runs (as ``python examples/X.py`` would) and checks its plan
against the unsharded reference."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_and_matches_the_reference(path, capsys):
    code = 0
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr().out
    assert code in (0, None), out
    assert "check:" in out and "match" in out, out
