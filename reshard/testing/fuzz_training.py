"""Random data-parallel training steps for differential fuzzing (``steps()``, a hypothesis
strategy of ``Recipe``s; ``data_parallel_step`` builds one).

A step is a stack of blocks on a ``dp x tp`` mesh: the batch input ``x`` split over dp along
its leading dim (or token ids read from an embedding table, a lookup), every weight replicated
over dp and laid out over tp by the recipe (Replicate, or split along any dim tp divides: a
table split along its rows is a vocab-parallel lookup), the output split over dp like the batch
(or a cross-entropy head: an lm-head matmul, its logits' logsumexp less the label's logit
(``pick``), per row split over dp or averaged into a replicated scalar loss).  So dp is a *data
axis* of the joint (``search.encode.data_axes``), which ``fuzz_programs.fusions`` never makes
(there every input is differentiated, so none is a batch).  Blocks: an MLP (``act(x @ w1) @ w2``,
with or without a residual), a bias, a scale, a norm over the hidden dim (mean, variance,
``rsqrt`` of it plus ``exp`` of an input), a residual ``x + tanh(x @ w)``, an attention-like
product (``exp(tanh(q k^T / 10)) x``), two heads of fused attention (``Fusion.attention``, its
decomposed form an alternative: ``passes.decompositions``; with one key/value head for both
query heads (GQA), and causal: the causal mask an input, which ``fuzz_programs.random_inputs``
feeds, as it feeds ids and labels in range) and a matmul over the sequence dim through two
transposes.  Everything is float64, small (hidden 6 or 12) and bounded (no op can overflow: an
inf would turn into NaN on a valid plan that sums in another order; the cross entropy's
logsumexp subtracts the max), so a plan matches the reference at tight tolerances.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from hypothesis import strategies as st

import reshard as rs
from reshard import DeviceMesh, Replicate, Shard

#: (dp, tp) mesh shapes: an even and an odd tp, a tp of one (dp alone), a larger dp
MESHES = ((2, 2), (2, 3), (2, 1), (4, 2))
#: the blocks a step stacks
BLOCKS = ("mlp", "bias", "scale", "norm", "residual", "attention", "sdpa", "transposed")
#: the blocks that need a sequence dim
SEQUENCE_BLOCKS = ("attention", "sdpa", "transposed")
ACTIVATIONS = ("gelu", "tanh", "relu", "silu")
HIDDEN = (6, 12)


#: vocabulary sizes of the lookups and cross-entropy heads (one tp divides, one it does not)
VOCABS = (6, 5)


class Block(NamedTuple):
    """One block of a step: its kind, the tp split of each weight it makes (a dim, or -1:
    Replicate), for an MLP its inner width, activation and whether it adds a residual, and for
    fused attention whether its keys and values have one head (GQA) and whether it is causal."""

    kind: str
    splits: tuple[int, ...] = ()
    width: int = 0
    act: str = "gelu"
    residual: bool = False
    gqa: bool = False
    causal: bool = False


class Recipe(NamedTuple):
    """A step: mesh (dp, tp), batch (a multiple of dp), sequence length (None: no sequence dim),
    hidden size and blocks; ``vocab``: the rows of the embedding table the step starts from
    (0: a float input ``x``) and the table's tp split; ``head``: "" (the blocks' output), "rows"
    (each row's cross entropy) or "mean" (their mean, a scalar), over ``head_vocab`` classes,
    the lm head's tp split ``head_split``."""

    dp: int
    tp: int
    batch: int
    seq: int | None
    hidden: int
    blocks: tuple[Block, ...]
    vocab: int = 0
    embed_split: int = -1
    head: str = ""
    head_vocab: int = 0
    head_split: int = -1


def _weights(kind: str, hidden: int, seq: int | None, width: int, gqa: bool = False) -> list[tuple[int, ...]]:
    """The shapes of the weights a block of ``kind`` makes (``gqa``: fused attention's keys and
    values of one head, half the hidden size)."""
    kv = (hidden, hidden // 2 if gqa else hidden)
    return {"mlp": [(hidden, width), (width, hidden)], "bias": [(hidden,)], "scale": [(hidden,)], "norm": [],
            "residual": [(hidden, hidden)], "attention": [(hidden, hidden)] * 2,
            "sdpa": [(hidden, hidden), kv, kv, (hidden, hidden)], "transposed": [(seq or 1, seq or 1)]}[kind]


def _split(draw: st.DrawFn, shape: tuple[int, ...], tp: int) -> int:
    """A tp split of a weight of ``shape``: -1 (Replicate) or a dim ``tp`` divides."""
    return draw(st.sampled_from([-1] + [d for d, n in enumerate(shape) if n % tp == 0]))


@st.composite
def steps(draw: st.DrawFn, max_blocks: int = 4) -> Recipe:
    """A random ``Recipe`` (module docstring); at least one block makes a weight."""
    dp, tp = draw(st.sampled_from(MESHES))
    seq = draw(st.sampled_from((None, 2, 3)))
    hidden = draw(st.sampled_from(HIDDEN))
    blocks = []
    for _ in range(draw(st.integers(1, max_blocks))):
        kind = draw(st.sampled_from([k for k in BLOCKS if seq is not None or k not in SEQUENCE_BLOCKS]))
        width = draw(st.sampled_from(HIDDEN))
        gqa, causal = (draw(st.booleans()), draw(st.booleans())) if kind == "sdpa" else (False, False)
        splits = tuple(_split(draw, shape, tp) for shape in _weights(kind, hidden, seq, width, gqa))
        blocks.append(Block(kind, splits, width if kind == "mlp" else 0, draw(st.sampled_from(ACTIVATIONS)),
                            draw(st.booleans()), gqa, causal))
    vocab = draw(st.sampled_from((0, *VOCABS)))
    embed_split = _split(draw, (vocab, hidden), tp) if vocab else -1
    head = draw(st.sampled_from(("", "rows", "mean")))
    head_vocab = draw(st.sampled_from(VOCABS)) if head else 0
    head_split = _split(draw, (hidden, head_vocab), tp) if head else -1
    if not vocab and not head and not any(b.splits for b in blocks):  # (a step trains some weight)
        blocks.append(Block("bias", (_split(draw, (hidden,), tp),)))
    return Recipe(dp, tp, dp * draw(st.sampled_from((1, 2, 3))), seq, hidden, tuple(blocks), vocab, embed_split,
                  head, head_vocab, head_split)


def data_parallel_step(r: Recipe) -> tuple[rs.Fusion, list[str]]:
    """The forward Fusion of ``r`` and the names of its weights (what a joint differentiates)."""
    devices = list(range(r.dp * r.tp))
    mesh = DeviceMesh([devices[i * r.tp:(i + 1) * r.tp] for i in range(r.dp)], ("dp", "tp"))
    f = rs.Fusion()
    rows = (r.batch,) if r.seq is None else (r.batch, r.seq)
    shape = rows + (r.hidden,)
    names: list[str] = []

    def weight(shape: tuple[int, ...], split: int) -> rs.Tensor:
        names.append(f"w{len(names)}")
        return f.input(names[-1], shape, "float64", mesh, [Replicate(), Replicate() if split < 0 else Shard(split)])

    if r.vocab:
        table = weight((r.vocab, r.hidden), r.embed_split)
        x = f.embedding(table, f.input("ids", rows, "int64", mesh, [Shard(0), Replicate()]))
    else:
        x = f.input("x", shape, "float64", mesh, [Shard(0), Replicate()])
    last = len(shape) - 1
    lead = tuple(range(last))
    for k, b in enumerate(r.blocks):
        ws = [weight(s, d) for s, d in zip(_weights(b.kind, r.hidden, r.seq, b.width, b.gqa), b.splits)]
        if b.kind == "mlp":
            y = f.matmul(getattr(f, b.act)(f.matmul(x, ws[0])), ws[1])
            x = f.add(y, x) if b.residual else y
        elif b.kind in ("bias", "scale"):
            along = f.broadcast(ws[0], shape, (last,))
            x = f.add(x, along) if b.kind == "bias" else f.mul(x, along)
        elif b.kind == "norm":
            d = f.sub(x, f.broadcast(f.mean(x, last), shape, lead))
            var = f.broadcast(f.mean(f.mul(d, d), last), shape, lead)
            eps = f.exp(f.input(f"eps{k}", (), "float64", mesh, [Replicate(), Replicate()]))  # (> 0)
            x = f.mul(d, f.rsqrt(f.add(var, f.broadcast(eps, shape, ()))))
        elif b.kind == "residual":
            x = f.add(x, f.tanh(f.matmul(x, ws[0])))
        elif b.kind == "attention":
            scores = f.matmul(f.matmul(x, ws[0]), f.permute(f.matmul(x, ws[1]), (0, 2, 1)))
            x = f.matmul(f.exp(f.tanh(f.scale(scores, 0.1))), x)  # (weights in [1/e, e]: no overflow)
        elif b.kind == "sdpa":  # two query heads of fused attention (GQA: one key/value head), projected
            heads = [f.permute(f.reshape(f.matmul(x, w), (r.batch, r.seq, w.shape[1] * 2 // r.hidden, r.hidden // 2)),
                               (0, 2, 1, 3)) for w in ws[:3]]
            mask = (f.input(f"mask{k}", (1, 1, r.seq, r.seq), "float64", mesh, [Replicate(), Replicate()])
                    if b.causal else None)
            o = f.permute(f.attention(*heads, mask, causal=b.causal), (0, 2, 1, 3))
            x = f.matmul(f.reshape(o, shape), ws[3])
        else:  # "transposed": a matmul over the sequence dim
            x = f.permute(f.matmul(f.permute(x, (0, 2, 1)), ws[0]), (0, 2, 1))
    if not r.head:
        f.output(x, [Shard(0), Replicate()])
        return f, names
    logits = f.matmul(x, weight((r.hidden, r.head_vocab), r.head_split))
    m = f.detach(f.reduce("max", logits, last))  # (read through detach, as the training converter's logsumexp)
    lse = f.add(f.log(f.reduce("sum", f.exp(f.sub(logits, f.broadcast(m, logits.shape, lead))), last)), m)
    loss = f.sub(lse, f.pick(logits, f.input("labels", rows, "int64", mesh, [Shard(0), Replicate()])))
    if r.head == "rows":
        f.output(loss, [Shard(0), Replicate()])
    else:
        f.output(f.scale(f.reduce("sum", loss, lead), 1.0 / math.prod(rows)), [Replicate(), Replicate()])
    return f, names
