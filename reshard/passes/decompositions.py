"""The decomposed form of every fused attention value, declared equal to it (``rules.attention``'s
law, both ways): ``with_decompositions``.

    attention(q, k, v, m) = softmax(q @ k^T * scale + m) @ v        (``decomposed_attention``)
    reshape(slice(attention_grad(q, k, v, g, m), 0, i, i + 1)) = (dq, dk, dv)[i]
                                                                     (``decomposed_attention_grad``)

Each right-hand side is added to the Fusion as ops of its own, joined to the left-hand side's
value by an ``alternative`` op (its nodes join the value's e-classes), so the e-graph holds both
ways and extraction picks per class by cost.
"""

from __future__ import annotations

from ..ir.fusion import Fusion, Op, Tensor
from ..ir.ops.attention import decomposed_attention, decomposed_attention_grad, has_attention


def with_decompositions(fusion: Fusion) -> Fusion:
    """A copy of ``fusion`` with the decomposed form of every fused attention value declared
    equal to it (module docstring); ``fusion`` itself when it has none.  The new ops come last:
    values, inputs and outputs, op indices and tensor ids stay.  Their values are named after
    the attention's result (``<value>.decomposed.<part>``) or, for a gradient, its q
    (``<q>.decomposed_grad.<part>``), so a decomposed form belongs to its layer (``ir.layers``)."""
    if not has_attention(fusion):
        return fusion
    out = fusion.copy()
    grads: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
    for op in fusion.ops:
        if op.kind == "attention":
            q, k, v, m = _operands(out, op)
            res = out.tensors[op.output]
            out.alternative(decomposed_attention(out, q, k, v, m, op.attrs["scale"], op.attrs["safe"],
                                                 f"{res.name}.decomposed"), res)
        elif op.kind == "reshape":
            read = _read_back(fusion, op)
            if read is None:
                continue
            g, i = read
            if g.index not in grads:
                q, k, v, m = _operands(out, g)
                grads[g.index] = decomposed_attention_grad(out, q, k, v, out.tensors[g.inputs[3]], m,
                                                           g.attrs["scale"], g.attrs["safe"],
                                                           f"{q.name}.decomposed_grad")
            out.alternative(grads[g.index][i], out.tensors[op.output])
    return out


def _operands(f: Fusion, op: Op) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """q, k, v and the mask (None: none) of a fused op."""
    n = 3 if op.kind == "attention" else 4
    ts = [f.tensors[i] for i in op.inputs]
    return ts[0], ts[1], ts[2], ts[n] if len(ts) > n else None


def _read_back(fusion: Fusion, op: Op) -> tuple[Op, int] | None:
    """(the ``attention_grad`` op, i) when reshape ``op`` reads gradient i back out of it (a
    slice ``[i, i + 1)`` of dim 0, reshaped to the operand's shape), else None."""
    sl = fusion.ops[fusion.producer[op.inputs[0]]]
    if sl.kind != "slice" or sl.attrs["dim"] != 0 or sl.attrs["stop"] != sl.attrs["start"] + 1:
        return None
    g = fusion.ops[fusion.producer[sl.inputs[0]]]
    if g.kind != "attention_grad" or fusion.tensors[op.output].shape != fusion.tensors[g.inputs[0]].shape:
        return None
    return g, sl.attrs["start"]
