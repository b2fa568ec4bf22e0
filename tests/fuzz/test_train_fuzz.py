"""Differential fuzzing of training plans: random programs made training steps, planned, and every
plan simulated and compared with the reference interpreter.

Two generators: ``fuzz_programs.fusions`` (its op families on 1-D, 2-D and cross-mesh programs)
made a training step by ``joint`` of a weighted loss over its float outputs, every float input
but attention masks differentiated; and ``fuzz_training.steps`` (stacks of MLPs, norms,
residuals, attention-like products, fused attention and transposed matmuls on a dp x tp mesh,
the batch split over dp and every weight replicated over it: dp is a data axis, which the first
never makes; some start at token ids looked up in an embedding table, some end in a
cross-entropy head, some attention has one key/value head for two query heads or is causal;
``LM_STEP`` has all four) differentiated by its weights.  Each joint is saturated with saved twins for recomputing (``recompute=True``, as a
memory budget asks), and its plans are checked against ``run_reference`` of the joint (whose
gradients ``test_autodiff_fuzz`` checks against torch.autograd): the optimized plan (the sharing
search, gradient buckets, the data-axis candidate, adoption), two random extractions (perturbed
costs: kept or recomputed values, plans the cost model would never pick), the plan under half the
optimized plan's saved bytes (when that can be met), the optimized plan under a random cost
profile (the same searches choosing on other costs; for half the seeds one where gradient buckets
pay, so that plans read them: random extractions never take a bucket's chain of cats and
slices), and the optimized plan and a random one of the e-graph cut into segments of 2-12 ops
(``segments``: the seams, with the saved twins a later segment's recomputes read).  Inputs are
clean normal values (a NaN would reach every gradient and hide a wrong one).

Profiles as ``test_fuzz`` (``RESHARD_FUZZ_PROFILE``: ``ci``, deterministic, 8 programs of the
first generator and 1 random step (and ``LM_STEP``); ``deep``, random, 1000 and 300, with
hypothesis' example database; ``scripts/deep_fuzz.sh``), ``RESHARD_FUZZ_EXAMPLES`` overrides both counts.
"""

from __future__ import annotations

import os
import random
from collections import Counter

from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.extract.budget import OverBudget
from reshard.ir.collective_kinds import KINDS
from reshard.ir.dtypes import dtype_kind
from reshard.ir.fusion import Fusion
from reshard.passes.autodiff import joint
from reshard.plan import Saturated
from reshard.search.encode import data_axes
from reshard.testing import fuzz_programs as FP
from reshard.testing.autodiff_oracle import weighted_loss
from reshard.testing.fuzz_training import Block, Recipe, data_parallel_step, steps
from tests.fuzz.test_fuzz import _unplannable, check_plan, memory_guard, must_be_plannable
from tests.ir.test_grad_buckets import bucketed

PROFILE = os.environ.get("RESHARD_FUZZ_PROFILE", "ci")
_COUNTS = {"ci": (8, 1), "deep": (1000, 300)}[PROFILE]
_EXAMPLES = os.environ.get("RESHARD_FUZZ_EXAMPLES")


def _settings(n: int) -> settings:
    """``n`` examples (or ``RESHARD_FUZZ_EXAMPLES``); ``ci``: derandomized, no example database."""
    ci = {"derandomize": True, "database": None} if PROFILE == "ci" else {}
    return settings(max_examples=int(_EXAMPLES) if _EXAMPLES else n, deadline=None, print_blob=True,
                    suppress_health_check=list(HealthCheck), **ci)


STATS: Counter = Counter()
#: the plans ``check_training_plans`` checks of each joint (the budgeted one where it can be met)
PLAN_KINDS = ("optimized plan", "random plan 0", "random plan 1", "plan under half its saved bytes",
              "plan under a random cost profile", "plan of the e-graph cut", "random plan of the e-graph cut")


#: ranges a random cost profile draws from: (alpha us, busbw GB/s, hbm GB/s, launch us, log10 of
#: the peak TFLOP/s), anywhere, and where gradient buckets pay (a collective's latency far above a
#: kernel launch, compute slow enough that a step split over the batch, its gradients reduced,
#: beats computing it whole: most data-parallel steps then read a bucket)
_ANYWHERE = ((0.3, 60), (0.5, 400), (0.05, 5000), (0.1, 20), (-7, 2))
_BUCKETS_PAY = ((30, 150), (100, 400), (1000, 5000), (0.001, 0.05), (-7, -5))


def _random_profile(seed: int) -> rs.CostProfile:
    """Latencies, bandwidths, launch costs and compute rates drawn far from the built-in
    profile's: for half the seeds from ``_BUCKETS_PAY``, else from ``_ANYWHERE``."""
    r = random.Random(seed)
    alpha, busbw, hbm, launch, flops = _BUCKETS_PAY if r.random() < 0.5 else _ANYWHERE
    return rs.CostProfile(alpha_us={k.name: r.uniform(*alpha) for k in KINDS},
                          busbw_gbps={k.name: r.uniform(*busbw) for k in KINDS},
                          hbm_gbps=r.uniform(*hbm), launch_us=r.uniform(*launch),
                          peak_tflops={k: 10 ** r.uniform(*flops) for k in ("2", "4", "8")})


def _no_plan(e: rs.ReshardError, f: Fusion) -> bool:
    """A "no plan" that ``test_fuzz`` accepts for ``f`` (a Partial mixed across axes, ...)."""
    return _unplannable(e) and not must_be_plannable(f)


def check_training_plans(jf: Fusion, seed: int, segment_ops: int) -> None:
    """The plans of the module docstring for the joint ``jf``, each simulated on the inputs of
    ``seed`` (clean: ``seed % 4 != 0``, see ``fuzz_programs.special_values``); ``segment_ops``:
    the segments' size of the e-graph cut small."""
    with memory_guard(jf):
        try:
            sat = Saturated.build(jf, rs.CostProfile(), rs.Limits(), recompute=True)
            plans = [(PLAN_KINDS[0], "", sat.plan())]
        except rs.ReshardError as e:
            if not _no_plan(e, jf):
                raise
            STATS["no plan"] += 1
            return
        rng = random.Random(seed)
        plans += [(PLAN_KINDS[1 + i], f" (random.Random({seed}))", sat.plan(perturb=rng)) for i in range(2)]
        if plans[0][2].saved_bytes:
            try:
                plans.append((PLAN_KINDS[3], "", sat.plan(memory_budget=plans[0][2].saved_bytes // 2)))
            except OverBudget:
                STATS["budget cannot be met"] += 1
        plans.append((PLAN_KINDS[4], f" (seed {seed})",
                      Saturated.build(jf, _random_profile(seed), rs.Limits(), recompute=True).plan()))
        cut = Saturated.build(jf, rs.CostProfile(), rs.Limits(segment_ops=segment_ops), recompute=True)
        STATS["e-graphs cut into segments"] += cut.report.segments > 1
        plans += [(PLAN_KINDS[5], f" into {cut.report.segments} segments", cut.plan()),
                  (PLAN_KINDS[6], f" (random.Random({seed}))", cut.plan(perturb=random.Random(seed)))]
        for kind, detail, plan in plans:
            check_plan(plan, jf, seed, kind + detail)
            STATS[kind] += 1
            STATS["plans reading a gradient bucket"] += bool(bucketed(plan))


@_settings(_COUNTS[0])
@given(f=FP.fusions(max_ops=16), seed=st.integers(0, 2**14), segment_ops=st.integers(2, 12))
def test_random_training_steps_plan_as_the_reference(f, seed, segment_ops):
    note(FP.fusion_source(f))
    outs = [f.tensors[t] for t, _ in f.outputs if dtype_kind(f.tensors[t].dtype) == "float"]
    wrt = FP.trained_inputs(f)
    if not wrt or not outs:
        return
    STATS["programs"] += 1
    check_training_plans(joint(f, weighted_loss(f, outs), wrt).fusion, 4 * seed + 1, segment_ops)


#: a step every profile checks: token ids looked up in a vocab-parallel table, a causal fused
#: attention with one key/value head for two query heads (GQA), and a vocab-parallel
#: cross-entropy head averaged into a scalar loss (the draws reach those seldom)
LM_STEP = Recipe(2, 2, 2, 2, 6, (Block("sdpa", (0, -1, -1, 1), gqa=True, causal=True),), vocab=6, embed_split=0,
                 head="mean", head_vocab=6, head_split=1)


@_settings(_COUNTS[1])
@given(r=steps(), seed=st.integers(0, 2**14), segment_ops=st.integers(2, 12))
@example(r=LM_STEP, seed=7, segment_ops=5)
def test_data_parallel_steps_plan_as_the_reference(r, seed, segment_ops):
    note(f"data_parallel_step({r!r})")
    f, weights = data_parallel_step(r)
    y = f.tensors[f.outputs[0][0]]
    jf = joint(f, weighted_loss(f, [y]), weights).fusion
    assert data_axes(jf, y.mesh) == frozenset({0})
    inputs = FP.random_inputs(jf, 4 * seed + 1)
    assert all(bool(t.isfinite().all()) for t in rs.run_reference(jf, inputs))  # (the generator's law)
    STATS["data-parallel steps"] += 1
    STATS["steps starting at a lookup"] += bool(r.vocab)
    STATS["steps ending in cross entropy"] += bool(r.head)
    STATS["steps with GQA"] += any(b.gqa for b in r.blocks)
    STATS["steps with causal attention"] += any(b.causal for b in r.blocks)
    check_training_plans(jf, 4 * seed + 1, segment_ops)


#: what some data-parallel step has (``LM_STEP`` has each)
_STEP_FEATURES = ("steps starting at a lookup", "steps ending in cross entropy", "steps with GQA",
                  "steps with causal attention")


def test_zz_training_fuzz_summary():
    """Runs last: prints the counts; with eight programs or more, each kind of plan was checked
    and some e-graph was cut into segments; with data-parallel steps, some plan read a gradient
    bucket (the random programs' plans hardly ever do: 0 of 2,549 in a deep run) and some steps
    started at a lookup, ended in cross entropy, had GQA and causal attention."""
    print(f"\ntraining fuzz summary [profile {PROFILE}]: {dict(STATS)}")
    if STATS["programs"] + STATS["data-parallel steps"] >= 8:
        for kind in PLAN_KINDS:
            assert STATS[kind] > 0, f"no {kind} checked: {dict(STATS)}"
        assert STATS["e-graphs cut into segments"] > 0, dict(STATS)
    if STATS["data-parallel steps"]:
        assert STATS["plans reading a gradient bucket"] > 0, dict(STATS)
        assert all(STATS[k] > 0 for k in _STEP_FEATURES), dict(STATS)
