"""The calibrated cost model: per-team-size profiles, built-in profiles, the α-β fit, and the
tuner (``reshard.tune`` / ``reshard tune``) measuring this machine with gloo."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch

import reshard as rs
from reshard.cli import main as cli_main
from reshard.rules import cost
from reshard.rules.cost_profile import CostProfile, builtin_profiles, bus_factor
from reshard.ir.collective_kinds import KIND_NAMES as KINDS
from reshard.tune import POOR_FIT_R2, UNRESOLVED_BUSBW_GBPS, TuneResult, fit_alpha_beta, fit_points, tune
from reshard.testing import programs as P

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--backend", "gloo", "--sizes", "1K", "32K", "--points", "3", "--reps", "3", "--warmup", "1",
        "--matmul-size", "32", "--copy-bytes", "256K", "--matmul-dtypes", "float32", "--threads", "1"]


def expected_cost_s(prof: CostProfile, c) -> float:
    """α + bytes·f(n)/busbw (+ the buffers' reorder copies) of a plan communication under
    ``prof`` (the laws the rules state)."""
    alpha_us, gbps = prof.collective(c.kind, c.team_size)
    return (alpha_us * 1e-6 + c.bytes * bus_factor(c.kind, c.team_size) / (gbps * 1e9)
            + c.reorder_copies * prof.reorder_copy_s(c.bytes))


def test_the_table_warns_of_a_poor_fit() -> None:
    """A fit whose R² is below ``POOR_FIT_R2`` (times that jump about: noise) is named in a
    warning under the table; good fits alone print none."""
    nbytes = [1024 * 4 ** k for k in range(5)]
    good = fit_points("allreduce", 2, nbytes, [1e-5 + b / 1e9 for b in nbytes])
    noisy = fit_points("allgather", 2, nbytes, [3e-4, 1e-4, 5e-4, 1e-4, 4e-4])
    assert good.r2 > 0.99 and noisy.r2 < POOR_FIT_R2
    device = {"device": "cpu", "hbm_gbps": 10.0, "launch_us": 5.0, "peak_tflops": {}}
    table = TuneResult(CostProfile(), [good, noisy], device).table()
    warning = [line for line in table.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and f"R^2 below {POOR_FIT_R2} for allgather n=2 (R^2 {noisy.r2:.2f})" in warning[0]
    assert "allreduce" not in warning[0] and "unreliable" in warning[0]
    assert "warning" not in TuneResult(CostProfile(), [good], device).table()


# ---- the fit ------------------------------------------------------------------------------------
def test_fit_recovers_known_alpha_beta_exactly():
    x = np.geomspace(1e3, 1e8, 9)
    alpha, beta = 3.7e-5, 1 / 42e9
    a, b, r2 = fit_alpha_beta(x, alpha + beta * x)
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9) and r2 == pytest.approx(1.0)
    a, b, _ = fit_alpha_beta(x, alpha + beta * x, weighted=False)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-9)
    # through the bus factor: allreduce on 4 ranks moves 2·3/4 of the bytes
    nbytes = [4096 * 4 ** k for k in range(6)]
    secs = [12.5e-6 + b_ * 1.5 / 80e9 for b_ in nbytes]
    fit = fit_points("allreduce", 4, nbytes, secs)
    assert fit.alpha_us == pytest.approx(12.5, rel=1e-9) and fit.busbw_gbps == pytest.approx(80.0, rel=1e-9)
    assert fit.points == 6 and fit.r2 == pytest.approx(1.0) and not fit.note


def test_fit_keeps_coefficients_nonnegative_and_r2_finite():
    x = np.array([1e3, 1e4, 1e5, 1e6])
    fit = fit_points("broadcast", 2, [int(v) for v in x], [5e-4, 4.9e-4, 4.8e-4, 4.7e-4])  # shrinking times
    assert fit.busbw_gbps == UNRESOLVED_BUSBW_GBPS and "unresolved" in fit.note
    assert fit.alpha_us == pytest.approx(np.mean([500, 490, 480, 470]), rel=0.05) and math.isfinite(fit.r2)
    x = np.array([1e4, 1e5, 1e6, 1e7])
    a, b, r2 = fit_alpha_beta(x, -2e-6 + 1e-9 * x)  # a line through a negative intercept
    assert a == 0 and b == pytest.approx(1e-9, rel=0.1) and 0.99 < r2 <= 1.0
    a, b, r2 = fit_alpha_beta([1e3, 1e4], [1e-4, 1e-4])  # constant times: perfect, α only
    assert a == pytest.approx(1e-4) and b == pytest.approx(0, abs=1e-20) and r2 == 1.0
    assert "unresolved" in fit_points("gather", 2, [1000, 10000], [1e-4, 1e-4]).note
    with pytest.raises(rs.ReshardError, match="2 distinct message sizes"):
        fit_alpha_beta([1e3, 1e3], [1e-4, 2e-4])


# ---- profiles -----------------------------------------------------------------------------------
def test_profile_lookup_by_team_size_nearest_then_per_kind_default():
    prof = CostProfile.load({"collectives": {"allgather": {"2": {"alpha_us": 20.0, "busbw_gbps": 100.0},
                                                           8: {"alpha_us": 80.0}}}})
    assert sorted(prof.collectives["allgather"]) == ["2", "8"]  # int keys normalized
    assert prof.collective("allgather", 2) == (20.0, 100.0)
    assert prof.collective("allgather", 4) == (20.0, 100.0)            # nearest: 2
    assert prof.collective("allgather", 5) == (20.0, 100.0)            # tie 2 / 8: the smaller
    assert prof.collective("allgather", 6) == (80.0, 265.0)            # nearest 8; busbw from the kind
    assert prof.collective("allreduce", 4) == (10.0, 328.0)            # no entries: per-kind figures
    assert prof.collective("send_recv", 2) == (6.0, 370.0)
    assert set(prof.alpha_us) == set(prof.busbw_gbps) == set(KINDS)
    with pytest.raises(rs.ReshardError, match="unknown collective kind 'alltoall'"):
        prof.collective("alltoall", 2)


@pytest.mark.parametrize("spec,msg", [
    ({"nope": 1}, "unknown keys"),
    ({"alpha_us": {"allgathr": 1.0}}, "unknown collective kinds"),
    ({"busbw_gbps": {"allgather": 0}}, "must be positive"),
    ({"busbw_gbps": {"allgather": "fast"}}, "finite number"),
    ({"alpha_us": {"allgather": -1.0}}, ">= 0"),
    ({"collectives": {"broadcast2": {"2": {"alpha_us": 1}}}}, "unknown collective kind 'broadcast2'"),
    ({"collectives": {"allgather": {"0": {"alpha_us": 1}}}}, "team size '0'"),
    ({"collectives": {"allgather": {"two": {"alpha_us": 1}}}}, "team size 'two'"),
    ({"collectives": {"allgather": {"2": {"beta": 1}}}}, "keys from"),
    ({"collectives": {"allgather": {"2": {}}}}, "keys from"),
    ({"collectives": {"allgather": {"2": {"busbw_gbps": -3}}}}, "must be positive"),
    ({"collectives": {"allgather": [1, 2]}}, "must map team sizes"),
    ({"hbm_gbps": 0}, "hbm_gbps must be positive"),
    ({"peak_tflops": {"2": 0}}, "peak_tflops"),
    ({"alpha_us": 3}, "must be a JSON object"),
])
def test_profile_rejects_bad_entries(spec, msg):
    with pytest.raises(rs.ReshardError, match=re.escape(msg)):
        CostProfile.load(spec)


def test_builtin_profile_by_name_matches_defaults_and_round_trips(tmp_path):
    assert "h200x2" in builtin_profiles()
    assert (ROOT / "reshard" / "profiles" / "h200x2.json").is_file()
    named = CostProfile.load("h200x2")
    assert named.meta and dataclasses.replace(named, meta={}) == CostProfile()
    with pytest.raises(rs.ReshardError, match=r"not a built-in profile \(built-in: \[.*'h200x2'"):
        CostProfile.load("h100x9")
    measured = CostProfile.load("h100x1")  # the tuner's output on one H100 (BENCHMARKS.md)
    assert measured.meta["backend"] == "nccl" and 2000 < measured.hbm_gbps < 3500
    p = CostProfile.load({"collectives": {"allreduce": {"4": {"alpha_us": 3.5}}}, "meta": {"x": [1]}})
    assert CostProfile.load(p.save(tmp_path / "p.json")) == p
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(rs.ReshardError, match="cannot read JSON"):
        CostProfile.load(tmp_path / "bad.json")


def test_rules_per_team_size_need_the_mesh_team_sizes():
    prof = CostProfile.load({"collectives": {"allgather": {"2": {"alpha_us": 1.0}}}})
    with pytest.raises(rs.ReshardError, match="per-team-size figures for allgather"):
        cost.rules(prof)
    general = [r.reported_name for r in cost.rules(prof, (2, 4, 2)) if "outermost" not in r.variant]
    assert general[:3] == ["cost-collective-allgather-n2", "cost-collective-allgather-n4",
                           "cost-collective-reduce_scatter"]
    assert [r.reported_name for r in cost.rules(CostProfile(), (2, 4)) if "outermost" not in r.variant][:4] == [
        "cost-collective-allgather", "cost-collective-reduce_scatter", "cost-collective-allreduce",
        "cost-collective-all_to_all"]


# ---- the profile drives extraction --------------------------------------------------------------
def test_default_profile_costs_follow_the_alpha_beta_law():
    for mesh, src, dst in [(P.MESH1, [rs.Shard(0)], [rs.Replicate()]), (P.MESH4, [rs.Partial()], [rs.Replicate()]),
                           (P.MESH1, [rs.Shard(0)], [rs.Shard(1)])]:
        plan = rs.optimize(P.redistribute(src, dst, mesh)())
        (c,) = plan.communications
        assert c.cost_s == pytest.approx(expected_cost_s(CostProfile(), c), abs=2e-12)


def test_per_team_size_figures_are_used_exactly():
    prof = CostProfile.load({"collectives": {"allgather": {"2": {"alpha_us": 100.0, "busbw_gbps": 10.0},
                                                           "4": {"alpha_us": 1000.0, "busbw_gbps": 0.5}}}})
    for mesh, alpha_us, gbps in [(P.MESH1, 100.0, 10.0), (P.MESH4, 1000.0, 0.5)]:
        f = P.redistribute([rs.Shard(0)], [rs.Replicate()], mesh, shape=(64, 32))()
        plan = rs.optimize(f, cost_profile=prof)
        (c,) = plan.communications
        n = mesh.size
        assert c.kind == "allgather" and c.team_size == n
        assert c.cost_s == pytest.approx(alpha_us * 1e-6 + c.bytes * (n - 1) / n / (gbps * 1e9), abs=2e-12)
        P.assert_plan_matches_reference(plan, f, P.random_inputs(f))


def test_team_size_entry_flips_the_plan_only_on_that_team_size():
    """A huge allgather α for teams of 4 only: the 4-rank MLP avoids allgather, the 2-rank
    MLP keeps the Megatron plan; the same entry under "2" flips the 2-rank one."""
    huge4 = {"collectives": {"allgather": {"2": {"alpha_us": 8.0}, "4": {"alpha_us": 1e4}}}}
    huge2 = {"collectives": {"allgather": {"2": {"alpha_us": 1e4}, "4": {"alpha_us": 8.0}}}}
    kinds = {}
    for name, prof in [("huge4", huge4), ("huge2", huge2)]:
        for mesh in (P.MESH1, P.MESH4):
            f = P.mlp(mesh)
            plan = rs.optimize(f, cost_profile=prof)
            kinds[name, mesh.size] = [c.kind for c in plan.communications]
            P.assert_plan_matches_reference(plan, f, P.random_inputs(f))
    assert kinds["huge4", 2] == ["allgather", "reduce_scatter"] and "allgather" not in kinds["huge4", 4]
    assert kinds["huge2", 4] == ["allgather", "reduce_scatter"] and "allgather" not in kinds["huge2", 2]


def test_allgather_vs_allreduce_latency_picks_the_mlp_collectives():
    f = P.mlp()
    slow_ag = rs.optimize(f, cost_profile={"collectives": {"allgather": {"2": {"alpha_us": 1e4}},
                                                           "reduce_scatter": {"2": {"alpha_us": 1e4}}}})
    slow_ar = rs.optimize(f, cost_profile={"collectives": {"allreduce": {"2": {"alpha_us": 1e4}},
                                                           "all_to_all": {"2": {"alpha_us": 1e4}}}})
    ag_kinds = [c.kind for c in slow_ag.communications]
    assert "allreduce" in ag_kinds and "allgather" not in ag_kinds and "reduce_scatter" not in ag_kinds
    assert [c.kind for c in slow_ar.communications] == ["allgather", "reduce_scatter"]
    for plan in (slow_ag, slow_ar):
        P.assert_plan_matches_reference(plan, f, P.random_inputs(f))
        for c in plan.communications:
            assert c.cost_s == pytest.approx(expected_cost_s(plan.profile, c), abs=2e-12)


def test_slow_profiles_do_not_overflow_on_large_programs():
    """CPU-class figures (MB/s links, MFLOP/s matmuls) on a 4096-wide block on 8 ranks: the
    i64 cost arithmetic neither overflows nor loses the α-β law."""
    from reshard.examples import transformer_block
    slow = {"collectives": {k: {"2": {"alpha_us": 500.0, "busbw_gbps": 0.006},
                                "8": {"alpha_us": 900.0, "busbw_gbps": 0.001}} for k in KINDS},
            "busbw_gbps": {k: 2e-6 for k in KINDS}, "hbm_gbps": 0.5, "peak_tflops": {"4": 2e-5}}
    f = transformer_block(rs.DeviceMesh(list(range(8)), ("tp",)), 4096, 4096, 32)
    plan = rs.optimize(f, cost_profile=slow)
    assert plan.communications and plan.cost > 1000  # seconds: these figures are slow
    for c in plan.communications:
        assert c.cost_s == pytest.approx(expected_cost_s(plan.profile, c), rel=1e-5)


# ---- the tuner ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> dict:
    """One real measurement: `reshard tune` with gloo on 2 spawned processes, tiny sizes."""
    path = tmp_path_factory.mktemp("tune") / "prof.json"
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli_main(["tune", "--nprocs", "2", "--out", str(path), *TINY])
    return {"rc": rc, "out": buf.getvalue(), "path": path}


@pytest.mark.multiproc
def test_tune_cli_writes_a_loadable_profile_with_finite_fits(tuned):
    assert tuned["rc"] == 0, tuned["out"]
    prof = CostProfile.load(tuned["path"])
    assert CostProfile.load(str(tuned["path"])) == prof
    raw = json.loads(tuned["path"].read_text())
    assert set(raw["collectives"]) == set(KINDS)
    assert all(list(raw["collectives"][k]) == ["2"] for k in KINDS)
    fits = prof.meta["fits"]
    assert sorted(f["kind"] for f in fits) == sorted(KINDS) and all(f["n"] == 2 for f in fits)
    for f in fits:
        assert math.isfinite(f["r2"]) and f["points"] == 3 and len(f["seconds"]) == 3
        assert f["alpha_us"] >= 0 and 0 < f["busbw_gbps"] <= UNRESOLVED_BUSBW_GBPS
        assert prof.collective(f["kind"], 2) == (f["alpha_us"], f["busbw_gbps"])
        assert all(s > 0 for s in f["seconds"])
    assert prof.meta["backend"] == "gloo" and prof.meta["nprocs"] == 2
    assert prof.hbm_gbps > 0 and prof.launch_us > 0 and prof.meta["matmul"]["4"]["dtype"] == "float32"
    assert prof.peak_tflops["4"] == prof.meta["matmul"]["4"]["tflops"] > 0
    assert prof.peak_tflops["2"] == CostProfile().peak_tflops["2"]  # not measured: the base's
    # the printed table: one row per kind with a finite R²
    rows = {m.group(1): float(m.group(2)) for m in
            re.finditer(r"^(\w+)\s+2\s+[\d.]+\s+(?:[\d.]+|unresolved)\s+(-?[\d.]+(?:e-?\d+)?)\s+3", tuned["out"], re.M)}
    assert set(rows) == set(KINDS) and all(math.isfinite(v) for v in rows.values())
    assert "copy bandwidth" in tuned["out"] and "wrote" in tuned["out"]


def test_tuned_profile_drives_optimize(tuned):
    f = P.mlp()
    default = rs.optimize(f)
    plan = rs.optimize(f, cost_profile=str(tuned["path"]))
    prof = CostProfile.load(tuned["path"])
    assert plan.profile == prof and plan.cost != default.cost
    assert plan.communications
    for c in plan.communications:
        assert c.cost_s == pytest.approx(expected_cost_s(prof, c), rel=1e-5, abs=2e-12)
    P.assert_plan_matches_reference(plan, f, P.random_inputs(f))


def test_tune_device_only_with_one_process(tmp_path):
    """nprocs = 1 (what a one-GPU run does): no collectives, device figures measured, the rest
    from the base profile."""
    res = tune(nprocs=1, backend="gloo", copy_bytes=1 << 18, matmul_size=32, matmul_dtypes=["float32", "float64"],
               reps=3, warmup=1, threads=1, out=tmp_path / "one.json", base="h200x2")
    prof = CostProfile.load(tmp_path / "one.json")
    assert res.fits == [] and prof.collectives == {} and prof.alpha_us == CostProfile().alpha_us
    assert prof.hbm_gbps == res.device["hbm_gbps"] > 0 and prof.launch_us > 0
    assert prof.peak_tflops["8"] == res.device["peak_tflops"]["8"][1] > 0 and prof.peak_tflops["2"] == 700.0
    assert "nprocs = 1" in res.table() and "(no collectives measured" in res.table()


@pytest.mark.parametrize("args,msg", [
    (["--nprocs", "0"], "nprocs must be an integer >= 1"),
    (["--sizes", "64K", "1K"], "must exceed the smallest"),
    (["--kinds", "allgather,bogus"], "unknown collective kinds ['bogus']"),
    (["--team-sizes", "2,8"], "exceed --nprocs 2"),
    (["--team-sizes", "two"], "comma-separated integers"),
    (["--dtype", "int7"], "dtype must be one of"),
    (["--reps", "0"], "reps must be an integer >= 1"),
    (["--base", "nosuch"], "not a built-in profile"),
])
def test_tune_cli_rejects_bad_options(args, msg, capsys, tmp_path):
    assert cli_main(["tune", "--backend", "gloo", "--out", str(tmp_path / "x.json"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reshard: error: ") and msg in err
    assert not (tmp_path / "x.json").exists()


def test_tune_cli_argument_errors_and_nccl_without_gpu(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli_main(["tune", "--sizes", "1X", "2"])
    assert e.value.code == 2 and "not a byte count: '1X'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli_main(["tune", "--backend", "nccl", "--nprocs", "1", "--out", str(tmp_path / "x.json")]) == 2
        assert "needs CUDA" in capsys.readouterr().err


def test_script_wrapper_is_the_same_command(capsys):
    ns = runpy.run_path(str(ROOT / "scripts" / "tune_cost_model.py"), run_name="tune_script")
    assert ns["main"](["--backend", "gloo", "--nprocs", "-1"]) == 2
    assert "tune_cost_model: error: tune: nprocs must be an integer >= 1" in capsys.readouterr().err
