"""The e-graph's vocabulary is declared once (``rules.schema.tables``): every table a rule or
an encoded fact names is declared for the e-graphs that get that rule, and every declared table
is documented and read, by some rule's query or by the code reading the saturated e-graph."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from reshard.rules.cost_profile import CostProfile
from reshard.rules.schema import FLAGS, T_CONSTRUCTORS, declared, schema, tables
from reshard.rules.table import Table, render
from reshard.search.encode import encode, rule_families
from reshard.testing import programs as P

ROOT = Path(__file__).resolve().parents[2] / "reshard"
#: an s-expression's head: the table or primitive it applies
HEAD = re.compile(r'\(([^\s()"]+)')
#: egglog's commands and primitives the rules and facts use
PRIMITIVES = {"=", "!=", "<", ">", "+", "-", "*", "/", "%", "max", "set", "union", "let"}
#: ``rule_families``' flag for each schema flag
FAMILY_FLAGS = {"transfers": "transfers", "lookups": "lookups", "expands": "expands", "remat": "remats",
                "attention": "attentions"}
PROFILE = CostProfile.load({"collectives": {"allgather": {"2": {"alpha_us": 1.0}}}})


def _heads(text: str) -> set[str]:
    return set(HEAD.findall(text)) - PRIMITIVES


def _rules(shape: tuple[int, ...], **flags: bool):
    families = rule_families(shape, PROFILE, **{FAMILY_FLAGS[f]: on for f, on in flags.items()})
    return [r for rs in families.values() for r in rs]


@pytest.mark.parametrize("shape", [(2,), (2, 2), (2, 2, 2)])
@pytest.mark.parametrize("on", [(), *((f,) for f in FLAGS), FLAGS], ids=lambda on: "+".join(on) or "core")
def test_every_table_a_rule_names_is_declared_for_its_egraph(shape, on):
    flags = {f: f in on for f in FLAGS}
    names = {t.name for t in declared(len(shape), **flags)}
    for r in _rules(shape, **flags):
        missing = _heads(r.query + " " + r.actions) - names
        assert not missing, f"rule {r.reported_name} names tables the schema does not declare: {sorted(missing)}"


@pytest.mark.parametrize("build", [P.mlp, P.scatter_lookups, P.training_attention, P.mask_broadcast],
                         ids=lambda b: b.__name__)
def test_every_table_an_encoded_fact_names_is_declared(build):
    enc = encode(build(), CostProfile())
    names = {t.name for t in tables(enc.mesh.ndim)}
    facts = " ".join(f for g in enc.groups for f in g) + " " + " ".join(enc.output_facts)
    assert not _heads(facts) - names
    assert _heads(facts), "the encoding wrote no facts"


def _read_by_code() -> set[str]:
    """The tables the code reading a saturated e-graph (``search``, ``extract``) reads by name, and,
    when ``extract.dag`` reads every implementation constructor's rows with their costs
    (``Snapshot.costed``, which reads each node table and its cost table), those."""
    source = {p: p.read_text() for d in ("search", "extract") for p in (ROOT / d).glob("*.py")}
    read = {name for text in source.values() for name in re.findall(r'rows\("(\w+)"\)', text)}
    dag, snapshot = source[ROOT / "extract" / "dag.py"], source[ROOT / "search" / "snapshot.py"]
    if "T_CONSTRUCTORS" in dag and "costed(" in dag and re.search(r'rows\(f"cost_\{\w+\}"\)', snapshot):
        read |= set(T_CONSTRUCTORS) | {f"cost_{c}" for c in T_CONSTRUCTORS if c != "InAt"}  # an input costs 0
    return read


def test_every_declared_table_is_documented_and_read():
    rules = _rules((2, 2), **dict.fromkeys(FLAGS, True))
    queried = {h for r in rules for h in _heads(r.query)}
    read = _read_by_code()
    decls = tables(2)
    assert len({t.name for t in decls}) == len(decls), "a table is declared twice"
    for t in decls:
        assert len(t.meaning) > 20 and t.meaning != t.name, f"{t.name}: no meaning stated"
        assert t.name in queried | read, f"{t.name} is declared but no rule's query and no e-graph reader reads it"
    assert read - {t.name for t in decls} == set(), "the e-graph readers read undeclared tables"


def test_render_groups_a_sorts_datatype_rows_and_keeps_every_declaration():
    rows = [Table("A", "datatype", ("i64",), "S", "an A of one integer"), Table("B", "datatype", (), "S", "a B"),
            Table("f", "function", ("S",), "i64", "f of an S", "min"), Table("C", "constructor", ("S",), "S", "a C"),
            Table("r", "relation", ("S", "i64"), "", "pairs")]
    assert render(rows) == ["(datatype S (A i64) (B))", "(function f (S) i64 :merge (min old new))",
                            "(constructor C (S) S)", "(relation r (S i64))"]
    with pytest.raises(ValueError, match="merges"):
        Table("g", "function", ("S",), "i64", "a function that forgot its merge")
    text = schema(2, transfers=True)
    assert all(re.search(rf"[( ]{t.name}[ )]", text) for t in declared(2, transfers=True))
    assert "(relation xfer " in text and "(relation xfer " not in schema(2)


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of a module that are not docstrings."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_code_outside_rules_search_and_extract_names_an_egraph_term():
    """Lowering, explanations and the plan dispatch on ``extract.plan_node``'s tags: only the
    optimizer's packages name the e-graph's terms (its sort T constructors, ``cost_*`` tables;
    ``real`` is left out: complex numbers have a real part too)."""
    terms = {t.name for t in tables(3) if t.result == "T" and t.name != "real" or t.name.startswith("cost_")}
    pattern = re.compile(r"\b(?:" + "|".join(sorted(terms, key=len, reverse=True)) + r")\b")
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.relative_to(ROOT).parts[0] in ("rules", "search", "extract"):
            continue
        for node in _strings(ast.parse(path.read_text())):
            if node.value in terms or re.search(r"\(\s*" + pattern.pattern, node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:60]!r}")
    assert not found, found
