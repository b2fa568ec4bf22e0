"""Grouped-query attention read as it is: the repeat of k and v feeding a fused attention op
folded into the op, both ways kept (``with_gqa``).

    attention(q, repeat(k), repeat(v), m) = attention(q, k, v, m)
    read_back(attention_grad(q, repeat(k), repeat(v), g, m))[0] = read_back(attention_grad(q, k, v, g, m))[0]
    group_sum(read_back(attention_grad(q, repeat(k), repeat(v), g, m))[i]) = read_back(attention_grad(q, k, v, g, m))[i]
                                                                               (i = 1, 2: dk, dv)

``repeat`` is ``ir.ops.attention.repeat_heads`` (a reshape, a broadcast of the group dim and a
reshape: Hugging Face's ``repeat_kv``, the frontend's ``enable_gqa``), seen through ``saved``
ops (the identity); ``group_sum`` its adjoint as ``passes.autodiff`` writes it (the repeated
gradient reshaped to ``[*B, Hkv, g, S, D]`` and summed over ``g``).  The op on k and v with
``Hkv`` heads is ``attention``'s grouped-query form (``ir.ops.attention``): no repeated copy
of k and v is made, kept for the backward pass, or summed back.

Each right-hand side is added to the Fusion as ops of its own, joined to the left-hand side's
value by an ``alternative`` op (its nodes join the value's e-classes), so the e-graph holds
both ways and extraction picks per class by cost: where the mesh splits the heads into more
parts than there are kv heads, only the repeated form has a head-split plan.
"""

from __future__ import annotations

from ..ir.fusion import Fusion, Op, Tensor
from ..ir.names import saved_name
from ..ir.ops.attention import has_attention, kv_groups, read_back


def with_gqa(fusion: Fusion) -> Fusion:
    """A copy of ``fusion`` with every fused attention value whose k and v are repeated heads
    declared equal to the grouped-query form (module docstring); ``fusion`` itself when there
    is none.  The new ops come last: values, inputs and outputs, op indices and tensor ids
    stay.  Their values are named after the attention's result (``<value>.gqa``) or, for a
    gradient, its q (``<q>.gqa_grad``), so they belong to its layer (``ir.layers``)."""
    if not has_attention(fusion):
        return fusion
    found = [(op, kv) for op in fusion.ops if op.kind in ("attention", "attention_grad")
             if (kv := _unrepeated(fusion, op)) is not None]
    if not found:
        return fusion
    out = fusion.copy()
    readers = fusion.readers()
    saved = {op.inputs[0]: out.tensors[op.output] for op in fusion.ops if op.kind == "saved"}
    for op, (k, v, backward) in found:
        ts = [out.tensors[i] for i in op.inputs]
        if backward:  # the repeat was read through a saved op: its operand is read saved too
            for x in (k, v):
                if x.id not in saved:
                    saved[x.id] = out.saved(out.tensors[x.id], name=saved_name(x.name))
            k, v = saved[k.id], saved[v.id]
        a = op.attrs
        if op.kind == "attention":
            res = out.tensors[op.output]
            gqa = out.attention(ts[0], k, v, ts[3] if len(ts) > 3 else None, scale=a["scale"], causal=a["causal"],
                                safe=a["safe"], name=f"{res.name}.gqa")
            out.alternative(gqa, res)
            continue
        st = out.attention_grad(ts[0], k, v, ts[3], ts[4] if len(ts) > 4 else None, scale=a["scale"],
                                causal=a["causal"], safe=a["safe"], name=f"{ts[0].name}.gqa_grad")
        for i, new in enumerate(read_back(out, st, ts[0], k)):
            old = _gradient(fusion, readers, op, i)
            if old is not None:
                out.alternative(new, out.tensors[old])
    return out


def _through_saved(f: Fusion, t: int) -> tuple[Op | None, bool]:
    """The op computing value ``t`` past ``saved`` ops (None: an input), and whether one was
    passed."""
    crossed = False
    while t in f.producer:
        op = f.ops[f.producer[t]]
        if op.kind != "saved":
            return op, crossed
        t, crossed = op.inputs[0], True
    return None, crossed


def _repeat_of(f: Fusion, t: int) -> tuple[Tensor, int, bool] | None:
    """(x, g, whether a saved op was passed) when value ``t [*B, g·Hkv, S, D]`` is
    ``repeat_heads(x)`` (module docstring) of ``x [*B, Hkv, S, D]``, else None."""
    wide, c1 = _through_saved(f, t)
    if wide is None or wide.kind != "reshape":
        return None
    grouped = f.tensors[wide.inputs[0]].shape
    bcast, c2 = _through_saved(f, wide.inputs[0])
    if bcast is None or bcast.kind != "broadcast" or bcast.attrs["dims"] != tuple(range(len(grouped))):
        return None
    one = f.tensors[bcast.inputs[0]].shape
    unit, c3 = _through_saved(f, bcast.inputs[0])
    if unit is None or unit.kind != "reshape" or len(one) < 4:
        return None
    x = f.tensors[unit.inputs[0]]
    shape, n = f.tensors[t].shape, len(one)
    if (one[n - 3] != 1 or grouped != one[:n - 3] + (grouped[n - 3],) + one[n - 2:] or x.shape != one[:n - 3] + one[n - 2:]
            or shape != x.shape[:-3] + (x.shape[-3] * grouped[n - 3],) + x.shape[-2:]):
        return None
    return x, grouped[n - 3], c1 or c2 or c3


def _unrepeated(f: Fusion, op: Op) -> tuple[Tensor, Tensor, bool] | None:
    """(k, v, whether they are read through a saved op) when fused op ``op``'s k and v are
    ``repeat_heads`` of them with one group size, q's heads over theirs; else None."""
    k, v = _repeat_of(f, op.inputs[1]), _repeat_of(f, op.inputs[2])
    if k is None or v is None or k[1] != v[1] or k[2] != v[2]:
        return None
    if kv_groups(f.tensors[op.inputs[0]].shape, k[0].shape) != k[1] or k[0].shape != v[0].shape:
        return None
    return k[0], v[0], k[2]


def _gradient(f: Fusion, readers: dict[int, list[Op]], grad: Op, i: int) -> int | None:
    """The value of ``f`` that is gradient ``i`` (dq, dk, dv) of the repeated ``attention_grad``
    op ``grad`` summed to k's heads (dk, dv: the reshape to ``[*B, Hkv, g, S, D]`` and the sum
    over ``g`` reading it back; dq: the read-back itself), None when ``f`` has none
    (``readers``: the ops reading each value)."""
    rows = [r for r in readers.get(grad.output, []) if r.kind == "slice" and r.attrs["dim"] == 0
            and r.attrs["start"] == i and r.attrs["stop"] == i + 1]
    full = [r for s in rows for r in readers.get(s.output, []) if r.kind == "reshape"
            and f.tensors[r.output].shape == f.tensors[grad.inputs[i]].shape]
    if i == 0:
        return full[0].output if full else None
    kv = _repeat_of(f, grad.inputs[i])
    assert kv is not None
    x, g, _ = kv
    n = len(x.shape)
    want = x.shape[:n - 2] + (g,) + x.shape[n - 2:]
    for r in full:
        for grouped in readers.get(r.output, []):
            if grouped.kind != "reshape" or f.tensors[grouped.output].shape != want:
                continue
            for s in readers.get(grouped.output, []):
                if s.kind == "reduce" and s.attrs["fn"] == "sum" and tuple(s.attrs["dims"]) == (n - 2,):
                    return s.output
    return None
