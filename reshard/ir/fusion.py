"""The Fusion IR: a DAG of tensor ops on device meshes, built with a small builder API.

Every tensor has a global shape, dtype, mesh, and optionally a fixed sharding (inputs,
``redistribute`` targets, outputs' required shardings).  Tensors left open are for the
optimizer to place.  Shape and dtype are inferred; malformed ops raise ``ReshardError``
naming the op and operand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import ReshardError
from .mesh import DeviceMesh
from .sharding import ShardingSpec, TensorSharding

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
}
UNARY = ("neg", "exp", "tanh", "gelu", "relu", "silu", "abs", "sqrt", "rsqrt", "sigmoid")
BINARY = ("add", "sub", "mul", "div", "maximum")
REDUCTIONS = ("sum", "mean", "max")
#: the optional name of an op's result (labels it in explanations and drawings; None: ``t<N>``)
Name = str | None
#: Ops through which a Partial("sum") value stays a Partial("sum") value (linear maps).
LINEAR_KINDS = frozenset({"neg", "reshape", "permute", "slice", "pad", "set", "sum", "mean", "scale",
                          "add", "sub", "cat", "broadcast"})


def dtype_name(dtype: Any, where: str) -> str:
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    for k, v in DTYPES.items():
        if dtype == v:
            return k
    raise ReshardError(f"{where}: unknown dtype {dtype!r}; supported: {sorted(DTYPES)}")


@dataclass(frozen=True)
class Tensor:
    """A tensor of a Fusion (an SSA value).  ``sharding`` is None when open."""

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    mesh: DeviceMesh
    sharding: TensorSharding | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=DTYPES[self.dtype]).element_size()

    def __repr__(self) -> str:
        return f"%{self.name}{list(self.shape)}:{self.dtype}"


@dataclass(frozen=True)
class Op:
    """One op: ``kind`` (input, unary, binary, scale, cast, reshape, permute, slice, cat, pad,
    broadcast, reduce, matmul, set, redistribute), operand tensor ids, result tensor id, attributes."""

    index: int
    kind: str
    inputs: tuple[int, ...]
    output: int
    attrs: dict[str, Any] = field(default_factory=dict, compare=False)

    def __repr__(self) -> str:
        a = ", ".join(f"{k}={v}" for k, v in self.attrs.items() if k != "sharding")
        return f"op{self.index}:{self.kind}({', '.join(f'%{i}' for i in self.inputs)}{', ' + a if a else ''})"


class Fusion:
    """Builder and container for a tensor program.

    >>> f = Fusion()
    >>> x = f.input("x", (8, 96), torch.float32, mesh, [Replicate(), Shard(1)])
    >>> y = f.gelu(f.reshape(x, (8, 12, 8)))
    >>> f.output(y, [Replicate(), Shard(1)])

    Every op takes ``name="..."`` for its result (``f.matmul(x, w, name="mlp.fc1")``):
    explanations and drawings show it instead of ``t<N>``.
    """

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []
        self.inputs: list[int] = []
        self.outputs: list[tuple[int, TensorSharding]] = []
        self.producer: dict[int, int] = {}

    # ---- internals -------------------------------------------------------------------
    def _new(self, shape: Sequence[int], dtype: str, mesh: DeviceMesh, name: str | None = None,
             sharding: TensorSharding | None = None) -> Tensor:
        if name is not None and (not isinstance(name, str) or not name):
            raise ReshardError(f"name must be a non-empty str (or None for t<N>), got {name!r}")
        t = Tensor(len(self.tensors), name or f"t{len(self.tensors)}", tuple(int(s) for s in shape), dtype, mesh,
                   sharding)
        self.tensors.append(t)
        return t

    def _op(self, kind: str, inputs: Sequence[Tensor], out: Tensor, **attrs: Any) -> Tensor:
        op = Op(len(self.ops), kind, tuple(t.id for t in inputs), out.id, attrs)
        self.ops.append(op)
        self.producer[out.id] = op.index
        return out

    def _check(self, t: Any, opname: str, what: str = "operand") -> Tensor:
        if not isinstance(t, Tensor) or t.id >= len(self.tensors) or self.tensors[t.id] is not t:
            raise ReshardError(f"{opname}: {what} {t!r} is not a tensor of this Fusion")
        return t

    def _same_mesh(self, opname: str, *ts: Tensor) -> DeviceMesh:
        meshes = {t.mesh for t in ts}
        if len(meshes) != 1:
            raise ReshardError(f"{opname}: operands {list(ts)} live on different meshes "
                               f"{[t.mesh for t in ts]}; insert f.redistribute(..., mesh=...) first")
        return ts[0].mesh

    def tensor(self, tid: int) -> Tensor:
        return self.tensors[tid]

    # ---- sources and sinks ---------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: Any, mesh: DeviceMesh,
              placements: ShardingSpec | None = None) -> Tensor:
        """A program input.  ``placements``: one placement per mesh axis, reshard's or
        ``torch.distributed.tensor``'s (``Shard(d)``, ``Replicate()``, ``Partial()``; see
        ``sharding.as_placement``), or a ``TensorSharding``; ``None`` lets the optimizer choose
        how it is fed.  Uneven shardings (a dim the mesh axes sharding it do not divide)
        are a ``ReshardError`` naming the input and the dim."""
        where = f"input {name!r}"
        if any(self.tensors[i].name == name for i in self.inputs):
            raise ReshardError(f"{where}: an input of that name exists already")
        if not isinstance(mesh, DeviceMesh):
            raise ReshardError(f"{where}: mesh must be a DeviceMesh, got {type(mesh).__name__}")
        shape = tuple(shape)
        if not shape or any(not isinstance(s, int) or s <= 0 for s in shape):
            raise ReshardError(f"{where}: shape must be a non-empty tuple of positive ints, got {shape}")
        ts = None if placements is None else TensorSharding.of(placements, shape, mesh, where)
        t = self._new(shape, dtype_name(dtype, where), mesh, name, ts)
        self._op("input", [], t, name=name)
        self.inputs.append(t.id)
        return t

    def output(self, t: Tensor, placements: ShardingSpec) -> None:
        """Mark ``t`` an output with a required sharding (placements as in ``input``)."""
        self._check(t, "output")
        self.outputs.append((t.id, TensorSharding.of(placements, t.shape, t.mesh, f"output {t!r}")))

    # ---- elementwise -----------------------------------------------------------------
    def unary(self, fn: str, t: Tensor, *, name: Name = None) -> Tensor:
        self._check(t, fn)
        if fn not in UNARY:
            raise ReshardError(f"unary: unknown function {fn!r}; supported: {UNARY}")
        return self._op("unary", [t], self._new(t.shape, t.dtype, t.mesh, name), fn=fn)

    def binary(self, fn: str, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor:
        self._check(a, fn, "lhs")
        self._check(b, fn, "rhs")
        if fn not in BINARY:
            raise ReshardError(f"binary: unknown function {fn!r}; supported: {BINARY}")
        if a.shape != b.shape:
            raise ReshardError(f"{fn}: operand shapes differ: lhs {a!r} vs rhs {b!r}")
        if a.dtype != b.dtype:
            raise ReshardError(f"{fn}: operand dtypes differ: lhs {a!r} vs rhs {b!r}; cast one first")
        mesh = self._same_mesh(fn, a, b)
        return self._op("binary", [a, b], self._new(a.shape, a.dtype, mesh, name), fn=fn)

    def add(self, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor: return self.binary("add", a, b, name=name)
    def sub(self, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor: return self.binary("sub", a, b, name=name)
    def mul(self, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor: return self.binary("mul", a, b, name=name)
    def div(self, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor: return self.binary("div", a, b, name=name)
    def neg(self, t: Tensor, *, name: Name = None) -> Tensor: return self.unary("neg", t, name=name)
    def exp(self, t: Tensor, *, name: Name = None) -> Tensor: return self.unary("exp", t, name=name)
    def tanh(self, t: Tensor, *, name: Name = None) -> Tensor: return self.unary("tanh", t, name=name)
    def gelu(self, t: Tensor, *, name: Name = None) -> Tensor: return self.unary("gelu", t, name=name)
    def relu(self, t: Tensor, *, name: Name = None) -> Tensor: return self.unary("relu", t, name=name)
    def silu(self, t: Tensor, *, name: Name = None) -> Tensor: return self.unary("silu", t, name=name)
    def sigmoid(self, t: Tensor, *, name: Name = None) -> Tensor: return self.unary("sigmoid", t, name=name)
    def abs(self, t: Tensor, *, name: Name = None) -> Tensor: return self.unary("abs", t, name=name)
    def sqrt(self, t: Tensor, *, name: Name = None) -> Tensor: return self.unary("sqrt", t, name=name)
    def rsqrt(self, t: Tensor, *, name: Name = None) -> Tensor: return self.unary("rsqrt", t, name=name)
    def maximum(self, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor:
        return self.binary("maximum", a, b, name=name)

    def scale(self, t: Tensor, factor: float, *, name: Name = None) -> Tensor:
        """``t * factor`` for a Python scalar (linear: keeps Partial sums)."""
        self._check(t, "scale")
        return self._op("scale", [t], self._new(t.shape, t.dtype, t.mesh, name), factor=float(factor))

    def cast(self, t: Tensor, dtype: Any, *, name: Name = None) -> Tensor:
        self._check(t, "cast")
        return self._op("cast", [t], self._new(t.shape, dtype_name(dtype, f"cast of {t!r}"), t.mesh, name))

    def set(self, t: Tensor, *, name: Name = None) -> Tensor:
        """A copy of ``t``."""
        self._check(t, "set")
        return self._op("set", [t], self._new(t.shape, t.dtype, t.mesh, name))

    # ---- layout ----------------------------------------------------------------------
    def reshape(self, t: Tensor, shape: Sequence[int], *, name: Name = None) -> Tensor:
        self._check(t, "reshape")
        shape = list(shape)
        if shape.count(-1) > 1:
            raise ReshardError(f"reshape of {t!r}: more than one -1 in {shape}")
        if -1 in shape:
            rest = math.prod(s for s in shape if s != -1)
            if rest == 0 or t.numel % rest:
                raise ReshardError(f"reshape of {t!r} to {shape}: -1 cannot be inferred")
            shape[shape.index(-1)] = t.numel // rest
        if any(not isinstance(s, int) or s <= 0 for s in shape) or math.prod(shape) != t.numel:
            raise ReshardError(f"reshape of {t!r} to {tuple(shape)}: element count {t.numel} "
                               f"!= {math.prod(shape) if all(isinstance(s, int) for s in shape) else '?'}")
        return self._op("reshape", [t], self._new(shape, t.dtype, t.mesh, name), shape=tuple(shape))

    def permute(self, t: Tensor, perm: Sequence[int], *, name: Name = None) -> Tensor:
        self._check(t, "permute")
        perm = tuple(p + len(t.shape) if isinstance(p, int) and p < 0 else p for p in perm)
        if sorted(perm) != list(range(len(t.shape))):
            raise ReshardError(f"permute of {t!r}: {tuple(perm)} is not a permutation of {len(t.shape)} dims")
        return self._op("permute", [t], self._new([t.shape[p] for p in perm], t.dtype, t.mesh, name), perm=perm)

    def broadcast(self, t: Tensor, shape: Sequence[int], dims: Sequence[int], *, name: Name = None) -> Tensor:
        """``t`` broadcast to ``shape``: operand dim ``i`` becomes result dim ``dims[i]``
        (``dims`` strictly increasing; permute first to reorder) and every other result dim
        is new, its values repeated.  An operand dim's extent equals its result dim's, or is
        1 (expanded, as ``torch.expand`` does).  Linear: keeps Partial sums and maxes.

        >>> b = f.broadcast(bias, (8, 16), (1,))  # bias [16] -> [8, 16]
        """
        self._check(t, "broadcast")
        shape = tuple(shape)
        if not shape or any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in shape):
            raise ReshardError(f"broadcast of {t!r}: shape must be a non-empty tuple of positive ints, got {shape}")
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(dims) != len(t.shape):
            raise ReshardError(f"broadcast of {t!r} to {shape}: dims {dims} must name one result dim per operand "
                               f"dim ({len(t.shape)})")
        if len(shape) < len(t.shape):
            raise ReshardError(f"broadcast of {t!r} to {shape}: the result has fewer dims than the operand")
        norm = []
        for i, d in enumerate(dims):
            if not isinstance(d, int) or isinstance(d, bool) or not -len(shape) <= d < len(shape):
                raise ReshardError(f"broadcast of {t!r} to {shape}: dims[{i}] = {d!r} is not a dim of the result")
            norm.append(d % len(shape))
        if any(a >= b for a, b in zip(norm, norm[1:])):
            raise ReshardError(f"broadcast of {t!r} to {shape}: dims {tuple(norm)} must be strictly increasing "
                               "(f.permute the operand first to reorder its dims)")
        for i, d in enumerate(norm):
            if t.shape[i] not in (shape[d], 1):
                raise ReshardError(f"broadcast of {t!r} to {shape}: operand dim {i} (extent {t.shape[i]}) cannot "
                                   f"become result dim {d} (extent {shape[d]}); extents must be equal or 1")
        return self._op("broadcast", [t], self._new(shape, t.dtype, t.mesh, name), shape=shape, dims=tuple(norm))

    def broadcast_to(self, t: Tensor, shape: Sequence[int], *, name: Name = None) -> Tensor:
        """``t`` broadcast to ``shape`` by torch/NumPy rules (trailing dims aligned; operand
        extents equal or 1); ``t`` itself (``name`` unused) when it already has that shape."""
        self._check(t, "broadcast_to")
        shape = tuple(shape)
        if shape == t.shape:
            return t
        if len(shape) < len(t.shape):
            raise ReshardError(f"broadcast_to of {t!r}: target {shape} has fewer dims than the operand")
        lead = len(shape) - len(t.shape)
        return self.broadcast(t, shape, tuple(range(lead, len(shape))), name=name)

    def expand_as(self, t: Tensor, other: Tensor, *, name: Name = None) -> Tensor:
        """``t`` broadcast to ``other``'s shape (``broadcast_to``)."""
        self._check(other, "expand_as", "target")
        return self.broadcast_to(t, other.shape, name=name)

    def _dim(self, t: Tensor, dim: int, opname: str) -> int:
        if not isinstance(dim, int) or not -len(t.shape) <= dim < len(t.shape):
            raise ReshardError(f"{opname} of {t!r}: dim {dim!r} out of range")
        return dim % len(t.shape)

    def slice(self, t: Tensor, dim: int, start: int, stop: int, *, name: Name = None) -> Tensor:
        self._check(t, "slice")
        d = self._dim(t, dim, "slice")
        if not 0 <= start < stop <= t.shape[d]:
            raise ReshardError(f"slice of {t!r}: [{start}:{stop}) is not a non-empty range inside dim {d} "
                               f"of size {t.shape[d]}")
        shape = list(t.shape)
        shape[d] = stop - start
        return self._op("slice", [t], self._new(shape, t.dtype, t.mesh, name), dim=d, start=start, stop=stop)

    def pad(self, t: Tensor, dim: int, lo: int, hi: int, *, name: Name = None) -> Tensor:
        """Zero-pad dim ``dim`` by ``lo`` before and ``hi`` after."""
        self._check(t, "pad")
        d = self._dim(t, dim, "pad")
        if lo < 0 or hi < 0:
            raise ReshardError(f"pad of {t!r}: negative padding ({lo}, {hi})")
        shape = list(t.shape)
        shape[d] += lo + hi
        return self._op("pad", [t], self._new(shape, t.dtype, t.mesh, name), dim=d, lo=lo, hi=hi)

    def cat(self, ts: Sequence[Tensor], dim: int, *, name: Name = None) -> Tensor:
        """Concatenation, built as a chain of two-operand cats (``name``: the last one's result; one
        operand is returned as it is)."""
        if len(ts) < 1:
            raise ReshardError("cat: no operands")
        for t in ts:
            self._check(t, "cat")
        out = ts[0]
        for k, t in enumerate(ts[1:], start=2):
            d = self._dim(out, dim, "cat")
            if len(t.shape) != len(out.shape) or any(a != b for i, (a, b) in enumerate(zip(out.shape, t.shape))
                                                     if i != d):
                raise ReshardError(f"cat along dim {d}: shapes {out!r} and {t!r} differ off that dim")
            if t.dtype != out.dtype:
                raise ReshardError(f"cat: dtypes differ: {out!r} vs {t!r}")
            mesh = self._same_mesh("cat", out, t)
            shape = list(out.shape)
            shape[d] += t.shape[d]
            out = self._op("cat", [out, t], self._new(shape, out.dtype, mesh, name if k == len(ts) else None), dim=d)
        return out

    # ---- reductions and contractions -------------------------------------------------
    def reduce(self, op: str, t: Tensor, dims: int | Sequence[int], *, name: Name = None) -> Tensor:
        self._check(t, op)
        if op not in REDUCTIONS:
            raise ReshardError(f"reduce: unknown reduction {op!r}; supported: {REDUCTIONS}")
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        ds = tuple(sorted({self._dim(t, d, op) for d in dims}))
        if not ds or len(ds) == len(t.shape):
            raise ReshardError(f"{op} of {t!r} over dims {dims}: must reduce some but not all dims")
        shape = [s for i, s in enumerate(t.shape) if i not in ds]
        return self._op("reduce", [t], self._new(shape, t.dtype, t.mesh, name), fn=op, dims=ds)

    def sum(self, t: Tensor, dims: int | Sequence[int], *, name: Name = None) -> Tensor:
        return self.reduce("sum", t, dims, name=name)
    def mean(self, t: Tensor, dims: int | Sequence[int], *, name: Name = None) -> Tensor:
        return self.reduce("mean", t, dims, name=name)
    def max(self, t: Tensor, dims: int | Sequence[int], *, name: Name = None) -> Tensor:
        return self.reduce("max", t, dims, name=name)

    def matmul(self, a: Tensor, b: Tensor, *, name: Name = None) -> Tensor:
        """``a [*batch, m, k] @ b [k, n]`` or ``b [*batch, k, n]`` (same batch dims)."""
        self._check(a, "matmul", "lhs")
        self._check(b, "matmul", "rhs")
        if len(a.shape) < 2 or len(b.shape) < 2:
            raise ReshardError(f"matmul: operands must be at least 2-D, got {a!r} @ {b!r}")
        if a.shape[-1] != b.shape[-2]:
            raise ReshardError(f"matmul: contraction sizes differ: {a!r} @ {b!r} ({a.shape[-1]} vs {b.shape[-2]})")
        if len(b.shape) > 2 and b.shape[:-2] != a.shape[:-2]:
            raise ReshardError(f"matmul: batch dims differ: {a!r} @ {b!r}")
        if a.dtype != b.dtype:
            raise ReshardError(f"matmul: dtypes differ: {a!r} @ {b!r}")
        mesh = self._same_mesh("matmul", a, b)
        return self._op("matmul", [a, b], self._new(a.shape[:-1] + (b.shape[-1],), a.dtype, mesh, name))

    # ---- communication -------------------------------------------------------------------
    def redistribute(self, t: Tensor, placements: ShardingSpec, mesh: DeviceMesh | None = None, *,
                     pin: bool = False, name: Name = None) -> Tensor:
        """The same global value with sharding ``placements`` (on ``mesh``, default t's).

        The requested sharding is one alternative: the communication may move past the ops
        that follow when that is cheaper (after a reduction, a narrowing cast, ...).
        ``pin=True`` makes the value materialize with exactly that sharding at this point.
        Another ``mesh`` makes a cross-mesh transfer (seed 001): it must have the shape of
        t's mesh and none of its devices; the optimizer chooses how the value moves
        (broadcast, scatter, parallel send/recv, with resharding on either side)."""
        self._check(t, "redistribute")
        mesh = mesh or t.mesh
        if not isinstance(mesh, DeviceMesh):
            raise ReshardError(f"redistribute of {t!r}: mesh must be a DeviceMesh, got {type(mesh).__name__}")
        if mesh != t.mesh:
            if mesh.shape != t.mesh.shape:
                raise ReshardError(f"redistribute of {t!r} to another mesh {mesh}: mesh shape {mesh.shape} differs "
                                   f"from the source mesh's {t.mesh.shape}; cross-mesh transfers between meshes of "
                                   "different shapes are not supported")
            shared = sorted(set(mesh.ranks) & set(t.mesh.ranks))
            if shared:
                raise ReshardError(f"redistribute of {t!r} to another mesh {mesh}: devices {shared} belong to both "
                                   f"meshes (source {t.mesh}); cross-mesh transfers need disjoint meshes")
        ts = TensorSharding.of(placements, t.shape, mesh, f"redistribute of {t!r}")
        attrs = {"pin": True} if pin else {}
        return self._op("redistribute", [t], self._new(t.shape, t.dtype, mesh, name, ts), sharding=ts, **attrs)

    def __repr__(self) -> str:
        lines = [f"Fusion({len(self.ops)} ops)"]
        for op in self.ops:
            lines.append(f"  {self.tensors[op.output]!r} = {op!r}")
        for tid, s in self.outputs:
            lines.append(f"  output {self.tensors[tid]!r} {s}")
        return "\n".join(lines)
