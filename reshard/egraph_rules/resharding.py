"""Resharding: changing one mesh axis's placement of a realized value with one collective.

For a value v realized at dist d and a candidate dist d' (``cand``) that differs from d on
exactly axis a (all other placements the same e-class), the change is:

====================  ==============================  ==========================
axis a: d -> d'       implementation                  communication
====================  ==============================  ==========================
S(x) -> R             ``AllGather(t, a)``             gather within a's teams
R -> S(y)             ``LocalSlice(t, a, S(y))``      none (seed 002)
P(o) -> R             ``AllReduce(t, a)``             reduce within a's teams
P(sum) -> S(y)        ``ReduceScatter(t, a, S(y))``   reduce-scatter
S(x) -> S(y)          ``AllToAll(t, a, S(y))``        all-to-all (x, y block splits of two dims)
====================  ==============================  ==========================

Changes on several axes are sequences of these over teams (seed 001); S(i)->S(j) via
allgather+slice is the AllGather/LocalSlice path through R, also present.
"""

from __future__ import annotations

from .rule import Rule

X = "reshard"


def _d(m: int, a: int, at: str) -> str:
    return "(D " + " ".join(at if i == a else f"p{i}" for i in range(m)) + ")"


def rules(m: int) -> list[Rule]:
    out: list[Rule] = []
    psum = '(Part "sum")'
    for a in range(m):
        def d(at: str) -> str:
            return _d(m, a, at)
        out += [
            Rule(f"allgather-{a}", f"v at d[{a}:=S(x)] = AllGather_{a}(v at d[{a}:=S(x)]) at d[{a}:=R]",
                 f"(= t (real v {d('(Bind x)')})) (cand v {d('(Rep)')})",
                 f"(union (real v {d('(Rep)')}) (AllGather t {a}))", X),
            Rule(f"local-slice-{a}", f"R -> S(y) on axis {a} is a local slice, no communication",
                 f"(= t (real v {d('(Rep)')})) (cand v {d('(Bind y)')})",
                 f"(union (real v {d('(Bind y)')}) (LocalSlice t {a} (Bind y)))", X),
            Rule(f"allreduce-{a}", f"P(o) -> R on axis {a} is an all-reduce with o",
                 f"(= t (real v {d('(Part o)')})) (cand v {d('(Rep)')})",
                 f"(union (real v {d('(Rep)')}) (AllReduce t {a}))", X),
            Rule(f"reduce-scatter-{a}", f"P(sum) -> S(y) on axis {a} is a reduce-scatter",
                 f"(= t (real v {d(psum)})) (cand v {d('(Bind y)')})",
                 f"(union (real v {d('(Bind y)')}) (ReduceScatter t {a} (Bind y)))", X),
            Rule(f"all-to-all-{a}", f"S(i) -> S(j) (block splits, i != j) on axis {a} is an all-to-all",
                 f"(= t (real v {d('(Bind (Outer (Root s i ei) n))')})) (cand v {d('(Bind (Outer (Root s j ej) n))')}) "
                 f"(!= i j)",
                 f"(union (real v {d('(Bind (Outer (Root s j ej) n))')}) (AllToAll t {a} (Bind (Outer (Root s j ej) n))))", X),
        ]
    out.append(Rule("realized-is-candidate", "every realized dist is a candidate of its value",
                    "(= t (real v d))", "(cand v d)", X))
    return out
