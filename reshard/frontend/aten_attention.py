"""Scaled dot-product attention: the registry's fused ``attention`` op
(``softmax(q @ k^T * scale + mask) @ v``, ``reshard.ir.ops.attention``).

Masks: ``is_causal`` is the causal mask (-inf above the diagonal, top-left aligned as torch's)
as a constant additive operand, with ``causal=True`` (the fused kernels run it with no mask); a
float ``attn_mask`` is the additive operand; a bool one (True: attend) is the additive mask
``where(mask, 0, -inf)``, folded at conversion when the mask is a constant (Hugging Face's
causal masks are; one equal to the causal mask is taken as ``is_causal``), else a ``where`` on
the mask.  A row that the mask masks entirely attends to nothing (0s, torch's
``_safe_softmax``): the op is ``safe`` unless the mask is a constant that masks no row entirely.  ``enable_gqa``: k and v
have fewer heads (dim -3) than q; each kv head serves ``Hq / Hkv`` consecutive q heads
(torch's ``repeat_interleave``), by a broadcast and a reshape (Hugging Face's ``repeat_kv``;
``passes.gqa`` folds it into the op).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..ir.errors import ReshardError
from ..ir.fusion import DTYPES, Tensor
from ..ir.ops.attention import causal_mask, decomposed_attention, repeat_heads
from .converter import Converter, graph_args, live_nodes, op


def repeat_kv(cv: Converter, x: Tensor, heads: int) -> Tensor:
    """[..., Hkv, S, D] -> [..., heads, S, D], kv head h // (heads / Hkv) at head h."""
    hkv = x.shape[-3]
    if heads % hkv:
        raise cv.fail(f"scaled_dot_product_attention with enable_gqa: {heads} query heads are not a multiple of "
                      f"{hkv} key/value heads")
    return repeat_heads(cv.f, x, heads)


def _mask(cv: Converter, mask: Any, scores: tuple[int, ...], dtype: str) -> tuple[Tensor, bool, bool]:
    """``mask`` as ``attention``'s operand: an additive ``dtype`` mask of ``scores``' rank (a bool
    one, True: attend, is ``where(mask, 0, -inf)``: folded when it is a constant, else a
    ``where``), its broadcast dims kept at extent 1; whether it is the causal mask (a constant
    equal to it, what Hugging Face's masks are); whether a row may be masked entirely (not for
    a constant that masks no row fully; a meta-device constant is taken to be one)."""
    known = cv.known(mask)
    if known is None:
        t = cv.tensor(mask, "attn_mask")
        t = cv.reshape(t, (1,) * (len(scores) - len(t.shape)) + t.shape)
        if t.dtype != "bool":
            return cv.cast(t, dtype), False, True
        return cv.f.where(t, cv.operand(0.0, t.shape, dtype), cv.operand(float("-inf"), t.shape, dtype)), False, True
    full = (1,) * (len(scores) - known.dim()) + tuple(known.shape)
    add = known.to(DTYPES[dtype]) if known.dtype != torch.bool else torch.zeros(
        known.shape, dtype=DTYPES[dtype], device=known.device).masked_fill(~known, float("-inf"))
    if not known.is_meta and tuple(add.shape[-2:]) == scores[-2:] and torch.equal(
            add, causal_mask(scores[-2], scores[-1], add.dtype, add.device).expand(add.shape)):
        return _causal(cv, scores, dtype), True, False
    dead = not known.is_meta and bool((add == float("-inf")).all(-1).any())
    if known.dtype == torch.bool:
        return cv.constant(add.reshape(full), ("additive", id(known), dtype)), False, dead
    return cv.cast(cv.reshape(cv.tensor(mask, "attn_mask"), full), dtype), False, dead


def _causal(cv: Converter, scores: tuple[int, ...], dtype: str) -> Tensor:
    """torch's ``is_causal`` mask for ``scores`` as an additive constant of its rank."""
    L, S = scores[-2], scores[-1]
    add = causal_mask(L, S, DTYPES[dtype], "meta" if cv.on_meta else "cpu")
    return cv.constant(add.reshape((1,) * (len(scores) - 2) + (L, S)), ("causal", L, S, dtype, len(scores)))


@op("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
     "_scaled_dot_product_flash_attention")
def _sdpa_kernel(cv: Converter, n: Any, a: dict) -> tuple:
    """The fused SDPA kernels' schemas: (output, logsumexp, ...); only the output is supported."""
    if a.get("attn_bias") is not None:
        a = {**a, "attn_mask": a["attn_bias"]}
    return (_sdpa(cv, n, a),) + (None,) * (len(n.target._schema.returns) - 1)


@op("scaled_dot_product_attention")
def _sdpa(cv: Converter, n: Any, a: dict) -> Tensor:
    q, k, v = (cv.tensor(a[x], x) for x in ("query", "key", "value"))
    if a.get("dropout_p", 0.0) not in (0, 0.0):
        raise cv.fail(f"scaled_dot_product_attention with dropout_p={a['dropout_p']} is not supported")
    if a.get("enable_gqa"):
        k, v = repeat_kv(cv, k, q.shape[-3]), repeat_kv(cv, v, q.shape[-3])
    scores = q.shape[:-1] + (k.shape[-2],)
    mask, causal, safe = a.get("attn_mask"), False, False
    if a.get("is_causal"):
        if mask is not None:
            raise cv.fail("scaled_dot_product_attention with both attn_mask and is_causal")
        mask, causal = _causal(cv, scores, q.dtype), True
    elif mask is not None:
        mask, causal, safe = _mask(cv, mask, scores, q.dtype)
    try:
        if cv.train and _mask_trains(n):  # the fused op gives its mask no gradient: the decomposed form does
            scale = a.get("scale")
            return decomposed_attention(cv.f, q, k, v, mask, 1.0 / math.sqrt(q.shape[-1]) if scale is None
                                        else float(scale), safe)
        return cv.f.attention(q, k, v, mask, scale=a.get("scale"), causal=causal, safe=safe)
    except ReshardError as e:
        raise cv.fail(f"scaled_dot_product_attention: {e}") from None


def _mask_trains(n: Any) -> bool:
    """Does autograd give the SDPA node ``n``'s mask (``attn_mask`` / ``attn_bias``) a gradient
    (it depends on a trained parameter: a learned position bias, T5's relative attention bias
    through the ops that bucket and broadcast it)?  Whether some node it is computed from
    requires a gradient (a graph input: the export marks the parameters, not every value
    computed from them)."""
    given = graph_args(n)
    mask = given.get("attn_mask", given.get("attn_bias"))
    return any(getattr(x.meta.get("val"), "requires_grad", False) for x in live_nodes([mask]))
