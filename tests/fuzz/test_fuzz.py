"""Differential fuzzing: random Fusions (``reshard.testing.fuzz_programs.fusions``) are optimized, the
plans simulated on CPU ranks and compared with the reference interpreter.

Profiles (env ``RESHARD_FUZZ_PROFILE``): ``ci`` (default; deterministic: 120 programs, 90 for
the random extractions; the lines of ``reshard/`` the two tests run level off by 100 programs:
by coverage.py, 7280 after 25 programs, 7582 after 100, 7595 after 125, 7606 after 200 for the
optimized plans; with the random extractions, 7701 lines at 125 + 100 programs, 7721 at
200 + 150) and ``deep`` (5000 examples, random, uses the example database;
``scripts/deep_fuzz.sh``).  ``RESHARD_FUZZ_EXAMPLES`` overrides the example count.  Generator features: ``RESHARD_FUZZ_FLAGS`` (see fuzz_programs).

Inputs: ``fuzz_programs.random_inputs`` (NaN/inf in some examples, compared as equal to
themselves); Partial inputs get random summands through ``plan.simulate(generator=...)``, which
vary along the Partial axes only (identical copies along Replicate axes, DTensor's meaning).

Uneven shardings (DTensor's torch.chunk pieces) appear in a fraction of the programs (counted;
at least a tenth); their plans are checked like any other, with global inputs and outputs.

Acceptable: ``optimize``/extraction raising "found no way to produce output" (or "to meet the
pinned redistribute") for a program that requires Partial ops mixed across axes or a loop-domain
sharding that cannot be reached one axis at a time (counted; at most ~20% of examples).  For
any other program a plan exists (gather to Replicate, compute, slice or make Partial locally),
so "no way" is a completeness bug.  Everything else is a failure: a mismatch, any exception
while simulating, any exception other than ReshardError, or an "internal" ReshardError.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import subprocess
import sys
import tempfile
import textwrap
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.plan import Saturated
from reshard.testing import fuzz_programs as FP
from reshard.testing.child_env import child_env

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
           HealthCheck.large_base_example]
settings.register_profile("ci", max_examples=120, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_HEALTH, print_blob=True)
settings.register_profile("deep", max_examples=5000, deadline=None, suppress_health_check=_HEALTH,
                          print_blob=True)
PROFILE = os.environ.get("RESHARD_FUZZ_PROFILE", "ci")
_SETTINGS = settings(settings.get_profile(PROFILE),
                     **({"max_examples": int(os.environ["RESHARD_FUZZ_EXAMPLES"])}
                        if "RESHARD_FUZZ_EXAMPLES" in os.environ else {}))
#: the random-extraction test builds one e-graph per example and checks several plans: fewer examples
_SETTINGS_RANDOM = settings(_SETTINGS, max_examples=max(1, _SETTINGS.max_examples * 3 // 4))

STATS: Counter = Counter()
#: generator flag -> (what the summary counts, the op kinds a program with that feature holds);
#: the summary asserts one program in twenty has each feature whose flag is on
FEATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "lookup": ("lookups", ("embedding", "pick")),
    "attention": ("attention", ("attention",)),
    "scan": ("scans", ("cumsum", "along")),
    "select": ("selects", ("masked",)),
    "linear_loss": ("linear losses", ("linear_max", "linear_sumexp", "linear_sumexp_grad")),
}
#: address-space headroom (GiB) for one example: a diverging saturation aborts the process
#: instead of exhausting the machine.  The example being run is written to LAST_EXAMPLE first.
MEM_GB = float(os.environ.get("RESHARD_FUZZ_MEM_GB", "8"))
LAST_EXAMPLE = Path(tempfile.gettempdir()) / "reshard_fuzz_last_example.py"


@contextlib.contextmanager
def memory_guard(f: rs.Fusion):
    LAST_EXAMPLE.write_text(FP.fusion_source(f) + "\n")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        with open("/proc/self/statm") as fh:
            used = int(fh.read().split()[0]) * resource.getpagesize()
        limit = used + int(MEM_GB * 2**30)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError):
        pass
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
MAX_UNPLANNABLE = 0.20


def _unplannable(e: BaseException) -> bool:
    """A ReshardError that legitimately says "no plan".  Any other error from optimize (an
    "internal:" one, an egglog panic, an invalid sharding the extractor decoded) is a bug."""
    return isinstance(e, rs.ReshardError) and str(e).startswith(
        ("optimize: found no way to produce output", "optimize: found no way to meet the pinned redistribute"))


def must_be_plannable(f: rs.Fusion) -> bool:
    """True when a plan surely exists: gathering everything to Replicate, computing replicated,
    slicing locally and making Partial locally reaches every required sharding (outputs,
    redistribute targets) one mesh axis at a time, unless one mixes Partial ops (sum on one
    axis, max on another: no defined value) or is a loop-domain sharding with a replicated
    subset that is not a valid sharding, and no input is fed at such a sharding (no step on one
    axis leaves it: ``encode.stuck_inputs``)."""
    from reshard.search.encode import replicable_axis_by_axis, stuck_inputs
    if stuck_inputs(f):
        return False
    required = [ts for _, ts in f.outputs] + [op.attrs["sharding"] for op in f.ops if op.kind == "redistribute"]
    for ts in required:
        if len({ts.axes[a].op for a in ts.partial_axes}) > 1 or not replicable_axis_by_axis(ts):
            return False
    return True


def check_plan(plan: rs.Plan, f: rs.Fusion, seed: int, what: str = "plan") -> None:
    """Simulate ``plan`` on random inputs (``FP.random_inputs``: NaN/inf in some) with random
    Partial summands (``reshard.shard``: identical copies along Replicate axes, summands that
    vary along the Partial axes only) and compare every output with the reference: NaN and
    inf at the same places, finite values within a tolerance relative to the output's largest
    finite magnitude."""
    inputs = FP.random_inputs(f, seed)
    try:
        outs = plan.simulate(inputs, generator=torch.Generator().manual_seed(seed + 1))
    except Exception:
        note(f"{what}:\n{plan.explain()}")
        raise
    refs = rs.run_reference(f, inputs)
    assert len(outs) == len(refs)
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert o.shape == r.shape and o.dtype == r.dtype, (i, o.shape, r.shape, o.dtype, r.dtype)
        finite = r[r.isfinite()]
        scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
        try:
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5 * scale, equal_nan=True)
        except AssertionError:
            note(f"{what}: output {i} differs\n{plan.explain()}")
            raise
    STATS["plans checked"] += 1


def _optimize(f: rs.Fusion):
    try:
        return rs.optimize(f)
    except rs.ReshardError as e:
        if not _unplannable(e) or must_be_plannable(f):
            raise
        STATS["ReshardError (no plan)"] += 1
        note(f"unplannable: {e}")
        return None


def _saturate(f: rs.Fusion):
    try:
        return Saturated.build(f, rs.CostProfile(), rs.Limits())
    except rs.ReshardError as e:
        if not _unplannable(e) or must_be_plannable(f):
            raise
        STATS["ReshardError (no plan, random)"] += 1
        return None


def check_random_plans(sat: Saturated, f: rs.Fusion, rng_seed: int, n: int, seed: int) -> int:
    rng = random.Random(rng_seed)
    done = 0
    for i in range(n):
        try:
            plan = sat.plan(perturb=rng)
        except rs.ReshardError as e:
            if not _unplannable(e) or must_be_plannable(f):
                raise
            STATS["ReshardError (no plan, random)"] += 1
            return done
        check_plan(plan, f, seed + i, what=f"random plan {i} (random.Random({rng_seed}))")
        done += 1
    return done


@pytest.mark.slow
@_SETTINGS
@given(f=FP.fusions(), seed=st.integers(0, 2**16))
def test_optimized_plan_matches_reference(f, seed):
    note(FP.fusion_source(f))
    STATS["examples"] += 1
    STATS["uneven examples"] += FP.is_uneven(f)
    STATS["nested uneven examples"] += FP.is_nested_uneven(f)
    for what, kinds in FEATURES.values():
        STATS[f"examples with {what}"] += any(op.kind in kinds for op in f.ops)
    with memory_guard(f):
        plan = _optimize(f)
        if plan is not None:
            check_plan(plan, f, seed, "optimized plan")


@pytest.mark.slow
@_SETTINGS_RANDOM
@given(f=FP.fusions(), seed=st.integers(0, 2**16))
def test_random_extractions_match_reference(f, seed):
    note(FP.fusion_source(f))
    STATS["examples (random plans)"] += 1
    with memory_guard(f):
        sat = _saturate(f)
        if sat is not None:
            check_random_plans(sat, f, seed, 2, seed)


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("build", FP.REGRESSIONS, ids=lambda b: b.__name__)
def test_fuzz_regression(build):
    """Programs the fuzzer found; each must plan and simulate correctly, for the optimized plan
    and for random extractions (the seeds recorded with the regression, default 0..3)."""
    if getattr(build, "diverges", False):
        _optimize_in_subprocess(build.__name__)
    f = build()
    plan = rs.optimize(f)
    check_plan(plan, f, 0, "optimized plan")
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    for s in getattr(build, "perturb_seeds", range(4)):
        check_random_plans(sat, f, s, getattr(build, "n_plans", 2), s)


def _optimize_in_subprocess(name: str, mem_gb: float = 3.0, timeout_s: float = 120.0) -> None:
    """optimize() of REGRESSIONS ``name`` in a child limited to ``mem_gb`` more address space than its
    imports mapped, and to ``timeout_s``."""
    code = textwrap.dedent(f"""
        import resource
        import reshard as rs
        from reshard.testing import fuzz_programs as FP
        with open("/proc/self/statm") as f:  # (the address space the imports mapped: torch's CUDA build, GiBs)
            mapped = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (mapped + {int(mem_gb * 2**30)}, resource.RLIM_INFINITY))
        rs.optimize(FP.{name}())
        print("optimize returned")
    """)
    root = Path(__file__).resolve().parents[2]
    # (one BLAS thread: OpenBLAS reserves a buffer per core, which on 16 cores failed under the cap)
    env = child_env(root, OPENBLAS_NUM_THREADS="1")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s,
                           cwd=root, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"optimize({name}) did not return within {timeout_s:.0f} s")
    assert r.returncode == 0 and "optimize returned" in r.stdout, (
        f"optimize({name}) failed in a {mem_gb:g} GiB / {timeout_s:.0f} s subprocess (rc {r.returncode}): "
        f"{(r.stdout + r.stderr)[-2000:]}")


def test_zz_fuzz_summary():
    """Runs last: prints the counts and fails when too many examples were unplannable."""
    features = "".join(f", {STATS[f'examples with {what}']} with {what}" for what, _ in FEATURES.values())
    line = ("fuzz summary [profile %s]: %d examples (optimize; %d with uneven shardings, %d nested%s) + %d examples "
            "(random plans), %d plans checked, %d ReshardErrors (optimize), %d ReshardErrors (random plans)"
            % (PROFILE, STATS["examples"], STATS["uneven examples"], STATS["nested uneven examples"], features,
               STATS["examples (random plans)"], STATS["plans checked"], STATS["ReshardError (no plan)"],
               STATS["ReshardError (no plan, random)"]))
    print("\n" + line)
    warnings.warn(line, stacklevel=1)
    if STATS["examples"] >= 50:
        rate = STATS["ReshardError (no plan)"] / STATS["examples"]
        assert rate <= MAX_UNPLANNABLE, f"{rate:.0%} of generated programs could not be planned: {line}"
        if FP.FLAGS["uneven"]:
            assert STATS["uneven examples"] >= STATS["examples"] // 10, f"too few uneven programs: {line}"
        if FP.FLAGS["uneven"] and FP.FLAGS["nested_uneven"] and FP.FLAGS["mesh2d"]:
            assert STATS["nested uneven examples"] >= STATS["examples"] // 40, f"too few nested uneven programs: {line}"
        for flag, (what, _) in FEATURES.items():
            if FP.FLAGS[flag]:
                assert STATS[f"examples with {what}"] >= STATS["examples"] // 20, f"too few programs with {what}: {line}"
