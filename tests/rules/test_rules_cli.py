"""Rules readable as they run: the name the e-graph reports is greppable in the source, and
``reshard rules [--family F]`` prints every rule with its law, grouped by family."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reshard.cli import main, rules_text
from reshard.rules.cost_profile import CostProfile
from reshard.search.encode import rule_families

SOURCE = "\n".join(p.read_text() for p in (Path(__file__).resolve().parents[2] / "reshard" / "rules").glob("*.py"))


def _all_rules(shape=(2, 2, 2)):
    prof = CostProfile.load({"collectives": {"allgather": {"2": {"alpha_us": 1.0}}}})  # per-team-size rules too
    families = rule_families(shape, prof, transfers=True, lookups=True, expands=True, remats=True, attentions=True)
    return [r for rs in families.values() for r in rs]


def test_every_reported_name_is_its_source_literal_plus_its_variant():
    rules = _all_rules()
    names = [r.reported_name for r in rules]
    assert len(names) == len(set(names)), "two rules would report the same name"
    for r in rules:
        assert f'"{r.name}"' in SOURCE, f"{r.reported_name}: the name {r.name!r} is not a literal in the source"
        assert r.reported_name == (f"{r.name}-{r.variant}" if r.variant else r.name)
        assert f':name "{r.reported_name}"' in r.render()


def test_generated_rules_name_their_family_statically():
    by_name = {r.reported_name: r for r in _all_rules()}
    assert (by_name["allgather-1"].name, by_name["allgather-1"].variant) == ("allgather", "1")
    assert by_name["cost-collective-allgather-n2"].variant == "allgather-n2"
    assert by_name["mm-view-lhs"].name == "mm-view"


def test_rules_command_prints_families_with_laws(capsys):
    assert main(["rules"]) == 0
    out = capsys.readouterr().out
    families = [line.split()[1] for line in out.splitlines() if line.startswith("== ")]
    assert families == list(rule_families((2, 2), CostProfile(), transfers=True, lookups=True, expands=True,
                                              remats=True, attentions=True)) + ["tables"]
    assert "\nD(P, P) -> Dist  [datatype]\n  a distribution: one placement per mesh axis\n" in out
    assert "kept(i64, T) -> i64  [function, min]  (only with remat)\n" in out
    assert {"crossmesh", "lookup", "attention"} <= set(families)
    assert "allgather-0  [reshard]" in out and "  law: " in out and ':name "allgather-0"' in out
    only = rules_text("resharding", "2x2")
    assert only.startswith("== resharding (") and only.count("== ") == 1 and "cost-collective" not in only
    assert "allgather-2" in rules_text("resharding", "2x2x2") and "allgather-2" not in only
    tables = rules_text("tables", "2x2x2")
    assert tables.startswith("== tables (") and tables.count("== ") == 1 and "D(P, P, P) -> Dist" in tables


def test_rules_command_rejects_unknown_families_and_shapes(capsys):
    assert main(["rules", "--family", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown family 'nope'; families: loading, id_algebra" in err and err.rstrip().endswith(", tables")
    assert main(["rules", "--mesh-shape", "2xq"]) == 2
    assert "--mesh-shape must look like 2x2" in capsys.readouterr().err


@pytest.mark.multiproc
@pytest.mark.parametrize("argv", [["--help"], ["rules", "--help"]])
def test_help_imports_neither_egglog_nor_torch(argv):
    code = (f"import sys, reshard.cli as c\ntry:\n    c.main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'egglog') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    assert out.strip().splitlines()[-1] == "[]"
