"""Complex values as pairs of reals: what every layer of the frontend reads of the representation.

A complex torch tensor of shape ``S`` is held in the Fusion as the float tensor of shape
``S + (2,)`` (the last dim: real part, imaginary part), ``torch.view_as_real``'s layout:
complex64 as float32, complex128 as float64.  Its placements name the complex dims; the pair
dim is never sharded by them (``pair_sharding``).  The ops on such values are
``frontend.aten_complex``'s.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ir.sharding import TensorSharding


def is_complex(v: Any) -> bool:
    """Is ``v`` (a graph node's value: a tensor, or a tuple of them) complex?"""
    if isinstance(v, (tuple, list)):
        return any(is_complex(x) for x in v)
    return isinstance(v, torch.Tensor) and v.is_complex()


def as_pairs(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the Fusion holds it: a complex tensor as its pairs (conjugation resolved), any
    other as it is."""
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def pair_sharding(ts: TensorSharding | None) -> TensorSharding | None:
    """The sharding of a complex value's pairs from its own (the pair dim whole on every
    mesh axis; None stays None)."""
    if ts is None:
        return None
    true = None if ts.true_shape is None else ts.true_shape + (2,)
    return TensorSharding(ts.mesh, ts.shape + (2,), ts.axes, true)
