"""Random data-parallel training steps for differential fuzzing (``steps()``, a hypothesis
strategy of ``Recipe``s; ``data_parallel_step`` builds one).

A step is a stack of blocks on a ``dp x tp`` mesh: the batch input ``x`` split over dp along
its leading dim, every weight replicated over dp and laid out over tp by the recipe (Replicate,
or split along any dim tp divides), the output split over dp like the batch.  So dp is a *data
axis* of the joint (``search.encode.data_axes``), which ``fuzz_programs.fusions`` never makes
(there every input is differentiated, so none is a batch).  Blocks: an MLP (``act(x @ w1) @ w2``,
with or without a residual), a bias, a scale, a norm over the hidden dim (mean, variance,
``rsqrt`` of it plus ``exp`` of an input), a residual ``x + tanh(x @ w)``, an attention-like
product (``exp(tanh(q k^T / 10)) x``), two heads of fused attention (``Fusion.attention``, its
decomposed form an alternative: ``passes.decompositions``) and a matmul over the sequence dim
through two transposes.  Everything is float64, small (hidden 6 or 12) and bounded (no op can
overflow: an inf would turn into NaN on a valid plan that sums in another order), so a plan
matches the reference at tight tolerances.
"""

from __future__ import annotations

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


class Block(NamedTuple):
    """One block of a step: its kind, the tp split of each weight it makes (a dim, or -1:
    Replicate), and for an MLP its inner width, activation and whether it adds a residual."""

    kind: str
    splits: tuple[int, ...] = ()
    width: int = 0
    act: str = "gelu"
    residual: bool = False


class Recipe(NamedTuple):
    """A step: mesh (dp, tp), batch (a multiple of dp), sequence length (None: no sequence dim),
    hidden size and blocks."""

    dp: int
    tp: int
    batch: int
    seq: int | None
    hidden: int
    blocks: tuple[Block, ...]


def _weights(kind: str, hidden: int, seq: int | None, width: int) -> list[tuple[int, ...]]:
    """The shapes of the weights a block of ``kind`` makes."""
    return {"mlp": [(hidden, width), (width, hidden)], "bias": [(hidden,)], "scale": [(hidden,)], "norm": [],
            "residual": [(hidden, hidden)], "attention": [(hidden, hidden)] * 2, "sdpa": [(hidden, hidden)] * 4,
            "transposed": [(seq or 1, seq or 1)]}[kind]


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
        splits = tuple(draw(st.sampled_from([-1] + [d for d, n in enumerate(shape) if n % tp == 0]))
                       for shape in _weights(kind, hidden, seq, width))
        blocks.append(Block(kind, splits, width if kind == "mlp" else 0, draw(st.sampled_from(ACTIVATIONS)),
                            draw(st.booleans())))
    if not any(b.splits for b in blocks):  # (a step trains some weight)
        blocks.append(Block("bias", (draw(st.sampled_from([-1] + [0] * (hidden % tp == 0))),)))
    return Recipe(dp, tp, dp * draw(st.sampled_from((1, 2, 3))), seq, hidden, tuple(blocks))


def data_parallel_step(r: Recipe) -> tuple[rs.Fusion, list[str]]:
    """The forward Fusion of ``r`` and the names of its weights (what a joint differentiates)."""
    devices = list(range(r.dp * r.tp))
    mesh = DeviceMesh([devices[i * r.tp:(i + 1) * r.tp] for i in range(r.dp)], ("dp", "tp"))
    f = rs.Fusion()
    shape = (r.batch, r.hidden) if r.seq is None else (r.batch, r.seq, r.hidden)
    x = f.input("x", shape, "float64", mesh, [Shard(0), Replicate()])
    names: list[str] = []

    def weight(shape: tuple[int, ...], split: int) -> rs.Tensor:
        names.append(f"w{len(names)}")
        return f.input(names[-1], shape, "float64", mesh, [Replicate(), Replicate() if split < 0 else Shard(split)])

    last = len(shape) - 1
    lead = tuple(range(last))
    for k, b in enumerate(r.blocks):
        ws = [weight(s, d) for s, d in zip(_weights(b.kind, r.hidden, r.seq, b.width), b.splits)]
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
        elif b.kind == "sdpa":  # two heads of fused attention, its output projected
            heads = [f.permute(f.reshape(f.matmul(x, w), (r.batch, r.seq, 2, r.hidden // 2)), (0, 2, 1, 3))
                     for w in ws[:3]]
            o = f.permute(f.attention(*heads), (0, 2, 1, 3))
            x = f.matmul(f.reshape(o, shape), ws[3])
        else:  # "transposed": a matmul over the sequence dim
            x = f.permute(f.matmul(f.permute(x, (0, 2, 1)), ws[0]), (0, 2, 1))
    f.output(x, [Shard(0), Replicate()])
    return f, names
