"""What the rule sweeps of ``tests/rules`` share (``test_resharding``, ``test_propagation``,
``test_placements``): deterministic hypothesis settings sized by ``$RESHARD_SWEEP_SCALE``, and the
attribution of a plan's nodes to the rule instances that created them (``Loc`` of a unary op ->
``unop-local`` plus one ``trp-*`` per mesh axis; a matmul ``Loc2`` -> ``mm-local`` plus one
``mmp-*`` per axis; an attention or lookup -> ``attention-local`` / ``lookup-local``, the
strategies of their own families, which these sweeps do not attribute further; a collective ->
its resharding rule)."""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, settings

import reshard as rs
from reshard import Partial, Replicate
from reshard.extract.plan_node import PlanNode, Tag
from reshard.ir.ops import op_kind


def sweep_settings(examples: int) -> settings:
    """Deterministic hypothesis settings for a sweep of ``examples`` random instances; with
    ``$RESHARD_SWEEP_SCALE`` = k > 1 (``scripts/deep_fuzz.sh``), k times as many, drawn at random."""
    scale = int(os.environ.get("RESHARD_SWEEP_SCALE", "1"))
    return settings(max_examples=examples * scale, deadline=None, derandomize=scale == 1, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


MMP_CASES = {("R", "R", "R"): "mmp-rr", ("S", "R", "S"): "mmp-sr", ("R", "S", "S"): "mmp-rs",
             ("S", "S", "S"): "mmp-batch", ("S", "S", "P"): "mmp-contract", ("P", "R", "P"): "mmp-pr",
             ("R", "P", "P"): "mmp-rp"}
TRP_CASES = {("R", "R"): "trp-rep", ("P", "P"): "trp-part", ("S", "S"): "trp-bind", ("S", "P"): "trp-reduce"}
COLLECTIVE_RULES = {"allgather": "allgather", "local slice": "local-slice", "allreduce": "allreduce",
                    "reduce_scatter": "reduce-scatter", "all_to_all": "all-to-all"}


def _letter(p: object) -> str:
    return "R" if isinstance(p, Replicate) else "P" if isinstance(p, Partial) else "S"


def rule_instances(f: rs.Fusion, roots: list[PlanNode]) -> Counter:
    """The rule instances a plan's nodes were created by (see the module docstring)."""
    out: Counter = Counter()
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n.uid in seen:
            continue
        seen.add(n.uid)
        stack.extend(n.args)
        h = n.head
        if h.tag in (Tag.COLLECTIVE, Tag.LOCAL) and h.form in COLLECTIVE_RULES:
            out[f"{COLLECTIVE_RULES[h.form]}-{h.axis}"] += 1
        elif h.tag is Tag.APPLY:
            op = f.ops[h.op]
            res = [_letter(p) for p in n.sharding.axes]
            if op.kind == "redistribute":
                out["redistribute"] += 1
            elif op.kind == "matmul":
                out["mm-local"] += 1
                if any(h.transposed):  # read through transposed views: placements are the operands'
                    out[{(True, False): "mm-view-lhs", (False, True): "mm-view-rhs",
                         (True, True): "mm-view-both"}[h.transposed]] += 1
                lhs, rhs = ([_letter(p) for p in arg.sharding.axes] for arg in n.args)
                for i in range(len(res)):
                    out[MMP_CASES[(lhs[i], rhs[i], res[i])]] += 1
            elif op_kind(op.kind).strategy in ("attention", "lookup"):  # (their own families' strategies)
                out[f"{op_kind(op.kind).strategy}-local"] += 1
            elif h.form == "expand":  # ``expand``: R on the axes where the result splits expanded dims
                (arg,) = n.args
                src = [_letter(p) for p in arg.sharding.axes]
                axes = [i for i in range(len(res)) if (src[i], res[i]) == ("R", "S")]
                out["expand-local-" + "-".join(str(i) for i in axes)] += 1
                for i in range(len(res)):
                    if i not in axes:
                        out[TRP_CASES[(src[i], res[i])]] += 1
            else:
                out["binop-local" if len(n.args) == 2 else "unop-local"] += 1
                for arg in n.args:
                    for p, r in zip(arg.sharding.axes, res):
                        out[TRP_CASES[(_letter(p), r)]] += 1
    return out


def plan_nodes(plan: rs.Plan) -> list[PlanNode]:
    """The nodes of ``plan``'s lowered DAG (the padded Fusion's, when uneven)."""
    return [n for n in plan.lowered.nodes]
