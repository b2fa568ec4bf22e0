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
and dim j *unmerged*, ``d[a := S(j) nested]`` is a candidate; ``resharding`` then reaches it in
one step on axis a (local slice from R, reduce-scatter from P, all-to-all from S(k)).  On two
axes these are the nested simple shardings one step from a realized dist (the only ones a
resharding path could enter) of the dims that are a flattening of several: ``unmerged-reshape``
marks a dim an op reads as a merge of two indices (a reshape splitting it: there the nested
dist is the simple one of the result, ``[S(0), S(0)]`` of ``[b*s, h]`` is ``[S(0), S(1)]`` of
``[b, s, h]``), ``unmerged-through`` carries the mark back through ops that map the dim whole
onto a marked one (elementwise ops, broadcasts, the rows of a matmul).  Elsewhere no plan
measured used one (the suite's programs, the tiny Llama, Qwen2 and GPT-2 training steps on 2 x
2), and enumerated for every value they were a quarter of the tiny Llama's 2 x 2 training e-graph (634k
e-nodes with it, 464k without; 482k with these rules).  The axis order (b before a, the outer
split on the lower axis) is ``TensorSharding.from_placements``' (the other order is a strided
shard no candidate names).  Bounded: a candidate nests a dim along two axes only (no third axis
may read that dim; deeper nests come from fixed shardings), so a realized dist begets at most
one per pair of axes.
"""

from __future__ import annotations

from .rule import Rule

X = "reshard"


def rules(m: int) -> list[Rule]:
    """``unmerged-*`` and ``nest-candidate`` per pair of mesh axes b < a (variant ``b-a``); none on
    one axis."""
    if m < 2:
        return []
    out = [
        Rule("unmerged-reshape", "dim j of u is unmerged when an op reads it as a merge of two indices of "
             "extents > 1 (a reshape splitting a flattened dim): Tr(Root(u, j), c) = Merge(x, y)",
             "(= z (Tr (Root u j e) c)) (= z (Merge x y)) (= ex (ext x)) (= ey (ext y)) (> ex 1) (> ey 1)",
             "(unmerged u j)", "analysis"),
        Rule("unmerged-through", "dim j of u is unmerged when an op maps it onto an unmerged dim j2 of its "
             "result o whole (Tr(Root(u, j), c) = Root(o, j2): an elementwise op, a broadcast, a permute)",
             "(unmerged o j2) (= z (Root o j2 e2)) (= z (Tr (Root u j e) c))",
             "(unmerged u j)", "analysis"),
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
                f"(= t (real v {dist('pa', '(Bind (Outer y nb))')})) (= j (rootof y)) (unmerged v j) (= e (ext y)) "
                f"(= qa (pdim pa)) (!= qa j) (= n (axsize {a})) (> n 1) (= 0 (% (/ e nb) n)) {others}",
                f"(cand v {dist('(Bind (Outer (Inner y nb) n))', '(Bind (Outer y nb))')})", X, variant=f"{b}-{a}"))
    return out
