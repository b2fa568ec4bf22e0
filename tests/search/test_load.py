"""Loading facts in bulk (``search.load``): the same e-graph as the facts run as commands, and
the index-map rows made the unions they state."""

from __future__ import annotations

import pytest

from reshard.rules.cost_profile import CostProfile
from reshard.rules.schema import tables
from reshard.search import encode, load
from reshard.search.egglog_pool import run_egglog
from reshard.search.saturate import new_egraph
from reshard.testing import programs as P

#: programs whose facts cover the bulk tables' kinds: strings (``keeps``, ``redop``), functions
#: (``nbytes``, cost selectors), the remat and lookup families, a 2-D mesh
PROGRAMS = [P.training_block, P.training_lookups, P.mesh2d_block, P.linear_loss]


def _rows(egraph) -> dict[str, list]:
    """Every table's rows: decoded values for the bulk tables (every argument i64/String),
    only the count for the others (their classes are numbered as each e-graph made them)."""
    sorts = {t.name: (*t.args, t.result or "Unit") for t in tables(2)}
    decode = {"i64": egraph.value_to_i64, "String": egraph.value_to_string}
    out: dict[str, list] = {}
    for name, fn in egraph.freeze().functions.items():
        if fn.is_let_binding:
            continue
        if name in load._BULK_RELATIONS | load._BULK_FUNCTIONS:
            out[name] = sorted(tuple(decode[s](v) for s, v in zip(sorts[name], (*row.inputs, row.output)) if s in decode)
                               for row in fn.rows)
        else:
            out[name] = [len(fn.rows)]
    return out


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_bulk_loaded_facts_make_the_same_egraph(program):
    enc = encode.encode(program(), CostProfile())
    facts = enc.facts()
    bulk = [f for f in facts if load._bulk_row(f) is not None]
    assert bulk and len(bulk) < len(facts)  # both paths are taken
    fast = new_egraph(enc.declarations)
    load.load_facts(fast, facts)
    slow = new_egraph(enc.declarations)
    for f in facts:
        run_egglog(slow, f, "program facts")
    run_egglog(slow, "(run-schedule (run load))", "load rules")
    assert _rows(fast) == _rows(slow)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_index_map_rows_are_the_unions_they_state(program):
    enc = encode.encode(program(), CostProfile())
    facts = enc.facts()
    rows = [f.strip("()").split()[1:] for f in facts if f.startswith("(rootmap ")]
    assert rows
    egraph = new_egraph(enc.declarations)
    load.load_facts(egraph, facts)
    for s, d, n, c, t, d2, n2 in rows:
        run_egglog(egraph, f"(check (= (Tr (Root {s} {d} {n}) {c}) (Root {t} {d2} {n2})))", "check")


def test_only_flat_rows_of_primitive_tables_load_in_bulk():
    assert load._bulk_row('(keeps 7 "sum")') == ("keeps", ["7", "sum"])
    assert load._bulk_row("(set (nbytes 3) 256)") == ("nbytes", ["3", "256"])
    assert load._bulk_row("(cdim 3 -1 4)") == ("cdim", ["3", "-1", "4"])
    assert load._bulk_row("(cand 3 (D (Rep)))") is None  # a term argument
    assert load._bulk_row("(set (lb 3 (D (Rep))) 8)") is None
    assert load._bulk_row("(union (Tr (Root 1 0 4) 9) (Red))") is None
    assert load._bulk_row("(Root 1 0 4)") is None  # a constructor, not a table of rows
