"""Lookups by integer index: ``embedding``, ``gather`` (one index per row: ``pick``) and the
classification losses.

``cross_entropy_loss`` (class indices, mean / sum / none, ``ignore_index``) is
``logsumexp(x) - pick(x, target)`` per row: the max, the sum of exponentials and the picked
target logit are each a reduction over the class dim, so logits sharded along the vocabulary
stay sharded (local max and sum-exp reduced across the shards, the picked logit a masked
local lookup: Megatron's vocab-parallel cross entropy), as the e-graph chooses by cost.
Rows whose target is ``ignore_index`` pick class 0 and count 0 (``where``); ``mean``
divides by the number of the other rows.  ``nll_loss`` is the same on log-probabilities
without the logsumexp.
"""

from __future__ import annotations

from typing import Any

from ..ir.fusion import Tensor
from .converter import Converter, op

#: aten's reduction enum
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


@op("embedding")
def _embedding(cv: Converter, n: Any, a: dict) -> Tensor:
    """``padding_idx`` (aten's -1: none) only changes the gradient: that row's stays 0."""
    w = cv.tensor(a["weight"], "weight")
    ids = cv.cast(cv.tensor(a["indices"], "indices"), "int64")
    if cv.train and a.get("scale_grad_by_freq"):
        raise cv.fail(f"unsupported op {n.target} with scale_grad_by_freq=True when training")
    pad = a.get("padding_idx", -1)
    return cv.f.embedding(w, ids, padding_idx=None if pad is None or pad < 0 else pad)


def _class_loss(cv: Converter, n: Any, a: dict, log_probs: bool) -> Tensor:
    """-log p(target) per row (``log_probs``: ``self`` holds log p, else logits), masked by
    ``ignore_index`` and reduced."""
    f = cv.f
    if a.get("weight") is not None:
        raise cv.fail(f"unsupported op {n.target} with class weights")
    if a.get("label_smoothing", 0.0) not in (0, 0.0, None):
        raise cv.fail(f"unsupported op {n.target} with label_smoothing={a['label_smoothing']}")
    x = cv.tensor(a["self"], "input")
    t = cv.tensor(a["target"], "target")
    if not t.dtype.startswith("int"):
        raise cv.fail(f"{n.target} with class probabilities (a float target) is not supported; give class indices")
    x, t = cv.cast(x, cv.out_dtype()), cv.cast(t, "int64")
    if len(x.shape) == 1:  # one sample: [C], target 0-dim
        x, t = cv.reshape(x, (1,) + x.shape), cv.reshape(t, (1,))
    elif len(x.shape) > 2:  # [N, C, d1, ...]: classes last
        x = f.movedim(x, 1, -1)
    rows = t.shape
    valid = f.ne(t, cv.operand(int(a["ignore_index"]), rows, "int64"))
    picked = f.pick(x, f.where(valid, t, cv.operand(0, rows, "int64")))
    if log_probs:
        loss = f.neg(picked)
    else:
        lse, _ = cv.logsumexp(x, -1)
        loss = f.sub(lse, picked)
    loss = f.where(valid, loss, cv.operand(0.0, rows, loss.dtype))
    reduction = _REDUCTIONS.get(a.get("reduction", 1))
    if reduction == "none":
        return cv.reshape(loss, cv.out_shape())
    dims = tuple(range(len(rows)))
    total, _ = cv.reduce("sum", loss, dims)
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise cv.fail(f"unsupported op {n.target} with reduction={a.get('reduction')!r}")
    count, _ = cv.reduce("sum", cv.cast(valid, loss.dtype), dims)
    return f.div(total, count)


@op("cross_entropy_loss")
def _cross_entropy(cv: Converter, n: Any, a: dict) -> Tensor:
    return _class_loss(cv, n, a, log_probs=False)


@op("nll_loss", "nll_loss_nd")
def _nll_loss(cv: Converter, n: Any, a: dict) -> Tensor:
    return _class_loss(cv, n, a, log_probs=True)


@op("gather")
def _gather(cv: Converter, n: Any, a: dict) -> Tensor:
    """``gather(x, dim, index)`` with one index per row (index extent 1 along ``dim``, the
    other dims x's): ``pick`` along ``dim`` (what a decomposed nll_loss reads)."""
    x, index = cv.tensor(a["self"], "input"), cv.tensor(a["index"], "index")
    d = a["dim"] % len(x.shape)
    rows = x.shape[:d] + x.shape[d + 1:]
    if index.shape != x.shape[:d] + (1,) + x.shape[d + 1:]:
        raise cv.fail(f"unsupported op {n.target} with index {index!r} of {x!r} along dim {d} (only one index per "
                      "row, the other dims as the input's)")
    last = len(x.shape) - 1
    if d != last:
        x, index = cv.f.movedim(x, d, last), cv.f.movedim(index, d, last)
    picked = cv.f.pick(x, cv.reshape(cv.cast(index, "int64"), rows))
    return cv.reshape(picked, cv.out_shape())
