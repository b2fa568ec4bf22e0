"""Index maps of ops: how each operand's root dims read in the result's index space.

``index_map(op, slot, fusion)`` returns, for every root dim of the operand, the ID term
(over the *result's* roots) with the same values, ``RED`` for a reduced dim, or None when
the dim has no image (sliced, padded, concatenated, contracted, expanded from extent 1 by a
broadcast).  The encoder turns them
into facts ``Tr(Root(operand, d, e), code) = term``.  Reshape factors into merges and splits: in a
group of operand dims [e_1..e_p] and result dims whose products agree, with M = Merge of
the result roots, operand dim t = Outer(Inner(M, e_1..e_{t-1}), e_t).
"""

from __future__ import annotations

import math
from typing import Union

from ..ir.errors import ReshardError
from ..ir.fusion import Fusion, Op
from ..ir.ids import ID, Inner, Merge, Outer, Root

RED = "red"
Image = Union[ID, str, None]


def _identity(shape: tuple[int, ...], skip: tuple[int, ...] = ()) -> list[Image]:
    return [None if d in skip else Root(d, e) for d, e in enumerate(shape)]


def reshape_map(src: tuple[int, ...], dst: tuple[int, ...]) -> list[Image]:
    """Each src root as a term over dst roots (size-1 dims map to nothing)."""
    out: list[Image] = [None] * len(src)
    i = j = 0
    while i < len(src) or j < len(dst):
        while i < len(src) and src[i] == 1:
            i += 1
        while j < len(dst) and dst[j] == 1:
            j += 1
        if i >= len(src) and j >= len(dst):
            break
        gi, gj = [i], [j]
        pi, pj = src[i], dst[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(i)
                pi *= src[i]
                i += 1
            else:
                gj.append(j)
                pj *= dst[j]
                j += 1
        gj = [d for d in gj if dst[d] != 1]
        m: ID = Root(gj[-1], dst[gj[-1]])
        for d in reversed(gj[:-1]):
            m = Merge(Root(d, dst[d]), m)
        gi = [d for d in gi if src[d] != 1]
        before = 1
        for t, d in enumerate(gi):
            x: ID = m if before == 1 else Inner(m, before)
            out[d] = x if t == len(gi) - 1 else Outer(x, src[d])
            before *= src[d]
    return out


def index_map(fusion: Fusion, op: Op, slot: int) -> list[Image]:
    """Images of operand ``slot``'s roots in op's result.  Matmul has six: 0/1 lhs/rhs into
    the result; 2/3 lhs/rhs into the contraction space (a 1-D space, root 0 = the contracted
    dim); 4/5 only the lhs/rhs dims that a shard may keep while the other operand is whole
    (lhs m, plus lhs batch when rhs is 2-D and broadcasts; rhs n)."""
    src = fusion.tensors[op.inputs[slot % 2]].shape
    out = fusion.tensors[op.output].shape
    k, a = op.kind, op.attrs
    if k in ("unary", "binary", "scale", "cast", "set", "redistribute"):
        return _identity(src)
    if k == "reshape":
        return reshape_map(src, out)
    if k == "permute":
        inv = {p: j for j, p in enumerate(a["perm"])}
        return [Root(inv[d], e) for d, e in enumerate(src)]
    if k in ("slice", "pad", "cat"):
        return _identity(src, (a["dim"],))
    if k == "broadcast":
        # operand dim d reads result dim dims[d]; an expanded extent-1 dim, like the new
        # result dims, has no image (its result dim can only be unsharded there)
        return [Root(a["dims"][d], e) if out[a["dims"][d]] == e else None for d, e in enumerate(src)]
    if k == "reduce":
        res: list[Image] = []
        j = 0
        for d, e in enumerate(src):
            if d in a["dims"]:
                res.append(RED)
            else:
                res.append(Root(j, e))
                j += 1
        return res
    if k == "matmul":
        nb = len(out) - 2
        if slot == 0:
            return [Root(d, e) for d, e in enumerate(src[:-1])] + [None]
        if slot == 1:
            lead = [Root(d, e) for d, e in enumerate(src[:-2])] if len(src) > 2 else []
            return lead + [None, Root(nb + 1, src[-1])]
        if slot == 2:
            return [None] * (len(src) - 1) + [Root(0, src[-1])]
        if slot == 3:
            return [None] * (len(src) - 2) + [Root(0, src[-2]), None]
        if slot == 4:
            rhs_batched = len(fusion.tensors[op.inputs[1]].shape) > 2
            return [None if rhs_batched else Root(d, e) for d, e in enumerate(src[:-2])] + [Root(nb, src[-2]), None]
        return [None] * (len(src) - 1) + [Root(nb + 1, src[-1])]
    raise ReshardError(f"{op!r}: no index map for op kind {k!r}")


def check_map(src: tuple[int, ...], images: list[Image]) -> None:
    """Sanity: every image has the extent of its root."""
    from ..ir.ids import extent
    for d, img in enumerate(images):
        if img is not None and img != RED and extent(img) != src[d]:
            raise ReshardError(f"internal: index map image {img} of dim {d} has extent {extent(img)} != {src[d]}")
    assert math.prod(src) >= 1
