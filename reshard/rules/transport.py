"""Index maps of ops: how each operand's root dims read in the result's index space.

``index_map(fusion, op, slot)`` returns, for every root dim of the operand, the ID term
(over the *result's* roots) with the same values, ``RED`` for a reduced dim, or None when
the dim has no image (sliced, padded, concatenated, contracted, expanded from extent 1 by a
broadcast).  Each op declares its map in the op registry (``reshard.ir.ops``, e.g.
``views.reshape_map``); the encoder turns them into facts ``Tr(Root(operand, d, e), code) = term``.
``part_map`` adds images of splits of dims that have none themselves (a slice or cat of whole
parts, ``ir.ops.slicing``): facts ``Tr(x, code) = y``.
"""

from __future__ import annotations

from ..ir.fusion import Fusion, Op
from ..ir.ops import RED, Image, PartImage, op_kind
from ..ir.ops.views import reshape_map

__all__ = ["RED", "Image", "PartImage", "index_map", "part_map", "reshape_map"]


def index_map(fusion: Fusion, op: Op, slot: int) -> list[Image]:
    """Images of operand ``slot``'s roots in op's result (matmul: six slots, ``ir.ops.matmul``)."""
    return op_kind(op.kind).index_map(fusion, op, slot)


def part_map(fusion: Fusion, op: Op, slot: int) -> list[PartImage]:
    """Images of splits of operand ``slot``'s dims in op's result (``OpKind.part_map``)."""
    return op_kind(op.kind).part_map(fusion, op, slot)
