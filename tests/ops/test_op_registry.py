"""The op registry's coverage: every op kind has a reference (its CPU step unless it overrides
``local``), the hooks of a generated kernel come in pairs, and the kinds without a generated
kernel or without a backward are listed here, each with its reason, so that a new op kind is
either given them or added to a list on purpose."""

from __future__ import annotations

from reshard.ir.ops import OPS

#: op kinds whose GPU step is not a generated kernel, and what runs instead
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
    "attention_grad": "torch's fused SDPA backward kernels",
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


def test_every_op_kind_but_input_has_a_reference():
    missing = sorted(k for k, op in OPS.items() if not op.declares("reference") and k != "input")
    assert not missing, f"op kinds without a reference: {missing}"


def test_kernel_hooks_come_in_pairs():
    odd = sorted(k for k, op in OPS.items() if op.declares("gpu_supported") != op.declares("gpu_run"))
    assert not odd, f"op kinds with only one of gpu_supported / gpu_run: {odd}"


def test_the_kinds_without_a_generated_kernel_are_listed():
    without = {k for k, op in OPS.items() if not op.declares("gpu_run")}
    assert without == set(WITHOUT_KERNEL), (
        f"not listed: {sorted(without - set(WITHOUT_KERNEL))}; listed but have a kernel or no longer exist: "
        f"{sorted(set(WITHOUT_KERNEL) - without)}")


def test_the_kinds_without_a_backward_are_listed():
    without = {k for k, op in OPS.items() if not op.declares("vjp")}
    assert without == set(WITHOUT_BACKWARD), (
        f"not listed: {sorted(without - set(WITHOUT_BACKWARD))}; listed but have a vjp or no longer exist: "
        f"{sorted(set(WITHOUT_BACKWARD) - without)}")
