"""Alias: a matmul reads a transposed operand through a view instead of a permute copy.

A permute that swaps the last two dims (fact ``tview p``) computes, on every rank, the
local transpose of its operand's local tensor (its index map carries each placement along,
so local(permute(u)) = permute(local(u))).  A matmul can read that operand as a strided
view of u's buffer (cuBLAS takes transposed operands), so the permute's copy is not needed:

    matmul(a, permute_T(u)) = MMT(a, u, rhs)      matmul(permute_T(v), b) = MMT(v, b, lhs)

``MMT`` joins the matmul's class as one more implementation; its cost is the matmul's
(the same flops and bytes), and the permute's copy is paid only if some other consumer, or
the chosen plan, still uses the permuted value.  Extraction decides per consumer.

These rules only add e-nodes to existing classes and create no class, so they run once
after growth (``saturate.FINISH``): running them earlier would add the same nodes and
enable no other rule, so no order of rule application loses an alias.  Segmented
saturation keeps a view permute in its first consumer's segment (``segments.cut``), and
feeds later consumers' segments the transpose together with the permute node that made it.
"""

from __future__ import annotations

from ..ir.fusion import Op
from ..ir.ops import op_kind
from ..ir.ops.views import is_transpose_view
from .rule import Rule

__all__ = ["is_transpose_view", "is_view_transpose", "rules"]

A = "alias"
C = "cost"

#: (name, side, query over the matmul node ``(Loc2 k ta tb)``, the MMT node's children)
_VIEWS = (
    ("rhs", 2, "(= tb (Loc p tu)) (tview p)", "ta tu"),
    ("lhs", 1, "(= ta (Loc q tv)) (tview q)", "tv tb"),
    ("both", 3, "(= ta (Loc q tv)) (tview q) (= tb (Loc p tu)) (tview p)", "tv tu"),
)


def is_view_transpose(op: Op) -> bool:
    """Is Fusion op ``op`` a permute a matmul may read as a transposed view (fact ``tview``)?"""
    return op_kind(op.kind).transpose_view(op)


def rules() -> list[Rule]:
    out: list[Rule] = []
    for name, side, query, kids in _VIEWS:
        match = f"(= z (Loc2 k ta tb)) (mm k a b o) {query}"
        out += [
            Rule("mm-view", f"matmul with its {name} operand(s) permute_T(u) = MMT reading u's local "
                 "buffer transposed (a view: no permute copy)", match, f"(union z (MMT k {kids} {side}))", A, variant=name),
            Rule("cost-mm-view", "cost(MMT) = cost of the matmul it reads through (same flops and bytes)",
                 f"{match} (= c (cost_Loc2 k ta tb))", f"(set (cost_MMT k {kids} {side}) c)", C, variant=name),
        ]
    return out
