"""The cost laws are declared once (``rules.cost_laws``): the text a cost rule sets is its
formula rendered, and the same formula evaluated on integers gives what egglog's arithmetic
gives for that text, so the symbolic mesh's repricer and the e-graph price alike."""

from __future__ import annotations

import random
import re

import pytest

from reshard.rules.collectives import TEAM_CTORS
from reshard.rules.cost_laws import PRICINGS, Quantities, Term, teams
from reshard.rules.cost_profile import CostProfile
from reshard.rules.schema import T_CONSTRUCTORS, tables
from reshard.search.encode import rule_families

PROFILES = [CostProfile(), CostProfile.load({"hbm_gbps": 0.9, "launch_us": 3.3, "busbw_gbps": {"allreduce": 0.37},
                                             "collectives": {"allgather": {"2": {"alpha_us": 1.0}}}})]
#: a cost rule that copies another node's cost (``alias``' MMT, ``remat``'s twins), not a law
COPIES = re.compile(r"^\(set \(cost_\w+[^()]*\) c\)$")


def _evaluate(text: str, env: dict[str, int]) -> int:
    """An egglog i64 expression over ``env``'s variables (``/`` truncates, ``%`` its remainder)."""
    tokens = text.replace("(", " ( ").replace(")", " ) ").split()

    def parse(i: int) -> tuple[int, int]:
        if tokens[i] != "(":
            tok = tokens[i]
            return (env[tok] if tok in env else int(tok)), i + 1
        op, i, args = tokens[i + 1], i + 2, []
        while tokens[i] != ")":
            v, i = parse(i)
            args.append(v)
        a, b = args
        ops = {"+": a + b, "-": a - b, "*": a * b, "max": max(a, b)}
        if op in ops:
            return ops[op], i + 1
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return (q if op == "/" else a - q * b), i + 1
    value, end = parse(0)
    assert end == len(tokens)
    return value


def _quantities(rng: random.Random, ctor: str, prof: CostProfile, wrap) -> Quantities:
    n = rng.choice([2, 3, 4, 8])
    team = teams(prof, TEAM_CTORS[ctor].name, [n])[0] if ctor in TEAM_CTORS else None
    facts = {"mmK": rng.randint(1, 4096), "mmitem": rng.choice([2, 4]), "mmpeak": rng.randint(1, 10 ** 9),
             "kprod": rng.choice([1, 2, 4]), "fl": rng.randint(0, 10 ** 12), "pb": rng.randint(0, 10 ** 8),
             "kn": rng.randint(1, 3), "atpeak": rng.randint(1, 10 ** 9), "xdev": n, "keepw": rng.choice([1, 2])}
    return Quantities(wrap("out", rng.randint(0, 10 ** 9)), tuple(wrap(f"in{i}", rng.randint(0, 10 ** 9))
                                                                   for i in range(5)),
                      wrap("n", n), ctor, team, rng.randint(0, 2), {k: wrap(k, v) for k, v in facts.items()})


@pytest.mark.parametrize("prof", PROFILES, ids=["default", "slow"])
def test_a_formula_rendered_for_egglog_and_evaluated_in_python_agree(prof):
    rng = random.Random(0)
    for p in PRICINGS:
        for ctor in p.ctors:
            for _ in range(20):
                seed = rng.random()
                env: dict[str, int] = {}

                def term(name: str, v: int) -> Term:
                    env[name] = v
                    return Term(name)
                ints = _quantities(random.Random(seed), ctor, prof, lambda name, v: v)
                terms = _quantities(random.Random(seed), ctor, prof, term)
                if p.rule.endswith("-xfer") or p.rule == "cost-send-recv":  # a transfer's team size is the mesh's
                    terms = Quantities(terms.out, terms.ins, ints.n, ctor, facts=terms.facts)
                assert _evaluate(p.render(prof, terms), env) == p.formula(prof, ints), (p.rule, ctor)


def test_the_facts_a_law_is_selected_by_and_reads_are_declared_tables_keyed_by_op():
    keyed_by_op = {t.name for t in tables(2) if t.args[:1] == ("i64",)}
    for p in PRICINGS:
        assert {p.selector, *p.reads} - {""} <= keyed_by_op, p.rule


def test_every_cost_rule_is_a_declared_law_or_a_copy_of_one():
    prof = PROFILES[1]
    rules = [r for rs in rule_families((2, 4), prof, True, True, True, True, True).values() for r in rs]
    laws = {p.rule: p for p in PRICINGS}
    priced: set[str] = set()
    for r in rules:
        m = re.match(r"\(set \(cost_(\w+)", r.actions)
        if not m:
            continue
        priced.add(m.group(1))
        if COPIES.match(r.actions):  # the repricer prices a copied node by its own law
            assert any(m.group(1) in p.ctors for p in PRICINGS), f"{r.reported_name}: {m.group(1)} has no law"
            continue
        assert r.name in laws, f"{r.reported_name} sets a cost by a law cost_laws does not declare"
        assert m.group(1) in laws[r.name].ctors, f"{r.reported_name} prices {m.group(1)}, its law does not"
    assert priced == set(T_CONSTRUCTORS) - {"InAt"}, "an implementation constructor no cost law prices"
    assert {r.name for r in rules} >= set(laws), "a declared law no rule renders"
