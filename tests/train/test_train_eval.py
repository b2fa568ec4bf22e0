"""Evaluation through a ``ParallelModule``: a call under ``torch.no_grad()`` or
``torch.inference_mode()`` runs the forward-only plan (``TrainingPlan.forward_only``: the loss
alone, made on the first such call and kept), returns eager's loss and leaves every ``.grad``
as it was (every rank simulated here; over gloo processes in ``tests/train/test_train_torchrun.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import reshard as rs
from tests.train.test_train_loss_fn import Classifier, batch, plan


def test_no_grad_call_runs_the_loss_alone() -> None:
    tp = plan()
    model = rs.parallelize(Classifier(), plan=tp, simulate=True)
    eager = Classifier()
    x, y = batch(3)
    with torch.no_grad():
        loss = model(x, targets=y)
        want = F.cross_entropy(eager(x), y)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=0)
    assert loss.grad_fn is None and not loss.requires_grad
    assert all(p.grad is None for p in model.parameters())
    ev = model.eval_plan
    assert ev is not None and ev.grads == {} and len(ev.plan.lowered.outputs) == 1 and ev.plan.saved_bytes == 0
    assert len(tp.plan.lowered.outputs) == 1 + len(tp.grads) and tp.plan.saved_bytes > 0  # training's: both passes
    assert len(ev.plan.lowered.nodes) < len(tp.plan.lowered.nodes)


def test_no_grad_leaves_grads_and_plan_is_kept() -> None:
    """Gradients of a training call stay as they were through evaluation calls (no_grad and
    inference_mode, one forward-only plan for both), and a later training call still trains."""
    model = rs.parallelize(Classifier(), plan=plan(), simulate=True)
    x, y = batch(0)
    model(x, targets=y).backward()
    grads = {n: p.grad.clone() for n, p in model.module.named_parameters()}
    x1, y1 = batch(1)
    with torch.no_grad():
        first = model(x1, targets=y1)
    ev = model.eval_plan
    with torch.inference_mode():
        again = model(x1, targets=y1)
    assert model.eval_plan is ev and float(again) == float(first)
    for n, p in model.module.named_parameters():
        assert torch.equal(p.grad, grads[n]), n
    model(x, targets=y).backward()  # accumulates: twice the first gradients
    for n, p in model.module.named_parameters():
        torch.testing.assert_close(p.grad, 2 * grads[n])
