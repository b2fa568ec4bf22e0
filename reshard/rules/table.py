"""E-graph tables as data: each constructor, function and relation of the schema with its
argument sorts, its result sort, how it merges, and one line of what it means.

``rules.schema`` declares every table once as a ``Table``; ``render`` writes the egglog
declarations from them, and ``reshard rules`` lists them (``Table.signature``).  Kinds:
``datatype`` (a constructor listed in its sort's ``datatype`` declaration), ``constructor``
(one declared apart, after its sort), ``function`` (a value per argument tuple, merged by
``merge``: ``min``, ``max``, or ``no-merge``) and ``relation`` (a set of argument tuples).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("datatype", "constructor", "function", "relation")
MERGES = {"min": ":merge (min old new)", "max": ":merge (max old new)", "no-merge": ":no-merge", "old": ":merge old"}


@dataclass(frozen=True)
class Table:
    """One table (module docstring).  ``when``: the schema flag that declares it (``""``:
    every e-graph; ``transfers``, ``lookups``, ``expands``, ``remat``, ``attention``: only
    e-graphs of Fusions that need it, ``schema.schema``)."""

    name: str
    kind: str
    args: tuple[str, ...]
    result: str
    meaning: str
    merge: str = ""
    when: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"table {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if (self.kind == "function") != (self.merge in MERGES):
            raise ValueError(f"table {self.name}: a function merges by one of {list(MERGES)}, nothing else merges")
        if (self.kind == "relation") != (self.result == ""):
            raise ValueError(f"table {self.name}: a relation has no result sort, every other table has one")

    def render(self) -> str:
        """The egglog declaration (a ``datatype`` row: its entry in the sort's declaration)."""
        args = " ".join(self.args)
        if self.kind == "datatype":
            return f"({self.name}{' ' + args if args else ''})"
        if self.kind == "constructor":
            return f"(constructor {self.name} ({args}) {self.result})"
        if self.kind == "function":
            return f"(function {self.name} ({args}) {self.result} {MERGES[self.merge]})"
        return f"(relation {self.name} ({args}))"

    def signature(self) -> str:
        """``name(arg sorts) -> result`` with its kind and merge, as ``reshard rules`` lists it."""
        result = f" -> {self.result}" if self.result else ""
        merge = f", {self.merge}" if self.kind == "function" else ""
        return f"{self.name}({', '.join(self.args)}){result}  [{self.kind}{merge}]"


def render(tables: list[Table]) -> list[str]:
    """One egglog declaration per line; consecutive ``datatype`` rows of one sort form that
    sort's ``(datatype S ...)`` line."""
    lines: list[str] = []
    sort = ""
    for t in tables:
        if t.kind == "datatype" and t.result == sort:
            lines[-1] = lines[-1][:-1] + f" {t.render()})"
            continue
        sort = t.result if t.kind == "datatype" else ""
        lines.append(f"(datatype {t.result} {t.render()})" if t.kind == "datatype" else t.render())
    return lines
