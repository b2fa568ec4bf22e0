"""Loading facts in bulk (``search.load``) and the loading rules (``rules.loading``): the same
e-graph as the facts run as commands, the index-map rows and seam rows made the unions they state."""

from __future__ import annotations

import tempfile

import pytest

import reshard as rs
from reshard.rules import loading
from reshard.rules.cost_profile import CostProfile
from reshard.rules.rule import render_all
from reshard.rules.schema import LOAD_ONLY, schema, tables
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
            out[name] = sorted(tuple(decode[s](v) for s, v in zip(sorts[name], (*row.inputs, row.output))
                                     if s in decode) for row in fn.rows)
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
    run_egglog(slow, load._LOAD_RUN, "load rules")
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


def _shardings() -> list:
    """Fed dists of a (4, 6, 2) value on 1-D and 2-D meshes: every placement kind the seam rows
    state (Rep, Part, a dim split, a dim whole, an axis of one), and a nested one they do not."""
    m1, m2, m12 = (rs.DeviceMesh(list(range(2)), ("x",)), rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y")),
                   rs.DeviceMesh([[0, 1]], ("x", "y")))
    shape = (4, 6, 2)
    out = []
    for mesh, placements in [(m1, [rs.Replicate()]), (m1, [rs.Shard(0)]), (m1, [rs.Shard(2)]),
                             (m1, [rs.Partial()]), (m1, [rs.Partial("max")]),
                             (m2, [rs.Shard(0), rs.Shard(1)]), (m2, [rs.Partial(), rs.Shard(2)]),
                             (m2, [rs.Replicate(), rs.Replicate()]), (m2, [rs.Shard(1), rs.Partial("max")]),
                             (m2, [rs.Shard(0), rs.Shard(0)]), (m12, [rs.Shard(1), rs.Shard(0)])]:
        out.append((mesh, rs.TensorSharding.from_placements(shape, placements, mesh)))
    return out


@pytest.mark.parametrize("ndim", [1, 2])
def test_seam_rows_feed_the_class_the_union_feeds(ndim):
    """``encode.seam_facts`` loaded (rows in bulk, the ``load`` rules) makes the same e-graph as
    the union ``(union (real v D) (Seam key))`` it stands for, and that union holds."""
    cases = [(ts, v) for v, (mesh, ts) in enumerate(_shardings()) if mesh.ndim == ndim]
    decl = schema(ndim) + render_all(loading.rules(ndim))
    facts = [f for key, (ts, v) in enumerate(cases) for f in encode.seam_facts(ts, v, key)]
    assert any(load._bulk_row(f) for f in facts)
    assert any(f.startswith("(union") for f in facts) == (ndim == 2)  # a dim split on both axes: nested
    fast = new_egraph(decl)
    load.load_facts(fast, facts)
    slow = new_egraph(decl)
    for key, (ts, v) in enumerate(cases):
        run_egglog(slow, f"(union (real {v} {encode.dist_term(ts, v)}) (Seam {key}))", "seam")
    counted = {name: rows for name, rows in _rows(fast).items() if name not in LOAD_ONLY}
    assert counted == {name: rows for name, rows in _rows(slow).items() if name not in LOAD_ONLY}
    for key, (ts, v) in enumerate(cases):
        run_egglog(fast, f"(check (= (real {v} {encode.dist_term(ts, v)}) (Seam {key})))", "check")


def test_a_temporary_directory_egglog_cannot_name_loads_every_fact_as_a_command(tmp_path, monkeypatch):
    odd = tmp_path / 'odd"dir'
    odd.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(odd))
    enc = encode.encode(P.training_block(), CostProfile())
    here = new_egraph(enc.declarations)
    load.load_facts(here, enc.facts())
    monkeypatch.undo()
    bulk = new_egraph(enc.declarations)
    load.load_facts(bulk, enc.facts())
    assert _rows(here) == _rows(bulk)


@pytest.mark.parametrize("failure", ["no temporary directory", "unwritable"])
def test_facts_load_as_commands_where_no_file_can_be_written(failure, monkeypatch):
    enc = encode.encode(P.training_block(), CostProfile())
    bulk = new_egraph(enc.declarations)
    load.load_facts(bulk, enc.facts())

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if failure == "no temporary directory":
        monkeypatch.setattr(tempfile, "TemporaryDirectory", refuse)
    else:
        monkeypatch.setattr("builtins.open", refuse)
    here = new_egraph(enc.declarations)
    load.load_facts(here, enc.facts())
    monkeypatch.undo()
    assert _rows(here) == _rows(bulk)
