"""Built-in example programs: the README demo's transformer block and its parts, and a
Llama-style layer (``llama_layers``, ``reshard demo --block llama``).

The block is a planner workload shaped like a transformer layer, not a model: attention with a
fused QKV projection whose weight is replicated, scores squashed by ``tanh`` (no softmax, no
causal mask, no rotary embedding), no norms, and a GELU MLP (not SwiGLU); residual adds around
both.  Only the shardings a user would fix are given (activations in and out, weights); every
intermediate tensor is left open for the optimizer.
"""

from __future__ import annotations

import math

import torch

from .ir.fusion import Fusion, Tensor
from .ir.mesh import DeviceMesh
from .ir.sharding import Replicate, Shard


def mlp_block(f: Fusion, x: Tensor, mesh: DeviceMesh, hidden: int, ffn: int, prefix: str = "") -> Tensor:
    """Megatron MLP ``gelu(x @ w1) @ w2`` with column-parallel ``w1`` and row-parallel ``w2``."""
    w1 = f.input(f"{prefix}w1", (hidden, ffn), x.dtype, mesh, [Shard(1)])
    w2 = f.input(f"{prefix}w2", (ffn, hidden), x.dtype, mesh, [Shard(0)])
    fc1 = f.matmul(x, w1, name=f"{prefix}fc1")
    return f.matmul(f.gelu(fc1, name=f"{prefix}gelu"), w2, name=f"{prefix}fc2")


def attention_block(f: Fusion, x: Tensor, mesh: DeviceMesh, heads: int, prefix: str = "") -> Tensor:
    """Attention-shaped ops: ``x @ wqkv`` (``wqkv`` [h, 3h] replicated), reshaped to
    [s, 3, heads, h/heads] and sliced into q, k, v (seed 000's case: the plan may split the
    heads with no communication), ``tanh(q k^T / sqrt(h/heads)) @ v`` per head (no softmax,
    mask or rotary embedding), the heads merged and ``@ wo`` (``wo`` row-parallel,
    ``Shard(0)``)."""
    s, h = x.shape
    hd = h // heads
    wqkv = f.input(f"{prefix}wqkv", (h, 3 * h), x.dtype, mesh, [Replicate()])
    wo = f.input(f"{prefix}wo", (h, h), x.dtype, mesh, [Shard(0)])
    qkv = f.reshape(f.matmul(x, wqkv, name=f"{prefix}qkv"), (s, 3, heads, hd), name=f"{prefix}qkv.heads")
    q, k, v = (f.permute(f.reshape(f.slice(qkv, 1, i, i + 1, name=f"{prefix}{c}.slice"), (s, heads, hd),
                                   name=f"{prefix}{c}.heads"), (1, 0, 2), name=f"{prefix}{c}")
               for i, c in enumerate("qkv"))
    scores = f.matmul(q, f.permute(k, (0, 2, 1), name=f"{prefix}kT"), name=f"{prefix}scores")
    probs = f.tanh(f.scale(scores, hd ** -0.5, name=f"{prefix}scores.scaled"), name=f"{prefix}probs")
    ctx = f.permute(f.matmul(probs, v, name=f"{prefix}ctx"), (1, 0, 2), name=f"{prefix}ctx.seq")
    return f.matmul(f.reshape(ctx, (s, h), name=f"{prefix}ctx.merged"), wo, name=f"{prefix}out")


def transformer_block(mesh: DeviceMesh | None = None, seq: int = 16, hidden: int = 32, heads: int = 4,
                      dtype: str = "float32") -> Fusion:
    """One simplified transformer block on a 1-D mesh: ``h = x + attention_block(x)``,
    ``y = h + mlp_block(h)`` (module docstring: tanh attention, no norms, GELU MLP); ``x`` and
    ``y`` sequence-parallel (``Shard(0)``), ``wqkv`` replicated, ``wo`` and ``w2`` row-parallel,
    ``w1`` column-parallel."""
    mesh = mesh or DeviceMesh([0, 1], ("tp",))
    f = Fusion()
    x = f.input("x", (seq, hidden), dtype, mesh, [Shard(0)])
    h1 = f.add(x, attention_block(f, x, mesh, heads, "attn."), name="h")
    y = f.add(h1, mlp_block(f, h1, mesh, hidden, 4 * hidden, "mlp."), name="y")
    f.output(y, [Shard(0)])
    return f


def transformer_stack(layers: int, mesh: DeviceMesh | None = None, seq: int = 16, hidden: int = 32,
                      heads: int = 4, dtype: str = "float32") -> Fusion:
    """``layers`` of ``transformer_block``'s blocks in sequence (for optimizer-scaling benchmarks); block
    ``i``'s values are named ``layers.i.*``, as ``nn.ModuleList`` paths are."""
    mesh = mesh or DeviceMesh([0, 1], ("tp",))
    f = Fusion()
    y = f.input("x", (seq, hidden), dtype, mesh, [Shard(0)])
    for i in range(layers):
        y = f.add(y, attention_block(f, y, mesh, heads, f"layers.{i}.attn."), name=f"layers.{i}.h")
        y = f.add(y, mlp_block(f, y, mesh, hidden, 4 * hidden, f"layers.{i}.mlp."), name=f"layers.{i}.y")
    f.output(y, [Shard(0)])
    return f


#: the names of ``llama_layers``' constant inputs, their values ``llama_constants``
LLAMA_CONSTANTS = ("rope.cos", "rope.sin", "mask", "eps")


def swiglu_width(hidden: int) -> int:
    """Llama's MLP width for ``hidden``: 8/3 of it rounded up to a multiple of 256 (11008 for
    4096, Llama-2-7B's), of 16 below hidden 256 (96 for 32)."""
    step = 256 if hidden >= 256 else 16
    return step * math.ceil(8 * hidden / 3 / step)


def rms_norm(f: Fusion, x: Tensor, eps: Tensor, prefix: str) -> Tensor:
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` over the hidden dim (``weight`` replicated)."""
    s, h = x.shape
    w = f.input(f"{prefix}weight", (h,), x.dtype, x.mesh, [Replicate()])
    ms = f.mean(f.mul(x, x, name=f"{prefix}square"), 1, name=f"{prefix}ms")
    eps_b = f.broadcast_to(eps, (s,), name=f"{prefix}eps")
    inv = f.rsqrt(f.add(ms, eps_b, name=f"{prefix}ms.eps"), name=f"{prefix}rsqrt")
    normed = f.mul(x, f.broadcast(inv, (s, h), (0,), name=f"{prefix}rsqrt.b"), name=f"{prefix}normed")
    return f.mul(normed, f.broadcast(w, (s, h), (1,), name=f"{prefix}weight.b"), name=f"{prefix}out")


def rope(f: Fusion, t: Tensor, cos: Tensor, sin: Tensor, prefix: str) -> Tensor:
    """Rotary embedding of ``t`` [heads, s, hd]: ``t * cos + rotate_half(t) * sin``, ``cos`` and
    ``sin`` [s, hd] (``rotate_half``: the halves of the last dim swapped, the second negated)."""
    heads, s, hd = t.shape
    half = hd // 2
    rotated = f.cat([f.neg(f.slice(t, 2, half, hd, name=f"{prefix}hi"), name=f"{prefix}hi.neg"),
                     f.slice(t, 2, 0, half, name=f"{prefix}lo")], 2, name=f"{prefix}rotated")
    c, n = (f.broadcast(u, t.shape, (1, 2), name=f"{prefix}{u.name}") for u in (cos, sin))
    return f.add(f.mul(t, c, name=f"{prefix}t.cos"), f.mul(rotated, n, name=f"{prefix}rot.sin"), name=prefix[:-1])


def llama_attention(f: Fusion, x: Tensor, heads: int, consts: dict[str, Tensor], prefix: str) -> Tensor:
    """Causal softmax attention with rotary q and k: q, k, v projections column-parallel
    (``Shard(1)``: each rank computes its heads), the output projection row-parallel
    (``Shard(0)``)."""
    s, h = x.shape
    hd = h // heads
    proj = {}
    for c in "qkv":
        w = f.input(f"{prefix}w{c}", (h, h), x.dtype, x.mesh, [Shard(1)])
        t = f.reshape(f.matmul(x, w, name=f"{prefix}{c}.proj"), (s, heads, hd), name=f"{prefix}{c}.heads")
        proj[c] = f.permute(t, (1, 0, 2), name=f"{prefix}{c}")
    q, k = (rope(f, proj[c], consts["rope.cos"], consts["rope.sin"], f"{prefix}{c}.rope.") for c in "qk")
    scores = f.scale(f.matmul(q, f.permute(k, (0, 2, 1), name=f"{prefix}kT"), name=f"{prefix}qk"), hd ** -0.5,
                     name=f"{prefix}qk.scaled")
    masked = f.add(scores, f.broadcast(consts["mask"], scores.shape, (1, 2), name=f"{prefix}mask"),
                   name=f"{prefix}scores")
    top = f.broadcast(f.max(masked, 2, name=f"{prefix}max"), masked.shape, (0, 1), name=f"{prefix}max.b")
    e = f.exp(f.sub(masked, top, name=f"{prefix}shifted"), name=f"{prefix}exp")
    z = f.broadcast(f.sum(e, 2, name=f"{prefix}z"), e.shape, (0, 1), name=f"{prefix}z.b")
    ctx = f.matmul(f.div(e, z, name=f"{prefix}probs"), proj["v"], name=f"{prefix}ctx")
    merged = f.reshape(f.permute(ctx, (1, 0, 2), name=f"{prefix}ctx.seq"), (s, h), name=f"{prefix}ctx.merged")
    wo = f.input(f"{prefix}wo", (h, h), x.dtype, x.mesh, [Shard(0)])
    return f.matmul(merged, wo, name=f"{prefix}out")


def swiglu(f: Fusion, x: Tensor, ffn: int, prefix: str) -> Tensor:
    """``(silu(x @ w_gate) * (x @ w_up)) @ w_down``: gate and up column-parallel, down
    row-parallel (Megatron's)."""
    h = x.shape[1]
    wg, wu = (f.input(f"{prefix}w_{n}", (h, ffn), x.dtype, x.mesh, [Shard(1)]) for n in ("gate", "up"))
    wd = f.input(f"{prefix}w_down", (ffn, h), x.dtype, x.mesh, [Shard(0)])
    gate = f.silu(f.matmul(x, wg, name=f"{prefix}gate"), name=f"{prefix}silu")
    return f.matmul(f.mul(gate, f.matmul(x, wu, name=f"{prefix}up"), name=f"{prefix}act"), wd, name=f"{prefix}down")


def llama_layers(layers: int = 1, mesh: DeviceMesh | None = None, seq: int = 16, hidden: int = 32, heads: int = 4,
                 dtype: str = "float32") -> Fusion:
    """``layers`` Llama-style decoder layers on a 1-D mesh with Megatron's placements:
    ``h = x + attention(rms_norm(x))``, ``y = h + swiglu(rms_norm(h))`` (``llama_attention``:
    causal softmax attention with rotary q and k; ``swiglu`` of width ``swiglu_width``);
    ``x`` and each layer's output sequence-parallel (``Shard(0)``); the norms' weights
    replicated.  The rotary tables, the additive causal mask and the norms' epsilon are
    replicated inputs (``LLAMA_CONSTANTS``, values ``llama_constants``).  One layer's values
    are named ``attn.*``, ``mlp.*``; several layers' ``layers.i.*`` (repeated layers are
    planned once)."""
    mesh = mesh or DeviceMesh([0, 1], ("tp",))
    hd = hidden // heads
    f = Fusion()
    y = f.input("x", (seq, hidden), dtype, mesh, [Shard(0)])
    shapes = {"rope.cos": (seq, hd), "rope.sin": (seq, hd), "mask": (seq, seq), "eps": (1,)}
    consts = {n: f.input(n, shapes[n], dtype, mesh, [Replicate()]) for n in LLAMA_CONSTANTS}
    for i in range(layers):
        p = f"layers.{i}." if layers > 1 else ""
        attn = llama_attention(f, rms_norm(f, y, consts["eps"], f"{p}attn_norm."), heads, consts, f"{p}attn.")
        y = f.add(y, attn, name=f"{p}h")
        mlp = swiglu(f, rms_norm(f, y, consts["eps"], f"{p}mlp_norm."), swiglu_width(hidden), f"{p}mlp.")
        y = f.add(y, mlp, name=f"{p}y")
    f.output(y, [Shard(0)])
    return f


def llama_constants(seq: int, hidden: int, heads: int, dtype: str = "float32", eps: float = 1e-6,
                    theta: float = 10000.0) -> dict[str, torch.Tensor]:
    """The values of ``llama_layers``' constant inputs: Llama's rotary tables (base ``theta``,
    the frequencies repeated over both halves), the additive causal mask (0 on and below the
    diagonal, the dtype's lowest value above it) and ``eps``."""
    from .ir.dtypes import DTYPES

    hd = hidden // heads
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    emb = torch.cat([angles, angles], -1)
    dt = DTYPES[dtype]
    mask = torch.full((seq, seq), torch.finfo(dt).min, dtype=torch.float64).triu(1)
    values = {"rope.cos": emb.cos(), "rope.sin": emb.sin(), "mask": mask, "eps": torch.tensor([eps])}
    return {n: v.to(dt) for n, v in values.items()}


__all__ = ["mlp_block", "attention_block", "transformer_block", "transformer_stack", "llama_layers",
           "llama_constants", "swiglu_width", "LLAMA_CONSTANTS"]
