"""Lookup strategies (gathers ``embedding``, ``pick`` and scatters ``embedding_grad``,
``unpick``: ``reshard.ir.ops.lookup``), per mesh axis.

Facts name each lookup op: ``lookup(k, table, indices, o)`` and ``lkcodes(k, c0..c5)``, the
transport codes of its six index maps (``ir.ops.lookup``: 0/1 table/indices into the result,
2 the table into the indexed space (root 0 = V), 4/5 the table/indices dims a shard may keep
while the other operand is whole); a gather has ``lkgather(k)`` (its cost law); a scatter
(operands g, indices) has code 0 (no image) in place of c2 and c3, ``lkcontract(k, c2, c3)``
(g's and the indices' token dims into the contraction space) and ``scatdim(o, d)`` (its
result's scattered dim V).  As for matmul (``propagation``'s ``MMP``), every pair of
realized operand dists is a candidate ``LkD``, resolved axis by axis by ``LkP``:

* R x R -> R;
* S(x) x R -> S(Tr(x, c4)): a table dim the result keeps (embedding's H);
* S(x) x R -> P(sum) when x splits the indexed dim V (Megatron's vocab-parallel embedding and
  cross-entropy target logit): each rank looks up the rows it holds and writes 0 for the others
  (the masked local lookup), and the team's sum gives every row's one holder's value;
* R x S(y) -> S(Tr(y, c5)): embedding's ids dims (the whole table serves any ids);
* S(x) x S(y) -> S(z) when both map to the same result index z (pick's batch dims: x's rows and
  the index's rows split alike);
* P(sum) x R -> P(sum): a lookup is linear in its table (it selects elements), a scatter in g;
* S(x) x S(y) -> P(sum) when x, y are the same split of a scatter's token dims (sequence- or
  data-parallel gradients): each rank scatters its tokens, the team's sum is the scatter.

An axis no rule resolves leaves the dist not ok, so that strategy does not exist.  A scatter
with both operands whole on mesh axes A also builds its result split along V on A with no
communication (``LocAt``, the *masked local scatter*: each rank writes the index values among
its rows; one node per target dist, like ``expand``'s ``Expand``).  Cost: a gather's is the
memory-bound ``cost-lookup`` (the indices, the rows read, the result written), not the table's
bytes; a scatter's ``Loc2`` the generic memory-bound law (g, indices, result) and its ``LocAt``
the same with the result block (``cost-scatter-rows``).  The masked local scatter reads its
targets, the candidate dists of the result that split V on A, from ``rowsto_A``
(``scatter-rows-target``, as ``expand``'s ``expto_A``).  Declarations and rules enter only
e-graphs of Fusions with lookups (``search.encode``), so every other e-graph is unchanged
(declarations: ``schema.tables``, ``when="lookups"``).
"""

from __future__ import annotations

from .cost_laws import PRICING, symbols
from .cost_profile import CostProfile
from .rule import Rule
from .schema import axis_sets, target_relation

S = "strategy"
IDS = "ids"

def facts(k: int, table: int, indices: int, out: int, codes: list[int], rows: tuple[int, ...] = ()) -> list[str]:
    """The facts of lookup op ``k`` (``codes``: its six transport codes, ``encode.code``;
    ``rows``: a scatter's scattered result dims, ``OpKind.scattered_dims``; empty for a gather)."""
    head = f"(lookup {k} {table} {indices} {out})"
    if not rows:
        return [head, f"(lkcodes {k} {' '.join(str(c) for c in codes)})", f"(lkgather {k})"]
    c0, c1, c2, c3, c4, c5 = codes
    return [head, f"(lkcodes {k} {c0} {c1} 0 0 {c4} {c5})", f"(lkcontract {k} {c2} {c3})"] + \
        [f"(scatdim {out} {d})" for d in rows]


def scatter_rows_rules(m: int, prof: CostProfile) -> list[Rule]:
    """The masked local scatter per nonempty set A of mesh axes (variant: the axes, ``0-1``), and
    its cost."""
    out: list[Rule] = []
    for axes in axis_sets(m):
        def dist(v: str, on_a: str) -> str:
            return "(D " + " ".join(on_a.format(i=i) if i in axes else f"{v}{i}" for i in range(m)) + ")"
        sa, sb, tr, dst = dist("a", "(Rep)"), dist("b", "(Rep)"), dist("p", "(Rep)"), dist("p", "(Bind y{i})")
        rows = " ".join(f"(= r{i} (rootof y{i})) (scatdim o r{i})" for i in axes)
        rel, rest = target_relation("rowsto", axes), " ".join(f"p{i}" for i in range(m) if i not in axes)
        names = ", ".join(str(a) for a in axes)
        variant = "-".join(str(a) for a in axes)
        out.append(Rule(
            "scatter-rows-target", f"a candidate dist of a scatter's result o splitting its scattered dim V on mesh "
            f"axes {{{names}}} is a target of the masked local scatter there, with its other placements ({rel}: "
            "scatter-rows starts from these few rows)", f"(cand o {dst}) {rows}", f"({rel} o {dst} {rest})",
            "analysis", variant=variant))
        out.append(Rule(
            "scatter-rows", f"g and the indices whole on mesh axes {{{names}}}: each device writes the index "
            "values among the rows of its block of a result split there along the scattered dim V (the masked "
            "local scatter): slice_y(scatter(g, i)) = scatter(g, i) keeping the rows of block y",
            f"({rel} o dst {rest}) (= od {tr}) (okD od) (= od (LkD da db k)) (lookup k a b o) (= da {sa}) "
            f"(= db {sb}) (= ta (real a da)) (= tb (real b db))",
            "(union (real o dst) (LocAt k ta tb dst))", S, variant=variant))
    out.append(Rule(
        "cost-scatter-rows", "cost(LocAt) = launch + (g + indices + local result bytes) / hbm: the masked scatter "
        "writes its block only",
        "(= z (LocAt k ta tb d)) (= z (real o d)) (= bo (lb o d)) (= ta (real a da)) (= ba (lb a da)) "
        "(= tb (real b db)) (= bb (lb b db))",
        f"(set (cost_LocAt k ta tb d) {PRICING['cost-scatter-rows'].render(prof, symbols('bo', ('ba', 'bb')))})",
        "cost"))
    return out


def rules(m: int, prof: CostProfile) -> list[Rule]:
    da = "(D " + " ".join(f"a{i}" for i in range(m)) + ")"
    db = "(D " + " ".join(f"b{i}" for i in range(m)) + ")"
    lkp = "(D " + " ".join(f"(LkP a{i} b{i} k)" for i in range(m)) + ")"
    codes = "(lkcodes k c0 c1 c2 c3 c4 c5)"
    q2 = "(= g (real o do)) (= bo (lb o do)) (= tb (real b db)) (= bb (lb b db))"
    return [
        Rule("lk-demand", "every pair of operand dists of a lookup is a candidate strategy",
             "(lookup k a b o) (= ta (real a da)) (= tb (real b db))", "(LkD da db k)", S),
        Rule("lkd", "LkD(D(a...), D(b...), k) = D(LkP(a_i, b_i, k)...)", f"(= z (LkD {da} {db} k))",
             f"(union z {lkp})", IDS),
        Rule("lk-local", "a lookup on local shards computes o at the per-axis strategy's dist",
             "(lookup k a b o) (= ta (real a da)) (= tb (real b db)) (= od (LkD da db k)) (okD od)",
             "(union (real o od) (Loc2 k ta tb))", S),
        Rule("lkp-rr", "R x R -> R", "(= z (LkP (Rep) (Rep) k))", "(union z (Rep))", IDS),
        Rule("lkp-table", "S(x) x R -> S(Tr(x, c4))  (c4 maps the table dims a shard may keep while the indices "
             "are whole: embedding's H; else unresolved)",
             f"(= z (LkP (Bind x) (Rep) k)) {codes} (= q (TrP (Bind x) c4))", "(union z q)", IDS),
        Rule("lkp-table-want", "S(x) x R needs TrP(S(x), c4)", f"(= z (LkP (Bind x) (Rep) k)) {codes}",
             "(trpw (Bind x) c4)", IDS),
        Rule("lkp-vocab-demand", "S(x) x R: transport x to the indexed space", f"(= z (LkP (Bind x) (Rep) k)) {codes}",
             "(Tr x c2)", IDS),
        Rule("lkp-vocab", "S(x) x R -> P(sum) when x splits the indexed dim V: the masked local lookup (0 for the "
             "rows another rank holds) summed over the team is the lookup",
             f"(= z (LkP (Bind x) (Rep) k)) {codes} (= y (Tr x c2)) (= e (ext y))", '(union z (Part "sum"))', IDS),
        Rule("lkp-indices", "R x S(y) -> S(Tr(y, c5))  (c5 maps embedding's ids dims: the whole table serves any "
             "ids; pick's index needs x's rows: unresolved)",
             f"(= z (LkP (Rep) (Bind y) k)) {codes} (= q (TrP (Bind y) c5))", "(union z q)", IDS),
        Rule("lkp-indices-want", "R x S(y) needs TrP(S(y), c5)", f"(= z (LkP (Rep) (Bind y) k)) {codes}",
             "(trpw (Bind y) c5)", IDS),
        Rule("lkp-batch-demand", "S x S: transport both sides to the result (lkss: the two transported indices)",
             f"(= z (LkP (Bind x) (Bind y) k)) {codes}", "(lkss z (Tr x c0) (Tr y c1))", IDS),
        Rule("lkp-batch", "S(x) x S(y) -> S(z) when both map to the same result index z (pick's batch dims)",
             "(lkss q z z) (= e (ext z))", "(union q (Bind z))", IDS),
        Rule("lkp-pr", "P(sum) x R -> P(sum) (a lookup is linear in its table, a scatter in g)",
             '(= z (LkP (Part "sum") (Rep) k))', '(union z (Part "sum"))', IDS),
        Rule("lkp-contract-demand", "S x S of a scatter: transport both sides to the contraction (token) space "
             "(lkcss: the two transported indices)",
             "(= z (LkP (Bind x) (Bind y) k)) (lkcontract k ca cb)", "(lkcss z (Tr x ca) (Tr y cb))", IDS),
        Rule("lkp-contract", "S(x) x S(y) -> P(sum) when x, y are the same split of the token dims a scatter sums "
             "over: each rank scatters its tokens, the team's sum is the scatter",
             "(lkcss q z z) (= e (ext z))", '(union q (Part "sum"))', IDS),
        Rule("cost-lookup", "cost(lookup) = launch + (indices + rows read + result bytes) / hbm (rows read = result "
             "bytes; not the table's bytes)",
             f"(= g (Loc2 k ta tb)) (lookup k a b o) (lkgather k) {q2}",
             f"(set (cost_Loc2 k ta tb) {PRICING['cost-lookup'].render(prof, symbols('bo', ('ba', 'bb')))})", "cost"),
    ] + scatter_rows_rules(m, prof)
