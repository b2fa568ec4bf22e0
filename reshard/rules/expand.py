"""Local expansion: a broadcast's result sharded on an expanded dim, built by each device.

A broadcast (``reshard.ir.ops.views``) repeats its operand along the result dims that no
operand dim maps to (new dims, and dims expanded from extent 1): ``OpKind.expanded_dims``,
facts ``expdim(o, d)`` (result tensor o's dim d).  Every block of such a dim equals every
other, so for an operand replicated on mesh axis a and a split y of expanded dims of o,

    slice_y(broadcast(x)) = broadcast(x) to the local shape

(each device broadcasts the whole operand into its own block; no communication, and no
materialised global result to slice).  Per nonempty set A of mesh axes (variant: the axes,
``0-1``), the op run on the operand's local tensor t at dist d (Rep on every axis of A) gives
the result at the dist that is TrD(d, c) off A and Bind(y_a), y_a over expanded dims, on
each axis a of A:

    real(o, D(..q..)) = Expand(k, t, D(..q..))

The rule reads its targets from ``expto_A(o, D(..q..), q off A)``, the candidate dists of o that
split expanded dims on A (``expand-target``, an analysis): egglog joined the same query through the
dists of every value, which took a quarter of a dp x tp mesh's saturation.

``Expand`` is a distinct constructor (not ``Loc``, whose node ``Loc(k, t)`` already sits in
the class of TrD(d, c)): one implementation per target dist.  Its local step is the op's
``apply`` with the local shape (lowering gives every op node its dist's local shape), so the
broadcast writes only the block.  Cost (``cost-expand``): the memory-bound law of the local
block, launch + (operand + local result bytes) / hbm.  The declarations and rules enter only
e-graphs of Fusions with expanded dims (``search.encode``), so every other e-graph is unchanged.
"""

from __future__ import annotations

from .cost_laws import PRICING, symbols
from .cost_profile import CostProfile
from .rule import Rule
from .schema import axis_sets, target_relation

S = "strategy"
C = "cost"


def facts(out: int, dims: tuple[int, ...]) -> list[str]:
    """The facts naming result tensor ``out``'s expanded dims."""
    return [f"(expdim {out} {d})" for d in dims]


def rules(m: int, prof: CostProfile) -> list[Rule]:
    out: list[Rule] = []
    for axes in axis_sets(m):
        src = "(D " + " ".join("(Rep)" if i in axes else f"a{i}" for i in range(m)) + ")"
        tr = "(D " + " ".join("(Rep)" if i in axes else f"p{i}" for i in range(m)) + ")"
        dst = "(D " + " ".join(f"(Bind y{i})" if i in axes else f"p{i}" for i in range(m)) + ")"
        exp = " ".join(f"(= r{i} (rootof y{i})) (expdim o r{i})" for i in axes)
        rel, rest = target_relation("expto", axes), " ".join(f"p{i}" for i in range(m) if i not in axes)
        variant = "-".join(str(a) for a in axes)
        names = ", ".join(str(a) for a in axes)
        out.append(Rule(
            "expand-target", f"a candidate dist of o splitting expanded dims of o on mesh axes {{{names}}} is a "
            f"target of the local expansion there, with its other placements ({rel}: expand-local starts from "
            "these few rows; joined through the dists of every value, the same query took a quarter of a 2-D "
            "mesh's saturation)", f"(cand o {dst}) {exp}", f"({rel} o {dst} {rest})", "analysis", variant=variant))
        out.append(Rule(
            "expand-local", f"an operand replicated on mesh axes {{{names}}} broadcasts, on each device, into "
            "its block of a result split there along expanded dims: slice_y(broadcast(x)) = broadcast(x) to "
            "the local shape (every block of an expanded dim equals the operand)",
            f"({rel} o dst {rest}) (= od {tr}) (okD od) (= od (TrD src c)) (unop k u o c) (= src {src}) "
            "(= t (real u src))",
            "(union (real o dst) (Expand k t dst))", S, variant=variant))
    out.append(Rule(
        "cost-expand", "cost(Expand) = launch + (operand + local result bytes) / hbm: the broadcast of the "
        "local block, not of the global result",
        "(= g (Expand k t d)) (= g (real o d)) (= bo (lb o d)) (= t (real u di)) (= bi (lb u di))",
        f"(set (cost_Expand k t d) {PRICING['cost-expand'].render(prof, symbols('bo', ('bi',)))})",
        C))
    return out
