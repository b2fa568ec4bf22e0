"""The per-op sweep: every op kind's example (``reshard.testing.op_examples``), each test's id the
op kind (``pytest tests/ops -k pad`` runs pad's):

* its plans (the chosen one and random extractions of the same e-graph) on a 1-D and a 2-D mesh,
  with random input shardings (Partial operands where the op keeps a Partial), simulated
  against ``run_reference``;
* for a kind with a backward, the joint Fusion's gradients against torch.autograd through the
  ops' references;
* for a kind with a generated kernel, every kernel its chosen plans launch compiled by NVRTC for
  sm_90 (no GPU needed; skipped without ``cuda.core``).

Plans are built once per module and shared by the oracle and kernel checks."""

from __future__ import annotations

import random

import pytest
import torch

import reshard as rs
from reshard.codegen.fuse import ELEMENTWISE
from reshard.codegen.kernels import KernelSource
from reshard.ir.ops import OPS
from reshard.plan import Saturated
from reshard.runtime.gpu_local import has_kernel, step_kernels
from reshard.runtime.local_ops import run_local
from reshard.runtime.simulator import simulate
from reshard.testing.autodiff_oracle import check_joint, loss_weights, weighted_loss
from reshard.testing.kernel_check import assert_cubin, kernel_cache  # noqa: F401
from reshard.testing.op_examples import EXAMPLES, example_fusion, example_inputs, float_input_operands, op_of
from reshard.testing.op_oracle import MESH1, MESH2, assert_same

KINDS = sorted(EXAMPLES)
MESHES = {"1d": MESH1, "2d": MESH2}
#: random extractions per e-graph, beside the chosen plan
RANDOM_PLANS = 2


#: kinds with a backward, but for a stand-in (``stands_for``: its result is read by nothing, its
#: vjp is the kind it subclasses, swept there)
WITH_VJP = [k for k in KINDS if OPS[k].declares("vjp") and not OPS[k].declares("stands_for")]
WITH_KERNEL = [k for k in KINDS if has_kernel(k)]

#: kinds that lower to no ``apply`` step of their own, and what they lower to
WITHOUT_APPLY_STEP = {"redistribute": "collectives and local reshards"}

#: (kind, mesh) -> (the example with random shardings, its plans: the chosen one first)
_PLANS: dict[tuple[str, str], tuple[rs.Fusion, list[rs.Plan]]] = {}


def plans_of(kind: str, mesh: str) -> tuple[rs.Fusion, list[rs.Plan]]:
    """``kind``'s example on ``mesh`` with random shardings, and its plans (built once)."""
    if (kind, mesh) not in _PLANS:
        f = example_fusion(kind, MESHES[mesh], seed=0)
        sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
        rng = random.Random(0)
        _PLANS[kind, mesh] = f, [sat.plan(), *(sat.plan(perturb=rng) for _ in range(RANDOM_PLANS))]
    return _PLANS[kind, mesh]


def test_every_op_kind_has_an_example():
    assert set(EXAMPLES) == set(OPS) - {"input"}, (
        f"without an example: {sorted(set(OPS) - set(EXAMPLES) - {'input'})}; "
        f"examples of no op kind: {sorted(set(EXAMPLES) - set(OPS))}")
    assert set(WITHOUT_APPLY_STEP) <= set(OPS)


@pytest.mark.parametrize("mesh", sorted(MESHES))
@pytest.mark.parametrize("kind", KINDS)
def test_plans_match_the_reference(kind, mesh):
    f, plans = plans_of(kind, mesh)
    if OPS[kind].keeps(op_of(f, kind)):  # a linear op is planned with Partial operands
        operands = [t for t in f.tensors if t.name in float_input_operands(f, kind)]
        assert operands and all(t.sharding.partial_axes for t in operands), f"{kind}: no Partial operand"
    for seed, plan in enumerate(plans):
        inputs = example_inputs(f, seed)
        refs = rs.run_reference(f, inputs)
        outs = plan.simulate(inputs, generator=torch.Generator().manual_seed(seed + 100))
        for got, want in zip(outs, refs, strict=True):
            assert_same(got, want)


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in WITHOUT_APPLY_STEP])
def test_some_plan_runs_the_op(kind):
    """The oracle above ran the op itself: some plan of its example has an apply step of its kind."""
    fops = {s.attr("fop") for mesh in MESHES for plan in plans_of(kind, mesh)[1] for s in plan.steps
            if s.attr("op") == "apply"}
    assert kind in fops, f"no plan of {kind}'s example runs it: {sorted(map(str, fops))}"


@pytest.mark.parametrize("kind", WITH_VJP)
def test_vjp_matches_autograd(kind):
    """The joint Fusion of the example (float64, replicated: the reference runs it) against
    torch.autograd through the ops' references."""
    f = example_fusion(kind, MESH1, "float64")
    loss = weighted_loss(f, [f.tensors[t] for t, _ in f.outputs])
    check_joint(f, loss, {**example_inputs(f, 0), **loss_weights(f, 1)})


@pytest.mark.parametrize("kind", WITH_KERNEL)
def test_kernels_compile(kind, kernel_cache):  # noqa: F811
    """The kernels of the chosen plans on both meshes (``step_kernels``: every variant a step
    may launch), some of them a step of ``kind``'s, each compiled by NVRTC."""

    kernels: dict[str, KernelSource] = {}
    of_kind: set[str] = set()

    def record(step, env, rank):
        ks = step_kernels(step, env, rank)
        kernels.update((k.name, k) for k in ks)
        if step.attr("fop") == kind or (step.attr("fop") == "pointwise" and kind in ELEMENTWISE):
            of_kind.update(k.name for k in ks)
        return run_local(step, env, rank)

    for mesh in MESHES:
        f, plans = plans_of(kind, mesh)
        simulate(plans[0].program, plans[0].shard_inputs(example_inputs(f, 0)), record)
    assert of_kind, f"no kernel for a step of {kind} in its plans"
    for ks in kernels.values():
        assert_cubin(ks)
