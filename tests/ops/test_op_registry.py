"""The registries' coverage, op by op: every op kind has a reference and a CPU step (its
registered one, ``runtime.cpu_steps``, else the reference on the step's attributes), each
registered step attributes (``codegen.step_attrs``), CPU step and GPU step
(``runtime.gpu_steps``) is of a registered op kind, and the kinds without a GPU step or
without a backward are listed here, each with its reason, so that a new op kind is either
given them or added to a list on purpose."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from reshard.codegen.pointwise_ops import INSTRUCTIONS
from reshard.codegen.step_attrs import STEP_ATTRS
from reshard.ir.ops import OPS
from reshard.ir.ops.elementwise import Pointwise
from reshard.runtime.cpu_steps import CPU_STEPS
from reshard.runtime.gpu_steps import GPU_STEPS

#: op kinds without a GPU step (``runtime.gpu_steps``): what runs on a GPU instead
WITHOUT_KERNEL = {
    "input": "no step: its value is given",
    "redistribute": "lowered to collectives and local reshards, never an apply step",
    "reshape": "a view, or a copy by the remap kernels of local reshards",
    "detach": "the identity: a view",
    "saved": "the identity: a view",
    "unbucket": "a view of its bucket",
    "alternative": "stands for its value: a view",
    "matmul": "cuBLAS (torch.matmul)",
    "attention": "torch's fused SDPA kernels",
    "linear_max": "chunked cuBLAS matmuls and torch reductions",
    "linear_sumexp": "chunked cuBLAS matmuls and torch reductions",
    "linear_sumexp_grad": "chunked cuBLAS matmuls",
    "cumsum": "torch.cumsum",
    "along": "torch's gather / scatter along a dim",
    "complex_mul": "torch ops on the pairs of reals",
}

#: op kinds without a ``vjp``, and why none is needed
WITHOUT_BACKWARD = {
    "attention_grad": "made by attention's vjp; a program is differentiated once",
    "linear_sumexp_grad": "made by linear_sumexp's vjp",
    "linear_max": "the cross entropy reads the max through detach",
    "alternative": "made by the attention rules after autodiff",
}


def test_every_op_kind_but_input_has_a_reference_and_a_cpu_step():
    missing = sorted(k for k, op in OPS.items() if not op.declares("reference") and k != "input")
    assert not missing, f"op kinds without a reference: {missing}"
    no_step = sorted(k for k, op in OPS.items()
                     if k != "input" and k not in CPU_STEPS and not op.declares("reference"))
    assert not no_step, f"op kinds without a CPU step: {no_step}"


def test_every_elementwise_op_kind_has_its_pointwise_kernel_instruction():
    elementwise = {k for k, op in OPS.items() if isinstance(op, Pointwise)}
    assert elementwise == set(INSTRUCTIONS), (
        f"without an instruction: {sorted(elementwise - set(INSTRUCTIONS))}; "
        f"instructions of no elementwise kind: {sorted(set(INSTRUCTIONS) - elementwise)}")


@pytest.mark.parametrize("what,registry", [("step attributes", STEP_ATTRS), ("CPU steps", CPU_STEPS),
                                           ("GPU steps", GPU_STEPS)])
def test_every_registered_step_is_of_a_registered_op_kind(what: str, registry: Mapping[str, object]) -> None:
    stale = sorted(set(registry) - set(OPS))
    assert not stale, f"{what} of unknown op kinds: {stale}"


def test_the_kinds_without_a_gpu_step_are_listed():
    without = set(OPS) - set(GPU_STEPS)
    assert without == set(WITHOUT_KERNEL), (
        f"not listed: {sorted(without - set(WITHOUT_KERNEL))}; listed but have a GPU step or no longer exist: "
        f"{sorted(set(WITHOUT_KERNEL) - without)}")


def test_the_kinds_without_a_backward_are_listed():
    without = {k for k, op in OPS.items() if not op.declares("vjp")}
    assert without == set(WITHOUT_BACKWARD), (
        f"not listed: {sorted(without - set(WITHOUT_BACKWARD))}; listed but have a vjp or no longer exist: "
        f"{sorted(set(WITHOUT_BACKWARD) - without)}")
