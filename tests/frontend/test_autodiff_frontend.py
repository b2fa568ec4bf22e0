"""The converter's ``train`` flag: softmax's and logsumexp's max are read through ``f.detach``
(their gradients through it are zero: ``joint`` then matches torch.autograd without forming
them), and ``aten.detach`` is ``f.detach``; without the flag the Fusion is unchanged."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.frontend.converter import OPS, Converter
from reshard.passes.autodiff import joint
from reshard.testing.autodiff_oracle import check_joint, loss_weights, weighted_loss

M2 = rs.DeviceMesh([0, 1], ("tp",))


def _softmax_and_logsumexp(train: bool) -> tuple[rs.Fusion, object]:
    cv = Converter(M2, train=train)
    x = cv.f.input("x", (3, 5), "float64", M2, [rs.Replicate()])
    p = cv.softmax(x, -1)
    lse, _ = cv.logsumexp(x, 1)
    return cv.f, weighted_loss(cv.f, [p, lse])


@pytest.mark.parametrize("train", [False, True])
def test_the_shift_is_detached_for_training_and_for_the_forward(train):
    """The max softmax and logsumexp subtract is read through ``f.detach`` in either mode: a forward
    program that ``joint`` differentiates later forms no gradient of it either."""
    f, _ = _softmax_and_logsumexp(train)
    assert sum(op.kind == "detach" for op in f.ops) == 2


@pytest.mark.parametrize("train", [False, True])
def test_softmax_and_logsumexp_gradients_match_torch(train):
    f, loss = _softmax_and_logsumexp(train)
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    w = loss_weights(f, 1)
    j = check_joint(f, loss, {"x": x, **w}, ["x"], plan=True)
    # no gradient flows into the maxes (their vjp's tie mask is never built)
    assert not [op for op in j.fusion.ops[len(f.ops):] if op.kind == "binary" and op.attrs["fn"] == "eq"]
    # the loss is torch's softmax / logsumexp
    f.output(loss, [rs.Replicate()])
    want = (torch.softmax(x, -1) * w["_lw0"]).sum() + (torch.logsumexp(x, 1) * w["_lw1"]).sum()
    torch.testing.assert_close(rs.run_reference(f, {"x": x, **w})[-1], want.reshape(1))


@pytest.mark.parametrize("train", [False, True])
def test_aten_detach(train):
    cv = Converter(M2, train=train)
    x = cv.f.input("x", (3,), "float64", M2, [rs.Replicate()])
    y = OPS["detach"](cv, None, {"self": x})
    assert (cv.f.ops[-1].kind == "detach") == train and (y is x) != train
    if train:
        loss = cv.f.reshape(cv.f.sum(cv.f.reshape(cv.f.mul(cv.f.exp(y), x), (1, 3)), 1), (1,))
        j = joint(cv.f, loss, ["x"])
        value = torch.randn(3, dtype=torch.float64)
        (grad,) = rs.run_reference(j.fusion, {"x": value})
        torch.testing.assert_close(grad, value.exp())  # d/dx (exp(detach(x)) * x) = exp(x)
