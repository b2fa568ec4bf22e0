"""IterDomain algebra and transport rules: every law checked on both sides through the
index-function oracle (``reshard.ir.ids.evaluate``), and every e-class the rules build
checked for soundness after saturation on random terms."""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict
from collections.abc import Callable

import egglog.bindings as eb
import pytest
import torch

from reshard.rules import id_algebra
from reshard.search.encode import id_term
from reshard.rules.rule import render_all
from reshard.rules.schema import schema
from reshard.rules.transport import reshape_map
from reshard.ir.ids import ID, Inner, Merge, Outer, Root, evaluate, extent

# ---- law oracles: random instance -> (lhs, rhs), or None when the guard fails ----------------

Law = Callable[[random.Random], "tuple[ID, ID] | None"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _leaf(rng: random.Random, dims: list[int]) -> ID:
    d = rng.randrange(len(dims))
    return Root(d, dims[d])


def _term(rng: random.Random, dims: list[int], depth: int = 2) -> ID:
    """A random well-formed ID over roots with extents ``dims``."""
    if depth == 0 or rng.random() < 0.3:
        return _leaf(rng, dims)
    x = _term(rng, dims, depth - 1)
    kind = rng.choice(["outer", "inner", "merge"])
    if kind == "merge":
        return Merge(x, _term(rng, dims, depth - 1))
    p = rng.choice(_divisors(extent(x)))
    return Outer(x, p) if kind == "outer" else Inner(x, p)


def _xy(rng: random.Random) -> tuple[ID, ID, list[int]]:
    dims = [rng.choice([2, 3, 4, 6, 8, 12]) for _ in range(3)]
    return _term(rng, dims), _term(rng, dims), dims


def _split(rng: random.Random, x: ID) -> int:
    return rng.choice(_divisors(extent(x)))


def law_outer_whole(rng):
    x, _, _ = _xy(rng)
    return Outer(x, extent(x)), x


def law_inner_one(rng):
    x, _, _ = _xy(rng)
    return Inner(x, 1), x


def law_merge_split(rng):
    x, _, _ = _xy(rng)
    p = _split(rng, x)
    return Merge(Outer(x, p), Inner(x, p)), x


def law_outer_merge_exact(rng):
    x, y, _ = _xy(rng)
    return Outer(Merge(x, y), extent(x)), x


def law_outer_merge_within(rng):
    x, y, _ = _xy(rng)
    p = _split(rng, x)
    if p >= extent(x):
        return None
    return Outer(Merge(x, y), p), Outer(x, p)


def law_outer_merge_across(rng):
    x, y, _ = _xy(rng)
    q = _split(rng, y)
    p = extent(x) * q
    if p <= extent(x):
        return None
    return Outer(Merge(x, y), p), Merge(x, Outer(y, q))


def law_inner_merge_exact(rng):
    x, y, _ = _xy(rng)
    return Inner(Merge(x, y), extent(x)), y


def law_inner_merge_within(rng):
    x, y, _ = _xy(rng)
    p = _split(rng, x)
    if p >= extent(x):
        return None
    return Inner(Merge(x, y), p), Merge(Inner(x, p), y)


def law_inner_merge_across(rng):
    x, y, _ = _xy(rng)
    q = _split(rng, y)
    p = extent(x) * q
    if p <= extent(x):
        return None
    return Inner(Merge(x, y), p), Inner(y, q)


def law_outer_outer(rng):
    x, _, _ = _xy(rng)
    p = _split(rng, x)
    q = rng.choice(_divisors(p))
    return Outer(Outer(x, p), q), Outer(x, q)


def law_inner_inner(rng):
    x, _, _ = _xy(rng)
    p = _split(rng, x)
    q = rng.choice(_divisors(extent(x) // p))
    return Inner(Inner(x, p), q), Inner(x, p * q)


def law_outer_inner(rng):
    x, _, _ = _xy(rng)
    p = _split(rng, x)
    q = rng.choice(_divisors(extent(x) // p))
    return Outer(Inner(x, p), q), Inner(Outer(x, p * q), p)


def law_merge_assoc(rng):
    x, y, dims = _xy(rng)
    z = _term(rng, dims)
    if 1 in (extent(x), extent(y), extent(z)):
        return None  # guarded: the unit laws cover it
    return Merge(Merge(x, y), z), Merge(x, Merge(y, z))


def _unit(rng: random.Random, dims: list[int]) -> ID:
    """A random ID of extent 1 (the index 0 everywhere): a size-1 root, Outer(x, 1),
    Inner(x, e(x)), or a merge of two units."""
    kind = rng.choice(["root", "outer", "inner", "merge"])
    if kind == "root":
        return Root(len(dims), 1)
    if kind == "merge":
        return Merge(_unit(rng, dims), _unit(rng, dims))
    x = _term(rng, dims)
    return Outer(x, 1) if kind == "outer" else Inner(x, extent(x))


def law_merge_unit_right(rng):
    x, _, dims = _xy(rng)
    return Merge(x, _unit(rng, dims)), x


def law_merge_unit_left(rng):
    x, _, dims = _xy(rng)
    return Merge(_unit(rng, dims), x), x


LAWS: dict[str, Law] = {
    "outer-whole": law_outer_whole, "inner-one": law_inner_one, "merge-split": law_merge_split,
    "outer-merge-exact": law_outer_merge_exact, "outer-merge-within": law_outer_merge_within,
    "outer-merge-across": law_outer_merge_across, "inner-merge-exact": law_inner_merge_exact,
    "inner-merge-within": law_inner_merge_within, "inner-merge-across": law_inner_merge_across,
    "outer-outer": law_outer_outer, "inner-inner": law_inner_inner,
    "outer-inner": law_outer_inner, "merge-assoc": law_merge_assoc,
    "merge-unit-right": law_merge_unit_right, "merge-unit-left": law_merge_unit_left,
}
#: rules that add analyses or transport, not equalities between ID terms over one space;
#: checked by the saturation sweeps below.
ANALYSES = {"ext-root", "ext-outer", "ext-inner", "ext-merge", "red-base", "red-outer", "red-inner", "red-merge",
            "tr-outer", "tr-inner", "tr-merge", "root-of-root", "root-of-outer", "root-of-inner", "rect-single",
            "rect-merge"}


def _grid(dims: list[int]) -> list[torch.Tensor]:
    return list(torch.meshgrid(*[torch.arange(e) for e in dims], indexing="ij"))


def test_every_id_rule_has_an_oracle():
    names = {r.name for r in id_algebra.RULES}
    assert names == set(LAWS) | ANALYSES


@pytest.mark.parametrize("name", sorted(LAWS))
def test_law_holds_on_random_instances(name):
    rng = random.Random(name)
    checked = 0
    for _ in range(200):
        inst = LAWS[name](rng)
        if inst is None:
            continue
        lhs, rhs = inst
        dims = [max(_root_extents(lhs, d) | _root_extents(rhs, d) | {1}) for d in range(4)]
        idx = _grid(dims)
        assert extent(lhs) == extent(rhs)
        assert torch.equal(evaluate(lhs, idx), evaluate(rhs, idx)), (name, str(lhs), str(rhs))
        checked += 1
    assert checked >= 50


def _root_extents(x: ID, d: int) -> set[int]:
    if isinstance(x, Root):
        return {x.extent} if x.dim == d else set()
    if isinstance(x, (Outer, Inner)):
        return _root_extents(x.x, d)
    return _root_extents(x.x, d) | _root_extents(x.y, d)


# ---- the egglog rules: each fires on its left side and proves the right side --------------

def _egraph(lets: list[str], facts: tuple[str, ...] = ()) -> eb.EGraph:
    eg = eb.EGraph()
    text = schema(1) + render_all(id_algebra.RULES) + "\n" + "\n".join(lets) + "\n" + "\n".join(facts)
    eg.run_program(*eg.parse_program(text))
    eg.run_program(*eg.parse_program("(run-schedule (saturate (run ids)))"))
    return eg


@pytest.mark.parametrize("name", sorted(LAWS))
def test_rule_proves_its_law_in_the_egraph(name):
    rng = random.Random(f"eg-{name}")
    proved = 0
    for _ in range(30):
        inst = LAWS[name](rng)
        if inst is None:
            continue
        lhs, rhs = inst
        eg = _egraph([f"(let $l {id_term(lhs, 0)})", f"(let $r {id_term(rhs, 0)})"])
        eg.run_program(*eg.parse_program("(check (= $l $r))"))
        proved += 1
        if proved == 8:
            break
    assert proved >= 3


def _classes(eg: eb.EGraph, space: int = 0, limit: int = 12) -> dict[object, set[ID]]:
    """Up to ``limit`` concrete Root/Outer/Inner/Merge terms per ID class, built from the
    roots of index space ``space`` only."""
    frozen = eg.freeze().functions
    rows = [(name, tuple(r.inputs), r.output) for name in ("Root", "Outer", "Inner", "Merge")
            for r in frozen[name].rows if not r.subsumed]
    terms: dict[object, set[ID]] = defaultdict(set)
    for _ in range(4):
        for name, args, cls in rows:
            if len(terms[cls]) >= limit:
                continue
            if name == "Root":
                if eg.value_to_i64(args[0]) == space:
                        terms[cls].add(Root(eg.value_to_i64(args[1]), eg.value_to_i64(args[2])))
            elif name in ("Outer", "Inner"):
                p = eg.value_to_i64(args[1])
                for x in list(terms.get(args[0], ()))[:4]:
                    terms[cls].add((Outer if name == "Outer" else Inner)(x, p))
            else:
                for x, y in itertools.islice(itertools.product(terms.get(args[0], ()), terms.get(args[1], ())), 4):
                    terms[cls].add(Merge(x, y))
    return terms


def _well_formed(x: ID) -> bool:
    try:
        extent(x)
        return True
    except Exception:
        return False


@pytest.mark.parametrize("seed", range(6))
def test_saturation_only_equates_equal_index_functions(seed):
    """Random terms (and every law's instances) saturated together: every pair of terms the
    rules put in one e-class evaluates equal everywhere."""
    rng = random.Random(seed)
    dims = [rng.choice([2, 4, 6, 8, 12]) for _ in range(3)]
    lets = []
    for i in range(12):
        lets.append(f"(let $t{i} {id_term(_term(rng, dims, 3), 0)})")
    eg = _egraph(lets)
    idx = _grid(dims)
    multi = 0
    for cls, members in _classes(eg).items():
        good = [t for t in members if _well_formed(t)]
        if len(good) < 2:
            continue
        multi += 1
        ref = evaluate(good[0], idx)
        for t in good[1:]:
            assert torch.equal(evaluate(t, idx), ref), (str(good[0]), str(t))
    assert multi > 0


# ---- transport through a reshape: Tr(x, c) is x read in the result's index space -----------

RESHAPES = [((16,), (2, 8)), ((16,), (2, 2, 4)), ((4, 4), (2, 2, 4)), ((4, 4), (16,)), ((2, 3, 4), (6, 4)),
            ((2, 3, 4), (2, 12)), ((6, 4), (3, 8)), ((8, 6), (2, 4, 3, 2))]


@pytest.mark.parametrize("src,dst", RESHAPES, ids=[f"{s}->{d}" for s, d in RESHAPES])
def test_reshape_transport_is_sound(src, dst):
    """For random operand IDs x (e.g. a sharded dim or a factor of it), every result-space
    term the rules find equal to Tr(x, reshape) selects the same elements as x does."""
    rng = random.Random(f"{src}{dst}")
    facts = [f"(union (Tr (Root 0 {d} {e}) 7) {id_term(img, 1)})"
             for d, (e, img) in enumerate(zip(src, reshape_map(src, dst))) if img is not None]
    xs = [_term(rng, list(src), 2) for _ in range(10)] + [Outer(Root(d, e), p) for d, e in enumerate(src)
                                                          for p in _divisors(e)]
    lets = [f"(let $x{i} (Tr {id_term(x, 0)} 7))" for i, x in enumerate(xs)]
    eg = _egraph(lets, tuple(facts))
    frozen = eg.freeze().functions
    lets_by_name = {name: fn.rows[0].output for name, fn in frozen.items() if fn.is_let_binding}
    classes = _classes(eg, space=1)
    dst_idx = _grid(list(dst))
    flat = sum(dst_idx[d] * math.prod(dst[d + 1:]) for d in range(len(dst)))
    src_idx = [(flat // math.prod(src[d + 1:])) % src[d] for d in range(len(src))]
    resolved = 0
    for i, x in enumerate(xs):
        for y in classes.get(lets_by_name[f"$x{i}"], ()):
            if _well_formed(y):
                assert torch.equal(evaluate(y, dst_idx), evaluate(x, src_idx)), (str(x), str(y))
                resolved += 1
    assert resolved >= len(src)



# ---- extent 1: unit indices and reduced dims saturate (issue 18) ----------------------------

def _grows_to_fixpoint(eg: eb.EGraph, max_iterations: int = 40, max_rows: int = 20_000) -> int:
    """Run ``ids`` one iteration at a time; the number of iterations to a fixpoint (fails when
    the e-graph keeps growing)."""
    for i in range(max_iterations):
        out = eg.run_program(*eg.parse_program("(run-schedule (run ids))"))
        if not any(o.report.updated for o in out if getattr(o, "report", None) is not None):
            return i
        rows = sum(n for o in eg.run_program(*eg.parse_program("(print-size)")) for _, n in getattr(o, "sizes", []))
        assert rows < max_rows, f"ids grew to {rows} rows after {i + 1} iterations"
    raise AssertionError(f"ids did not saturate in {max_iterations} iterations")


def _factor(rng: random.Random, shape: list[int]) -> list[int]:
    """A random shape of the same size with size-1 dims inserted (an unsqueeze-like reshape)."""
    flat = [q for e in shape for q in ([2] * (e.bit_length() - 1) if e > 1 else [])]
    out: list[int] = []
    while flat:
        k = rng.randint(1, min(2, len(flat)))
        out.append(math.prod(flat[:k]))
        flat = flat[k:]
        if rng.random() < 0.4:
            out.append(1)
    return out or [1]


@pytest.mark.parametrize("seed", range(10))
def test_unit_and_reduced_indices_saturate_soundly(seed):
    """Terms over dims of extent 1 and 2 (size-1 dims, a dim of 2 split 2 ways, merges with a
    unit) carried through a reshape that inserts size-1 dims and then a reduction: the ids
    rules reach a fixpoint quickly (they grew without bound: Merge(x, u) = x made cyclic
    classes that merge-assoc expanded forever, and transports expanded the terms of the
    reduced-index class), and every class they build is sound."""
    rng = random.Random(seed)
    src = [rng.choice([1, 2, 2, 4]) for _ in range(3)]
    mid = _factor(rng, src)
    facts = [f"(union (Tr (Root 0 {d} {e}) 7) {id_term(img, 1)})"
             for d, (e, img) in enumerate(zip(src, reshape_map(tuple(src), tuple(mid)))) if img is not None]
    shape = mid
    for space, c in ((1, 13), (2, 19)):  # ops 13, 19: each reduces about half the dims
        kept: list[int] = []
        for d, e in enumerate(shape):
            img = "(Red)" if rng.random() < 0.5 else id_term(Root(len(kept), e), space + 1)
            facts.append(f"(union (Tr (Root {space} {d} {e}) {c}) {img})")
            kept += [e] if img != "(Red)" else []
        shape = kept
    lets = []
    for i in range(6):
        x = _term(rng, src, 3)
        u = _unit(rng, src)
        for j, t in enumerate([x, Merge(x, u), Outer(Merge(x, u), extent(x)), Merge(Outer(x, 1), x)]):
            lets.append(f"(let $a{i}_{j} (Tr (Tr (Tr {id_term(t, 0)} 7) 13) 19))")
    eg = eb.EGraph()
    text = schema(1) + render_all(id_algebra.RULES) + "\n" + "\n".join(facts + lets)
    eg.run_program(*eg.parse_program(text))
    assert _grows_to_fixpoint(eg) < 20
    for space, dims in ((0, src + [1]), (1, mid)):
        idx = _grid(dims)
        for cls, members in _classes(eg, space).items():
            good = [t for t in members if _well_formed(t)]
            for t in good[1:]:
                assert torch.equal(evaluate(t, idx), evaluate(good[0], idx)), (str(good[0]), str(t))
