"""Placement and distribution analysis: which placements are well-formed and how many
shards a distribution has; and transport of placements through an op's index map.

A placement is *ok* when it is Rep, Part, or Bind of an ID with a known extent (built
from roots only: a ``Tr`` that no fact resolved has no extent) that is rectangular
(``rect``: each device then holds a product of per-dim index sets, which is what a local
tensor can store; e.g. a 2-way split of a reshape-merged [3, 2] is not).  ``shards(D)`` is the
product of the bound IDs' extents (= the mesh axis sizes they are bound to).  ``pdim(p)``, on
meshes of several axes, is the one dim a placement's index reads (-1: none, for Rep and Part; no
entry for an index of several dims), which ``resharding``'s ``slice-candidate`` reads.

Transport: ``TrD(d, c)`` and ``TrP(p, c)`` are *functions*, computed where a rule asks for them
(``trdw(d, c)``: a strategy's demand for an operand dist d of an op with index map c; ``trpw``:
each of d's placements), bottom up: TrP of Rep and of a linear op's Part at once, of Bind(x) once
Tr(x, c) has an extent (or reduces), then TrD as the D of the per-axis results.  They were
constructor terms unioned with their normal forms, and an egglog iteration that unions rebuilds
every table of a segment (design.md, what an iteration costs): computed by ``set`` instead, the
tiny Llama's 2 x 2 training step's growth runs 1,828 union iterations instead of 2,442, the
same plans, 5-20% less saturation on the tiny training configs.  A (p, c) pair meets one
result: a placement class holds one normal form, and TrP(Bind(x), c) is Bind(Tr(x, c)) when
Tr(x, c) has an extent and Part(o) when c reduces x, never both (a reduced index has no extent);
``:merge old`` keeps the first value written, and where two keys become one their values are
equal by congruence (built by constructors from the keys' parts).  ``Tr`` itself stays a
constructor: an ID class holds several terms whose images the ID algebra unions (design.md).
"""

from __future__ import annotations

from .rule import Rule


def _dist(prefix: str, m: int) -> str:
    return "(D " + " ".join(f"{prefix}{i}" for i in range(m)) + ")"


def rules(m: int) -> list[Rule]:
    A = "analysis"
    ps = [f"p{i}" for i in range(m)]
    prod = "1"
    for i in range(m):
        prod = f"(* {prod} f{i})"
    out = [
        Rule("ok-rep", "Rep is a placement with factor 1", "(= p (Rep))", "(okP p) (set (fac p) 1)", A),
        Rule("ok-part", "Part(op) is a placement with factor 1", "(= p (Part o))", "(okP p) (set (fac p) 1)", A),
        Rule("ok-bind", "Bind(x) with e(x) known and x rectangular (each device holds a product of "
             "per-dim index sets, which local tensors can store) is a placement with factor e(x)",
             "(= p (Bind x)) (= e (ext x)) (rect x)", "(okP p) (set (fac p) e)", A),
        Rule("ok-dist", "D(p...) is ok when every placement is; shards = product of factors",
             f"(= d {_dist('p', m)}) " + " ".join(f"(okP p{i}) (= f{i} (fac p{i}))" for i in range(m)),
             f"(okD d) (set (shards d) {prod})", A),
        Rule("local-bytes", "local bytes of value v with dist d = nbytes(v) / shards(d)",
             "(= t (real v d)) (= s (shards d)) (= nb (nbytes v))", "(set (lb v d) (/ nb s))", A),
        # ---- transport of placements (law: TrP(p, c) is p seen through c's index map) ----
        Rule("trd-want", "TrD(D(p...), c) needs TrP(p, c) of every axis", f"(trdw {_dist('p', m)} c)",
             " ".join(f"(trpw {p} c)" for p in ps), "ids"),
        Rule("trd", "TrD(D(p...), c) = D(TrP(p, c)...)",
             f"(trdw {_dist('p', m)} c) " + " ".join(f"(= q{i} (TrP p{i} c))" for i in range(m)),
             f"(set (TrD {_dist('p', m)} c) {_dist('q', m)})", "ids"),
        Rule("trp-rep", "TrP(Rep, c) = Rep", "(trpw (Rep) c)", "(set (TrP (Rep) c) (Rep))", "ids"),
        Rule("trp-part", "TrP(Part(o), c) = Part(o)  when op c is linear for o",
             "(trpw (Part o) c) (keeps c o)", "(set (TrP (Part o) c) (Part o))", "ids"),
        Rule("trp-bind-demand", "TrP(Bind(x), c) needs the transported index Tr(x, c)", "(trpw (Bind x) c)",
             "(Tr x c)", "ids"),
        Rule("trp-bind", "TrP(Bind(x), c) = Bind(Tr(x, c))  when Tr(x, c) is an index of the result (has an "
             "extent; a reduced or unmapped index is not)", "(trpw (Bind x) c) (= y (Tr x c)) (= e (ext y))",
             "(set (TrP (Bind x) c) (Bind y))", "ids"),
        Rule("trp-reduce", "TrP(Bind(x), c) = Part(o)  when c reduces every index x reads with o",
             "(trpw (Bind x) c) (red (Tr x c)) (redop c o)", "(set (TrP (Bind x) c) (Part o))", "ids"),
    ]
    if m > 1:
        out += [
            Rule("pdim-rep", "Rep reads no dim of the value (pdim -1)", "(= p (Rep))", "(set (pdim p) -1)", A),
            Rule("pdim-part", "Part(o) reads no dim of the value (pdim -1)", "(= p (Part o))", "(set (pdim p) -1)", A),
            Rule("pdim-bind", "Bind(x) reads x's one dim when x reads one (rootof); an index of several dims has "
                 "no pdim", "(= p (Bind x)) (= r (rootof x))", "(set (pdim p) r)", A),
        ]
    return out
