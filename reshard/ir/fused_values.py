"""Which values lowering computes inside the kernels that read them (``codegen.fuse``), read off
the program alone: what recomputation's prices (``rules.remat``) and the saved twins that make
it possible (``passes.recompute``) need to know of a value before any plan exists.

``OpKind.fused_read``: an op lowering computes inside its reader's kernel (an elementwise op,
a broadcast); ``OpKind.fuses_operands``: an op whose kernel computes such operands itself (an
elementwise op; a reduction, as its prologue).  Laws (``readers``: ``Fusion.readers``):

* ``in_registers(v)``: a ``fused_read`` op makes ``v`` and its one reader (saved ops aside)
  fuses its operands: ``v`` is never written unless it is kept;
* ``read_fused(s)`` of saved op ``s`` (``saved(v)``): every reader of ``saved(v)`` fuses its
  operands, so ``saved(v)`` recomputed by a ``fused_read`` op is computed inside the kernels
  that read it (a recomputed value a matmul reads would be written by a kernel of its own).
  A saved op that ``passes.recompute`` added has no reader: only the twins of the ops along
  its chain read it, and those are ``fused_read`` ops.
"""

from __future__ import annotations

from .fusion import Fusion, Op
from .ops import op_kind


def in_registers(fusion: Fusion, v: int, readers: dict[int, list[Op]]) -> bool:
    """Is ``v`` computed in registers only, never written unless kept (module docstring)?"""
    p = fusion.producer.get(v)
    if p is None or not op_kind(fusion.ops[p].kind).fused_read:
        return False
    rest = [r for r in readers.get(v, ()) if op_kind(r.kind).boundary != "saved"]
    return len(rest) == 1 and op_kind(rest[0].kind).fuses_operands


def read_fused(s: Op, readers: dict[int, list[Op]]) -> bool:
    """Is saved op ``s``'s value read only by kernels fusing their operands (module docstring)?"""
    return all(op_kind(r.kind).fuses_operands for r in readers.get(s.output, ()))
