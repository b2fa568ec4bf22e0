"""The package's import graph: no cycles, and no import against the layer order.

Edges: every ``import`` / ``from ... import`` of a reshard module anywhere in a module's
source counts -- at module level, inside functions (lazy imports), and under
``if TYPE_CHECKING:`` -- since each is a dependency of the importing module's code or
types.  The layer order holds for all of them; cycles are looked for among the imports that
run (a ``TYPE_CHECKING`` import never executes, so it cannot make an import order fail: the op
registry ``ir.ops`` names ``ir.fusion.Fusion`` in its signatures while ``Fusion`` installs the
registry's builders).  ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to
``pkg``.  A package's ``__init__`` is a module of its own (its explicit imports are edges);
the implicit import of a package's ``__init__`` when one of its submodules is imported is
not an edge.

Layers (``ALLOWED``: which units a unit's modules may import; a unit is a subpackage or a
top-level module of ``reshard``), in the order ``ir`` -> ``passes`` -> ``rules`` -> ``search``
-> ``extract`` -> ``codegen`` -> ``runtime`` / explanations -> ``plan`` -> ``train`` / ``cli``
(``ORDER``: no unit imports a later one):

* ``ir`` imports no other unit: the IR, errors and the table of collective kinds;
* ``passes`` (Fusion -> Fusion passes: padding, recompute twins, buckets, autodiff, pins,
  phases; ``prepare``) imports ``ir`` only;
* ``rules`` (the e-graph's schema and rule families, ``CostProfile``) imports ``ir`` only;
* ``search`` (encoding, saturation, segments, the snapshot) imports ``ir`` and ``rules``;
* ``extract`` (DAG extraction, ILP, windows, budgets, plan nodes) imports ``ir``, ``passes``
  (the buckets' values), ``rules`` and ``search``;
* ``codegen`` imports ``ir``, ``passes`` (phases) and ``extract`` (lowering reads the extracted plan, whose nodes
  extraction decoded into tagged ``PlanNode``s), never ``rules`` or ``search``: lowering knows no
  e-graph constructor;
* ``runtime`` imports ``ir`` and ``codegen`` (the program it runs), never ``rules``,
  ``search`` or ``extract``: the runtime never builds or reads an e-graph;
* ``frontend`` (torch.export -> Fusion) imports ``ir`` and ``passes`` (autodiff);
* the explanations sit on the decoded plan and ``codegen``: ``plan_view`` (what explanations read
  of a plan, ``PlanView``), ``alternatives`` (rejected alternatives, priced and described; it
  also reads the e-graph's snapshot, ``search``), ``whynot`` and ``summary`` on ``plan_view``,
  ``explain`` and ``draw`` on those; none imports ``rules`` (nor, but ``alternatives``,
  ``search``) or ``plan``, whose methods call them;
* ``plan`` imports every layer below it and the explanations; ``tune`` measures through
  ``runtime``; ``forksafe`` (optimize() in a fresh interpreter after ``fork()``) sits under
  ``plan``, ``fresh_process`` (that interpreter's side, which calls ``plan.optimize``) above
  it; ``plan_cache`` (plans on disk by key) sits under ``plan`` and reads a plan through its
  ``CachedPlan`` protocol; ``plan_graph`` (``Plan.graphed``: a plan's step as a CUDA graph) sits
  under ``plan`` on ``runtime`` and reads a plan through its ``GraphablePlan`` protocol;
  ``collector`` (the garbage collector's threshold while planning) imports nothing and sits
  under ``plan`` and ``train``;
  ``plan_symbolic`` (``optimize_symbolic``: one planning for every size of a symbolic mesh)
  sits on ``plan``, whose ``Saturated`` e-graphs it re-prices per size;
* ``train`` (the training wrapper) exports through ``frontend`` and plans through ``plan``,
  running ranks through ``runtime``, its plans by input shapes in ``train_plans`` (which
  reads a plan through its ``PlanOfInputs`` protocol); ``cli`` and the package ``__init__``
  may import everything;
* ``testing`` (what the tests share with scripts and benchmarks: programs, oracles, the fuzz
  generator) sits on top: it may import every unit but ``cli``, and no unit imports it.

A new unit must be added to ``ALLOWED`` (the test names it).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "reshard"

#: the optimizer's rooms and what sits on them, in order: a unit imports earlier units only
ORDER = ("ir", "passes", "rules", "search", "extract", "codegen")
#: what an explanation of a plan may read: the IR and its passes, the decoded plan and the lowered plan
_PLANNED = {"ir", "passes", "extract", "codegen"}
_LOWER = set(ORDER) | {"runtime", "frontend"}
ALLOWED: dict[str, set[str]] = {
    "ir": set(),
    "passes": {"ir"},
    "rules": {"ir"},
    "search": {"ir", "rules"},
    "extract": {"ir", "passes", "rules", "search"},
    "codegen": {"ir", "passes", "extract"},
    "runtime": {"ir", "codegen"},
    "frontend": {"ir", "passes"},
    "examples": {"ir"},
    "plan_view": _PLANNED,
    "alternatives": _PLANNED | {"search", "plan_view"},
    "whynot": _PLANNED | {"plan_view"},
    "summary": _PLANNED | {"plan_view", "whynot"},
    "explain": _PLANNED | {"plan_view", "whynot", "summary"},
    "draw": _PLANNED | {"plan_view", "summary"},
    "tune": _PLANNED | {"rules", "runtime"},
    "forksafe": {"ir"},
    "collector": set(),
    "plan_cache": set(ORDER),
    "plan_graph": {"ir", "codegen", "runtime"},
    "plan": (_LOWER - {"frontend"}) | {"alternatives", "explain", "draw", "forksafe", "collector", "plan_cache",
                                      "plan_graph"},
    "fresh_process": {"ir", "plan"},
    "plan_symbolic": (_LOWER - {"frontend"}) | {"plan", "summary"},
    "train_plans": {"ir"},
    "train": {"ir", "frontend", "runtime", "plan", "plan_symbolic", "train_plans", "collector"},
    "cli": _LOWER | {"examples", "explain", "draw", "tune", "plan"},
    "__init__": _LOWER | {"examples", "explain", "draw", "tune", "plan", "plan_symbolic", "cli", "train"},
}
ALLOWED["testing"] = set(ALLOWED) - {"cli"}


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every ``reshard/**/*.py``."""
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = ["reshard", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under an ``if TYPE_CHECKING:`` block."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def import_edges(run_only: bool = False) -> dict[str, set[str]]:
    """Module -> the reshard modules it imports (see the module docstring); ``run_only``: only
    the imports that execute (not those under ``if TYPE_CHECKING:``)."""
    mods = modules()
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_only(tree) if run_only else set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for a in node.names:
                    targets.add(f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module)
        edges[name] = {t for t in targets if t in mods and t != name}
    return edges


def unit(module: str) -> str:
    """``reshard.rules.cost`` -> ``rules``; ``reshard.plan`` -> ``plan``;
    the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_every_kind_of_import() -> None:
    edges = import_edges()
    assert "reshard.ir.errors" in edges["reshard.ir.collective_kinds"]  # module level, relative
    assert "reshard.runtime.distributed" in edges["reshard.plan"]  # inside a method
    assert "reshard.codegen.remap_index" in edges["reshard.codegen.remap_form"]  # ``from .x import``
    assert "reshard.ir.fusion" in edges["reshard.ir.ops.registry"]  # under TYPE_CHECKING
    assert "reshard.ir.fusion" not in import_edges(run_only=True)["reshard.ir.ops.registry"]


def test_no_import_cycles() -> None:
    found = cycles(import_edges(run_only=True))
    assert not found, f"import cycles: {found}"


def test_imports_follow_the_layers() -> None:
    edges = import_edges()
    unknown = sorted({unit(m) for m in edges} - set(ALLOWED))
    assert not unknown, f"units missing from ALLOWED (say which layers they may import): {unknown}"
    bad = sorted(f"{m} -> {t}" for m, ts in edges.items() for t in ts
                 if unit(t) != unit(m) and unit(t) not in ALLOWED[unit(m)])
    assert not bad, "imports against the layer order ir -> passes -> rules -> search -> extract -> codegen -> runtime / " \
        "explanations -> plan -> train / cli:\n" \
        + "\n".join(bad)


def test_the_layer_table_is_one_way() -> None:
    """``ORDER``'s units import earlier ones only; nothing the runtime or the optimizer may import
    reads the e-graph's later rooms, the explanations or ``plan``."""
    for i, u in enumerate(ORDER):
        assert ALLOWED[u] <= set(ORDER[:i]), f"{u} may import a later layer: {sorted(ALLOWED[u] - set(ORDER[:i]))}"
    explanations = {"plan_view", "alternatives", "whynot", "summary", "explain", "draw"}
    top = {"plan", "train", "cli", "__init__", "fresh_process"}
    for u in (*ORDER, "runtime", *explanations):
        assert not ALLOWED[u] & top, u
    assert not ALLOWED["runtime"] & ({"passes", "rules", "search", "extract"} | explanations)
    for u in ("codegen", *explanations - {"alternatives"}):  # they dispatch on decoded plan nodes
        assert not ALLOWED[u] & {"rules", "search"}, u
    assert "rules" not in ALLOWED["alternatives"]
    assert not [u for u, may in ALLOWED.items() if "testing" in may], "the library imports its test helpers"


def test_cycle_and_layer_checks_catch_a_violation() -> None:
    edges = {"reshard.a": {"reshard.b"}, "reshard.b": {"reshard.c"}, "reshard.c": {"reshard.a"}, "reshard.d": set()}
    assert cycles(edges) == [["reshard.a", "reshard.b", "reshard.c"]]
    assert "extract" not in ALLOWED[unit("reshard.runtime.simulator")]
    assert "codegen" not in ALLOWED[unit("reshard.rules.cost")]
    assert "extract" not in ALLOWED[unit("reshard.search.saturate")]
    assert not {"rules", "search"} & ALLOWED[unit("reshard.codegen.lower")]
    assert "rules" not in ALLOWED[unit("reshard.passes.buckets")]
