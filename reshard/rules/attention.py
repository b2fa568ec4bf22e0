"""Fused attention: its local strategies, its cost, and its decomposed form as an alternative.

Law (the rewrite, both ways): for every ``attention`` op (``reshard.ir.ops.attention``),

    attention(q, k, v, m) = softmax(q @ k^T * scale + m) @ v        (``decomposed_attention``)

and for every gradient read back out of an ``attention_grad`` op,

    reshape(slice(attention_grad(q, k, v, g, m), 0, i, i + 1)) = (dq, dk, dv)[i]
    (``decomposed_attention_grad``: the probabilities recomputed from q and k)

``passes.decompositions`` adds the right-hand sides to a Fusion, each declared equal to the
left-hand side (``alternative``: its nodes join the value's e-classes), so every class of an
attention result also holds the decomposed way, and shardings only it allows (q and k sharded
on the head dim D, the scores all-reduced before the softmax; a sharded key dim S) stay
reachable; extraction picks per class by cost.

Strategies (``attention-local``): the fused op runs on local shards at the result dist ``od``
from the operand dists its registry declaration enumerates (``OpKind.operand_strategies``, per
result placement per mesh axis, Replicate / Shard / Partial: batch / heads sharded alike, q's L
with k and v whole, v's Dv, v's ``Partial("sum")`` summands giving the result's (linear in v),
g's for the gradient; ``search.encode`` writes them), one rule per arity (``Loc2`` .. ``Loc5``).
The fused linear loss (``reshard.ir.ops.linear_loss``, the alternative ``passes.fused_loss``
adds) is an enumerated op of this family too: its strategies and cost are these rules'.

Cost (``cost-attention``): one step reading every operand and writing the result once, a
roofline ``launch * kernels + max(bytes / hbm, flops / peak)`` with the local step's flops on
the strategy's shards (``OpKind.local_work``: two matmuls forward, five backward for attention,
one kernel), plus the bytes its intermediates move through memory (``local_work``'s second
figure: 0 for attention's kernels; a linear loss's chunked logits, written and read again, by
several torch calls per chunk) over ``hbm``.
The decomposed attention pays each ``[*B, L, S]`` intermediate's write and read
(``cost-mem-*``, ``cost-matmul``), so the fused op wins wherever its strategies allow.

Declarations and rules enter only e-graphs of Fusions with enumerated ops (``search.encode``):
every other e-graph is unchanged (declarations: ``schema.tables``, ``when="attention"``).
"""

from __future__ import annotations

from .cost_laws import PRICING, symbols
from .cost_profile import CostProfile
from .rule import Rule
from .schema import ATTENTION_ARITIES as ARITIES

S = "strategy"
C = "cost"


def facts(k: int, out: int, operands: tuple[int, ...], strategies: list[tuple[str, list[str], int, int, int]],
          peak: int) -> list[str]:
    """The facts of fused op ``k`` (result ``out``): one ``attn<n>`` per local strategy (the
    result's dist term, the operands' dist terms, the local step's flops, extra bytes and
    kernels), and its peak rate (MFLOP/s)."""
    n = len(operands)
    ids = " ".join(str(a) for a in operands)
    return [f"(attn{n} {k} {out} {ids} {od} {' '.join(ds)} {fl} {pb} {kn})" for od, ds, fl, pb, kn in strategies] + \
        [f"(set (atpeak {k}) {peak})"]


def rules(prof: CostProfile) -> list[Rule]:
    """The strategy and cost rules, per arity (module docstring)."""
    out: list[Rule] = []
    for n in ARITIES:
        a = " ".join(f"a{i}" for i in range(n))
        d = " ".join(f"d{i}" for i in range(n))
        t = " ".join(f"t{i}" for i in range(n))
        reals = " ".join(f"(= t{i} (real a{i} d{i}))" for i in range(n))
        fact = f"(attn{n} k o {a} od {d} fl pb kn)"
        node = f"(Loc{n} k {t})"
        sizes = " ".join(f"(= b{i} (lb a{i} d{i}))" for i in range(n))
        local = symbols("bo", tuple(f"b{i}" for i in range(n)), fl="fl", pb="pb", kn="kn", atpeak="pk")
        out += [
            Rule("attention-local", "the fused op k on local shards of its operands at the dists of a declared "
                 "strategy computes its result at od", f"{fact} {reals}", f"(union (real o od) {node})", S,
                 variant=str(n)),
            Rule("cost-attention", "cost(fused op) = launch * kernels + max(operand and result bytes / hbm, "
                 "local flops / peak) + extra bytes / hbm: one step, its intermediates' round trips (none for "
                 "attention's kernels) on top",
                 f"(= g {node}) {fact} (= g (real o od)) {reals} {sizes} (= bo (lb o od)) (= pk (atpeak k))",
                 f"(set (cost_Loc{n} k {t}) {PRICING['cost-attention'].render(prof, local)})", C, variant=str(n)),
        ]
    return out
