"""Loading a program's facts into an e-graph: flat rows in bulk, every other fact as a command.

egglog runs a fact given as a command in 15-20 us (a ``union`` of two nested terms: about
80 us), so the facts of a tiny training step took a sixth of its plan.  Most facts are flat
rows of a table whose arguments are all ``i64`` or ``String`` (``made``, ``cdim``,
``unop``, ``(set (nbytes v) n)``, ``rootmap``, ...): those are written to one tab-separated
file per table and read by egglog's ``input`` command, at well under a microsecond a row.  The
other facts (unions of terms, ``let`` bindings, facts with terms as arguments) run as
commands, in their order, ``FACT_CHUNK`` per program text.  Then the ``load`` ruleset runs
twice (``rules.loading``): its rules turn bulk-loaded rows into the terms and unions they
state, which commands used to make: an op's index map (``rootmap``: ``Tr(Root(s, d, n), c) =
Root(t, d2, n2)``) and a value fed to a segment (``seamv`` and its placements: ``(union (real
v D) (Seam key))``, ``encode.seam_facts``).

Law: the e-graph after ``load_facts`` holds the same rows as after running ``facts`` as
commands in order (and the ``load`` ruleset twice): a row of an ``i64``/``String`` table is
one value tuple wherever it is read, tables are sets, and unions commute.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections import defaultdict

from ..rules.schema import tables
from .egglog_pool import eb, run_egglog

#: facts per program text of commands: running one program text costs egglog more than
#: linearly in its number of commands (loading a 64-op segment of the Llama-2-7B decoder
#: stack: 0.12 s in chunks of 200 facts, 0.08 s in chunks of 10-50; 400: 0.19 s).  The same
#: facts run in the same order whatever the chunking, so the e-graph is the same.
FACT_CHUNK = 25

_PRIMITIVE = {"i64", "String"}
#: relations and functions (of an ``i64`` result) whose arguments are all ``i64``/``String``
_BULK_RELATIONS = frozenset(t.name for t in tables(1) if t.kind == "relation" and set(t.args) <= _PRIMITIVE)
_BULK_FUNCTIONS = frozenset(t.name for t in tables(1) if t.kind == "function" and t.result == "i64"
                            and set(t.args) <= _PRIMITIVE)
_ROW = re.compile(r'\((\w+)((?: (?:-?\d+|"\w+"))+)\)')
_SET = re.compile(r"\(set \((\w+)((?: -?\d+)+)\) (-?\d+)\)")
_LOAD_RUN = "(run-schedule (repeat 2 (run load)))"


def _bulk_row(fact: str) -> tuple[str, list[str]] | None:
    """(table, its values as ``input`` reads them) when ``fact`` is a flat row of a bulk table."""
    m = _ROW.fullmatch(fact)
    if m is not None and m[1] in _BULK_RELATIONS:
        return m[1], [a.strip('"') for a in m[2].split()]
    m = _SET.fullmatch(fact)
    if m is not None and m[1] in _BULK_FUNCTIONS:
        return m[1], [*m[2].split(), m[3]]
    return None


def _written(folder: str, rows: dict[str, list[str]]) -> list[str] | None:
    """Each table's ``rows`` written to a file of ``folder``: the ``input`` commands that read
    them, or None where they cannot be (egglog cannot name the path in a string, with a ``"``
    or ``\\`` in it; the files cannot be written)."""
    if '"' in folder or "\\" in folder:
        return None
    inputs = []
    try:
        for name, lines in rows.items():
            path = os.path.join(folder, f"{name}.tsv")
            with open(path, "w") as f:
                f.writelines(lines)
            inputs.append(f'(input {name} "{path}")')
    except OSError:
        return None
    return inputs


def load_facts(egraph: eb.EGraph, facts: list[str]) -> list:
    """Load ``facts`` (egglog commands, in program order) into ``egraph`` as the module
    docstring says; returns the ``load`` run's outputs (its rule matches).  Where the rows
    cannot go through files (no temporary directory can be made, egglog cannot name it, a file
    cannot be written: ``_written``) every fact runs as a command: the same e-graph, more
    slowly."""
    rows: dict[str, list[str]] = defaultdict(list)
    commands: list[str] = []
    for fact in facts:
        row = _bulk_row(fact)
        if row is None:
            commands.append(fact)
        else:
            rows[row[0]].append("\t".join(row[1]) + "\n")
    try:
        folder = tempfile.TemporaryDirectory(prefix="reshard-facts-")
    except OSError:
        folder = None
    if folder is None:
        commands = facts
    else:
        with folder as path:
            inputs = _written(path, rows) if rows else []
            if inputs is None:
                commands = facts
            elif inputs:
                run_egglog(egraph, "\n".join(inputs), "program facts (rows)")
    for i in range(0, len(commands), FACT_CHUNK):
        run_egglog(egraph, "\n".join(commands[i:i + FACT_CHUNK]), "program facts")
    return run_egglog(egraph, _LOAD_RUN, "program facts (load rules)")
