"""``prepare``: the Fusion ``optimize()`` encodes, made from the user's by the passes of
``PASSES``, by name, in this order:

1. ``padding`` (``passes.padding.pad_fusion``): when some requested sharding is uneven, the
   padded Fusion (every dim even inside the plan) and its boundary (``Padding``);
2. ``decompositions`` (``passes.decompositions.with_decompositions``): the decomposed form of
   every fused attention value as an alternative (named after its layer's values);
3. ``gqa`` (``passes.gqa.with_gqa``): every fused attention value whose k and v are repeated
   kv heads, computed from the kv heads as they are (grouped-query attention), as an alternative;
4. ``fused_loss`` (``passes.fused_loss.with_fused_loss``; only when asked, under a memory
   budget, with ``recompute``): the fused linear cross entropy of every softmax over a linear's
   logits as an alternative of its unfused values (the logits recomputed in chunks);
5. ``recompute`` (``passes.recompute.with_saved_operands``): saved twins of every forward value
   a recompute reads (asked under a memory budget), else of those along chains of ops that
   lowering fuses into their readers (recomputing those costs no time of its own);
6. ``layers`` (``ir.layers.find_stack``; only when asked, for planning a stack's layers once):
   the regular stack of repeated layers, found before buckets are added;
7. ``buckets`` (``passes.buckets.bucket_gradients``): gradient buckets as alternatives, grouped
   within one layer of the stack when one was found.

Each pass returns a Fusion computing the same outputs (law of each module); none decides a
sharding (the e-graph does).  ``passes.autodiff`` (the frontend's ``joint``) and
``passes.pins`` (hand-pinned shardings) run before ``optimize()``, where a caller asks for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..ir.fusion import Fusion
from ..ir.layers import Stack, find_stack
from .buckets import bucket_gradients
from .decompositions import with_decompositions
from .fused_loss import with_fused_loss
from .gqa import with_gqa
from .padding import Padding, pad_fusion
from .recompute import with_saved_operands


@dataclass(frozen=True)
class Options:
    """What the planner asks of the passes: saved twins for recomputing any chain (``recompute``;
    else only chains of ops fused into their readers); the
    stack of at least ``stack_depth`` layers (None: no stack is looked for)."""

    recompute: bool = False
    stack_depth: int | None = None


@dataclass(frozen=True)
class Prepared:
    """The Fusion to encode (``fusion``) and what the passes found on the way: the boundary of
    the padded Fusion (``padding``; None when nothing is uneven), the stack of the Fusion before
    buckets (``stack``), and whether buckets were added (``bucketed``)."""

    fusion: Fusion
    padding: Padding | None = None
    stack: Stack | None = None
    bucketed: bool = False


def _padding(p: Prepared, o: Options) -> Prepared:
    padding = pad_fusion(p.fusion)
    return p if padding is None else replace(p, fusion=padding.fusion, padding=padding)


def _decompositions(p: Prepared, o: Options) -> Prepared:
    return replace(p, fusion=with_decompositions(p.fusion))


def _gqa(p: Prepared, o: Options) -> Prepared:
    return replace(p, fusion=with_gqa(p.fusion))


def _fused_loss(p: Prepared, o: Options) -> Prepared:
    return replace(p, fusion=with_fused_loss(p.fusion)) if o.recompute else p


def _recompute(p: Prepared, o: Options) -> Prepared:
    return replace(p, fusion=with_saved_operands(p.fusion, fused_only=not o.recompute))


def _layers(p: Prepared, o: Options) -> Prepared:
    return p if o.stack_depth is None else replace(p, stack=find_stack(p.fusion, min_depth=o.stack_depth))


def _buckets(p: Prepared, o: Options) -> Prepared:
    f, stack = p.fusion, p.stack
    out = bucket_gradients(f, None if stack is None else lambda v: stack.layer_of.get(f.producer[v]))
    return replace(p, fusion=out, bucketed=out is not f)


#: the passes, by name, in the order ``prepare`` runs them (module docstring)
PASSES: tuple[tuple[str, Callable[[Prepared, Options], Prepared]], ...] = (
    ("padding", _padding), ("decompositions", _decompositions), ("gqa", _gqa), ("fused_loss", _fused_loss),
    ("recompute", _recompute), ("layers", _layers),
    ("buckets", _buckets))


def prepare(fusion: Fusion, options: Options = Options()) -> Prepared:
    """``fusion`` through every pass of ``PASSES`` in order (module docstring)."""
    p = Prepared(fusion)
    for _, run in PASSES:
        p = run(p, options)
    return p
