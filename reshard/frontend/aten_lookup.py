"""Lookups by integer index: ``embedding``, ``_embedding_bag``, ``one_hot`` and the
classification losses (``gather`` and the other indexing ops: ``aten_indexing``).

``_embedding_bag`` (``F.embedding_bag``; sum and mean): index ``j``'s bag is the number of
``offsets`` at most ``j``, minus one (offsets ascend from 0; with ``include_last_offset`` the
final offset ends the last bag, and indices past it are in none); the rows ``embedding``
reads (times ``per_sample_weights``; 0 at ``padding_idx`` and outside every bag) are summed
into their bags by ``embedding_grad``; a mean is divided by its bag's count of those rows (an
empty bag's is 0).

``cross_entropy_loss`` (class indices, mean / sum / none, ``ignore_index``, class weights,
``label_smoothing``) is, per row with logits ``x`` over ``C`` classes, target ``t`` and
``lse = logsumexp(x)``, with ``w`` the class weights (all 1 without them):

    nll    = w[t] * (lse - x[t])
    smooth = lse * sum_c w_c - sum_c w_c * x_c        (= -sum_c w_c * log_softmax(x)_c;
                                                         unweighted: C * lse - sum_c x_c)
    loss   = (1 - eps) * nll + eps / C * smooth        (eps = label_smoothing; no smooth at 0)

The max, the sum of exponentials, the weighted class sum and the picked target logit are each
a reduction over the class dim, so logits sharded along the vocabulary stay sharded (local
partial reductions reduced across the shards, the picked logit a masked local lookup:
Megatron's vocab-parallel cross entropy), as the e-graph chooses by cost; ``w[t]`` is an
``embedding`` lookup in ``w`` viewed ``[C, 1]`` (a buffer or a constant: torch forms no
gradient for the weight, and torch.export refuses one that requires it).  Rows whose target is
``ignore_index`` look up class 0 and count 0 (``where``); ``mean`` divides the sum of the
rows' losses by the sum of ``w[t]`` over the other rows (without weights: their number), as
aten's ``nll_loss`` and ``cross_entropy_loss_label_smoothing`` do.

``lse - x[t]`` is written ``-x[t] + lse`` (the same float, bit for bit): lowering orders a plan's
steps depth first along operands, so the target logit is read before the logsumexp, whose
``exp(x - max)`` is then the logits' last reader and writes into their memory
(``codegen.alloc``): the loss holds one ``[tokens, vocab]`` buffer, not two (a smoothed loss
still reads ``x`` for its class sum after the exponentials).  ``nll_loss`` is ``nll``
on log-probabilities (``-w[t] * x[t]``), without the logsumexp and without smoothing.  A float
target (class probabilities) is a ``ReshardError``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir.fusion import Tensor
from .converter import Converter, items_read, op

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


@op("_embedding_bag", "_embedding_bag_forward_only")
def _embedding_bag(cv: Converter, n: Any, a: dict) -> tuple[Tensor, None, None, None]:
    """The bags (the module docstring's law); its other results (offset2bag, bag_size,
    max_indices) are not converted: reading them is an error."""
    f = cv.f
    mode = a.get("mode", 0)
    if items_read(cv, n) - {0} or mode not in (0, 1) or a.get("scale_grad_by_freq"):
        raise cv.fail(f"unsupported op {n.target} with mode={mode}, scale_grad_by_freq={a.get('scale_grad_by_freq')} "
                      f"or a result but the bags read (supported: sum and mean, the bags)")
    w = cv.tensor(a["weight"], "weight")
    ids = cv.cast(cv.tensor(a["indices"], "indices"), "int64")
    offsets = cv.cast(cv.tensor(a["offsets"], "offsets"), "int64")
    (m,), (k,) = ids.shape, offsets.shape
    bags = k - 1 if a.get("include_last_offset") else k
    pos = cv.constant(torch.arange(m, device="meta" if cv.on_meta else "cpu"), ("arange", m))
    starts = f.le(f.broadcast(offsets, (m, k), (1,)), f.broadcast(pos, (m, k), (0,)))
    bag = f.sub(cv.cast(f.sum(cv.cast(starts, "float32"), 1), "int64"), cv.operand(1, (m,), "int64"))
    rows, dt = f.embedding(w, ids), w.dtype
    if a.get("per_sample_weights") is not None:
        rows = f.mul(rows, f.broadcast(cv.cast(cv.tensor(a["per_sample_weights"], "weights"), dt), rows.shape, (0,)))
    kept = []  # the rows that count: not padding, in a bag
    pad = a.get("padding_idx", -1)
    if pad is not None and pad >= 0:
        kept.append(f.ne(ids, cv.operand(pad, (m,), "int64")))
    if bags < k:
        kept.append(f.lt(bag, cv.operand(bags, (m,), "int64")))
        bag = f.where(kept[-1], bag, cv.operand(0, (m,), "int64"))
    ones = cv.operand(1.0, (m, 1), dt)
    if kept:
        keep = kept[0] if len(kept) == 1 else f.logical_and(*kept)
        rows = f.where(f.broadcast(keep, rows.shape, (0,)), rows, cv.operand(0.0, rows.shape, dt))
        ones = cv.cast(cv.reshape(keep, (m, 1)), dt)
    out = f.embedding_grad(rows, bag, bags)
    if mode == 1:
        count = f.maximum(f.embedding_grad(ones, bag, bags), cv.operand(1.0, (bags, 1), dt))
        out = f.div(out, f.broadcast_to(count, out.shape))
    return out, None, None, None


def _class_loss(cv: Converter, n: Any, a: dict, log_probs: bool) -> Tensor:
    """The loss of each row (``log_probs``: ``self`` holds log p, else logits), weighted,
    smoothed, masked by ``ignore_index`` and reduced, as the module docstring says."""
    f = cv.f
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
    index = f.where(valid, t, cv.operand(0, rows, "int64"))
    picked = f.pick(x, index)
    w = None if a.get("weight") is None else cv.cast(cv.tensor(a["weight"], "weight"), x.dtype)
    if log_probs:
        loss, lse = f.neg(picked), None
    else:
        lse, _ = cv.logsumexp(x, -1)
        loss = f.add(f.neg(picked), lse)  # = lse - x[t] bit for bit; x[t] first (module docstring)
    w_target = None
    if w is not None:
        w_target = cv.reshape(f.embedding(cv.reshape(w, w.shape + (1,)), index), rows)
        loss = f.mul(w_target, loss)
    eps = float(a.get("label_smoothing") or 0.0)
    if eps and lse is not None:
        smooth = _smoothing(cv, x, lse, w)
        loss = f.add(_scaled(cv, loss, 1.0 - eps), _scaled(cv, smooth, eps / x.shape[-1]))
    zero = cv.operand(0.0, rows, loss.dtype)
    loss = f.where(valid, loss, zero)
    reduction = _REDUCTIONS.get(a.get("reduction", 1))
    if reduction == "none":
        return cv.reshape(loss, cv.out_shape())
    dims = tuple(range(len(rows)))
    total, _ = cv.reduce("sum", loss, dims)
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise cv.fail(f"unsupported op {n.target} with reduction={a.get('reduction')!r}")
    counted = cv.cast(valid, loss.dtype) if w_target is None else f.where(valid, w_target, zero)
    count, _ = cv.reduce("sum", counted, dims)
    return f.div(total, count)


def _smoothing(cv: Converter, x: Tensor, lse: Tensor, w: Tensor | None) -> Tensor:
    """``-sum_c w_c * log_softmax(x)_c`` per row as ``lse * sum_c w_c - sum_c w_c * x_c``
    (unweighted: ``C * lse - sum_c x_c``): reductions over the class dim only."""
    f, last = cv.f, len(x.shape) - 1
    if w is None:
        mass: Tensor = cv.operand(float(x.shape[-1]), lse.shape, lse.dtype)
    else:
        x = f.mul(x, f.broadcast(w, x.shape, (last,)))
        mass = f.broadcast_to(cv.reduce("sum", w, (0,))[0], lse.shape)
    class_sum, _ = cv.reduce("sum", x, (last,))
    return f.sub(f.mul(lse, mass), class_sum)


def _scaled(cv: Converter, x: Tensor, c: float) -> Tensor:
    return cv.f.mul(x, cv.operand(c, x.shape, x.dtype))


@op("cross_entropy_loss")
def _cross_entropy(cv: Converter, n: Any, a: dict) -> Tensor:
    return _class_loss(cv, n, a, log_probs=False)


@op("nll_loss", "nll_loss_nd")
def _nll_loss(cv: Converter, n: Any, a: dict) -> Tensor:
    return _class_loss(cv, n, a, log_probs=True)


@op("one_hot")
def _one_hot(cv: Converter, n: Any, a: dict) -> Tensor:
    """``one_hot(ids, C)[..., c] = (ids[...] == c)`` as int64: a comparison of ids, broadcast
    along the class dim, with the constant ``arange(C)``, broadcast along the others."""
    f = cv.f
    ids = cv.cast(cv.tensor(a["self"], "input"), "int64")
    shape = cv.out_shape()
    classes = shape[-1]
    arange = torch.arange(classes, device="meta" if cv.on_meta else "cpu")
    hit = f.eq(f.broadcast(ids, shape, tuple(range(len(ids.shape)))),
               f.broadcast(cv.constant(arange, ("arange", classes)), shape, (len(shape) - 1,)))
    return cv.cast(hit, "int64")
