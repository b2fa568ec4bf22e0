"""``attention`` and its gradient ``attention_grad``: scaled dot-product attention as one op.

``attention(q, k, v, mask, scale, causal, safe)`` with ``q [*B, L, D]``, ``k [*B', S, D]``,
``v [*B', S, Dv]`` (the batch dims: batch and heads; ``B' = B`` but for grouped-query attention,
where k and v have ``Hkv`` heads (dim -3) dividing q's ``H``: each kv head serves ``g = H / Hkv``
consecutive q heads, ``repeat_heads``) and an optional additive float ``mask`` of q's dtype whose
shape is ``[*B, L, S]`` with any dims of extent 1 (broadcast):

    attention = softmax(q @ repeat(k)^T * scale + mask) @ repeat(v)  [*B, L, Dv]

The local step reads the ``Hkv`` heads as they are (torch's SDPA with ``enable_gqa``): no
repeated copy of k and v is made, kept or read back.  ``passes.gqa`` folds a repeat feeding
the op into it.

``causal``: the mask is torch's ``is_causal`` mask (0 on and below the diagonal, -inf above,
top-left aligned), so a local step whose q rows are all of L runs the causal kernels with no
mask (the reference checks the mask).  ``safe``: a row that the mask masks entirely attends to
nothing (0s: torch's ``_safe_softmax``); without it no row may be masked entirely.

Index maps (``passes.padding`` reads them; the e-graph's strategies are the enumerated
``operand_strategies``): q's batch and L dims read the result's; k's and v's batch dims, v's
Dv dim; a mask dim of the result's extent reads it (of extent 1: none).  Strategies, per mesh
axis (``operand_strategies``): Replicate from replicated operands; a batch / head dim sharded
alike on q, k, v (and the mask where it has that dim); q's L dim sharded with k and v
replicated (the mask sharded on L where it has it); v's Dv dim with q, k replicated; v's
``Partial("sum")`` summands with q, k and the mask replicated give the result's (it is linear in
v; the softmax is not linear, so q and k are never Partial).  Cost: ``rules.attention``'s fused roofline (operands and
result read and written once, no ``[*B, L, S]`` round trips).

Gradient: ``attention_grad(q, k, v, g, mask)``, for k, v of one shape ``[*B', S, D]`` and q, g
of that shape with ``H = g·Hkv`` heads, is ``[dq_0, .., dq_{g-1}, dk, dv]`` stacked on a new dim
0 (``[g + 2, *B', S, D]``), ``dq_j`` the gradient of the q heads ``i·g + j`` (kv head i's j-th),
``dk`` and ``dv`` summed over each kv head's group (``read_back``: a slice of dim 0, for dq moved
to its heads and reshaped; with ``g = 1`` ``[dq, dk, dv]``); its
reference and local steps recompute the forward under ``torch.enable_grad`` and call
``torch.autograd.grad`` (on a GPU torch's fused backward kernels), so what the backward pass
keeps is q, k, v and the mask, never the ``[*B, L, S]`` probabilities.  Other shapes get the
decomposed gradient (``decomposed_attention_grad``).  The mask gets no gradient (``grad_free``:
``passes.autodiff`` refuses one that would flow there; ``from_torch`` builds the decomposed form,
whose ops all have gradients, for a mask that needs one).  ``attention_grad`` has no gradient of its own.
Its strategies: batch / heads split alike; g's ``Partial("sum")`` summands; and q's sequence
split (q, g and the mask's L, k and v whole), whose result is a ``Partial("sum")``: each rank's
dq in its rows of zeros over all of L (its step carries q's sharding, ``runtime.cpu_steps.attention``) and its
summands of dk and dv.

The decomposed forms (``decomposed_attention``, ``decomposed_attention_grad``: matmul, scale,
add, max / exp / sum / div, matmuls) are the same values; ``passes.decompositions`` adds them to
a Fusion as alternatives of the fused ops, so shardings only they allow stay reachable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import check_kind
from ..errors import ReshardError
from ..ids import Outer, Root
from ..sharding import Partial, Replicate, Shard
from .registry import OPS, Image, OpKind, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None
Placement = Replicate | Shard


#: the fused op kinds (``attention`` and its gradient)
FUSED_KINDS = ("attention", "attention_grad")


def has_attention(f: Fusion) -> bool:
    """Does ``f`` hold fused attention ops?"""
    return any(op.kind in FUSED_KINDS for op in f.ops)


def kv_groups(q: Sequence[int], k: Sequence[int]) -> int | None:
    """The q heads each kv head serves (``g``): 1 when q's batch dims are k's, ``H / Hkv`` when
    they differ only in the heads (dim -3) and ``Hkv`` divides ``H``; None when they do not fit."""
    if tuple(q[:-2]) == tuple(k[:-2]):
        return 1
    if len(q) != len(k) or len(q) < 3 or tuple(q[:-3]) != tuple(k[:-3]) or not k[-3] or q[-3] % k[-3]:
        return None
    return q[-3] // k[-3]


def repeat_heads(f: Fusion, x: Tensor, heads: int, name: Name = None) -> Tensor:
    """``x [*B, Hkv, S, D]`` with each head repeated ``heads / Hkv`` times in place (head h of
    the result is x's head ``h // (heads / Hkv)``: torch's ``repeat_interleave``, Hugging Face's
    ``repeat_kv``) by a reshape, a broadcast and a reshape; ``x`` itself when it has ``heads``."""
    *batch, hkv, s, d = x.shape
    if heads == hkv:
        return x
    wide = f.broadcast_to(f.reshape(x, (*batch, hkv, 1, s, d)), (*batch, hkv, heads // hkv, s, d))
    return f.reshape(wide, (*batch, heads, s, d), name=name)


def _group_sum(f: Fusion, x: Tensor, shape: tuple[int, ...], name: Name) -> Tensor:
    """``x [*B, H, S, D]`` summed over each group of ``H / Hkv`` consecutive heads to ``shape``
    ``[*B, Hkv, S, D]`` (``repeat_heads``' adjoint); ``x`` itself when it has ``shape``."""
    if x.shape == shape:
        return x
    grouped = f.reshape(x, shape[:-2] + (x.shape[-3] // shape[-3],) + shape[-2:])
    return f.sum(grouped, len(shape) - 2, name=name)


def _check_qkv(f: Fusion, what: str, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
    for t, n in ((q, "query"), (k, "key"), (v, "value")):
        f._check(t, what, n)
        if len(t.shape) < 2:
            raise ReshardError(f"{what}: {n} {t!r} must be at least 2-D")
    check_kind(what, q, ("float",), "query")
    if not q.dtype == k.dtype == v.dtype:
        raise ReshardError(f"{what}: dtypes differ: {q!r}, {k!r}, {v!r}")
    if k.shape[:-2] != v.shape[:-2] or kv_groups(q.shape, k.shape) is None:
        raise ReshardError(f"{what}: batch dims differ: {q!r}, {k!r}, {v!r} (k and v may have fewer heads, "
                           "dim -3, dividing q's)")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ReshardError(f"{what}: q [.., L, D], k [.., S, D], v [.., S, Dv] do not fit: {q!r}, {k!r}, {v!r}")
    if mask is None:
        return
    f._check(mask, what, "mask")
    scores = q.shape[:-1] + (k.shape[-2],)
    if mask.dtype != q.dtype or len(mask.shape) != len(scores) or any(
            e not in (1, s) for e, s in zip(mask.shape, scores)):
        raise ReshardError(f"{what}: the mask {mask!r} must be an additive {q.dtype} mask of shape {scores} "
                           "(dims of extent 1 broadcast)")
    f._same_mesh(what, q, k, v, mask)


def attention(f: Fusion, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, scale: float | None = None,
              causal: bool = False, safe: bool = False, name: Name = None) -> Tensor:
    """``softmax(q @ k^T * scale + mask) @ v`` (module docstring); ``scale`` defaults to
    ``1 / sqrt(D)``; ``causal`` needs the causal mask as ``mask``."""
    _check_qkv(f, "attention", q, k, v, mask)
    if causal and mask is None:
        raise ReshardError("attention: causal=True needs the causal mask as mask (its decomposed form adds it)")
    mesh = f._same_mesh("attention", q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ins = [q, k, v] + ([mask] if mask is not None else [])
    return f._op("attention", ins, f._new(q.shape[:-1] + v.shape[-1:], q.dtype, mesh, name),
                 scale=scale, causal=bool(causal), safe=bool(safe))


def attention_grad(f: Fusion, q: Tensor, k: Tensor, v: Tensor, g: Tensor, mask: Tensor | None = None, *,
                   scale: float, causal: bool = False, safe: bool = False, name: Name = None) -> Tensor:
    """``[dq_0, .., dq_{g-1}, dk, dv]`` (stacked on a new dim 0, module docstring) of
    ``attention(q, k, v, mask)`` given its result's gradient ``g``; k and v of one shape, q and g
    of k's but for the heads (``read_back``: dq, dk and dv)."""
    _check_qkv(f, "attention_grad", q, k, v, mask)
    f._check(g, "attention_grad", "gradient")
    if not (q.shape == g.shape and k.shape == v.shape and q.shape[-2:] == k.shape[-2:]) or g.dtype != q.dtype:
        raise ReshardError(f"attention_grad: q, k, v and the gradient must have one shape and dtype (k and v "
                           f"may have fewer heads): {q!r}, {k!r}, {v!r}, {g!r}")
    mesh = f._same_mesh("attention_grad", q, k, v, g)
    ins = [q, k, v, g] + ([mask] if mask is not None else [])
    lanes = kv_groups(q.shape, k.shape) or 1
    return f._op("attention_grad", ins, f._new((lanes + 2,) + k.shape, q.dtype, mesh, name),
                 scale=float(scale), causal=bool(causal), safe=bool(safe))


def read_back(f: Fusion, st: Tensor, q: Tensor, k: Tensor) -> list[Tensor]:
    """``[dq, dk, dv]`` read out of ``attention_grad``'s result ``st`` for q and k: dk and dv its
    last two slices of dim 0, reshaped to k's shape; dq its first slice reshaped (``g = 1``), or
    its first ``g`` slices moved after the kv heads and merged with them to q's heads."""
    lanes = st.shape[0] - 2
    if lanes == 1:
        return [f.reshape(f.slice(st, 0, i, i + 1), q.shape) for i in range(3)]
    n = len(st.shape)
    per_head = f.permute(f.slice(st, 0, 0, lanes), tuple(range(1, n - 2)) + (0, n - 2, n - 1))
    return [f.reshape(per_head, q.shape)] + [f.reshape(f.slice(st, 0, i, i + 1), k.shape)
                                             for i in (lanes, lanes + 1)]


def stack_pieces(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> list[torch.Tensor]:
    """The slices along dim 0 of ``attention_grad``'s value (module docstring), as views of
    the gradients of q, k and v: dq (or its ``g`` lanes of k's heads), dk, dv."""
    if dq.shape == dk.shape:
        return [dq, dk, dv]
    lanes = dq.unflatten(-3, (dk.shape[-3], dq.shape[-3] // dk.shape[-3])).movedim(-3, 0)
    return [*lanes.unbind(0), dk, dv]


def stack_grads(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> torch.Tensor:
    """``attention_grad``'s value (module docstring) from the gradients of q, k and v."""
    return torch.stack(stack_pieces(dq, dk, dv))


def is_gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Are ``k``'s heads fewer than ``q``'s (grouped-query attention)?"""
    return q.dim() > 2 and q.shape[-3] != k.shape[-3]


def causal_mask(L: int, S: int, dtype: torch.dtype, device: Any = "cpu") -> torch.Tensor:
    """torch's ``is_causal`` mask as an additive one: 0 on and below the diagonal, -inf above."""
    keep = torch.ones(L, S, dtype=torch.bool, device=device).tril()
    return torch.zeros(L, S, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))


def attention_values(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                     safe: bool) -> torch.Tensor:
    """The op's semantics on torch tensors, step by step (the decomposed form's values)."""
    if is_gqa(q, k):
        k, v = (x.repeat_interleave(q.shape[-3] // k.shape[-3], -3) for x in (k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    if not safe:
        return torch.matmul(torch.softmax(s, -1), v)
    dead = torch.isneginf(s.amax(-1, keepdim=True))  # a row masked entirely: 0s (no NaN, nor in its gradient)
    return torch.matmul(torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0), v)


def _check_causal(a: Mapping[str, Any], mask: torch.Tensor | None) -> None:
    """A ``ReshardError`` unless a causal op's mask is the causal mask."""
    if not a.get("causal"):
        return
    assert mask is not None
    want = causal_mask(mask.shape[-2], mask.shape[-1], mask.dtype, mask.device)
    if not torch.equal(mask, want.expand(mask.shape)):
        raise ReshardError("attention: causal=True but the mask is not the causal mask")


def stacked_grads(run: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
           mask: torch.Tensor | None) -> torch.Tensor:
    """``attention_grad``'s value (``stack_grads``) of ``run(q, k, v, mask)`` given ``g``, by
    torch's autograd (the forward recomputed)."""
    return stack_grads(*grad_parts(run, q, k, v, g, mask))


def grad_parts(run: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                g: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """``(dq, dk, dv)`` of ``run(q, k, v, mask)`` given ``g`` (``_grads``, unstacked)."""
    with torch.enable_grad():
        xs = [x.detach().requires_grad_(True) for x in (q, k, v)]
        out = run(*xs, mask)
        return torch.autograd.grad(out, xs, g)


def _mask_map(fusion: Fusion, op: Op, slot: int) -> list[Image]:
    """A mask dim of the result's extent (batch, heads, L) reads it; of extent 1 or S: none."""
    out = fusion.tensors[op.output].shape
    return [Root(d, e) if d < len(out) - 1 and e == out[d] and e > 1 else None
            for d, e in enumerate(fusion.tensors[op.inputs[slot]].shape)]


def _mask_along(fusion: Fusion, op: Op, d: int, extent: int) -> Placement:
    """The mask's placement when the others shard their dim ``d`` of ``extent``: sharded alike
    where the mask has that dim, else Replicate (it broadcasts there)."""
    return Shard(d) if fusion.tensors[op.inputs[-1]].shape[d] == extent else Replicate()


def mask_of(op: Op) -> int | None:
    """The tensor id of a fused attention op's additive mask (the operand after its ``arity``
    others); None for any other op, or one without a mask."""
    kind = OPS.get(op.kind)
    if not isinstance(kind, _Fused) or len(op.inputs) <= kind.arity:
        return None
    return op.inputs[kind.arity]


def _extents(ins: list[tuple[int, ...]]) -> tuple[int, tuple[int, ...], int, int]:
    """(the batch dims' product, q's shape, S, Dv) of a fused op's operands of shapes ``ins``."""
    q, k, v = ins[:3]
    return math.prod(q[:-2]), q, k[-2], v[-1]


class _Fused(OpKind):
    """What both fused ops share: ``arity`` operands before an optional mask, strategies
    enumerated (no transport codes), the contraction D of q and k summed, the mask checked by
    the reference; ``values`` (the reference) on the operands (the local step:
    ``runtime.cpu_steps.attention``)."""

    strategy = "attention"
    arity = 3

    def values(self, a: Mapping[str, Any], xs: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError(self.kind)

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        mask = xs[self.arity] if len(xs) > self.arity else None
        _check_causal(a, mask)
        return self.values(a, xs[:self.arity], mask)

    def slots(self, op: Op) -> int:
        """None in the e-graph: its strategies are enumerated (``operand_strategies``)."""
        return 0

    def reduced_dims(self, fusion: Fusion, op: Op, slot: int) -> dict[int, tuple[str, int]]:
        """The contraction D (q's and k's last dim), summed; S is the softmax's and PV's (a
        padded S would need -inf scores, not a fold's identity)."""
        nd = len(fusion.tensors[op.inputs[slot]].shape)
        return {nd - 1: ("sum", 0)} if slot in (0, 1) else {}


@register("attention")
class Attention(_Fused):
    builders = {"attention": attention}
    grad_free = (3,)  # the mask (the frontend builds the decomposed form for a mask with a gradient)

    def values(self, a: Mapping[str, Any], xs: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        return attention_values(xs[0], xs[1], xs[2], mask, a["scale"], a["safe"])

    def local_work(self, ins: list[tuple[int, ...]], out: tuple[int, ...], itemsize: int) -> tuple[int, int, int]:
        """Two matmuls, ``2·B·L·S·(D + Dv)``, in one kernel; no intermediate leaves it."""
        b, q, s, v = _extents(ins)
        return 2 * b * q[-2] * s * (q[-1] + v), 0, 1

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        shape = fusion.tensors[op.inputs[slot]].shape
        out = fusion.tensors[op.output].shape
        nb = len(shape) - 2
        # k's and v's kv heads (fewer than q's): head i serves the result's heads i·g .. i·g + g - 1
        batch: list[Image] = [Root(d, e) if e == out[d] else Outer(Root(d, out[d]), e)
                              for d, e in enumerate(shape[:nb])]
        if slot == 0:
            return batch + [Root(nb, shape[nb]), None]
        if slot == 1:
            return batch + [None, None]
        if slot == 2:
            return batch + [None, Root(nb + 1, shape[nb + 1])]
        return _mask_map(fusion, op, slot)

    def operand_strategies(self, fusion: Fusion, op: Op, placement: Any) -> list[list[Any]]:
        """The operands' placements on one mesh axis that compute the result's ``placement``
        there with no communication (module docstring; none for other placements)."""
        nb = len(fusion.tensors[op.output].shape) - 2
        n, rep = len(op.inputs), Replicate()
        if isinstance(placement, Replicate):
            return [[rep] * n]
        if placement == Partial("sum"):  # v's summands: the result is linear in v
            return [[rep, rep, placement] + [rep] * (n - 3)]
        if not isinstance(placement, Shard):
            return []
        d = placement.dim
        if d > nb:  # v's Dv: q, k and the mask whole
            return [[rep, rep, placement] + [rep] * (n - 3)]
        lay: list[Any] = [placement] * 3 if d < nb else [placement, rep, rep]
        return [lay + [_mask_along(fusion, op, d, fusion.tensors[op.output].shape[d])] * (n - 3)]

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """k and v of one shape, q of theirs but the heads: ``attention_grad`` read back per
        operand (``read_back``); else the decomposed gradient.  Both read q, k, v and the mask
        through ``saved`` (no probabilities kept)."""
        q, k, v = (saved(x) for x in xs[:3])
        mask = saved(xs[3]) if len(xs) > 3 else None
        a = op.attrs
        if k.shape == v.shape and q.shape[-2:] == k.shape[-2:]:
            st = attention_grad(f, q, k, v, g, mask, scale=a["scale"], causal=a["causal"], safe=a["safe"])
            grads = read_back(f, st, q, k)
        else:
            grads = list(decomposed_attention_grad(f, q, k, v, g, mask, a["scale"], a["safe"]))
        return grads + [None] * (len(xs) - 3)


@register("attention_grad")
class AttentionGrad(_Fused):
    builders = {"attention_grad": attention_grad}
    arity = 4
    carries_sharding = 0  # q's: a q-sequence block's rows (its CPU step's ``run_on``)

    def local_work(self, ins: list[tuple[int, ...]], out: tuple[int, ...], itemsize: int) -> tuple[int, int, int]:
        """The scores recomputed and four more matmuls, ``2·B·L·S·(3·D + 2·Dv)``, in one
        kernel; no intermediate leaves it."""
        b, q, s, v = _extents(ins)
        return 2 * b * q[-2] * s * (3 * q[-1] + 2 * v), 0, 1

    def values(self, a: Mapping[str, Any], xs: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        return stacked_grads(lambda q, k, v, m: attention_values(q, k, v, m, a["scale"], a["safe"]), *xs, mask)

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        """Batch and heads of q, k, v, g read result dims 1.. (q's and g's heads, where more
        than k's, none: each result dim 0 slice holds one of each group); q's L and D (k's,
        v's, g's too: one shape) have no image (each result row mixes every row); the mask as
        ``attention``'s shifted by the stacked dim."""
        shape = fusion.tensors[op.inputs[slot]].shape
        nb = len(shape) - 2
        out = fusion.tensors[op.output].shape[1:]
        if slot < 4:
            return [Root(d + 1, e) if e == out[d] else None for d, e in enumerate(shape[:nb])] + [None, None]
        return [Root(d + 1, e) if d < nb and e == out[d] and e > 1 else None for d, e in enumerate(shape)]

    def operand_strategies(self, fusion: Fusion, op: Op, placement: Any) -> list[list[Any]]:
        """Replicate from replicated operands; ``Partial("sum")`` from g's summands (dq, dk and
        dv are linear in g), or from q and g split along q's sequence L (the mask too where it
        has L) with k and v whole: each block's dk and dv are summands, and its dq, in its rows
        of zeros over all of L (its CPU step's ``run_on``), one too (the blocks' rows are disjoint); the
        stacked result's batch / head dim ``1 + d`` from q, k, v, g sharded on ``d`` (the mask
        where it has it)."""
        n, rep = len(op.inputs), Replicate()
        nb = len(fusion.tensors[op.inputs[0]].shape) - 2
        if isinstance(placement, Replicate):
            return [[rep] * n]
        if placement == Partial("sum"):
            rows = Shard(nb)
            return [[rep, rep, rep, placement] + [rep] * (n - 4),
                    [rows, rep, rep, rows] + [_mask_along(fusion, op, nb, fusion.tensors[op.inputs[0]].shape[nb])]
                    * (n - 4)]
        if not isinstance(placement, Shard):
            return []

        d = placement.dim - 1
        if not 0 <= d < nb:
            return []
        return [[Shard(d)] * 4 + [_mask_along(fusion, op, d, fusion.tensors[op.inputs[0]].shape[d])] * (n - 4)]


def _transposed(f: Fusion, t: Tensor, name: Name) -> Tensor:
    n = len(t.shape)
    return f.permute(t, tuple(range(n - 2)) + (n - 1, n - 2), name=name)


def _namer(name: Name) -> Callable[[str], Name]:
    """``part`` -> ``<name>.<part>`` (None without a name: ``t<N>``)."""
    return lambda part: None if name is None else f"{name}.{part}"


def _scores(f: Fusion, q: Tensor, k: Tensor, mask: Tensor | None, scale: float, at: Callable[[str], Name]) -> Tensor:
    s = f.scale(f.matmul(q, _transposed(f, k, at("kt")), name=at("qk")), scale, name=at("scaled"))
    return s if mask is None else f.add(s, f.broadcast_to(mask, s.shape, name=at("mask")), name=at("scores"))


def _probs(f: Fusion, s: Tensor, safe: bool, at: Callable[[str], Name]) -> Tensor:
    """softmax over the last dim: ``e / sum(e)``, ``e = exp(s - max(s))``; ``safe``: 0 where the
    row's max is not finite (all -inf: ``m - m`` is NaN there, and ``NaN != NaN``)."""
    n = len(s.shape)
    keep = tuple(range(n - 1))
    m = f.max(s, n - 1, name=at("max"))
    e = f.exp(f.sub(s, f.broadcast(m, s.shape, keep, name=at("max_b")), name=at("shifted")), name=at("exp"))
    p = f.div(e, f.broadcast(f.sum(e, n - 1, name=at("sum")), s.shape, keep, name=at("sum_b")), name=at("probs"))
    if not safe:
        return p
    z = f.sub(m, m, name=at("max_nan"))
    live = f.broadcast(f.eq(z, z, name=at("live")), s.shape, keep, name=at("live_b"))
    return f.masked(p, live, True, name=at("safe_probs"))


def decomposed_attention(f: Fusion, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                         safe: bool, name: Name = None) -> Tensor:
    """``attention``'s value from matmul, scale, add, softmax (max, exp, sum, div) and matmul
    (k and v with fewer heads repeated first, ``repeat_heads``; ``name``: the intermediates are
    ``<name>.<part>``)."""
    at = _namer(name)
    if len(q.shape) > 2:
        k, v = repeat_heads(f, k, q.shape[-3], at("k_rep")), repeat_heads(f, v, q.shape[-3], at("v_rep"))
    return f.matmul(_probs(f, _scores(f, q, k, mask, scale, at), safe, at), v, name=at("out"))


def decomposed_attention_grad(f: Fusion, q: Tensor, k: Tensor, v: Tensor, g: Tensor, mask: Tensor | None,
                              scale: float, safe: bool, name: Name = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of ``attention`` from the recomputed probabilities ``p``:
    ``dv = p^T g``, ``dp = g v^T``, ``ds = p * (dp - rowsum(dp * p)) * scale``, ``dq = ds k``,
    ``dk = ds^T q``; k and v with fewer heads repeated first and dk, dv summed over each kv
    head's group (``name``: the intermediates are ``<name>.<part>``)."""
    at = _namer(name)
    kv = k.shape, v.shape
    if len(q.shape) > 2:
        k, v = repeat_heads(f, k, q.shape[-3], at("k_rep")), repeat_heads(f, v, q.shape[-3], at("v_rep"))
    p = _probs(f, _scores(f, q, k, mask, scale, at), safe, at)
    n = len(p.shape)
    dv = f.matmul(_transposed(f, p, at("pt")), g, name=at("dv"))
    dp = f.matmul(g, _transposed(f, v, at("vt")), name=at("dp"))
    dot = f.sum(f.mul(dp, p, name=at("dp_p")), n - 1, name=at("rows"))
    rows = f.broadcast(dot, p.shape, tuple(range(n - 1)), name=at("rows_b"))
    ds = f.scale(f.mul(p, f.sub(dp, rows, name=at("dp_rows")), name=at("ds_raw")), scale, name=at("ds"))
    dq = f.matmul(ds, k, name=at("dq"))
    dk = f.matmul(_transposed(f, ds, at("dst")), q, name=at("dk"))
    return dq, _group_sum(f, dk, kv[0], at("dk_sum")), _group_sum(f, dv, kv[1], at("dv_sum"))
