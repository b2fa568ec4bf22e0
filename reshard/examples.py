"""Built-in example programs: the README demo's transformer block and its parts.

The block is a planner workload shaped like a transformer layer, not a model: attention with a
fused QKV projection whose weight is replicated, scores squashed by ``tanh`` (no softmax, no
causal mask, no rotary embedding), no norms, and a GELU MLP (not SwiGLU); residual adds around
both.  Only the shardings a user would fix are given (activations in and out, weights); every
intermediate tensor is left open for the optimizer.
"""

from __future__ import annotations

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


__all__ = ["mlp_block", "attention_block", "transformer_block", "transformer_stack"]
