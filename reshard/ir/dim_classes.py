"""Dim classes: which dims of a program's values index the same thing, across its ops.

Two root dims are in one class when an op's index map (``OpKind.index_map``, ``part_map``)
says one reads the other: an elementwise op's operand dim d and its result dim d, a reshape's
dim and the result dims its image spans, a matmul's contracted dims of both operands (one
class for the contraction), a transposed dim and its new place.  A class that holds a dim of a
trained parameter (an input whose gradient is an output, ``passes.autodiff``'s law) indexes
the *model*: hidden, heads, head dim, ffn, vocab.  A class that holds a dim of another input
(the tokens, the labels, the positions, a mask) and none of a parameter indexes the *data*:
the batch and the sequence (and the batch and sequence merged into one dim by a reshape).

``activation_dims`` gives the data dims of every value: a value split along one of them on a
mesh axis is batch- or sequence-parallel there (``extract``'s model-parallel candidate prices
such splits out on the model axes).  Law: the classes follow only the ops' declared index maps,
so renaming values or reordering independent ops gives the same classes; a dim no input reaches
(an op with no declared map, a fused attention) is in neither kind.
"""

from __future__ import annotations

from .fusion import Fusion
from .ids import Root, root_dims
from .names import grad_name
from .ops import RED, op_kind

#: a root dim of a value (tensor id, dim), or a matmul's contraction space (-1 - op index, its number)
Dim = tuple[int, int]


class _Classes:
    """Union-find over ``Dim``s."""

    def __init__(self) -> None:
        self.up: dict[Dim, Dim] = {}

    def find(self, x: Dim) -> Dim:
        root = x
        while self.up.get(root, root) != root:
            root = self.up[root]
        while x != root:  # (path compression)
            self.up[x], x = root, self.up.get(x, x)
        return root

    def join(self, x: Dim, y: Dim) -> None:
        a, b = self.find(x), self.find(y)
        if a != b:
            self.up[max(a, b)] = min(a, b)


def _classes(fusion: Fusion) -> _Classes:
    """The dims of ``fusion`` joined along every op's index maps (module docstring)."""
    dims = _Classes()
    for op in fusion.ops:
        spec = op_kind(op.kind)
        for slot in range(min(spec.slots(op), 4)):  # (slots 4, 5 of a matmul repeat 0, 1 in part)
            src = op.inputs[slot % 2]
            dst = -1 - op.index if slot in (2, 3) else op.output
            for d, img in enumerate(spec.index_map(fusion, op, slot)):
                if img is None or img == RED:
                    continue
                for r in ([img.dim] if isinstance(img, Root) else sorted(root_dims(img))):
                    dims.join((src, d), (dst, r))
            for x, y in spec.part_map(fusion, op, slot):
                for d in sorted(root_dims(x)):
                    for r in sorted(root_dims(y)):
                        dims.join((src, d), (dst, r))
    return dims


def parameters(fusion: Fusion) -> frozenset[int]:
    """The trained parameters: inputs whose gradient (``grad.<name>``) is an output."""
    outs = {fusion.tensors[tid].name for tid, _ in fusion.outputs}
    return frozenset(i for i in fusion.inputs if grad_name(fusion.tensors[i].name) in outs)


def activation_dims(fusion: Fusion) -> frozenset[Dim]:
    """Every (value, dim) of ``fusion`` whose class holds a dim of an input that is not a
    trained parameter and none of a parameter (module docstring); empty for a program with no
    parameters (a forward program: nothing tells model dims from data dims there)."""
    params = parameters(fusion)
    if not params:
        return frozenset()
    dims = _classes(fusion)
    model, data = set(), set()
    for i in fusion.inputs:
        for d in range(len(fusion.tensors[i].shape)):
            (model if i in params else data).add(dims.find((i, d)))
    data -= model
    return frozenset((t.id, d) for t in fusion.tensors for d in range(len(t.shape)) if dims.find((t.id, d)) in data)
