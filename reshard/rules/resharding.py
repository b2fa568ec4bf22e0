"""Resharding: changing one mesh axis's placement of a realized value in one step.

For a value v realized at dist d and a candidate dist d' (``cand``) that differs from d on
exactly axis a (all other placements the same e-class), the change is:

====================  ==============================  ==========================================
axis a: d -> d'       implementation                  communication
====================  ==============================  ==========================================
S(x) -> R             ``AllGather(t, a)``             gather within a's teams
R -> S(y)             ``LocalSlice(t, a, S(y))``      none (seed 002)
P(o) -> R             ``AllReduce(t, a)``             reduce within a's teams
P(o) -> S(y)          ``ReduceScatter(t, a, S(y))``   reduce-scatter with o (sum, max)
S(x) -> S(y)          ``AllToAll(t, a, S(y))``        all-to-all (x, y each read one dim, not the same)
R -> P(o)             ``MakePartial(t, a, P(o))``     none: sum keeps the value on coordinate 0 of
                                                      the axis and zeros elsewhere, max keeps every copy
S(x) -> P(o)          ``MakePartial(t, a, P(o))``     none: each device's block in a tensor of the
                                                      axis's full extent filled with o's identity
====================  ==============================  ==========================================

Each law holds whatever the other axes hold (along a Replicate axis the local values are
identical copies, so a slice or a local Partial along it commutes with a Partial on another
axis).  Changes on several axes are sequences of these over teams (seed 001), passing through
intermediate dists: a value realized Partial on an axis keeps that Partial as a candidate
while its other axes move toward any candidate (``keep-partial``), so ``[R, P] -> [S(0), R]``
can slice first and all-reduce the smaller value, and ``[P, P] -> [S(0), S(0)]`` can
reduce-scatter one axis at a time.  (Candidates with a Partial that a target asks for are
listed by ``encode.candidates``.)  S(i)->S(j) via allgather+slice is the AllGather/LocalSlice
path through R, also present.

On meshes of several axes the rules match ``rat<a>(v, others, p, t)`` (``realized-by-axis``: v
realized as class t at a dist with p on axis a and ``others`` on the rest) and ``cat<a>(v,
others, p)`` (``candidate-by-axis``) instead of joining ``real`` with ``cand`` through two ``D``
terms that share the other axes' placement classes: the same matches, found by one join on
(v, others) (the tiny Llama's training step on 2 x 2: these rules 0.72 -> 0.24 s).

Candidates are the unnested simple Replicate/Shard combinations (no dim split along two axes) and
the fixed shardings' steps (``encode.candidates``), so a value whose other axes hold an index no placement list names (a
``FusedShard`` head split, a cyclic or inner split carried through ops) could not be sliced on a
Replicate axis: on a dp x tp mesh GPT-2's ``c_attn`` bias, broadcast at ``[R, FusedShard]``,
could not meet the batch-sharded tokens at ``[S(0), FusedShard]`` without gathering them over dp.
``slice-candidate`` adds, for a value realized R on axis a, ``d[a := S(j)]`` for every dim j the
axis divides and no other axis's placement reads (``placements``' ``pdim``: a placement whose index
reads several dims blocks it), which ``local-slice`` then reaches with no communication.  It is
bounded: each candidate binds one more axis of a realized dist to a block split of one of the
value's dims, and only on meshes of several axes (on one axis every such dist is a simple one).

A realized dist is a candidate (``realized-is-candidate``) and a Replicate axis may be sliced
(``slice-candidate``) only for a value *made* in this e-graph (``made``: an op of it computes the
value or its result stands for it, or an earlier segment a limit stopped feeds it with its
candidates, ``search.segments``).  A value fed complete from an earlier segment arrives at every
dist its producer realized, and the producer closed its resharding there (every candidate it
could reach, with these same rules): steps between its fed dists are the producer's, so the
consumer builds none of them (``MergedSnapshot`` dropped every one it did build).  Candidates
the consumer finds that the producer did not (``nesting``'s, of a dim the consumer's ops read
nested, and ``keep-partial``'s of those) are still reached from the fed dists.  ``keep-partial``
reads which axes and Partial ops a value was realized with (``partial-on``: one row per value,
axis and op) rather than every realized dist, which it joined with every candidate.

A *view image* (``encode.view_image``: the result v of a reshape or identity, free at every dist,
with its operand u's bytes, each simple placement of v the image of one of u's, of dim 0 where
v's is) is not made (on meshes of several axes, unless an output, a fixed or
nested sharding or another op's nodes ask for it, or u is fed from an earlier segment): every
dist of v is then the image of one of u's, and a step between two of them costs at v no less
than the same step at u (same local bytes and team; a collective or slice of dim 0 costs less,
``cost``'s ``OUTERMOST``), so the plan that steps at u and
carries the result through the view (cost 0) costs no more than the one stepping at v, with or
without sharing (whatever shares v's step shares u's and the view).  The other way round, an
operand u whose only reader is such a view to a v that is made, each simple placement of u the
image of one of v's, of dim 0 where u's is (``encode.view_preimage``: a reshape splitting a dim,
``[b, s, h] -> [b, s, heads, d]``, or dropping a leading unit dim), is not made: a step at u can
only be followed by the view, and the view followed by the same step at v costs no more.  Together these steps were 8% of a 2 x 2 training step's
e-graph (the tiny Llama: 447k e-nodes, 413k without); a value still reaches dists that split one
dim along two axes (``nesting``) by its own steps.

A mesh axis of size 1 is a team of one device: there S(x), R and P(o) hold the same local
tensor (the whole value), and every collective is the identity.  So dists enter the e-graph
with R on every such axis (``encode.dist_term``) and no rule writes anything else there (a
transport keeps R, a matmul strategy maps R x R to R, and the rules above need a candidate
that differs on the axis): no step is ever built on a team of one, and none is priced.
(Unioning such dists in the e-graph instead does not terminate: Dist terms are shared by
all values, so one value's S(x) joins every value's R class, and transports of it through
other values' ops nest without end.)
"""

from __future__ import annotations

from .rule import Rule

X = "reshard"


def _d(m: int, a: int, at: str, other: str = "p") -> str:
    return "(D " + " ".join(at if i == a else f"{other}{i}" for i in range(m)) + ")"


def _real(m: int, a: int, at: str, t: str = "t") -> str:
    """The atom matching value v realized (class ``t``) at a dist with ``at`` on axis ``a`` and
    ``p<b>`` on the others: on one axis ``real`` itself, on several the ``rat`` relation, which
    keys the class by its other axes' placements (a join of ``real`` with ``cand`` through two
    ``D`` terms sharing placements costs egglog every value's dists)."""
    if m == 1:
        return f"(= {t} (real v (D {at})))"
    return f"(rat{a} v " + " ".join(f"p{b}" for b in range(m) if b != a) + f" {at} {t})"


def _cand(m: int, a: int, at: str) -> str:
    """The atom matching a candidate of value v with ``at`` on axis ``a`` and ``p<b>`` on the others."""
    if m == 1:
        return f"(cand v (D {at}))"
    return f"(cat{a} v " + " ".join(f"p{b}" for b in range(m) if b != a) + f" {at})"


def rules(m: int) -> list[Rule]:
    out: list[Rule] = []
    if m > 1:
        ps = " ".join(f"p{b}" for b in range(m))
        others = [" ".join(f"p{b}" for b in range(m) if b != a) for a in range(m)]
        out.append(Rule("realized-by-axis", "rat_a(v, others, p, t): v realized as class t at a dist with p on axis "
                        "a and the others' placements", f"(= t (real v (D {ps})))",
                        " ".join(f"(rat{a} v {others[a]} p{a} t)" for a in range(m)), "analysis"))
        out.append(Rule("candidate-by-axis", "cat_a(v, others, p): v has a candidate dist with p on axis a and the "
                        "others' placements", f"(cand v (D {ps}))",
                        " ".join(f"(cat{a} v {others[a]} p{a})" for a in range(m)), "analysis"))
    for a in range(m):
        def d(at: str) -> str:
            return _d(m, a, at)

        def real(at: str) -> str:
            return _real(m, a, at)

        def cand(at: str) -> str:
            return _cand(m, a, at)
        out += [
            Rule("allgather", f"v at d[{a}:=S(x)] = AllGather_{a}(v at d[{a}:=S(x)]) at d[{a}:=R]",
                 f"{real('(Bind x)')} {cand('(Rep)')}",
                 f"(union (real v {d('(Rep)')}) (AllGather t {a}))", X, variant=str(a)),
            Rule("local-slice", f"R -> S(y) on axis {a} is a local slice, no communication",
                 f"{real('(Rep)')} {cand('(Bind y)')}",
                 f"(union (real v {d('(Bind y)')}) (LocalSlice t {a} (Bind y)))", X, variant=str(a)),
            Rule("allreduce", f"P(o) -> R on axis {a} is an all-reduce with o",
                 f"{real('(Part o)')} {cand('(Rep)')}",
                 f"(union (real v {d('(Rep)')}) (AllReduce t {a}))", X, variant=str(a)),
            Rule("reduce-scatter", f"P(o) -> S(y) on axis {a} is a reduce-scatter with o: chunk_i(o(x_0..x_n-1)) "
                 "(an elementwise reduction commutes with taking each device's elements)",
                 f"{real('(Part o)')} {cand('(Bind y)')}",
                 f"(union (real v {d('(Bind y)')}) (ReduceScatter t {a} (Bind y)))", X, variant=str(a)),
            Rule("all-to-all", f"S(x) -> S(y) on axis {a}, x reading only dim i and y only dim j != i, is an "
                 "all-to-all: device k sends device l the elements with x = k and y = l, as many for every pair "
                 "(the local sets are products of per-dim sets, equal in size on every device)",
                 f"{real('(Bind x)')} {cand('(Bind y)')} (= i (rootof x)) (= j (rootof y)) "
                 f"(!= i j)",
                 f"(union (real v {d('(Bind y)')}) (AllToAll t {a} (Bind y)))", X, variant=str(a)),
            Rule("partial-of-replicate", f"R -> P(o) on axis {a} is local: o(v, 0, .., 0) = v for sum (the "
                 "value on coordinate 0, zeros elsewhere), max(v, .., v) = v for max (every copy kept)",
                 f"{real('(Rep)')} {cand('(Part o)')}",
                 f"(union (real v {d('(Part o)')}) (MakePartial t {a} (Part o)))", X, variant=str(a)),
            Rule("partial-of-shard", f"S(x) -> P(o) on axis {a} is local: each device places its block in a "
                 "tensor of the full extent filled with o's identity (0, -inf); o over the team puts every "
                 "element's one holder's value back",
                 f"{real('(Bind x)')} {cand('(Part o)')}",
                 f"(union (real v {d('(Part o)')}) (MakePartial t {a} (Part o)))", X, variant=str(a)),
        ]
        if m > 1:
            out.append(Rule("partial-on", f"parton(v, {a}, o): v is realized at some dist with P(o) on axis {a}",
                            f"(= t (real v {_d(m, a, '(Part o)', 'p')}))", f"(parton v {a} o)", "analysis",
                            variant=str(a)))
            out.append(Rule("keep-partial", f"a value realized P(o) on axis {a} (parton) may stay P(o) while its "
                            "other axes change toward a candidate: d' with axis a := P(o) is a candidate",
                            f"(parton v {a} o) (cand v {_d(m, a, 'r', 'q')})",
                            f"(cand v {_d(m, a, '(Part o)', 'q')})", X, variant=str(a)))
            others = " ".join(f"(= q{b} (pdim p{b})) (!= q{b} j)" for b in range(m) if b != a)
            out.append(Rule("slice-candidate", f"a value realized R on axis {a} may be sliced there (local-slice) "
                            "to S(j) = Outer(Root(v, j, e), n), n = the axis's size | e, for a dim j that the axis "
                            "may split (axdim) and no other axis's placement reads (pdim): each device still holds a "
                            "product of per-dim index sets, so d[a:=S(j)] is a sharding of v, reached with no "
                            "communication",
                            f"(= t (real v {d('(Rep)')})) (made v) (= r (Root v j e)) (axdim {a} j) (= n (axsize {a})) "
                            f"(> n 1) (= 0 (% e n)) {others}",
                            f"(cand v {d('(Bind (Outer r n))')})", X, variant=str(a)))
    out.append(Rule("realized-is-candidate", "every realized dist of a value made in this e-graph is a candidate "
                    "of it", "(= t (real v d)) (made v)", "(cand v d)", X))
    return out
