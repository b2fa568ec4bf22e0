"""The reductions of a linear's rows without its ``[tokens, vocab]`` result: ``linear_max``,
``linear_sumexp`` and the gradient ``linear_sumexp_grad`` (fused linear cross entropy, as
cut-cross-entropy and Liger's fused linear cross entropy compute it: the lm_head matmul and the
loss in chunks of tokens, forward and backward, the backward recomputing the chunk's logits).

With ``h [N, H]`` (tokens), ``w [V, H]`` (the lm_head weight, vocab rows) and the logits
``x = h @ w^T`` (``[N, V]``, never held whole: each local step computes them ``CHUNK_ELEMENTS``
at a time):

    linear_max(h, w)                     = max_v x[n, v]                          [N]
    linear_sumexp(h, w, m)               = sum_v exp(x[n, v] - m[n])              [N]
    linear_sumexp_grad(h, w, m, g, "input")  = (exp(x - m) * g) @ w               [N, H]
    linear_sumexp_grad(h, w, m, g, "weight") = (exp(x - m) * g)^T @ h             [V, H]
    linear_sumexp_grad(h, w, m, g, "both")   = the two, rows concatenated        [N + V, H]

(``m``, ``g`` broadcast along V).  So cross entropy's ``logsumexp(x) = log(linear_sumexp(h, w, m))
+ m`` with ``m = linear_max(h, w)``, and its gradient's softmax part with ``g = dloss / s``
(``passes.fused_loss`` declares these equal to the unfused values, an ``alternative``).

Strategies, per mesh axis (``operand_strategies``; ``rules.attention`` enumerates them):
Replicate from replicated operands; tokens (``h``, ``m``, ``g`` split along N, ``w`` whole):
rows are independent, so the result is split along N, except the weight gradient, a sum over
the tokens, which is ``Partial("sum")``; vocab-parallel (``w`` split along V, the others
whole): ``linear_max`` is ``Partial("max")`` (the max of the blocks' maxes: Megatron's
all-reduced max), ``linear_sumexp`` and the input gradient ``Partial("sum")`` (sums over V of
the blocks' sums), the weight gradient split along V (its rows are the vocab rows); and ``g``
``Partial("sum")`` with the others whole gives the gradients ``Partial("sum")`` (linear in g).
Both gradients at once (``"both"``: one pass over the chunks, each chunk's logits recomputed
once, as Liger's fused linear cross entropy) have the Replicate and Partial-g strategies only:
split tokens or vocab would leave one part of the result split and the other Partial.
H (the contraction) is never split.  Local work (``local_work``): the matmuls' flops, and
the chunks' logits written and read again (a torch-call step: ``PASSES`` round trips of the
local ``[N, V]`` bytes, ``CALLS`` kernels per chunk), so the unfused form is the faster one wherever its logits fit and
these win on kept and peak bytes (a memory budget).

Padding (``passes.padding``): only N has an image (the result's N; the weight gradient's V
reads ``w``'s V); every other dim is read whole, so an uneven V or H is sliced back to its true
extent (gathered) before these ops; N is free.  ``linear_sumexp_grad`` has no gradient of its
own, ``linear_max`` none either (the cross entropy reads its max through ``detach``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import check_kind
from ..errors import ReshardError
from ..ids import Root
from ..sharding import Partial, Replicate, Shard
from .registry import Image, OpKind, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None
Placement = Replicate | Shard | Partial

#: logits elements a local step holds at once (64 MiB of float32; on an H200, 2^22 made the GPT-2
#: loss's steps 1.3x slower and 2^26 1.2x faster, at 2.3x the peak: ``benchmarks/fused_loss_gpu.py``)
CHUNK_ELEMENTS = 1 << 24
#: per local step: the passes of the chunks' logits through memory (written by the matmul, read
#: by the max; or read and written by the shift, the exp and the product with g, read by the sum
#: or by each gradient's matmul), and the torch calls (kernels) per chunk
PASSES = {"linear_max": 2, "linear_sumexp": 6, "linear_sumexp_grad": 8, "both": 9}
CALLS = {"linear_max": 3, "linear_sumexp": 5, "linear_sumexp_grad": 6, "both": 7}
#: the gradients ``linear_sumexp_grad`` forms (its ``wrt``)
WRT = ("input", "weight", "both")


def _check(f: Fusion, what: str, h: Tensor, w: Tensor, rows: tuple[Tensor, ...]) -> None:
    """h ``[N, H]``, w ``[V, H]`` of one float dtype, each row operand ``[N]`` of it, one mesh."""
    f._check(h, what, "h")
    f._check(w, what, "w")
    check_kind(what, h, ("float",), "h")
    if len(h.shape) != 2 or len(w.shape) != 2 or h.shape[1] != w.shape[1] or h.dtype != w.dtype:
        raise ReshardError(f"{what}: h {h!r} must be [N, H] and w {w!r} [V, H] of one dtype")
    for r in rows:
        f._check(r, what, "row operand")
        if r.shape != h.shape[:1] or r.dtype != h.dtype:
            raise ReshardError(f"{what}: {r!r} must be [N] = {h.shape[:1]} of h's dtype {h.dtype}")
    f._same_mesh(what, h, w, *rows)


def linear_max(f: Fusion, h: Tensor, w: Tensor, *, name: Name = None) -> Tensor:
    """``max_v (h @ w^T)[n, v]`` (module docstring)."""
    _check(f, "linear_max", h, w, ())
    return f._op("linear_max", [h, w], f._new(h.shape[:1], h.dtype, h.mesh, name))


def linear_sumexp(f: Fusion, h: Tensor, w: Tensor, m: Tensor, *, name: Name = None) -> Tensor:
    """``sum_v exp((h @ w^T)[n, v] - m[n])`` (module docstring)."""
    _check(f, "linear_sumexp", h, w, (m,))
    return f._op("linear_sumexp", [h, w, m], f._new(h.shape[:1], h.dtype, h.mesh, name))


def linear_sumexp_grad(f: Fusion, h: Tensor, w: Tensor, m: Tensor, g: Tensor, wrt: str, *,
                       name: Name = None) -> Tensor:
    """``(exp(h @ w^T - m) * g) @ w`` (``wrt="input"``, ``[N, H]``) or its transpose times
    ``h`` (``wrt="weight"``, ``[V, H]``): the gradient of ``linear_sumexp`` given ``g``, the
    gradient of its result (module docstring)."""
    _check(f, "linear_sumexp_grad", h, w, (m, g))
    if wrt not in WRT:
        raise ReshardError(f"linear_sumexp_grad: wrt must be one of {WRT}, got {wrt!r}")
    shape = {"input": h.shape, "weight": w.shape, "both": (h.shape[0] + w.shape[0], h.shape[1])}[wrt]
    return f._op("linear_sumexp_grad", [h, w, m, g], f._new(shape, h.dtype, h.mesh, name), wrt=wrt)


def chunks(n: int, v: int) -> Iterator[slice]:
    """Row ranges of ``n`` tokens whose logits (``v`` each) hold at most ``CHUNK_ELEMENTS``."""
    step = max(1, CHUNK_ELEMENTS // max(1, v))
    return (slice(i, min(n, i + step)) for i in range(0, n, step))


class _Linear(OpKind):
    """What the three share: enumerated strategies (``rules.attention``: ``strategy``
    ``"attention"``), h's N the result's first dim, and the work of its chunked local step
    (``runtime.cpu_steps.linear_loss``)."""

    strategy = "attention"

    def slots(self, op: Op) -> int:
        """None in the e-graph: its strategies are enumerated (``operand_strategies``)."""
        return 0

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        """h's, m's and g's N read the result's N; nothing else has an image (module docstring)."""
        t = fusion.tensors[op.inputs[slot]]
        return [Root(0, t.shape[0])] + [None] * (len(t.shape) - 1) if slot != 1 else [None, None]

    def local_work(self, ins: list[tuple[int, ...]], out: tuple[int, ...], itemsize: int) -> tuple[int, int, int]:
        """The flops of the local logits' matmuls (one for the reductions, two for a gradient),
        the bytes of ``PASSES`` round trips of the local logits, and ``CALLS`` kernels per chunk
        (module docstring)."""
        (n, hid), (v, _) = ins[0], ins[1]
        both = self.kind == "linear_sumexp_grad" and out[0] == n + v  # only "both" has N + V rows
        kind = "both" if both else self.kind
        matmuls = 3 if both else 2 if self.kind == "linear_sumexp_grad" else 1
        count = sum(1 for _ in chunks(n, v))
        return 2 * n * v * hid * matmuls, PASSES[kind] * n * v * itemsize, CALLS[kind] * count

    def tokens(self, op: Op) -> Placement | None:
        """The result's placement when the tokens are split (module docstring; None: no such
        strategy)."""
        return Shard(0)

    def vocab(self, op: Op) -> Placement | None:
        """The result's placement when w's vocab rows are split (module docstring; None: no
        such strategy)."""
        raise NotImplementedError(self.kind)

    def operand_strategies(self, fusion: Fusion, op: Op, placement: Any) -> list[list[Any]]:
        """The operands' placements on one mesh axis computing the result at ``placement``
        (module docstring's strategies)."""
        rep, n = Replicate(), len(op.inputs)
        found = []
        if isinstance(placement, Replicate):
            found.append([rep] * n)
        if self.tokens(op) is not None and placement == self.tokens(op):
            found.append([Shard(0), rep] + [Shard(0)] * (n - 2))
        if self.vocab(op) is not None and placement == self.vocab(op):
            found.append([rep, Shard(0)] + [rep] * (n - 2))
        if n == 4 and placement == Partial("sum"):  # g's summands: the gradient is linear in g
            found.append([rep, rep, rep, placement])
        return found


@register("linear_max")
class LinearMax(_Linear):
    builders = {"linear_max": linear_max}

    def vocab(self, op: Op) -> Placement:
        return Partial("max")

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return torch.matmul(xs[0], xs[1].t()).amax(-1)


@register("linear_sumexp")
class LinearSumexp(_Linear):
    builders = {"linear_sumexp": linear_sumexp}

    def vocab(self, op: Op) -> Placement:
        return Partial("sum")

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        h, w, m = xs
        return torch.exp(torch.matmul(h, w.t()) - m[:, None]).sum(-1)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """h and w: ``linear_sumexp_grad``; m: ``-g * out`` (``d/dm exp(x - m) = -exp(x - m)``)."""
        h, w, m = (saved(x) for x in xs)
        return [linear_sumexp_grad(f, h, w, m, g, "input"), linear_sumexp_grad(f, h, w, m, g, "weight"),
                f.neg(f.mul(g, saved(out)))]


@register("linear_sumexp_grad")
class LinearSumexpGrad(_Linear):
    builders = {"linear_sumexp_grad": linear_sumexp_grad}

    def tokens(self, op: Op) -> Placement | None:
        """The weight gradient sums over the tokens: each split's sum is a summand."""
        return {"input": Shard(0), "weight": Partial("sum")}.get(op.attrs["wrt"])

    def vocab(self, op: Op) -> Placement | None:
        return {"input": Partial("sum"), "weight": Shard(0)}.get(op.attrs["wrt"])

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        """The input gradient: as the reductions'; the weight gradient: w's V reads the result's
        V, nothing else has an image (the tokens are summed)."""
        if op.attrs["wrt"] == "input":
            return super().index_map(fusion, op, slot)
        t = fusion.tensors[op.inputs[slot]]
        return [Root(0, t.shape[0]), None] if slot == 1 and op.attrs["wrt"] == "weight" else [None] * len(t.shape)

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        h, w, m, g = xs
        p = torch.exp(torch.matmul(h, w.t()) - m[:, None]) * g[:, None]
        parts = {"input": [torch.matmul(p, w)], "weight": [torch.matmul(p.t(), h)]}
        return torch.cat(parts.get(a["wrt"]) or parts["input"] + parts["weight"])
