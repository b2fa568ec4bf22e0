"""The Fusion IR: a DAG of tensor ops on device meshes, built with a small builder API.

Every tensor has a global shape, dtype, mesh, and optionally a fixed sharding (inputs,
``redistribute`` targets, outputs' required shardings).  Tensors left open are for the
optimizer to place.  Shape and dtype are inferred; malformed ops raise ``ReshardError``
naming the op and operand.  The op builders (``f.matmul``, ``f.slice``, ...) are declared
with their ops in ``reshard.ir.ops`` and installed on ``Fusion`` below.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .dtypes import DTYPES, check_partial, dtype_name
from .errors import ReshardError
from .mesh import DeviceMesh
from .ops import BUILDERS
from .sharding import ShardingSpec, TensorSharding

#: the optional name of an op's result (labels it in explanations and drawings; None: ``t<N>``)
Name = str | None


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

    def readers(self) -> dict[int, list[Op]]:
        """The ops reading each value, in program order (an op reading it twice: twice)."""
        out: dict[int, list[Op]] = {}
        for op in self.ops:
            for i in op.inputs:
                out.setdefault(i, []).append(op)
        return out

    def copy(self) -> "Fusion":
        """A Fusion with this one's tensors, ops, inputs and outputs (the same ids and objects),
        for passes that append ops to it and leave the original as it is."""
        out = Fusion()
        out.tensors, out.ops, out.inputs = list(self.tensors), list(self.ops), list(self.inputs)
        out.outputs, out.producer = list(self.outputs), dict(self.producer)
        return out

    # ---- sources and sinks ---------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: Any, mesh: DeviceMesh,
              placements: ShardingSpec | None = None) -> Tensor:
        """A program input.  ``placements``: one placement per mesh axis, reshard's or
        ``torch.distributed.tensor``'s (``Shard(d)``, ``Replicate()``, ``Partial()``; see
        ``sharding.as_placement``), or a ``TensorSharding``; ``None`` lets the optimizer choose
        how it is fed.  Uneven shardings (a dim the mesh axes sharding it do not divide) have
        DTensor's ``torch.chunk`` pieces (``sharding`` module docstring), nested ones (several
        axes on one dim) torch.chunk inside torch.chunk."""
        where = f"input {name!r}"
        if any(self.tensors[i].name == name for i in self.inputs):
            raise ReshardError(f"{where}: an input of that name exists already")
        if not isinstance(mesh, DeviceMesh):
            raise ReshardError(f"{where}: mesh must be a DeviceMesh, got {type(mesh).__name__}")
        shape = tuple(shape)
        if any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in shape):
            raise ReshardError(f"{where}: shape must be a tuple of positive ints (() for a 0-dim value), got {shape}")
        ts = None if placements is None else TensorSharding.of(placements, shape, mesh, where)
        check_partial(dtype_name(dtype, where), ts, where)
        t = self._new(shape, dtype_name(dtype, where), mesh, name, ts)
        self._op("input", [], t, name=name)
        self.inputs.append(t.id)
        return t

    def output(self, t: Tensor, placements: ShardingSpec) -> None:
        """Mark ``t`` an output with a required sharding (placements as in ``input``)."""
        self._check(t, "output")
        ts = TensorSharding.of(placements, t.shape, t.mesh, f"output {t!r}")
        check_partial(t.dtype, ts, f"output {t!r}")
        self.outputs.append((t.id, ts))

    def fixed_shardings(self) -> list[tuple[str, int, TensorSharding]]:
        """(what, tensor id, sharding) of every sharding the program fixes, in program order,
        then the outputs: an input's (``"input"``), a redistribute's target for its result
        (``"redistribute"``) and for its operand (``"redistribute operand"``), each output's
        (``"output"``)."""
        out = []
        for op in self.ops:
            if op.kind == "input" and self.tensors[op.output].sharding is not None:
                out.append(("input", op.output, self.tensors[op.output].sharding))
            elif op.kind == "redistribute" and op.attrs.get("sharding") is not None:
                out += [("redistribute", op.output, op.attrs["sharding"]),
                        ("redistribute operand", op.inputs[0], op.attrs["sharding"])]
        return out + [("output", tid, ts) for tid, ts in self.outputs]

    @staticmethod
    def _ints(value: Any, opname: str, what: str) -> tuple[int, ...]:
        """``value`` (an int, or a sequence of ints) as a tuple of ints; anything else (None, a
        float, a string, a bool) is a ``ReshardError`` naming the op and the argument."""
        items = (value,) if isinstance(value, int) else value
        try:
            items = tuple(items)
        except TypeError:
            items = None
        if items is None or any(not isinstance(v, int) or isinstance(v, bool) for v in items) \
                or isinstance(value, bool):
            raise ReshardError(f"{opname}: {what} must be an int or a sequence of ints, got {value!r}")
        return items

    def _dim(self, t: Tensor, dim: int, opname: str) -> int:
        if not isinstance(dim, int) or not -len(t.shape) <= dim < len(t.shape):
            raise ReshardError(f"{opname} of {t!r}: dim {dim!r} out of range")
        return dim % len(t.shape)

    def __repr__(self) -> str:
        lines = [f"Fusion({len(self.ops)} ops)"]
        for op in self.ops:
            lines.append(f"  {self.tensors[op.output]!r} = {op!r}")
        for tid, s in self.outputs:
            lines.append(f"  output {self.tensors[tid]!r} {s}")
        return "\n".join(lines)


for _name, _builder in BUILDERS.items():
    setattr(Fusion, _name, _builder)

__all__ = ["DTYPES", "dtype_name", "Name", "Tensor", "Op", "Fusion"]
