"""The plan cache (``reshard.plan_cache``, issue 27 item 5): the second optimize() of the same
program returns the stored plan without planning; a different program, cost profile or option
is a miss; ``RESHARD_PLAN_CACHE=off`` and ``cache=False`` neither read nor write; a corrupt file
is a miss, never an error; a cached training plan computes what the fresh one does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import reshard as rs
from reshard import plan_cache
from reshard.plan import Saturated
from reshard.testing import programs as P
from reshard.testing.child_env import child_env

MESH = rs.DeviceMesh([0, 1], ("tp",))
ROOT = Path(__file__).resolve().parents[2]


def prog(n: int = 16, out: object = rs.Shard(0), w: object = rs.Shard(1), factor: float = 0.5,
         name: str = "y") -> rs.Fusion:
    """``scale(x @ w)``: each argument changes one part of the Fusion (a shape, a placement, an
    op attribute, a name)."""
    f = rs.Fusion()
    x = f.input("x", (n, 32), "float32", MESH, [rs.Shard(0)])
    wt = f.input("w", (32, 32), "float32", MESH, [w])
    f.output(f.scale(f.matmul(x, wt), factor, name=name), [out])
    return f


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "plans"
    monkeypatch.setenv(plan_cache.ENV, str(d))
    return d


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the e-graphs built (``Saturated.build`` calls): a hit builds none."""
    calls: list[int] = []
    build = Saturated.build

    def counting(*args: object, **kwargs: object) -> Saturated:
        calls.append(1)
        return build(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Saturated, "build", staticmethod(counting))
    return calls


def files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def _tail(plan: rs.Plan) -> str:
    """The explanation without its first line (the report: seconds, and whether cached)."""
    return plan.explain().split("\n", 1)[1]


def test_the_second_optimize_is_a_hit_and_does_not_plan(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = rs.optimize(P.mlp())
    assert not fresh.report.cached and "plan cache" not in str(fresh.report)
    assert len(files(cache_dir)) == 1 and files(cache_dir)[0].endswith(".pkl")

    def no_planning(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cache hit must not plan")

    monkeypatch.setattr(Saturated, "build", staticmethod(no_planning))
    seen: list[object] = []
    hit = rs.optimize(P.mlp(), progress=seen.append)  # an equal Fusion, built again
    assert hit.report.cached and "from the plan cache" in str(hit.report)
    assert not seen  # no progress reports on a hit
    assert hit.digest() == fresh.digest() and hit.cost == fresh.cost and hit.comm_bytes == fresh.comm_bytes
    assert _tail(hit) == _tail(fresh)  # the alternatives were priced before storing
    assert "from the plan cache" in hit.explain().split("\n", 1)[0]


@pytest.mark.multiproc
def test_equal_programs_have_equal_keys_in_another_process() -> None:
    """The key is a canonical form, not an object identity or a per-process hash."""
    def key() -> str | None:
        return plan_cache.key(P.mlp(), rs.CostProfile.load("h100x1"), rs.Limits(), {"extractor": "greedy"})

    code = textwrap.dedent("""
        import reshard as rs
        from reshard import plan_cache
        from reshard.testing import programs as P
        print(plan_cache.key(P.mlp(), rs.CostProfile.load("h100x1"), rs.Limits(), {"extractor": "greedy"}))
    """)
    env = child_env(ROOT, PYTHONHASHSEED="12345")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert key() is not None and r.stdout.split() == [key()]


@pytest.mark.parametrize("change", [
    dict(fusion=prog(n=24)), dict(fusion=prog(w=rs.Replicate())), dict(fusion=prog(out=rs.Replicate())),
    dict(fusion=prog(factor=0.25)), dict(fusion=prog(name="z")),
    dict(profile=rs.CostProfile.load({"hbm_gbps": 1000.0})), dict(profile=rs.CostProfile.load("h100x1")),
    dict(limits=rs.Limits(max_iterations=7)), dict(limits=rs.Limits(time_limit_s=30.0)),
    dict(options={"extractor": "windows"}), dict(options={"ilp_time_limit_s": 5.0}),
    dict(options={"memory_budget": 1 << 20}), dict(options={"comm_budget": 1 << 20}),
], ids=["shape", "input-placement", "output-placement", "op-attr", "name", "profile-field", "profile-named",
        "limits-iterations", "limits-time", "extractor", "ilp-time", "memory-budget", "comm-budget"])
def test_every_part_of_the_key_changes_it(change: dict) -> None:
    base = dict(fusion=prog(), profile=rs.CostProfile(), limits=rs.Limits(),
                options={"extractor": "greedy", "ilp_time_limit_s": 30.0, "memory_budget": None, "comm_budget": None})
    other = {**base, **change}
    if "options" in change:
        other["options"] = {**base["options"], **change["options"]}
    assert plan_cache.key(**base) == plan_cache.key(**{**base, "fusion": prog()})  # equal parts, equal keys
    assert plan_cache.key(**other) != plan_cache.key(**base)


@pytest.mark.parametrize("variant", [
    lambda: rs.optimize(prog(n=24)), lambda: rs.optimize(prog(out=rs.Replicate())),
    lambda: rs.optimize(prog(factor=0.25)), lambda: rs.optimize(prog(), cost_profile="h100x1"),
    lambda: rs.optimize(prog(), limits=rs.Limits(max_iterations=7)),
], ids=["shape", "placement", "op-attr", "profile", "limits"])
def test_a_different_program_profile_or_option_plans_again(cache_dir: Path, planned: list[int], variant) -> None:
    rs.optimize(prog())
    assert rs.optimize(prog()).report.cached and len(planned) == 1
    plan = variant()
    assert not plan.report.cached and len(planned) == 2
    assert len(files(cache_dir)) == 2


@pytest.mark.parametrize("off", ["off", "0", "OFF"])
def test_the_environment_turns_the_cache_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planned: list[int],
                                             off: str) -> None:
    monkeypatch.setenv(plan_cache.ENV, off)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # where the default directory would be
    monkeypatch.setenv("HOME", str(tmp_path))
    for _ in range(2):
        assert not rs.optimize(P.mlp()).report.cached
    assert len(planned) == 2 and not any(tmp_path.iterdir())


def test_cache_false_neither_reads_nor_writes(cache_dir: Path, planned: list[int]) -> None:
    rs.optimize(P.mlp(), cache=False)
    assert files(cache_dir) == []
    rs.optimize(P.mlp())  # stored
    stored = files(cache_dir)
    assert len(stored) == 1
    plan = rs.optimize(P.mlp(), cache=False)  # not read
    assert not plan.report.cached and len(planned) == 3 and files(cache_dir) == stored


def test_cache_must_be_a_bool_or_none(cache_dir: Path) -> None:
    with pytest.raises(rs.ReshardError, match="cache must be True, False or None"):
        rs.optimize(P.mlp(), cache="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "another-key", "empty"])
def test_a_corrupt_cache_file_is_a_miss_not_an_error(cache_dir: Path, planned: list[int], damage: str) -> None:
    fresh = rs.optimize(P.mlp())
    (path,) = cache_dir.iterdir()
    data = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not a pickle")
    elif damage == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "another-key":  # a valid file under a name that is not its key
        other = rs.optimize(prog())
        (moved,) = set(cache_dir.iterdir()) - {path}
        os.replace(moved, path)
        assert other.digest() != fresh.digest()
    else:
        path.write_bytes(b"")
    again = rs.optimize(P.mlp())  # the file is ignored (removed), the plan made and stored again
    assert not again.report.cached and again.digest() == fresh.digest()
    assert rs.optimize(P.mlp()).report.cached


def test_an_unwritable_directory_warns_and_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(plan_cache.ENV, str(blocker / "plans"))  # under a file: cannot be made
    with pytest.warns(UserWarning, match="plan cache: could not write"):
        plan = rs.optimize(P.mlp())
    assert not plan.report.cached


def test_a_plan_the_clock_cut_is_not_stored(cache_dir: Path) -> None:
    plan = rs.optimize(P.mlp(), limits=rs.Limits(time_limit_s=0.001))
    assert plan.report.cut and files(cache_dir) == []


def test_a_fusion_part_without_a_canonical_form_is_not_cached(cache_dir: Path) -> None:
    f = prog()
    f.ops[-1].attrs["note"] = object()  # no stable serialization: never a wrong hit
    assert plan_cache.key(f, rs.CostProfile(), rs.Limits(), {}) is None
    rs.optimize(f)
    assert files(cache_dir) == []


def test_the_default_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(plan_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert plan_cache.directory(None) == tmp_path / "xdg" / "reshard" / "plans"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert plan_cache.directory(None) == tmp_path / ".cache" / "reshard" / "plans"
    monkeypatch.setenv(plan_cache.ENV, "~/plans")
    assert plan_cache.directory(None) == tmp_path / "plans"
    monkeypatch.setenv(plan_cache.ENV, "off")
    assert plan_cache.directory(None) is None and plan_cache.directory(False) is None
    assert plan_cache.directory(True) == tmp_path / ".cache" / "reshard" / "plans"


def test_a_cached_training_plan_computes_what_the_fresh_one_does(cache_dir: Path) -> None:
    f = P.training_block()
    fresh = rs.optimize(f, memory_budget=1 << 20)
    hit = rs.optimize(P.training_block(), memory_budget=1 << 20)
    assert hit.report.cached and hit.digest() == fresh.digest() and hit.saved_bytes == fresh.saved_bytes
    inputs = P.random_inputs(f)
    want = fresh.simulate(inputs, generator=torch.Generator().manual_seed(0))
    got = hit.simulate(inputs, generator=torch.Generator().manual_seed(0))
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    P.assert_plan_matches_reference(hit, f, inputs)


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def test_plan_training_of_the_same_module_is_a_hit(cache_dir: Path, planned: list[int]) -> None:
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))

    def plan() -> rs.TrainingPlan:
        return rs.plan_training(Classifier(), (x,), MESH, loss_fn=F.cross_entropy, example_targets=(y,),
                                param_placements={"fc1.weight": [rs.Shard(0)], "fc2.weight": [rs.Shard(1)]})

    fresh, hit = plan(), plan()
    assert not fresh.plan.report.cached and hit.plan.report.cached and len(planned) == 1
    assert hit.plan.digest() == fresh.plan.digest()
    model = rs.parallelize(Classifier(), plan=hit, simulate=True)
    eager = Classifier()
    torch.testing.assert_close(model(x, targets=y), F.cross_entropy(eager(x), y), rtol=1e-5, atol=1e-6)


def _optimize_mlp(conn) -> None:
    """A forked child: optimize ``P.mlp()`` (in a fresh interpreter: the parent used egglog)."""
    try:
        plan = rs.optimize(P.mlp())
        conn.send((plan.report.cached, plan.digest()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(repr(e))


@pytest.mark.multiproc
def test_a_plan_made_in_a_fresh_process_is_stored_under_the_callers_key(cache_dir: Path, planned: list[int]) -> None:
    """After fork() optimize() runs in a fresh interpreter, whose time limit is what is left of
    the caller's: the plan is stored by the caller, under the caller's key."""
    from tests.search.test_bounded import _from_forked_child
    rs.optimize(prog(), cache=False)  # the parent uses egglog
    got = _from_forked_child(_optimize_mlp, (), 120, "the forked child did not finish optimize() in 120 s")
    assert isinstance(got, tuple) and got[0] is False, got
    assert len(files(cache_dir)) == 1
    hit = rs.optimize(P.mlp())
    assert hit.report.cached and hit.digest() == got[1] and len(planned) == 1
