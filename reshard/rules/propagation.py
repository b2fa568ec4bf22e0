"""Sharding propagation: per-op strategies, all added as alternatives.

Facts name each Fusion op (``unop``, ``binop``, ``mm``, ``redist``); these rules then give
an op's result a distribution for every realized distribution of its operands that the op
can run on locally.  Nothing is chosen here: extraction chooses.

* unary-like ops (elementwise, cast, reshape, permute, slice, pad, reduce, set): result
  dist = operand dist transported through the op's index map, when every bound ID maps
  (a sliced/padded dim cannot stay sharded; a reduced one becomes Partial).
* binary ops: both operands transport to the same dist.
* matmul, per mesh axis (``MMP``): S(batch/m) x R -> S; R x S(n/batch) -> S; S(batch) x
  S(batch) -> S; S(k) x S(k) -> Partial(sum); P x R and R x P -> Partial(sum); R x R -> R.
  The axis strategies are resolved for each pair of placements the operands are realized with
  on that axis (``rpl``), and a pair of operand dists is tried only when every axis's resolves
  (``mmok``): most pairs have an axis with none (tiny Llama, 2 x 2: 18.8k pairs tried, 1.7k
  ran), and each was an ``MMD`` and a ``D`` of unresolved placements left in the e-graph.
  ``MMP`` and ``MMD`` are functions computed where a demand asks for them (``mmpw``, ``mmdw``),
  as ``placements``' transports are, not terms unioned with their values (the tiny 2 x 2 Llama:
  1,828 -> 1,628 union iterations, the same plans, the time within the noise: egglog's time
  follows the rows matched and written, design.md).  A placement class holds one normal form, and each value is built by
  constructors from the key's parts, so two keys that become one have equal values.
* redistribute: the result has the requested dist, which is the operand's value; it is also
  an identity unary op (every operand dist, as a free view), so the communication it asks
  for commutes through the ops after it and lands where it moves the fewest bytes.
"""

from __future__ import annotations

from .rule import Rule

S = "strategy"


def rules(m: int) -> list[Rule]:
    da = "(D " + " ".join(f"a{i}" for i in range(m)) + ")"
    db = "(D " + " ".join(f"b{i}" for i in range(m)) + ")"
    mmq = "(D " + " ".join(f"q{i}" for i in range(m)) + ")"
    return [
        Rule("unop-demand", "a unary op's result may take the transported dist of any operand dist",
             "(unop k u o c) (= t (real u d))", "(trdw d c)", S),
        Rule("unop-local", "op k on local shards of u at dist d computes o at dist TrD(d, c)",
             "(unop k u o c) (= t (real u d)) (= od (TrD d c)) (okD od)", "(union (real o od) (Loc k t))", S),
        Rule("binop-demand-a", "a binary op's lhs dists are transported", "(binop k a b o ca cb) (= ta (real a da))",
             "(trdw da ca)", S),
        Rule("binop-demand-b", "a binary op's rhs dists are transported", "(binop k a b o ca cb) (= tb (real b db))",
             "(trdw db cb)", S),
        Rule("binop-lhs", "binlhs(k, od, ta): op k's lhs, realized at da (term ta), transports to the valid od",
             "(binop k a b o ca cb) (= ta (real a da)) (= od (TrD da ca)) (okD od)", "(binlhs k od ta)", "analysis"),
        Rule("binop-local", "op k on local shards of a, b whose dists transport to the same od computes o at od "
             "(binlhs: the lhs's; one lookup per rhs dist, not a join of both operands' dists)",
             "(binop k a b o ca cb) (= tb (real b db)) (= od (TrD db cb)) (binlhs k od ta)",
             "(union (real o od) (Loc2 k ta tb))", S),
        Rule("realized-placement", "rpl(v, i, p): v is realized at some dist with p on axis i",
             f"(= t (real v {da}))", " ".join(f"(rpl v {i} a{i})" for i in range(m)), "analysis"),
        Rule("mm-axis-demand", "every pair of operand placements on one mesh axis is a candidate axis strategy",
             "(mm k a b o) (rpl a i pa) (rpl b i pb)", "(mmpw pa pb k)", S),
        Rule("mm-axis-ok", "mmok(pa, pb, k): the axis strategy MMP(pa, pb, k) resolves to a placement",
             "(= z (MMP pa pb k)) (okP z)", "(mmok pa pb k)", "analysis"),
        Rule("mm-demand", "every pair of operand dists of a matmul whose axis strategies all resolve (mmok) is a "
             "candidate strategy (any other pair's MMD has an unresolved placement: no okD, no mm-local)",
             f"(mm k a b o) (= ta (real a {da})) (= tb (real b {db})) "
             + " ".join(f"(mmok a{i} b{i} k)" for i in range(m)), f"(mmdw {da} {db} k)", S),
        Rule("mmd", "MMD(D(a...), D(b...), k) = D(MMP(a_i, b_i, k)...)",
             f"(mmdw {da} {db} k) " + " ".join(f"(= q{i} (MMP a{i} b{i} k))" for i in range(m)),
             f"(set (MMD {da} {db} k) {mmq})", "ids"),
        Rule("mm-local", "a matmul on local shards computes o at the per-axis strategy's dist",
             "(mm k a b o) (= ta (real a da)) (= tb (real b db)) (= od (MMD da db k)) (okD od)",
             "(union (real o od) (Loc2 k ta tb))", S),
        Rule("mmp-rr", "R x R -> R", "(mmpw (Rep) (Rep) k)", "(set (MMP (Rep) (Rep) k) (Rep))", "ids"),
        Rule("mmp-sr", "S(x) x R -> S(Tr(x, cam))  (cam maps lhs m, and batch when rhs has none; else unresolved)",
             "(mmpw (Bind x) (Rep) k) (mmcodes k ca cb cka ckb cam cbn)",
             "(set (MMP (Bind x) (Rep) k) (Bind (Tr x cam)))", "ids"),
        Rule("mmp-rs", "R x S(y) -> S(Tr(y, cbn))  (cbn maps rhs n only: batch needs both sides; else unresolved)",
             "(mmpw (Rep) (Bind y) k) (mmcodes k ca cb cka ckb cam cbn)",
             "(set (MMP (Rep) (Bind y) k) (Bind (Tr y cbn)))", "ids"),
        Rule("mmp-ss-demand", "S x S: transport both sides to the result and to the contraction (mmss: the four "
             "transported indices, which the two rules below compare)",
             "(mmpw (Bind x) (Bind y) k) (mmcodes k ca cb cka ckb cam cbn)",
             "(mmss (Bind x) (Bind y) k (Tr x ca) (Tr y cb) (Tr x cka) (Tr y ckb))", "ids"),
        Rule("mmp-batch", "S(x) x S(y) -> S(z) when both map to the same result index z (batch)",
             "(mmss pa pb k z z xk yk) (= e (ext z))", "(set (MMP pa pb k) (Bind z))", "ids"),
        Rule("mmp-contract", "S(x) x S(y) -> Partial(sum) when x, y are the same split of the contraction",
             "(mmss pa pb k xr yr z z) (= e (ext z))", '(set (MMP pa pb k) (Part "sum"))', "ids"),
        Rule("mmp-pr", "P(sum) x R -> P(sum) (matmul is linear in a)", '(mmpw (Part "sum") (Rep) k)',
             '(set (MMP (Part "sum") (Rep) k) (Part "sum"))', "ids"),
        Rule("mmp-rp", "R x P(sum) -> P(sum) (matmul is linear in b)", '(mmpw (Rep) (Part "sum") k)',
             '(set (MMP (Rep) (Part "sum") k) (Part "sum"))', "ids"),
        Rule("redistribute", "redistribute(u, d) is u's value at dist d (du, do: d over u's, o's roots)",
             "(redist k u o du do) (= t (real u du))", "(union (real o do) (Loc k t))", S),
    ]
