"""One tiny Fusion per op kind (``EXAMPLES``: every kind of ``reshard.ir.ops.OPS`` but ``input``),
built on any mesh with random input shardings, for the per-op sweep (``tests/ops/test_op_sweep.py``):
its plan against the reference, its vjp against torch.autograd, its kernels through NVRTC.

An example declares its inputs (name, shape, dtype; ``FLOAT`` stands for the float dtype the
check asks for) and builds the op from them; its result is the Fusion's one output.  Where the
op keeps a Partial (``OpKind.keeps``), its float operands that are inputs are made Partial on one
mesh axis, so that the planner's linearity for the op is exercised."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

import reshard as rs
from reshard.ir.dtypes import dtype_kind
from reshard.ir.fusion import Op, Tensor
from reshard.ir.ops import op_kind

from .op_oracle import rand
from .programs import index_bounds

#: stands for the float dtype of the check (float32 for plans and kernels, float64 for gradients)
FLOAT = "float"

InputSpec = tuple[str, tuple[int, ...], str]


@dataclass(frozen=True)
class Example:
    """The inputs of a tiny use of one op kind, and ``build(f, *inputs)``: the op on them (and
    whatever the op needs around it), returning the output."""

    inputs: tuple[InputSpec, ...]
    build: Callable[..., Tensor]


def _lse_with_detached_shift(f: rs.Fusion, x: Tensor, m: Tensor) -> Tensor:
    """``log(sum(exp(x - d), 1)) + d`` with ``d = detach(m)``: its value and gradient do not
    depend on ``m``, so detaching it changes neither (as a softmax's max)."""
    d = f.detach(m)
    return f.add(f.log(f.sum(f.exp(f.sub(x, f.broadcast(d, x.shape, (0,)))), 1)), d)


def _stood_for(stand_in: Callable[[Tensor, Tensor], Tensor], x: Tensor, of: Tensor) -> Tensor:
    """``of``, with ``stand_in(x, of)`` declaring ``x`` equal to it (``alternative``, ``unbucket``):
    as the passes that build them do, the output is the value stood for, and the stand-in's
    result is read by nothing (extraction may implement ``of`` by either)."""
    stand_in(x, of)
    return of


def _replicated(t: Tensor) -> list[rs.Placement]:
    return [rs.Replicate()] * t.mesh.ndim


#: the (4, 6) float input most examples take, and the shape of a row operand
X, ROWS = ("x", (4, 6), FLOAT), (4,)

EXAMPLES: dict[str, Example] = {
    "reduce": Example((X,), lambda f, x: f.sum(x, 1)),
    "along": Example((X,), lambda f, x: f.cumprod(x, 1)),
    "detach": Example((X, ("m", ROWS, FLOAT)), _lse_with_detached_shift),
    "saved": Example((X,), lambda f, x: f.saved(x)),
    "grad_seed": Example((X,), lambda f, x: f.mul(x, f.grad_seed(x))),
    "alternative": Example((X,), lambda f, x: _stood_for(f.alternative, x, f.scale(x, 1.0))),
    "attention": Example((("q", (2, 4, 4), FLOAT), ("k", (2, 4, 4), FLOAT), ("v", (2, 4, 4), FLOAT)),
                         lambda f, q, k, v: f.attention(q, k, v)),
    "attention_grad": Example(tuple((n, (2, 4, 4), FLOAT) for n in "qkvg"),
                              lambda f, q, k, v, g: f.attention_grad(q, k, v, g, scale=0.5)),
    "reshape": Example((X,), lambda f, x: f.reshape(x, (2, 2, 6))),
    "permute": Example((X,), lambda f, x: f.permute(x, (1, 0))),
    "broadcast": Example((("x", ROWS, FLOAT),), lambda f, x: f.broadcast(x, (4, 6), (0,))),
    "movedim": Example((("x", (2, 4, 6), FLOAT),), lambda f, x: f.movedim(x, 0, 2)),
    "unbucket": Example((("x", (8,), FLOAT),), lambda f, x: _stood_for(f.unbucket, x, f.reshape(x, (4, 2)))),
    "complex_mul": Example((("a", (4, 2), FLOAT), ("b", (4, 2), FLOAT)), lambda f, a, b: f.complex_mul(a, b)),
    "unary": Example((X,), lambda f, x: f.exp(x)),
    "binary": Example((("a", (4, 6), FLOAT), ("b", (4, 6), FLOAT)), lambda f, a, b: f.add(a, b)),
    "scale": Example((X,), lambda f, x: f.scale(x, -1.5)),
    "cast": Example((X,), lambda f, x: f.cast(x, "bfloat16")),
    "set": Example((X,), lambda f, x: f.set(x)),
    "linear_max": Example((("h", (4, 3), FLOAT), ("w", (6, 3), FLOAT)), lambda f, h, w: f.linear_max(h, w)),
    "linear_sumexp": Example((("h", (4, 3), FLOAT), ("w", (6, 3), FLOAT), ("m", ROWS, FLOAT)),
                             lambda f, h, w, m: f.linear_sumexp(h, w, m)),
    "linear_sumexp_grad": Example((("h", (4, 3), FLOAT), ("w", (6, 3), FLOAT), ("m", ROWS, FLOAT), ("g", ROWS, FLOAT)),
                                  lambda f, h, w, m, g: f.linear_sumexp_grad(h, w, m, g, "input")),
    "embedding": Example((("w", (6, 3), FLOAT), ("ids", ROWS, "int64")), lambda f, w, ids: f.embedding(w, ids)),
    "pick": Example((X, ("index", ROWS, "int64")), lambda f, x, i: f.pick(x, i)),
    "embedding_grad": Example((("g", (4, 3), FLOAT), ("ids", ROWS, "int64")),
                              lambda f, g, ids: f.embedding_grad(g, ids, 6)),
    "unpick": Example((("g", ROWS, FLOAT), ("index", ROWS, "int64")), lambda f, g, i: f.unpick(g, i, 6)),
    "matmul": Example((("a", (4, 6), FLOAT), ("b", (6, 4), FLOAT)), lambda f, a, b: f.matmul(a, b)),
    "cumsum": Example((X,), lambda f, x: f.cumsum(x, 1)),
    "masked": Example((X, ("c", (4, 6), "bool")), lambda f, x, c: f.masked(x, c, True)),
    "slice": Example((X,), lambda f, x: f.slice(x, 1, 1, 5)),
    "pad": Example((X,), lambda f, x: f.pad(x, 1, 1, 2)),
    "cat": Example((X, ("y", (4, 2), FLOAT)), lambda f, x, y: f.cat([x, y], 1)),
    "redistribute": Example((X,), lambda f, x: f.redistribute(x, [rs.Shard(1)] + _replicated(x)[1:])),
}


def op_of(f: rs.Fusion, kind: str) -> Op:
    """The first op of ``kind`` in ``f``."""
    return next(op for op in f.ops if op.kind == kind)


def _build(kind: str, mesh: rs.DeviceMesh, dtype: str,
           placements: dict[str, list[rs.Placement]], out: Callable[[Tensor], list[rs.Placement]]) -> rs.Fusion:
    ex = EXAMPLES[kind]
    f = rs.Fusion()
    xs = [f.input(n, shape, dtype if dt == FLOAT else dt, mesh, placements.get(n, [rs.Replicate()] * mesh.ndim))
          for n, shape, dt in ex.inputs]
    y = ex.build(f, *xs)
    f.output(y, out(y))
    return f


def float_input_operands(f: rs.Fusion, kind: str) -> tuple[str, ...]:
    """The names of the inputs that are float operands of ``f``'s op of ``kind``."""
    op = op_of(f, kind)
    names = {f.tensors[i].name for i in f.inputs}
    return tuple(dict.fromkeys(t.name for t in (f.tensors[i] for i in op.inputs)
                               if t.name in names and dtype_kind(t.dtype) == "float"))


def _shard_or_replicate(shape: tuple[int, ...], mesh: rs.DeviceMesh, rng: random.Random) -> list[rs.Placement]:
    """Per mesh axis, Replicate or Shard of a dim it divides evenly (each dim sharded once)."""
    out: list[rs.Placement] = []
    for size in mesh.shape:
        dims = [d for d, e in enumerate(shape) if e % size == 0 and rs.Shard(d) not in out]
        out.append(rng.choice([rs.Replicate()] + [rs.Shard(d) for d in dims]))
    return out


def example_fusion(kind: str, mesh: rs.DeviceMesh, dtype: str = "float32", seed: int | None = None) -> rs.Fusion:
    """``kind``'s example on ``mesh`` with float dtype ``dtype``.  ``seed`` None: every input and
    the output replicated; else random shardings (seeded by ``kind`` and ``seed``): each input
    and the output Replicate or Shard per mesh axis, and where the op keeps Partial ops, its
    float input operands Partial on one random axis with one of them."""
    if seed is None:
        return _build(kind, mesh, dtype, {}, _replicated)
    rng = random.Random(zlib.crc32(kind.encode()) + seed)
    placements = {n: _shard_or_replicate(shape, mesh, rng) for n, shape, _ in EXAMPLES[kind].inputs}
    probe = _build(kind, mesh, dtype, {}, _replicated)
    keeps = op_kind(kind).keeps(op_of(probe, kind))
    if keeps:
        axis, reduce_op = rng.randrange(mesh.ndim), rng.choice(keeps)
        for n in float_input_operands(probe, kind):
            placements[n][axis] = rs.Partial(reduce_op)
    return _build(kind, mesh, dtype, placements, lambda y: _shard_or_replicate(y.shape, mesh, rng))


def example_inputs(f: rs.Fusion, seed: int) -> dict[str, torch.Tensor]:
    """Random values of ``f``'s inputs (``op_oracle.rand``), a lookup's indices uniform over its
    vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    bounds = index_bounds(f)
    return {f.tensors[i].name: torch.randint(0, bounds[i], f.tensors[i].shape, generator=gen) if i in bounds
            else rand(f.tensors[i].shape, f.tensors[i].dtype, gen) for i in f.inputs}
