"""The families of e-nodes a candidate of ``extract.select`` prices out, and that pricing.

A *priced-out* candidate searches (and, for the model-parallel one, finishes) its plan with
every e-node of a family costing more than all other nodes together (``dear``): it takes one
only where an output has no way without it.  Two families, each a property of the (value,
dist) class a node computes:

- ``data_axis_split``: a value split (not Replicate) along a data axis (``encode.data_axes``):
  the data-axis candidate computes every value whole on each rank of the data axes.
- ``model_axis_split``: a value split, on a mesh axis that is not a data axis, along a dim that
  indexes the data (``ir.dim_classes.activation_dims``: the batch, the sequence): the
  model-parallel candidate splits, on the model axes, only dims a parameter's dims reach
  (hidden, heads, ffn, vocab), Megatron's tensor parallelism, never sequence parallelism.

Fed inputs (``InAt``) are never priced out: they are fed as their placements say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir.dim_classes import activation_dims
from ..ir.fusion import Fusion
from ..ir.ids import root_dims
from ..ir.sharding import Partial, Replicate
from ..search.snapshot import Snapshot
from .dag import ENode, _Costs


def _family(nodes: list[ENode], names: dict[Any, tuple[int, Any]], member: Callable[[int, Any], bool]
            ) -> frozenset[int]:
    """The e-nodes of ``nodes`` (fed inputs aside) whose (value, dist class), ``names[cls]``,
    is a ``member``; each class asked once."""
    seen: dict[tuple[int, Any], bool] = {}
    out = []
    for n in nodes:
        if n.ctor == "InAt":
            continue
        key = names[n.cls]
        m = seen.get(key)
        if m is None:
            m = seen[key] = member(*key)
        if m:
            out.append(n.id)
    return frozenset(out)


def data_axis_split(snap: Snapshot, nodes: list[ENode], names: dict[Any, tuple[int, Any]],
                    axes: frozenset[int]) -> frozenset[int]:
    """The e-nodes of ``nodes`` that compute a value split (not Replicate) along one of ``axes``
    (the data axes, ``encode.data_axes``), fed inputs aside: what the data-axis candidate prices
    out.  ``names``: ``real_classes(snap)``."""
    if not axes:
        return frozenset()
    whole: dict[Any, bool] = {}  # dist class -> Replicate on every data axis

    def split(_: int, d: Any) -> bool:
        if d not in whole:
            whole[d] = all(snap.replicated(d, a) for a in axes)
        return not whole[d]

    return _family(nodes, names, split)


def model_axis_split(snap: Snapshot, nodes: list[ENode], names: dict[Any, tuple[int, Any]], fusion: Fusion,
                     data: frozenset[int]) -> frozenset[int]:
    """The e-nodes of ``nodes`` that compute a value split, on a mesh axis not in ``data`` (the
    data axes), along a dim that indexes the data (``activation_dims``), fed inputs aside: what
    the model-parallel candidate prices out.  Empty for a program with no trained parameters."""
    act = activation_dims(fusion)
    if not act:
        return frozenset()
    ids = snap.id_terms()

    def split(tid: int, d: Any) -> bool:
        return any(a not in data and not isinstance(p, (Replicate, Partial))
                   and any((tid, r) in act for r in root_dims(p))
                   for a, p in enumerate(snap.axis_placements(d, ids)))

    return _family(nodes, names, split)


def dear(costs: _Costs, family: frozenset[int]) -> _Costs:
    """``costs`` with each node of ``family`` priced out: at more than all other nodes
    together, as far as int64 sums allow (a priced-out candidate's pricing)."""
    total = int(costs.costs.sum())
    penalty = min(total + 1, (2**62 - total) // max(1, len(family)))
    extra = np.zeros(len(costs.costs), dtype=np.int64)
    extra[sorted(family)] = penalty
    return _Costs.of_array(costs.costs + extra)
