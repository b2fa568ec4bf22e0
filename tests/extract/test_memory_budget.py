"""``optimize(..., memory_budget=B)``: bytes per rank of saved activations (forward buffers the
backward pass reads).  Without a budget the plan keeps what is cheaper to keep; with one,
extraction prices kept bytes (``extract.memory``) and the plan recomputes or keeps values
sharded until it fits, measured by the simulator; an impossible budget says the minimum."""

from __future__ import annotations

import re

import pytest

import reshard as rs
from reshard.plan_view import recomputed
from reshard.plan import Saturated
from reshard.testing import programs as P


def training_mlp(s: int = 16, h: int = 32) -> rs.Fusion:
    """The Megatron MLP's forward, ``grad_seed`` of its output, and backward-like matmuls
    reading x, w1, w2, a = x @ w1 and h = gelu(a) through ``saved``."""
    f = rs.Fusion()
    x = f.input("x", (s, h), "float32", P.MESH1, [rs.Shard(0)])
    w1 = f.input("w1", (h, 4 * h), "float32", P.MESH1, [rs.Shard(1)])
    w2 = f.input("w2", (4 * h, h), "float32", P.MESH1, [rs.Shard(0)])
    a = f.matmul(x, w1, name="a")
    hh = f.gelu(a, name="h")
    y = f.matmul(hh, w2, name="y")
    gy = f.grad_seed(y, name="gy")
    xs, w1s, w2s, as_, hs = (f.saved(t, name=f"{t.name}.saved") for t in (x, w1, w2, a, hh))
    gh = f.matmul(gy, f.permute(w2s, (1, 0)), name="gh")
    ga = f.mul(gh, f.tanh(as_), name="ga")
    f.output(y, [rs.Shard(0)])
    f.output(f.matmul(f.permute(xs, (1, 0)), ga, name="grad.w1"), [rs.Shard(1)])
    f.output(f.matmul(f.permute(hs, (1, 0)), gy, name="grad.w2"), [rs.Shard(0)])
    f.output(f.matmul(ga, f.permute(w1s, (1, 0)), name="grad.x"), [rs.Shard(0)])
    return f


@pytest.fixture(scope="module")
def mlp() -> Saturated:
    return Saturated.build(training_mlp(), rs.CostProfile(), rs.Limits())


def measured(plan: rs.Plan, f: rs.Fusion) -> int:
    """The simulator's peak of saved activations (every rank), after checking the outputs."""
    stats: dict = {}
    inputs = P.random_inputs(f, seed=2)
    P.assert_plan_matches_reference(plan, f, inputs)
    plan.simulate(inputs, stats=stats)
    peaks = set(stats["saved_peak_bytes"].values())
    assert len(peaks) == 1
    return peaks.pop()


def _recomputed(plan: rs.Plan) -> set[str]:
    return {plan.fusion.tensors[n.value].name for n in plan.lowered.nodes if recomputed(plan, n)}


def test_without_a_budget_the_plan_keeps(mlp):
    plan = mlp.plan()
    assert _recomputed(plan) == set() and plan.extraction.multiplier is None
    # a and h kept (sharded on their columns: 4 kB each), x gathered for the forward (2 kB) and
    # y gathered for the seed (2 kB)
    assert plan.saved_bytes == plan.extraction.kept_bytes == measured(plan, mlp.fusion) == 12288
    assert mlp.plan(memory_budget=12288).digest() == plan.digest()


def test_a_tight_budget_recomputes_and_the_measured_peak_fits(mlp):
    free = mlp.plan()
    plan = mlp.plan(memory_budget=4096)
    assert "h.saved" in _recomputed(plan)  # gelu run again in the backward pass on the saved a
    assert measured(plan, mlp.fusion) == plan.saved_bytes <= 4096 < free.saved_bytes
    assert plan.cost > free.cost and plan.extraction.multiplier > 0
    assert f"ps per kept byte ({plan.saved_bytes} B kept)" in str(plan.extraction)
    assert "recomputed in the backward pass" in plan.explain()


def test_the_budget_shards_a_saved_activation_and_the_backward_gathers_it(mlp):
    """With no room for the gathered x the forward reads, the plan keeps x as fed (sharded,
    counting nothing) and gathers x.saved in the backward pass: the saved activation's sharding
    differs from the one the forward pass used."""
    plan = mlp.plan(memory_budget=2048)
    x_forward = {str(n.sharding) for n in plan.lowered.nodes if plan.fusion.tensors[n.value].name == "x"}
    gathered = [n for n in plan.lowered.nodes
                if n.head.form == "allgather" and plan.fusion.tensors[n.value].name == "x.saved"]
    assert "[R]" in x_forward and gathered and str(gathered[0].args[0].sharding) == "[S(0)]"
    assert measured(plan, mlp.fusion) == plan.saved_bytes <= 2048


def test_an_impossible_budget_says_the_minimum(mlp):
    with pytest.raises(rs.ReshardError, match=r"memory_budget=100 bytes per rank .* give at least (\d+)") as e:
        mlp.plan(memory_budget=100)
    least = int(re.search(r"give at least (\d+)", str(e.value)).group(1))
    assert 100 < least < 2048  # the seed reads y at its output sharding: [S(0)], 1 kB
    plan = mlp.plan(memory_budget=least)
    assert measured(plan, mlp.fusion) == plan.saved_bytes == least
    assert {"a.saved", "h.saved"} <= _recomputed(plan)


def test_optimize_takes_the_budget():
    f = training_mlp(8, 16)
    free = rs.optimize(f)
    plan = rs.optimize(f, memory_budget=free.saved_bytes // 2)
    assert measured(plan, f) <= free.saved_bytes // 2


@pytest.mark.parametrize("budget", [-1, 1.5, "1kB", True])
def test_bad_budgets_raise(mlp, budget):
    with pytest.raises(rs.ReshardError, match="memory_budget must be a non-negative int"):
        mlp.plan(memory_budget=budget)


def test_a_budget_on_a_program_without_saved_ops_keeps_its_plan():
    f = P.mlp()
    assert rs.optimize(f, memory_budget=0).digest() == rs.optimize(f).digest()


def test_a_joint_from_autodiff_meets_a_budget_with_exact_gradients():
    """``passes.autodiff.joint`` of the Megatron MLP (gelu(x @ w1 + b1) @ w2, tp 2) saves only what
    its vjps read; ``optimize`` with a budget first gives every forward value a recompute reads a
    saved twin (``passes.recompute``), and a
    quarter of the time-only plan's bytes fits: values are recomputed from the kept inputs and
    parameters, and the gradients are still torch.autograd's."""
    import torch

    from reshard.passes.autodiff import joint
    from reshard.testing.autodiff_oracle import torch_grads
    from tests.train.test_autodiff_plans import M2, _values, megatron_mlp

    f, loss = megatron_mlp(M2, [rs.Replicate()], [rs.Shard(1)], [rs.Shard(0)])
    j = joint(f, loss)
    free = rs.optimize(j.fusion)
    budget = free.saved_bytes // 4
    plan = rs.optimize(j.fusion, memory_budget=budget)
    assert len(plan.fusion.ops) > len(j.fusion.ops) and _recomputed(plan)
    inputs, stats = _values(f), {}
    outs = plan.simulate(inputs, stats=stats)
    assert max(stats["saved_peak_bytes"].values()) == plan.saved_bytes <= budget
    for got, want in zip(outs[len(f.outputs):], torch_grads(f, loss, inputs, list(j.grads))):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
