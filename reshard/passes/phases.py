"""Forward and backward phase of a joint (training) Fusion's values.

A value is **backward phase** when it is the result of an op that starts the backward pass
(``OpKind.boundary``: ``saved``, the forward / backward boundary, or the loss's ``grad_seed``)
or reads a backward value; every other value is **forward phase**.  Structural: no
attribute of a value says it.  Lowering runs forward steps before backward ones
(``codegen.lower``), so the forward values the backward pass reads are alive together at the
boundary (the saved activations).  A Fusion with no such op is all forward.
"""

from __future__ import annotations

from ..ir.fusion import Fusion
from ..ir.ops import op_kind


def backward_values(fusion: Fusion) -> frozenset[int]:
    """The tensor ids of the backward-phase values (module docstring), in one pass over the
    ops in program order (operands come first)."""
    out: set[int] = set()
    for op in fusion.ops:
        if op_kind(op.kind).boundary is not None or any(t in out for t in op.inputs):
            out.add(op.output)
    return frozenset(out)
