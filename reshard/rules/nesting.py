"""Nested candidates: a dim split along several mesh axes, offered where a value reaches it.

A dist that splits one dim along two mesh axes (DTensor's ``[S(j), S(j)]``: axis b takes the
outer blocks ``Outer(y, n_b)``, axis a > b splits each block again, ``Outer(Inner(y, n_b), n_a)``)
is a sharding of the value: each device still holds one contiguous block of dim j, a product of
per-dim index sets.  Such dists are not enumerated for every value (``encode.candidates``
lists unnested ones only): joined by collectives to every other dist of every value on a 2-D
mesh they were a quarter of a training step's e-graph.  They are needed where a flattened dim
carries two axes (GPT-2's ``Conv1D`` flattens ``[b, s, h]`` to ``[b*s, h]``, so sequence
parallelism under data parallelism reduce-scatters ``[S(0), P] -> [S(0), S(0)]``).

``nest-candidate`` adds them on demand: for a value *realized* at d with axis b bound to the
block split ``Outer(y, n_b)`` of an index y of one dim j, axis a > b holding no index of dim j
(Replicate, Partial, or a split of another dim: ``placements``' ``pdim``), nor any third axis,
and dim j *nestable*, ``d[a := S(j) nested]`` is a candidate; ``resharding`` then reaches it in
one step on axis a (local slice from R, reduce-scatter from P, all-to-all from S(k)).  On two
axes these are the nested simple shardings one step from a realized dist (the only ones a
resharding path could enter) of the dims where a nested split is asked for: a dim a fixed
sharding splits along several axes (an input's, an output's, a redistribute's: facts of
``encode``), and a dim an op reads as a merge of two indices (``nestable-reshape``: a reshape
splitting a flattened dim, where the nested dist is the simple one of the result: ``[S(0),
S(0)]`` of ``[b*s, h]`` is ``[S(0), S(1)]`` of ``[b, s, h]``); ``nestable-back`` carries the mark
back from a result to the operand dims an op maps onto it whole (elementwise ops, broadcasts,
permutes, the rows of a matmul).  Elsewhere no plan measured used one (the suite's programs,
the tiny Llama, Qwen2 and GPT-2 training steps on 2 x 2), and enumerated for every value they
were a quarter of the tiny Llama's 2 x 2 training e-graph (634k e-nodes with them, 464k
without; 482k with these rules).  The axis order (b before a, the outer split on the lower axis)
is ``TensorSharding.from_placements``' (the other order is a strided shard no candidate names).
Bounded: a candidate nests a dim along two axes only (no third axis may read that dim; deeper
nests come from fixed shardings), so a realized dist begets at most one per pair of axes.
"""

from __future__ import annotations

from .rule import Rule

X = "reshard"


def rules(m: int) -> list[Rule]:
    """``nestable-*``, and ``nest-candidate`` per pair of mesh axes b < a (variant ``b-a``); none on
    one axis."""
    if m < 2:
        return []
    out = [
        Rule("nestable-reshape", "dim j of u is nestable when an op reads it as a merge of two indices of "
             "extents > 1 (a reshape splitting a flattened dim): Tr(Root(u, j), c) = Merge(x, y)",
             "(= z (Tr (Root u j e) c)) (= z (Merge x y)) (= ex (ext x)) (= ey (ext y)) (> ex 1) (> ey 1)",
             "(nestable u j)", "analysis"),
        Rule("nestable-back", "dim j of u is nestable when an op maps it whole onto a nestable dim j2 of its "
             "result o (Tr(Root(u, j), c) = Root(o, j2): an elementwise op, a broadcast, a permute, a matmul's rows)",
             "(nestable o j2) (= z (Root o j2 e2)) (= z (Tr (Root u j e) c))",
             "(nestable u j)", "analysis"),
    ]
    for b in range(m):
        for a in range(b + 1, m):
            def dist(at_a: str, at_b: str) -> str:
                return "(D " + " ".join(at_a if i == a else at_b if i == b else f"p{i}" for i in range(m)) + ")"
            others = " ".join(f"(= q{c} (pdim p{c})) (!= q{c} j)" for c in range(m) if c not in (a, b))
            out.append(Rule(
                "nest-candidate", f"a value realized with axis {b} bound to Outer(y, n{b}) (y of one dim j) and axis "
                f"{a} holding no index of dim j may split each of axis {b}'s blocks along axis {a}: "
                f"d[{a} := Outer(Inner(y, n{b}), n{a})] is a sharding of v (every device holds one block of j), "
                f"a candidate when n{a} | e(y) / n{b}",
                f"(= t (real v {dist('pa', '(Bind (Outer y nb))')})) (= j (rootof y)) (nestable v j) (= e (ext y)) "
                f"(= qa (pdim pa)) (!= qa j) (= n (axsize {a})) (> n 1) (= 0 (% (/ e nb) n)) {others}",
                f"(cand v {dist('(Bind (Outer (Inner y nb) n))', '(Bind (Outer y nb))')})", X, variant=f"{b}-{a}"))
    return out
