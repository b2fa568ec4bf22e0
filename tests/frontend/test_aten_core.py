"""PyTorch's core ATen operator set through ``from_torch`` on 2 ranks (issue 30; the sweep:
``reshard/testing/aten_core.py``, the coverage table: ``scripts/aten_coverage.py`` -> docs/ops.md).

Every core overload's module plans and matches eager, or is refused with a ``ReshardError``
naming it and saying it is unsupported; at least 90% plan.  Elementwise and reduction families
also plan with their first input sharded; a sample across the families trains against
autograd (the full backward sweep is the script's)."""

from __future__ import annotations

import pytest

from reshard.testing.aten_core import SAMPLES, Case, check_backward, check_forward, core_overloads, share

#: overloads checked with their first input sharded along dim 0
SHARDED = ["aten.exp.default", "aten.atanh.default", "aten.pow.Tensor_Tensor", "aten.fmod.Tensor",
           "aten.bitwise_xor.Tensor", "aten.amin.default", "aten.prod.dim_int", "aten.sum.dim_IntList",
           "aten.var.correction", "aten.gather.default", "aten.index_select.default", "aten.scatter_add.default",
           "aten.convolution.default", "aten.avg_pool2d.default", "aten.slice.Tensor"]
#: overloads trained against autograd, one or two per family the sweep added
TRAINED = ["aten.acos.default", "aten.tan.default", "aten.pow.Tensor_Tensor", "aten.fmod.Tensor",
           "aten.prod.dim_int", "aten.amin.default", "aten.gather.default", "aten.index.Tensor",
           "aten.scatter.src", "aten.index_put.default", "aten.convolution.default", "aten.avg_pool2d.default",
           "aten._adaptive_avg_pool2d.default", "aten.max_pool2d_with_indices.default",
           "aten.reflection_pad2d.default", "aten.upsample_bilinear2d.vec", "aten.diagonal.default",
           "aten.slice.Tensor", "aten._cdist_forward.default", "aten._native_batch_norm_legit_no_training.default",
           "aten.native_layer_norm_backward.default"]


def test_every_core_overload_has_a_case() -> None:
    assert set(SAMPLES) == set(core_overloads())
    assert len(SAMPLES) >= 189


@pytest.mark.slow
def test_core_aten_plans_or_is_refused_by_name() -> None:
    """The acceptance: >= 90% plan and match eager; each other overload is refused by name."""
    outcomes = [check_forward(name, case) for name, case in SAMPLES.items() if isinstance(case, Case)]
    assert len(outcomes) == len(SAMPLES)
    wrong = [(o.op, o.forward) for o in outcomes if o.forward not in ("ok", "unsupported")]
    assert not wrong
    assert share(outcomes) >= 0.9, sorted(o.op for o in outcomes if o.forward != "ok")


@pytest.mark.parametrize("name", SHARDED)
def test_sharded_first_input(name: str) -> None:
    case = SAMPLES[name]
    assert isinstance(case, Case)
    assert check_forward(name, case, sharded=True).forward == "ok"


@pytest.mark.parametrize("name", TRAINED)
def test_trains_like_autograd(name: str) -> None:
    case = SAMPLES[name]
    assert isinstance(case, Case)
    assert check_backward(name, case) == ("ok", "")
