"""Scatters that add into the buffer they are summed with, instead of into zeros.

Law: a scatter ``S(g, i)`` (``unpick``, ``embedding_grad``: ``Scatter`` kinds) adds ``g``'s
values at ``i`` into a block of zeros (on a vocab-split block, the masked local scatter: each
rank adds the values whose index its rows hold).  For a buffer ``a`` of the result's local
shape and dtype, ``a + S(g, i) = S_a(g, i)``: the same values added at ``i`` into ``a``
(the CPU step, ``runtime.cpu_steps.lookup``, with ``a`` as a third operand, the accumulator).  For ``unpick`` (one
value per element) the floats are the same (``a + (0 + g) = a + g``); for ``embedding_grad``
the tokens of one row are added into ``a`` one by one rather than summed first (the same sum,
associated otherwise).

So where an ``apply binary add`` step reads, in either slot, the result of a scatter step that
nothing else reads and that is not kept (a program output), the two steps become one scatter
step reading ``(g, i, a)``, at the add's place (every operand is ready there).  Its result may
then take ``a``'s memory where ``a`` dies at that step (``codegen.alloc.in_place``, read off
``OpKind.accumulator``), so cross entropy's gradient ``softmax * dlse - unpick(dnll, target)``
is the softmax-gradient's buffer with the target column added in, and no zeroed
``[tokens, vocab]`` block is written beside it (nor, for a tied embedding, a second
``[vocab, hidden]`` gradient beside the lm_head's).

A lowering rewrite, not a choice the e-graph makes: it is exact, moves fewer bytes (the
scatter writes ``g``'s elements, not a whole block the add then reads again) and holds one
buffer where the two steps held two, whatever the shardings; the steps keep the sharding the
e-graph chose for the scatter (its ``dst``).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir.ops import OPS
from .program import Step

__all__ = ["accumulate_scatters"]

#: the kinds whose local step may add into an accumulator (``OpKind.accumulates``: the scatters)
SCATTERS = frozenset(k for k, spec in OPS.items() if spec.accumulates)


def _scatter(s: Step) -> bool:
    return s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") in SCATTERS and len(s.ins) == 2


def _add(s: Step) -> bool:
    return s.kind == "local" and s.attr("op") == "apply" and s.attr("fop") == "binary" and s.attr("fn") == "add"


def accumulate_scatters(steps: list[Step], keep: set[str], meta: Mapping[str, tuple[tuple[int, ...], str]]
                        ) -> list[Step]:
    """``steps`` with every ``add(a, scatter(g, i))`` (either order) of a scatter result read
    by that add alone and not kept made one scatter step into ``a`` (module docstring).
    ``keep``: buffers that must stay; ``meta``: local (shape, dtype) of every buffer."""
    readers: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for b in s.ins:
            readers.setdefault(b, []).append(i)
    producer = {s.out: i for i, s in enumerate(steps)}
    merged: dict[int, Step] = {}  # add step -> its scatter step into the other operand
    gone: set[int] = set()
    for j, s in enumerate(steps):
        if not _add(s) or len(s.ins) != 2 or s.ins[0] == s.ins[1]:
            continue
        for slot in (1, 0):
            u, a = s.ins[slot], s.ins[1 - slot]
            i = producer.get(u)
            if (i is None or i in gone or not _scatter(steps[i]) or u in keep or readers.get(u) != [j]
                    or meta[a] != meta[s.out] or meta[u] != meta[s.out] or steps[i].attr("on") != s.attr("on")):
                continue
            sc = steps[i]
            merged[j] = Step(sc.kind, s.out, (*sc.ins, a), sc.attrs)
            gone.add(i)
            break
    return [merged.get(j, s) for j, s in enumerate(steps) if j not in gone]
