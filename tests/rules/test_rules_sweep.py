"""Rule soundness sweep: every value-level rewrite rule, on random instantiations, checked by
the oracle (issue 8, item 2).  IterDomain laws are swept separately (test_rules_ids).

* **Resharding rules** (one collective per changed mesh axis): a random value shape, mesh,
  source distribution (DTensor placements, Partial, or loop-domain IDs) and a target that
  differs on exactly one axis.  The program ``input at src -> output at dst`` must plan to
  exactly the collective the rule's law names (or no communication for a local slice or a
  local Partial), on
  that axis, and simulate to the reference.  So each rule is shown to fire on the instance
  and its two sides to agree on random data.
* **Strategy, matmul-strategy and transport rules**: random small programs (the fuzz
  generator) extract random plans (perturbed costs), every plan is simulated against the
  reference, and each plan node is attributed to the rule instance that created it
  (``Loc`` of a unary op -> ``unop-local`` plus one ``trp-*`` per mesh axis; a matmul
  ``Loc2`` -> ``mm-local`` plus one ``mmp-*`` per axis; a collective -> its resharding
  rule).  Every rule must be verified on several random instances.
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard import Partial, Replicate, TensorSharding
from reshard.extract.plan_node import PlanNode, Tag
from reshard.ir import Inner, Outer, Root
from reshard.ir.ids import evaluate
from reshard.ir.fusion import Tensor
from reshard.plan import Saturated
from reshard.testing import fuzz_programs as FP
from tests.fuzz.test_fuzz import check_plan

def _sweep(examples: int) -> settings:
    """Deterministic hypothesis settings for a sweep of ``examples`` random instances; with
    ``$RESHARD_SWEEP_SCALE`` = k > 1 (``scripts/deep_fuzz.sh``), k times as many, drawn at random."""
    scale = int(os.environ.get("RESHARD_SWEEP_SCALE", "1"))
    return settings(max_examples=examples * scale, deadline=None, derandomize=scale == 1, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


_SETTINGS = _sweep(300)

SWEEP: Counter = Counter()


def same_elements(a: TensorSharding, b: TensorSharding) -> bool:
    """Two distributions that give every device the same elements in the same order (e.g.
    ``outer(merge(i0[2], i1[2]), 2)`` and ``outer(i0[2], 2)``): the same value, no step."""
    import itertools
    if [p for p in a.axes if isinstance(p, Partial)] != [p for p in b.axes if isinstance(p, Partial)]:
        return False
    coords = itertools.product(*(range(n) for n in a.mesh.shape))
    return all(torch.equal(a.local_indices(c), b.local_indices(c)) for c in coords)


def _is_block(p: object) -> bool:
    return isinstance(p, Outer) and isinstance(p.x, Root)


def read_dim(ts: TensorSharding, a: int) -> int | None:
    """The one dim whose index alone decides axis ``a``'s coordinate (a block or cyclic
    split of a dim, an inner factor, up to IterDomain equivalence), else None."""
    p = ts.axes[a]
    if isinstance(p, (Replicate, Partial)):
        return None
    k = len(ts.shape)
    index = [torch.arange(e).view([e if i == d else 1 for i in range(k)]) for d, e in enumerate(ts.shape)]
    vals = evaluate(p, index).expand(ts.shape)
    dims = [d for d in range(k) if not torch.equal(vals, vals.narrow(d, 0, 1).expand(ts.shape))]
    return dims[0] if len(dims) == 1 else None


def expected_steps(src: TensorSharding, dst: TensorSharding, a: int) -> tuple[tuple[str, ...], ...]:
    """The collective sequences on axis ``a`` that the resharding rules' laws give for
    ``src -> dst``, any of which cost may choose (``()``: a local slice or a local Partial,
    no communication)."""
    s, d = src.axes[a], dst.axes[a]
    if same_elements(src, dst) or isinstance(s, Replicate) or not isinstance(s, Partial) and isinstance(d, Partial):
        return ((),)
    if isinstance(s, Partial):
        if isinstance(d, Partial):  # P(o) -> P(o'): through R, or through S (then a local Partial)
            return ("allreduce",), ("reduce_scatter",)
        return (("allreduce",),) if isinstance(d, Replicate) else (("reduce_scatter",),)
    if isinstance(d, Replicate):
        return (("allgather",),)
    i, j = read_dim(src, a), read_dim(dst, a)
    if i is not None and j is not None and i != j:
        return (("all_to_all",),)
    # through R, or (both reading one dim) two all-to-alls through another dim
    return ("allgather",), ("all_to_all", "all_to_all")


#: at the sweep's tiny sizes latencies decide: with the default figures an all-gather then a
#: free outermost-dim slice beats an all-to-all (8 us vs 10 us), and a free slice then an
#: all-to-all can beat a 2 us slice kernel.  With a cheap all-to-all and free kernel launches
#: every transition's own step is its single cheapest implementation.
SWEEP_PROFILE = {"alpha_us": {"all_to_all": 1.0}, "launch_us": 0.0}


@st.composite
def one_axis_changes(draw):
    mesh = draw(st.sampled_from([FP.M2, FP.M3, FP.M4, FP.M2x2, FP.M2x3]))
    shape = tuple(draw(st.sampled_from((2, 3, 4, 6, 8, 12))) for _ in range(draw(st.integers(1, 3))))
    spec = draw(FP.shardings(shape, mesh, allow_partial=True, partial_weight=2))
    src = spec if isinstance(spec, TensorSharding) else TensorSharding.of(spec, shape, mesh, "sweep")
    a = draw(st.integers(0, mesh.ndim - 1))
    n = mesh.shape[a]
    options: list[object] = [Replicate(), Partial(draw(st.sampled_from(("sum", "max"))))] + FP.id_candidates(shape, n)
    blocks = [Outer(Root(d, e), n) for d, e in enumerate(shape) if e % n == 0]
    if len(blocks) >= 2 and draw(st.integers(0, 3)) == 0:  # all-to-all instances: S(i) -> S(j)
        axes = list(src.axes)
        axes[a] = draw(st.sampled_from(blocks))
        try:
            src = TensorSharding(mesh, shape, tuple(axes))
        except rs.ReshardError:
            pass
    if isinstance(src.axes[a], Partial) or _is_block(src.axes[a]):
        options += blocks * 4  # reduce-scatter and all-to-all targets
    options = [p for p in options if p != src.axes[a]] or [Replicate()]
    new = draw(st.sampled_from(options))
    axes = list(src.axes)
    axes[a] = new
    try:
        dst = TensorSharding(mesh, shape, tuple(axes))
    except rs.ReshardError:
        dst = None
    return shape, mesh, src, dst, a


@pytest.mark.slow
@_SETTINGS
@given(case=one_axis_changes(), seed=st.integers(0, 2**16))
def test_resharding_rules_on_random_instances(case, seed):
    shape, mesh, src, dst, a = case
    if dst is None or dst == src:
        return
    if src.true_shape is not None or dst.true_shape is not None:
        return  # uneven: its padded plan is the padding pass's (tests/ir/test_uneven.py, the fuzzers)
    if any(len({p.op for p in ts.axes if isinstance(p, Partial)}) > 1 for ts in (src, dst)):
        return  # Partial ops mixed across axes: no defined value
    f = rs.Fusion()
    x = f.input("x", shape, "float64", mesh, src)
    f.output(f.set(x), dst)  # a copy: the output value is a separate tensor whose dists are open
    plan = rs.optimize(f, cost_profile=SWEEP_PROFILE)
    check_plan(plan, f, seed, "resharding sweep")
    got = tuple(c.kind for c in plan.communications)
    assert got in expected_steps(src, dst, a), (src, dst, got)
    assert all(c.axis == mesh.axis_names[a] for c in plan.communications), (src, dst, plan.communications)
    if got:
        SWEEP[got[0]] += 1
    else:
        SWEEP["local-partial" if isinstance(dst.axes[a], Partial) else "local-slice"] += 1


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


def _nodes(plan: rs.Plan) -> list[PlanNode]:
    return [n for n in plan.lowered.nodes]


STRATEGY_RULES = (["unop-local", "binop-local", "mm-local", "redistribute", "mm-view-lhs", "mm-view-rhs",
                   "mm-view-both"] + sorted(MMP_CASES.values())
                  + sorted(TRP_CASES.values()))
VERIFIED: Counter = Counter()


@pytest.mark.slow
@_sweep(70)
@given(f=FP.fusions(min_ops=1, max_ops=4), seed=st.integers(0, 2**16))
def test_strategy_rules_on_random_plans(f, seed):
    _random_plans_match_the_reference(f, seed, 3)


def _random_plans_match_the_reference(f: rs.Fusion, seed: int, plans: int) -> None:
    """``plans`` random extractions of ``f``'s e-graph, each checked against the reference; the
    rule instances they ran are counted (``VERIFIED``)."""
    try:
        sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    except rs.ReshardError as e:
        assert str(e).startswith("optimize: found no way"), e
        return
    rng = random.Random(seed)
    for i in range(plans):
        try:
            plan = sat.plan(perturb=rng)
        except rs.ReshardError as e:
            assert str(e).startswith("optimize: found no way"), e
            return
        check_plan(plan, f, seed + i, "strategy sweep")
        VERIFIED.update(rule_instances(plan.fusion, _nodes(plan)))  # padded when uneven


@st.composite
def matmul_programs(draw):
    """``out = a @ b`` (optionally batched, optionally followed by an add) with random operand
    and result shardings: the matmul strategies' instances are drawn here, since random
    programs rarely give a matmul operands that are both sharded.  Either operand may be a
    transpose of the input (``alias``: read as a view)."""
    mesh = draw(st.sampled_from([FP.M2, FP.M4, FP.M2x2]))
    dims = st.sampled_from((2, 4, 8, 12))
    batch = (draw(dims),) if draw(st.booleans()) else ()
    m, k, n = draw(dims), draw(dims), draw(dims)
    b_shape = batch + (k, n) if batch and draw(st.booleans()) else (k, n)
    f = rs.Fusion()

    def operand(name: str, shape: tuple[int, ...]) -> Tensor:
        if not draw(st.booleans()):
            return f.input(name, shape, "float64", mesh, draw(FP.shardings(shape, mesh, allow_partial=True)))
        swapped = shape[:-2] + (shape[-1], shape[-2])
        x = f.input(name, swapped, "float64", mesh, draw(FP.shardings(swapped, mesh, allow_partial=True)))
        return f.permute(x, tuple(range(len(shape) - 2)) + (len(shape) - 1, len(shape) - 2))

    a, b = operand("a", batch + (m, k)), operand("b", b_shape)
    out = f.matmul(a, b)
    f.output(out, draw(FP.shardings(out.shape, mesh, allow_partial=draw(st.booleans()), partial_weight=3)))
    return f


@pytest.mark.slow
@_sweep(60)
@given(f=matmul_programs(), seed=st.integers(0, 2**16))
def test_matmul_strategy_rules_on_random_plans(f, seed):
    _random_plans_match_the_reference(f, seed, 6)  # a matmul has many ways (views, axis strategies)


@st.composite
def reduce_programs(draw):
    """``sum``/``max`` of a randomly sharded tensor over random dims (a sharded reduced dim
    turns its placement Partial: ``trp-reduce``), then an elementwise op."""
    mesh = draw(st.sampled_from([FP.M2, FP.M4, FP.M2x2]))
    shape = tuple(draw(st.sampled_from((2, 4, 8))) for _ in range(draw(st.integers(2, 3))))
    f = rs.Fusion()
    x = f.input("x", shape, "float64", mesh, draw(FP.shardings(shape, mesh, allow_partial=False)))
    dims = draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape) - 1, unique=True))
    y = f.reduce(draw(st.sampled_from(["sum", "max"])), x, dims)
    f.output(f.tanh(y), draw(FP.shardings(y.shape, mesh, allow_partial=False)))
    return f


@pytest.mark.slow
@_sweep(40)
@given(f=reduce_programs(), seed=st.integers(0, 2**16))
def test_reduce_strategy_rules_on_random_plans(f, seed):
    test_strategy_rules_on_random_plans.hypothesis.inner_test(f, seed)


def test_every_strategy_rule_was_verified_on_random_instances():
    """Runs after the sweep above (file order): each strategy/transport rule was exercised on
    at least a few random instances whose plans matched the reference."""
    if not VERIFIED:
        pytest.skip("run together with test_strategy_rules_on_random_plans")
    thin = {r: VERIFIED[r] for r in STRATEGY_RULES if VERIFIED[r] < 3}
    print("\nrule instances verified:", dict(sorted(VERIFIED.items())))
    assert not thin, f"rules verified on fewer than 3 random instances: {thin}"


def test_resharding_sweep_covered_every_collective():
    if not SWEEP:
        pytest.skip("run together with test_resharding_rules_on_random_instances")
    print("\nresharding instances verified:", dict(SWEEP))
    for kind in ("allgather", "allreduce", "reduce_scatter", "all_to_all", "local-slice", "local-partial"):
        assert SWEEP[kind] >= 3, (kind, dict(SWEEP))


def test_block_split_of_cyclic_split_is_the_same_sharding():
    """Hypothesis found it: ``Outer(Inner(i, 2), 2)`` and ``Inner(Outer(i, 4), 2)`` on an 8-row dim are
    the same index (rule ``outer-inner``), so the change is no step (it was two all-to-alls)."""
    r0 = Root(0, 8)
    src = TensorSharding(FP.M2x2, (8, 2), (Outer(r0, 2), Outer(Inner(r0, 2), 2)))
    dst = TensorSharding(FP.M2x2, (8, 2), (Outer(r0, 2), Inner(Outer(r0, 4), 2)))
    f = rs.Fusion()
    f.output(f.set(f.input("x", (8, 2), "float64", FP.M2x2, src)), dst)
    plan = rs.optimize(f, cost_profile=SWEEP_PROFILE)
    check_plan(plan, f, 0, "outer-inner")
    assert not plan.communications
