"""Small Fusions covering every op kind and rule family; shared by the optimizer tests."""

from __future__ import annotations

from collections.abc import Callable

import torch

import reshard as rs
from reshard.ir import Inner, Merge, Outer, Root, TensorSharding
from reshard.passes.autodiff import joint
from reshard.ir.fusion import DTYPES
from reshard.ir.ops import op_kind

MESH1 = rs.DeviceMesh([0, 1])
MESH4 = rs.DeviceMesh([0, 1, 2, 3])
MESH2D = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))
MESH_ONE = rs.DeviceMesh([0])
MESH4x1 = rs.DeviceMesh([[0], [1], [2], [3]], ("x", "y"))
D, A, H, B, S = 2, 4, 16, 2, 3

Program = tuple[rs.Fusion, dict[str, torch.Tensor]]


def index_bounds(f: rs.Fusion) -> dict[int, int]:
    """Tensor id -> the vocabulary of the lookup reading it as indices (a gather's table's indexed
    dim, a scatter's result's scattered dim)."""
    out = {}
    for op in f.ops:
        kind = op_kind(op.kind)
        if kind.strategy == "lookup":
            rows = kind.scattered_dims(f, op)
            vocab = f.tensors[op.output].shape[rows[0]] if rows else f.tensors[op.inputs[0]].shape[kind.indexed]
            out[op.inputs[1]] = vocab
    return out


def _inputs(f: rs.Fusion, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Normal floats; the indices of a lookup uniform over its vocabulary."""
    bounds = index_bounds(f)
    return {f.tensors[i].name: torch.randint(0, bounds[i], f.tensors[i].shape, generator=gen) if i in bounds
            else torch.randn(f.tensors[i].shape, generator=gen).to(DTYPES[f.tensors[i].dtype]) for i in f.inputs}


def split_h() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (H,), "float32", MESH1, [rs.Shard(0)])
    f.output(f.reshape(x, (D, H // D)), [rs.Shard(0)])
    return f


def split_h_three() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (H,), "float32", MESH1, [rs.Shard(0)])
    f.output(f.reshape(x, (D, A // D, H // A)), [rs.Shard(0)])
    return f


def merge_heads() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (A, H // A), "float32", MESH1, [rs.Shard(0)])
    f.output(f.reshape(x, (D, A // D, H // A)), [rs.Shard(0)])
    return f


def merge_then_split() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (A, H // A), "float32", MESH1, [rs.Shard(0)])
    y = f.reshape(x, (H,))
    f.output(f.reshape(y, (D, H // D)), [rs.Shard(0)])
    return f


def manual_heads() -> rs.Fusion:
    """[b,s,h] -> [b,s,a,h/a] with the output sharded [b,s,d,a/d,h/a] (loop domain)."""
    f = rs.Fusion()
    x = f.input("x", (B, S, H), "float32", MESH1, [rs.Shard(2)])
    y = f.reshape(x, (B, S, A, H // A))
    f.output(y, TensorSharding(MESH1, (B, S, A, H // A), (Outer(Root(2, A), D),)))
    return f


def qkv_slice() -> rs.Fusion:
    """seed 000's [b,s,3dh] -> [b,s,dh] slice of a sharded dim: not local."""
    f = rs.Fusion()
    x = f.input("x", (B, S, 3 * D * H), "float32", MESH1, [rs.Shard(2)])
    f.output(f.slice(x, 2, 0, D * H), [rs.Shard(2)])
    return f


def redistribute(src: list, dst: list, mesh: rs.DeviceMesh = MESH1, shape: tuple = (8, 12)) -> Callable[[], rs.Fusion]:
    def build() -> rs.Fusion:
        f = rs.Fusion()
        x = f.input("x", shape, "float32", mesh, src)
        f.output(f.redistribute(x, dst), dst)
        return f
    build.__name__ = f"redistribute_{src}_{dst}"
    return build


def matmul_small_out(m: int = 8, dtype: str = "float32") -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (64, 1024), dtype, MESH1, [rs.Shard(0)])
    w = f.input("w", (1024, m), dtype, MESH1, [rs.Replicate()])
    f.output(f.matmul(x, w), [rs.Replicate()])
    return f


def mlp(mesh: rs.DeviceMesh = MESH1, s: int = 16, h: int = 32) -> rs.Fusion:
    """Megatron MLP: only input/output and weight shardings given."""
    f = rs.Fusion()
    x = f.input("x", (s, h), "float32", mesh, [rs.Shard(0)])
    w1 = f.input("w1", (h, 4 * h), "float32", mesh, [rs.Shard(1)])
    w2 = f.input("w2", (4 * h, h), "float32", mesh, [rs.Shard(0)])
    y = f.matmul(f.gelu(f.matmul(x, w1)), w2)
    f.output(y, [rs.Shard(0)])
    return f


def attention() -> rs.Fusion:
    """Heads sharded: x @ Wqkv, per-head reshape, q/k/v slices, scores, softmax-free mix."""
    s, h, a = 8, 16, 4
    f = rs.Fusion()
    x = f.input("x", (s, h), "float32", MESH1, [rs.Replicate()])
    wq = f.input("wq", (h, h), "float32", MESH1, [rs.Shard(1)])
    wk = f.input("wk", (h, h), "float32", MESH1, [rs.Shard(1)])
    wo = f.input("wo", (h, h), "float32", MESH1, [rs.Shard(0)])
    q = f.permute(f.reshape(f.matmul(x, wq), (s, a, h // a)), (1, 0, 2))
    k = f.permute(f.reshape(f.matmul(x, wk), (s, a, h // a)), (1, 2, 0))
    sc = f.tanh(f.scale(f.matmul(q, k), 0.5))
    ctx = f.matmul(sc, q)
    o = f.reshape(f.permute(ctx, (1, 0, 2)), (s, h))
    f.output(f.matmul(o, wo), [rs.Replicate()])
    return f


def reductions() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (8, 6, 4), "float32", MESH1, [rs.Shard(0)])
    a = f.sum(x, 0)
    b = f.mean(x, (0, 2))
    c = f.max(x, 0)
    f.output(a, [rs.Replicate()])
    f.output(b, [rs.Shard(0)])
    f.output(c, [rs.Shard(1)])
    return f


def layout_ops() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (8, 6), "float32", MESH1, [rs.Shard(1)])
    y = f.input("y", (8, 6), "float32", MESH1, [rs.Shard(0)])
    z = f.add(x, y)  # operands disagree: implicit resharding on either side
    c = f.cat([z, f.neg(y)], 1)
    p = f.pad(c, 0, 1, 1)
    q = f.cast(f.exp(f.set(p)), "float64")
    f.output(q, [rs.Shard(1)])
    f.output(f.permute(c, (1, 0)), [rs.Shard(0)])
    return f


def open_inputs() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", MESH1, [rs.Shard(0)])
    w = f.input("w", (16, 4), "float32", MESH1)  # sharding left to the optimizer
    f.output(f.relu(f.matmul(x, w)), [rs.Shard(0)])
    return f


def mesh2d_block() -> rs.Fusion:
    """Tensor x data parallel MLP on a 2x2 mesh with a 2-D Partial sum."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", MESH2D, [rs.Shard(0), rs.Replicate()])
    w1 = f.input("w1", (16, 32), "float32", MESH2D, [rs.Replicate(), rs.Shard(1)])
    w2 = f.input("w2", (32, 16), "float32", MESH2D, [rs.Replicate(), rs.Shard(0)])
    y = f.matmul(f.silu(f.matmul(x, w1)), w2)
    f.output(y, [rs.Shard(0), rs.Replicate()])
    return f


def partial_inputs() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (8, 12), "float32", MESH2D, [rs.Partial(), rs.Shard(1)])
    y = f.input("y", (8, 12), "float32", MESH2D, [rs.Partial(), rs.Shard(1)])
    f.output(f.sub(x, y), [rs.Shard(0), rs.Shard(1)])
    return f


def cyclic_reduce() -> rs.Fusion:
    """A cyclically sharded dim (Inner split) reduced away: the result is Partial."""
    f = rs.Fusion()
    x = f.input("x", (8, 6), "float32", MESH1, TensorSharding(MESH1, (8, 6), (Inner(Root(0, 8), 4),)))
    f.output(f.sum(x, 0), [rs.Replicate()])
    return f


def merged_reduce() -> rs.Fusion:
    """Reduce two dims whose factors are merged into one mesh axis (the sharded index is a
    Merge of an inner and an outer split: not expressible with placements)."""
    f = rs.Fusion()
    bound = Merge(Inner(Root(0, 4), 2), Outer(Root(1, 4), 2))
    x = f.input("x", (4, 4, 6), "float32", MESH4, TensorSharding(MESH4, (4, 4, 6), (bound,)))
    f.output(f.sum(x, (0, 1)), [rs.Replicate()])
    return f


def transformer_like() -> rs.Fusion:
    """The README demo's block at small size (attention + MLP with residuals)."""
    from reshard.examples import transformer_block
    return transformer_block(MESH1, seq=8, hidden=16, heads=4)


def one_row_per_device() -> rs.Fusion:
    """Dim 0 has exactly one element per device of mesh axis "y", so its split is the dim
    itself: collectives on it need no reorder copy (the cost rules' ``Root`` layout cases)."""
    f = rs.Fusion()
    x = f.input("x", (2, 8), "float32", MESH2D, [rs.Replicate(), rs.Shard(0)])
    z = f.input("z", (2, 8), "float32", MESH2D, [rs.Replicate(), rs.Partial()])
    f.output(f.exp(x), [rs.Replicate(), rs.Replicate()])
    f.output(f.tanh(x), [rs.Replicate(), rs.Shard(1)])
    f.output(f.neg(z), [rs.Replicate(), rs.Shard(0)])
    return f


def transposed_matmuls() -> rs.Fusion:
    """Matmuls with transposed operands (``alias``: read as views): nn.Linear's x @ w.T, a
    transposed lhs, both transposed and batched; the transposed w is also an output (its
    permute then still runs, for that consumer)."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", MESH1, [rs.Shard(0)])
    w = f.input("w", (12, 16), "float32", MESH1, [rs.Shard(0)])
    a = f.input("a", (16, 8), "float32", MESH1, [rs.Replicate()])
    c = f.input("c", (2, 6, 4), "float32", MESH1, [rs.Shard(0)])
    d = f.input("d", (2, 5, 6), "float32", MESH1, [rs.Shard(0)])
    wt = f.permute(w, (1, 0))
    f.output(f.matmul(x, wt), [rs.Shard(0)])
    f.output(f.matmul(f.permute(a, (1, 0)), wt), [rs.Replicate()])
    f.output(f.matmul(f.permute(c, (0, 2, 1)), f.permute(d, (0, 2, 1))), [rs.Shard(0)])
    f.output(wt, [rs.Shard(1)])
    return f


def training_linear() -> rs.Fusion:
    """``x @ w.T`` and its input gradient, by hand: the backward reads the saved transpose of the
    parameter transposed, which is ``w`` itself (``kept-input-transpose``: it keeps no bytes;
    lowering reads ``w``, ``codegen.transposes``)."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", MESH1, [rs.Shard(0)])
    w = f.input("w", (12, 16), "float32", MESH1, [rs.Replicate()])
    wt = f.permute(w, (1, 0), name="wt")
    y = f.matmul(x, wt, name="y")
    loss = f.sum(f.reshape(y, (1, 96)), 1, name="loss")
    g = f.broadcast_to(f.reshape(f.grad_seed(loss), (1, 1)), (8, 12), name="g")
    f.output(loss, [rs.Replicate()])
    f.output(f.matmul(g, f.permute(f.saved(wt, name="wt.saved"), (1, 0)), name="grad.x"), [rs.Shard(0)])
    return f


def partial_outputs() -> rs.Fusion:
    """Outputs requested Partial (sum and max) from Replicate and Shard placements: made
    Partial locally, one mesh axis at a time (``resharding``'s partial-of-* laws)."""
    f = rs.Fusion()
    x = f.input("x", (8, 12), "float32", MESH2D, [rs.Replicate(), rs.Shard(0)])
    f.output(x, [rs.Partial(), rs.Partial()])
    f.output(f.neg(x), [rs.Partial("max"), rs.Partial("max")])
    return f


def embedding_lookups() -> rs.Fusion:
    """An embedding with a vocab-parallel weight and open ids (every lookup strategy of the
    e-graph: vocab-parallel -> Partial, hidden-sharded, ids-sharded, replicated)."""
    f = rs.Fusion()
    w = f.input("w", (32, 8), "float32", MESH2D, [rs.Replicate(), rs.Shard(0)])
    ids = f.input("ids", (4, 2), "int64", MESH2D)
    f.output(f.tanh(f.embedding(w, ids)), [rs.Shard(0), rs.Replicate()])
    return f


def pick_lookups() -> rs.Fusion:
    """The target-logit pick of a Partial x (linear: stays Partial) with open indices, and of
    a vocab-sharded x (masked local picks -> Partial)."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", MESH1, [rs.Partial()])
    v = f.input("v", (8, 16), "float32", MESH1, [rs.Shard(1)])
    idx = f.input("idx", (8,), "int64", MESH1)
    f.output(f.pick(x, idx), [rs.Shard(0)])
    f.output(f.pick(v, idx), [rs.Replicate()])
    return f


def scatter_lookups() -> rs.Fusion:
    """The lookups' backward on a dp x tp mesh: an embedding gradient of tokens sharded on x
    (scattered per rank -> Partial on x) into vocab rows sharded on y (masked local scatter from
    g and ids whole there), one of open g and ids, and a pick's gradient (``unpick``) written
    vocab-sharded from whole values."""
    f = rs.Fusion()
    g = f.input("g", (4, 8), "float32", MESH2D, [rs.Shard(0), rs.Replicate()])
    ids = f.input("ids", (4,), "int64", MESH2D, [rs.Shard(0), rs.Replicate()])
    f.output(f.embedding_grad(g, ids, 16), [rs.Replicate(), rs.Shard(0)])
    h = f.input("h", (4, 8), "float32", MESH2D)
    f.output(f.embedding_grad(h, f.input("hids", (4,), "int64", MESH2D), 8), [rs.Shard(0), rs.Shard(1)])
    p = f.input("p", (4,), "float32", MESH2D, [rs.Replicate(), rs.Replicate()])
    f.output(f.unpick(p, f.input("pidx", (4,), "int64", MESH2D), 16), [rs.Shard(1), rs.Shard(1)])
    return f


def fused_bias_dp_tp() -> rs.Fusion:
    """Data x tensor parallelism: a fused ``[q | k | v]`` bias (``FusedShard`` on y, replicated on
    x) added to batch-sharded tokens: its broadcast is sliced locally to the tokens' batch shard
    (``resharding``'s ``slice-candidate``), not the tokens gathered over x."""
    f = rs.Fusion()
    fused = rs.FusedShard(1, groups=3)
    x = f.input("x", (4, 12), "float32", MESH2D, [rs.Shard(0), fused])
    b = f.input("b", (12,), "float32", MESH2D, [rs.Replicate(), rs.FusedShard(0, groups=3)])
    f.output(f.add(x, f.broadcast(b, (4, 12), (1,))), [rs.Shard(0), fused])
    return f


def flattened_sequence_parallel() -> rs.Fusion:
    """GPT-2's ``Conv1D`` under data x sequence parallelism: ``[b, s, h]`` flattened to ``[b*s, h]``
    (hidden sharded on y), a row-parallel matmul (a Partial sum on y), an activation, unflattened
    to batch on x and sequence on y: the token dim of ``[b*s, h]`` split along both axes, a nested
    dist reached by one reduce-scatter before the activation (``nesting``'s ``nest-candidate``)."""
    f = rs.Fusion()
    x = f.input("x", (4, 8, 16), "float32", MESH2D, [rs.Shard(0), rs.Shard(2)])
    w = f.input("w", (16, 16), "float32", MESH2D, [rs.Replicate(), rs.Shard(0)])
    y = f.gelu(f.matmul(f.reshape(x, (32, 16)), w))
    f.output(f.reshape(y, (4, 8, 16)), [rs.Shard(0), rs.Shard(1)])
    return f


def mask_broadcast() -> rs.Fusion:
    """A replicated causal mask [1, 1, 8, 8] broadcast to scores [2, 4, 8, 8] sharded on batch
    and heads (dp x tp), both expanded dims: each device broadcasts into its own block
    (``rules.expand``), and the scores' add needs no communication."""
    f = rs.Fusion()
    mask = f.input("mask", (1, 1, 8, 8), "float32", MESH2D, [rs.Replicate(), rs.Replicate()])
    s = f.input("s", (2, 4, 8, 8), "float32", MESH2D, [rs.Shard(0), rs.Shard(1)])
    f.output(f.add(s, f.broadcast_to(mask, (2, 4, 8, 8))), [rs.Shard(0), rs.Shard(1)])
    return f


def training_block(b: int = 2, s: int = 4, h: int = 8) -> rs.Fusion:
    """A training step built by hand: forward ops, the forward values the backward-like ops
    read through ``saved`` (the boundary), and those ops, started by ``grad_seed``.  Every op
    ``rules.remat`` may recompute in the backward pass has saved operands: a matmul
    (``Loc2``), one reading a transpose as a view (``MMT``), a mask broadcast into batch-sharded
    blocks (``Expand``), elementwise ops (``Loc``, ``Loc2``)."""
    f = rs.Fusion()
    x = f.input("x", (b, s, h), "float32", MESH1, [rs.Shard(0)])
    w = f.input("w", (h, h), "float32", MESH1, [rs.Shard(1)])
    mask = f.input("mask", (s, s), "float32", MESH1, [rs.Replicate()])
    xw = f.matmul(x, w, name="xw")
    q = f.scale(xw, h ** -0.5, name="q")
    sc = f.matmul(q, f.permute(q, (0, 2, 1)), name="sc")
    bm = f.broadcast_to(mask, (b, s, s), name="bm")
    u = f.add(sc, bm, name="u")
    t = f.tanh(u, name="t")
    p = f.exp(t, name="p")
    loss = f.sum(f.reshape(p, (1, b * s * s)), 1, name="loss")
    xs, ws, ms, xws, qs, scs, bms, us, ts, ps = (f.saved(v, name=f"{v.name}.saved")
                                                 for v in (x, w, mask, xw, q, sc, bm, u, t, p))
    g = f.broadcast_to(f.reshape(f.grad_seed(loss), (1, 1, 1)), (b, s, s), name="g")
    gt = f.mul(g, ps, name="gt")
    gu = f.sub(gt, f.mul(gt, f.mul(ts, ts)), name="gu")
    gsc = f.add(gu, f.mul(f.mul(us, scs), f.add(bms, f.broadcast_to(ms, (b, s, s)))), name="gsc")
    gq = f.add(f.matmul(gsc, qs), f.matmul(f.permute(gsc, (0, 2, 1)), qs), name="gq")
    gw = f.sum(f.matmul(f.permute(xs, (0, 2, 1)), gq), 0, name="grad.w")
    gx = f.add(f.matmul(gq, f.permute(ws, (1, 0))), xws, name="grad.x")
    f.output(loss, [rs.Replicate()])
    f.output(gw, [rs.Shard(1)])
    f.output(gx, [rs.Shard(0)])
    return f


def training_lookups() -> rs.Fusion:
    """A training step built by hand around lookups: a vocab-parallel embedding and a forward
    scatter of its rows into a vocab-sharded table (the masked local scatter, ``LocAt``), read
    by the backward-like ops through ``saved``, so ``rules.remat`` may recompute both
    from the saved table and ids."""
    f = rs.Fusion()
    table = f.input("table", (16, 8), "float32", MESH1, [rs.Shard(0)])
    ids = f.input("ids", (4,), "int64", MESH1, [rs.Replicate()])
    e = f.embedding(table, ids, name="e")
    rows = f.embedding_grad(e, ids, 16, name="rows")
    loss = f.sum(f.reshape(f.mul(rows, table), (1, 128)), 1, name="loss")
    ts, idss, es, rs_ = (f.saved(v, name=f"{v.name}.saved") for v in (table, ids, e, rows))
    g = f.broadcast_to(f.reshape(f.grad_seed(loss), (1, 1)), (16, 8), name="g")
    grad = f.add(f.add(f.mul(g, rs_), f.mul(g, ts)), f.embedding_grad(es, idss, 16), name="grad.table")
    f.output(loss, [rs.Replicate()])
    f.output(grad, [rs.Shard(0)])
    return f


def _attention_step(masked: bool) -> rs.Fusion:
    """A training step through fused attention (``joint``): q, k, v sharded on the heads, an
    additive mask (``masked``: an input broadcast over batch and heads, so the ops have four and
    five operands), the loss ``sum(o * o)`` (whose gradient saves o, so ``remat`` may recompute
    the attention); its e-graph holds ``attention`` and ``attention_grad`` and their decomposed
    alternatives (``rules.attention``)."""
    f = rs.Fusion()
    q, k, v = (f.input(n, (2, 2, 4, 4), "float32", MESH1, [rs.Shard(1)]) for n in "qkv")
    mask = f.input("mask", (1, 1, 4, 4), "float32", MESH1, [rs.Replicate()]) if masked else None
    o = f.attention(q, k, v, mask, scale=0.5, name="o")
    loss = f.sum(f.reshape(f.mul(o, o), (1, o.numel)), 1, name="loss")
    f.output(loss, [rs.Replicate()])
    return joint(f, loss, ["q", "k", "v"]).fusion


def training_attention() -> rs.Fusion:
    return _attention_step(False)


def training_attention_masked() -> rs.Fusion:
    return _attention_step(True)


def linear_loss() -> rs.Fusion:
    """The fused linear loss (``ir.ops.linear_loss``): a vocab-parallel w, the logsumexp from
    ``linear_max`` and ``linear_sumexp``, and both gradients."""
    f = rs.Fusion()
    rep = [rs.Replicate()]
    h, g = f.input("h", (8, 4), "float32", MESH1, rep), f.input("g", (8,), "float32", MESH1, rep)
    w = f.input("w", (16, 4), "float32", MESH1, [rs.Shard(0)])
    m = f.linear_max(h, w)
    f.output(f.add(f.log(f.linear_sumexp(h, w, m)), m), rep)
    f.output(f.linear_sumexp_grad(h, w, m, g, "input"), rep)
    f.output(f.linear_sumexp_grad(h, w, m, g, "weight"), [rs.Shard(0)])
    return f


ALL: list[Callable[[], rs.Fusion]] = [
    one_row_per_device, transposed_matmuls, training_linear,
    cyclic_reduce, merged_reduce,
    split_h, split_h_three, merge_heads, merge_then_split, manual_heads, qkv_slice, matmul_small_out, mlp,
    attention, reductions, layout_ops, open_inputs, mesh2d_block, partial_inputs,
    redistribute([rs.Shard(0)], [rs.Replicate()]),
    redistribute([rs.Replicate()], [rs.Shard(1)]),
    redistribute([rs.Partial()], [rs.Replicate()]),
    redistribute([rs.Partial()], [rs.Shard(0)]),
    redistribute([rs.Shard(0)], [rs.Shard(1)]),
    redistribute([rs.Shard(0), rs.Shard(1)], [rs.Shard(1), rs.Shard(0)], MESH2D),
    redistribute([rs.Partial(), rs.Shard(1)], [rs.Replicate(), rs.Shard(1)], MESH2D),
    redistribute([rs.Shard(0), rs.Shard(0)], [rs.Replicate(), rs.Shard(1)], MESH2D),
    redistribute([rs.Shard(1)], [rs.Shard(0)], MESH4, (8, 12)),
    partial_outputs,
    redistribute([rs.Shard(1)], [rs.Partial("max")], MESH_ONE),  # axes of size 1: no step at all
    redistribute([rs.Shard(0), rs.Partial()], [rs.Replicate(), rs.Shard(1)], MESH4x1),
    embedding_lookups, pick_lookups, fused_bias_dp_tp, mask_broadcast, scatter_lookups, training_block,
    training_lookups, training_attention, training_attention_masked, linear_loss, flattened_sequence_parallel,
]


def random_inputs(f: rs.Fusion, seed: int = 0) -> dict[str, torch.Tensor]:
    return _inputs(f, torch.Generator().manual_seed(seed))


def assert_plan_matches_reference(plan: rs.Plan, f: rs.Fusion, inputs: dict[str, torch.Tensor], seed: int = 0,
                                  device: str | None = None) -> None:
    outs = plan.simulate(inputs, generator=torch.Generator().manual_seed(seed), device=device)
    refs = rs.run_reference(f, inputs)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and o.dtype == r.dtype
        torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
