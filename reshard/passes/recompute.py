"""Saved twins for recomputation: a training Fusion's forward values that recomputing a saved
value would read, each given a ``saved`` op of its own.

Autodiff saves only what the backward pass reads (``passes.autodiff``), so ``rules.remat``
can recompute ``saved(v)`` for ``v = op_k(a, b)`` only when ``a`` and ``b`` happen to be saved
too.  ``with_saved_operands`` adds ``saved(a)`` for every operand ``a`` of the producer of a
saved value, and then of theirs (the closure, back to the program inputs), so that any chain
of forward ops can be recomputed from whatever the extractor keeps (inputs and parameters
cost nothing to keep).  The added saved values have no consumer: they are alternatives for
remat's twins only, and a plan that does not use them has no step for them.  Values, inputs
and outputs are unchanged (the new ops come last, so the old op indices and tensor ids stay).
"""

from __future__ import annotations

from ..ir.fusion import Fusion
from ..ir.ops import op_kind


def with_saved_operands(fusion: Fusion) -> Fusion:
    """A copy of ``fusion`` with a ``saved`` op (named ``<value>.saved``) for every forward
    value that recomputing a saved value reads and that has none (module docstring); ``fusion``
    itself when it has no ``saved`` op."""
    saved = {op.inputs[0] for op in fusion.ops if op_kind(op.kind).boundary == "saved"}
    need: set[int] = set()
    todo = list(saved)
    while todo:
        producer = fusion.ops[fusion.producer[todo.pop()]]
        for a in producer.inputs:
            if a not in saved and a not in need:
                need.add(a)
                todo.append(a)
    if not need:
        return fusion
    out = fusion.copy()
    for a in sorted(need):
        out.saved(out.tensors[a], name=f"{fusion.tensors[a].name}.saved")
    return out
