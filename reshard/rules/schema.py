"""The egglog sorts, tables and rulesets of reshard's e-graph.

Layer 1, IterDomains (sort ``ID``): ``Root(space, dim, extent)`` (space: the tensor
id, or a matmul's contraction space), ``Outer(x, parts)``,
``Inner(x, parts)``, ``Merge(x, y)`` (see ``reshard.ir.ids`` for their values),
``Tr(x, code)``: x carried through an op's operand->result index map ``code`` (defined by
facts on roots), and ``Red``: an index reduced away.

Placements (sort ``P``): ``Rep``, ``Part(op)``, ``Bind(ID)``; ``TrP``/``MMP`` are pending
transports that rules resolve.  Distributions (sort ``Dist``): ``D(p_0, ..., p_{m-1})``, one
placement per mesh axis.

Layer 2, tensor terms (sort ``T``): an e-class is one Fusion value with one Dist, holding
every implementation found: ``InAt`` (fed input), ``Loc``/``Loc2`` (the Fusion op run on
local tensors), ``Expand`` (a broadcast run on local tensors into a result sharded on
expanded dims, ``expand``), ``LocAt`` (a scatter run on local tensors into the rows of its
result block, ``lookup``), ``MMT`` (a matmul reading an operand through a transposed view, ``alias``),
and the resharding steps on one mesh axis: the collectives ``AllGather``, ``AllReduce``,
``ReduceScatter``, ``AllToAll`` and the local ``LocalSlice`` (R -> S) and ``MakePartial``
(R or S -> P, ``resharding``); and the cross-mesh
transfers ``SendRecv``, ``Bcast``, ``Scatter`` (op k's value moved to another mesh of the
same shape; facts ``xfer``/``xsrc``/``xdev``, see ``crossmesh``).  ``real(value, dist)``
names the class; the extractor never picks a ``real`` node.  ``Seam(key)`` marks a value fed
from an earlier saturation segment (``search.segments``): the class is that segment's class ``key``.
"""

from __future__ import annotations

import itertools

T_CONSTRUCTORS: dict[str, tuple[str, ...]] = {
    "InAt": ("String", "Dist"),
    "Loc": ("i64", "T"),
    "Loc2": ("i64", "T", "T"),
    # matmul op k reading operand(s) through a transposed view (``alias``): side 1 lhs, 2 rhs, 3 both
    "MMT": ("i64", "T", "T", "i64"),
    "AllGather": ("T", "i64"),
    "LocalSlice": ("T", "i64", "P"),
    "AllReduce": ("T", "i64"),
    "ReduceScatter": ("T", "i64", "P"),
    "AllToAll": ("T", "i64", "P"),
    "MakePartial": ("T", "i64", "P"),
    # cross-mesh transfers of Fusion op k (``reshard.rules.crossmesh``)
    "SendRecv": ("i64", "T"),
    "Bcast": ("i64", "T", "i64"),
    "Scatter": ("i64", "T", "i64", "Dist"),
    # broadcast op k run on local tensor t, building its block of the result at dist Dist
    # (sharded on expanded dims, ``reshard.rules.expand``)
    "Expand": ("i64", "T", "Dist"),
    # scatter op k run on local tensors ta, tb, writing the rows of its result block at Dist
    # (a masked local scatter, ``reshard.rules.lookup``)
    "LocAt": ("i64", "T", "T", "Dist"),
    # a fused op k of three, four or five operands (attention, ``reshard.rules.attention``)
    "Loc3": ("i64", "T", "T", "T"),
    "Loc4": ("i64", "T", "T", "T", "T"),
    "Loc5": ("i64", "T", "T", "T", "T", "T"),
}
RULESETS = ("ids", "analysis", "strategy", "reshard", "remat", "alias", "cost")
#: constructors that run Fusion op ``args[0]`` on local tensors
OP_CTORS = ("Loc", "Loc2", "MMT", "Expand", "LocAt", "Loc3", "Loc4", "Loc5")
#: the resharding constructors that move no data between devices, as plans name them
LOCAL_RESHARDS = {"LocalSlice": "local slice", "MakePartial": "local partial"}
#: constructors and tables declared only for Fusions with cross-mesh transfers (one-mesh
#: e-graphs stay exactly as they were)
TRANSFER_CONSTRUCTORS = ("SendRecv", "Bcast", "Scatter")
#: declared only for Fusions with expanded dims (``rules.expand``)
EXPAND_CONSTRUCTORS = ("Expand",)
EXPAND_TABLES = """
(relation expdim (i64 i64))
"""


def axis_sets(m: int) -> list[tuple[int, ...]]:
    """The nonempty sets of mesh axes of an ``m``-axis mesh, smallest first."""
    return [axes for n in range(1, m + 1) for axes in itertools.combinations(range(m), n)]


def target_relation(prefix: str, axes: tuple[int, ...]) -> str:
    """The relation of the candidate dists that split a value's dims on the mesh ``axes``
    (``expand``'s ``expto``, ``lookup``'s ``rowsto``): (value, dist, the dist's other placements)."""
    return f"{prefix}_{'_'.join(str(a) for a in axes)}"


def target_relations(prefix: str, m: int) -> str:
    """Declarations of ``target_relation(prefix, A)`` for every set A of ``m`` mesh axes."""
    return "".join(f"(relation {target_relation(prefix, axes)} (i64 Dist{' P' * (m - len(axes))}))\n"
                   for axes in axis_sets(m))


#: the arities of the ops whose strategies are enumerated (attention: q, k, v [, mask];
#: attention_grad: q, k, v, g [, mask]; the fused linear loss: h, w [, m [, g]]) and their
#: constructors (``Loc2`` is every binary op's, declared always), declared only for Fusions with
#: them (``rules.attention``): per arity n the strategy facts ``attn<n>`` (op, result, operands,
#: result dist, operand dists, the local step's flops, extra bytes and kernels)
ATTENTION_ARITIES = (2, 3, 4, 5)
ATTENTION_CONSTRUCTORS = tuple(f"Loc{n}" for n in ATTENTION_ARITIES if n > 2)
ATTENTION_TABLES = "".join(
    f"(relation attn{n} (i64 i64 {' '.join(['i64'] * n)} Dist {' '.join(['Dist'] * n)} i64 i64 i64))\n"
    for n in ATTENTION_ARITIES) + "(function atpeak (i64) i64 :no-merge)\n"
#: declared only for Fusions with lookup ops (``rules.lookup``)
LOOKUP_CONSTRUCTORS = ("LocAt",)
LOOKUP_TABLES = """
(constructor LkP (P P i64) P)
(constructor LkD (Dist Dist i64) Dist)
(relation lookup (i64 i64 i64 i64))
(relation lkcodes (i64 i64 i64 i64 i64 i64 i64))
(relation lkgather (i64))
(relation lkcontract (i64 i64 i64))
(relation lkss (P ID ID))
(relation lkcss (P ID ID))
(relation scatdim (i64 i64))
"""
#: declared only for training Fusions (``rules.remat``): twin pairs, the ops whose
#: operand class is kept for the backward pass (``keep``), and the bytes per rank it holds
REMAT_TABLES = """
(relation twin (i64 i64 i64))
(relation keep (i64))
(function kept (i64 T) i64 :merge (min old new))
"""
#: tables keyed by T classes (their argument sorts) whose outputs are plain values: merged
#: snapshots (``search.segments``) find their classes like a constructor's
T_KEYED = {"kept": ("i64", "T")}
TRANSFER_TABLES = """
(relation xfer (i64 i64 i64 i64))
(relation xsrc (i64 i64))
(function xdev (i64) i64 :no-merge)
(relation nopart (P))
"""


def schema(mesh_ndim: int, transfers: bool = False, lookups: bool = False, expands: bool = False,
           remat: bool = False, attention: bool = False) -> str:
    """egglog declarations for a mesh of ``mesh_ndim`` axes (``transfers``: with the
    cross-mesh transfer constructors and facts; ``lookups``: with the lookup strategies'
    constructors and facts, ``rules.lookup``; ``expands``: with the local expansion's
    constructor and facts, ``rules.expand``; ``remat``: with the recompute family's facts
    and the kept bytes, ``rules.remat``; ``attention``: with the fused ops' constructors and
    facts, ``rules.attention``)."""
    ps = " ".join(["P"] * mesh_ndim)
    ctors = {n: a for n, a in T_CONSTRUCTORS.items()
             if (transfers or n not in TRANSFER_CONSTRUCTORS) and (expands or n not in EXPAND_CONSTRUCTORS)
             and (lookups or n not in LOOKUP_CONSTRUCTORS) and (attention or n not in ATTENTION_CONSTRUCTORS)}
    t_ctors = " ".join(f"({name} {' '.join(args)})" for name, args in ctors.items())
    costs = "\n".join(f"(function cost_{name} ({' '.join(args)}) i64 :merge (min old new))"
                      for name, args in ctors.items() if name != "InAt")
    return f"""
{''.join(f'(ruleset {r})' for r in RULESETS)}
(datatype ID (Root i64 i64 i64) (Outer ID i64) (Inner ID i64) (Merge ID ID) (Tr ID i64) (Red))
(function ext (ID) i64 :no-merge)
(relation red (ID))
(relation rect (ID))
(function rootof (ID) i64 :merge (min old new))
(datatype P (Rep) (Part String) (Bind ID) (TrP P i64) (MMP P P i64))
(datatype Dist (D {ps}) (TrD Dist i64) (MMD Dist Dist i64))
(function fac (P) i64 :no-merge)
(function pdim (P) i64 :merge (min old new))
(relation okP (P))
(relation okD (Dist))
(function shards (Dist) i64 :no-merge)
(datatype T {t_ctors})
(constructor real (i64 Dist) T)
(constructor Seam (i64) T)
(relation cand (i64 Dist))
(relation made (i64))
(relation parton (i64 i64 String))
(relation cdim (i64 i64 i64))
(relation cpl (i64 i64 P i64))
(relation nestable (i64 i64))
(relation keeps (i64 String))
(relation redop (i64 String))
(relation unop (i64 i64 i64 i64))
(relation binop (i64 i64 i64 i64 i64 i64))
(relation mm (i64 i64 i64 i64))
(relation mmcodes (i64 i64 i64 i64 i64 i64 i64))
(relation mmss (P ID ID ID ID))
(relation rpl (i64 i64 P))
(relation mmok (P P i64))
(relation redist (i64 i64 i64 Dist Dist))
(relation tview (i64))
(function axsize (i64) i64 :no-merge)
(function nbytes (i64) i64 :no-merge)
(function lb (i64 Dist) i64 :no-merge)
(function kf (P P) i64 :merge (max old new))
(relation mmaxis (P P))
(relation viewop (i64))
(relation memop (i64))
(function mmK (i64) i64 :no-merge)
(function mmitem (i64) i64 :no-merge)
(function mmpeak (i64) i64 :no-merge)
{TRANSFER_TABLES.lstrip() if transfers else ""}{LOOKUP_TABLES.lstrip() + target_relations("rowsto", mesh_ndim) if lookups else ""}\
{EXPAND_TABLES.lstrip() + target_relations("expto", mesh_ndim) if expands else ""}{REMAT_TABLES.lstrip() if remat else ""}\
{ATTENTION_TABLES if attention else ""}{costs}
"""
