"""Lookups: ``embedding`` and ``pick``, a table read at integer indices (*gathers*), and their
backward, a table written at integer indices (*scatters*: ``embedding_grad``, ``unpick``).

* ``embedding(weight [V, H], ids [*I] int64) -> [*I, H]``: ``torch.nn.functional.embedding``;
* ``pick(x [*B, V], index [*B] int64) -> [*B]``: ``torch.gather(x, -1, index[..., None])[..., 0]``
  (the target logit of a cross entropy);
* ``embedding_grad(g [*I, H], ids [*I] int64, V) -> [V, H]``: the rows of ``g`` summed into the
  rows ``ids`` name (``index_add``; torch's embedding backward), the vjp of ``embedding`` (an
  embedding's ``padding_idx``, torch's, passes to it: ids of that row add nothing);
* ``unpick(g [*B], index [*B] int64, V) -> [*B, V]``: ``g`` at the picked index, 0 elsewhere
  (``scatter``; torch's gather backward), the vjp of ``pick``.

The gathers' tables may hold floats or ints (a position or index table: T5's decoder inputs
built by ``slice_scatter``, RoBERTa's position ids); the scatters' are float gradients.
Each is linear in its table operand, and the gathers and scatters are each other's transposes:
the vjp of ``embedding_grad`` is ``embedding`` of the result's gradient at the ids (the rows the
tokens were summed into; with a ``padding_idx``: no backward, a ``ReshardError``), the vjp of
``unpick`` is ``pick`` of it at the index; the indices have no gradient.

Operand 0 is the *table* (weight, x), operand 1 the *indices*; the table's *indexed dim* (V) is
read at the index values.  Six index maps, in matmul's slot convention, read off each op's
einsum spec (``spec``: ``vh,I->Ih``, ``Bv,B->B``, ``Ih,I->vh``, ``B,B->Bv``;
``registry.einsum_slots``; ``rules.lookup`` states the strategies over them): 0/1
table/indices into the result (embedding: H, and every ids dim; pick: the batch dims of both); 2 the table into the lookup's indexed space (a 1-D
space, root 0 = V; ``encode.contraction_space``), 3 nothing; 4/5 only the table/indices dims a
shard may keep while the other operand is whole (embedding: H / every ids dim; pick: none, since
x's rows and the index's rows must be split alike).

A table split along V (Megatron's vocab-parallel embedding and cross-entropy target logit)
runs a *masked local lookup*: indices of rows this rank does not hold give 0, so the team's sum
of the local results is the lookup (a Partial("sum") result).  The step carries the table's
``TensorSharding`` (``carries_sharding``) and the local step reads the rank's rows from it
(``runtime.cpu_steps.lookup``).  Cost: memory-bound, the indices read plus the rows read plus the result written
(``rules.lookup``'s ``cost-lookup``).  Indices must lie in ``[0, V)``.  On a GPU
(``runtime.gpu_steps.lookup``): one gather of the rank's block, each index's row read from the
local table at its position (``row_positions``, a device-cached table of the rank's rows, -1
for rows another rank holds, which give 0); an index outside ``[0, V)`` (which the op does not
allow; torch raises) gives 0 and is never read through.

A scatter's result has the indexed dim (V; ``scattered_dims``), which no operand dim maps to.
Its six index maps: 0/1 g/indices into the result (embedding_grad: g's H; unpick: the batch
dims of both); 2/3 g/indices into the contraction space (embedding_grad's token dims, which
it sums over; unpick: none); 4 the g dims a shard may keep while the indices are whole
(embedding_grad: H), 5 none.  Strategies (``rules.lookup``): g and the indices whole
on a mesh axis give a result split there along V by a *masked local scatter* (each rank
writes only the index values in its rows; no communication); g and ids split alike along
tokens give a Partial("sum") result (each rank scatters its tokens); g's H split gives H
split.  The step carries the result's ``TensorSharding`` (``carries_result``) and writes the
rows that sharding gives the rank.  Cost: memory-bound (``mem``: g, the indices and the
result block).  Uneven V: built at the padded extent (``widens_new_dims``), the rows past V
are never written and stay 0.  On a GPU (``runtime.gpu_steps.lookup``, each finding the rows
of the rank's block as the forward lookups do): ``unpick`` writes each element of its block
once; ``embedding_grad`` zeroes a float32 block and adds g's rows into the rows their ids name
by float32 atomics, then rounds it to g's dtype when that is 16-bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import check_kind
from ..errors import ReshardError
from ..sharding import TensorSharding
from ..tensor_cache import tensor_lru
from .registry import Image, OpKind, StepLike, einsum_slots, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None
INDEX_DTYPE = "int64"
#: the dtype kinds a gather's table takes (ints: exact, and a Partial sum of the masked local
#: lookups of a table split along its indexed dim is exact too; bools are never Partial)
GATHERED = ("float", "int")


def _operands(f: Fusion, op: str, table: Tensor, index: Tensor, table_what: str, index_what: str,
              kinds: tuple[str, ...] = ("float",)) -> None:
    """The checks the lookups share: tensors of this Fusion, a table of ``kinds`` (a gather's may
    hold ints too: a position table, a scatter's is a float gradient), int64 indices (what
    ``torch.gather`` takes), one mesh."""
    f._check(table, op, table_what)
    f._check(index, op, index_what)
    check_kind(op, table, kinds, table_what)
    if index.dtype != INDEX_DTYPE:
        raise ReshardError(f"{op}: {index_what} {index!r} must be {INDEX_DTYPE}, got {index.dtype}")
    f._same_mesh(op, table, index)


def _padding_idx(op: str, padding_idx: Any, rows: int) -> dict[str, int]:
    """The ``padding_idx`` attribute (torch's: the row whose gradient stays 0; negative counts
    from the end) in ``[0, rows)``; none when None."""
    if padding_idx is None:
        return {}
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, int) or not -rows <= padding_idx < rows:
        raise ReshardError(f"{op}: padding_idx must be an int in [-{rows}, {rows}) or None, got {padding_idx!r}")
    return {"padding_idx": padding_idx % rows}


def embedding(f: Fusion, weight: Tensor, ids: Tensor, *, padding_idx: int | None = None, name: Name = None) -> Tensor:
    """``weight [V, H]`` read at ``ids [*I]`` (int64, values in [0, V)): ``[*I, H]``.  ``padding_idx``
    (torch's): the forward is the same; the gradient of that row is 0 (``embedding_grad``)."""
    _operands(f, "embedding", weight, ids, "weight", "ids", GATHERED)
    if len(weight.shape) != 2:
        raise ReshardError(f"embedding: weight {weight!r} must be 2-D [V, H], got shape {weight.shape}")
    return f._op("embedding", [weight, ids], f._new(ids.shape + weight.shape[1:], weight.dtype, weight.mesh, name),
                 **_padding_idx("embedding", padding_idx, weight.shape[0]))


def pick(f: Fusion, x: Tensor, index: Tensor, *, name: Name = None) -> Tensor:
    """``x [*B, V]`` read along its last dim at ``index [*B]`` (int64, values in [0, V)): ``[*B]``."""
    _operands(f, "pick", x, index, "x", "index", GATHERED)
    if len(x.shape) < 2 or x.shape[:-1] != index.shape:
        raise ReshardError(f"pick: x {x!r} must be [*B, V] with index {index!r} of shape [*B]: "
                           f"got {x.shape} and {index.shape}")
    return f._op("pick", [x, index], f._new(index.shape, x.dtype, x.mesh, name))


def _extent(op: str, n: Any) -> int:
    """The scattered dim's extent V: a positive int (indices must lie in ``[0, V)``)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ReshardError(f"{op}: the indexed extent must be a positive int, got {n!r}")
    return n


def embedding_grad(f: Fusion, g: Tensor, ids: Tensor, num_rows: int, *, padding_idx: int | None = None,
                   name: Name = None) -> Tensor:
    """``g [*I, H]`` summed into the rows ``ids [*I]`` (int64, values in [0, num_rows)) name of a
    ``[num_rows, H]`` zero table: the gradient of ``embedding``'s weight (``padding_idx``: ids of
    that row add nothing, as in torch's embedding backward)."""
    _operands(f, "embedding_grad", g, ids, "g", "ids")
    if len(g.shape) != len(ids.shape) + 1 or g.shape[:-1] != ids.shape:
        raise ReshardError(f"embedding_grad: g {g!r} must be [*I, H] with ids {ids!r} of shape [*I]: "
                           f"got {g.shape} and {ids.shape}")
    shape = (_extent("embedding_grad", num_rows), g.shape[-1])
    return f._op("embedding_grad", [g, ids], f._new(shape, g.dtype, g.mesh, name), shape=shape,
                 **_padding_idx("embedding_grad", padding_idx, shape[0]))


def unpick(f: Fusion, g: Tensor, index: Tensor, extent: int, *, name: Name = None) -> Tensor:
    """``[*B, extent]`` zeros holding ``g [*B]`` at ``index [*B]`` (int64, values in [0, extent)) along
    the last dim: the gradient of ``pick``'s ``x``."""
    _operands(f, "unpick", g, index, "g", "index")
    if g.shape != index.shape:
        raise ReshardError(f"unpick: g {g!r} and index {index!r} must have one shape, got {g.shape} and {index.shape}")
    shape = g.shape + (_extent("unpick", extent),)
    return f._op("unpick", [g, index], f._new(shape, g.dtype, g.mesh, name), shape=shape)


@tensor_lru()
def row_positions(table: TensorSharding, coords: tuple[int, ...], dim: int, device: str) -> torch.Tensor | None:
    """For each global row of the table's dim ``dim``, its position in the local tensor of the
    device at ``coords`` (-1: another device holds it), on torch device ``device``; None when
    the device holds every row."""
    n = table.shape[dim]
    ranges = table.block_ranges(coords)
    if ranges is not None:
        start, length = ranges[dim]
        if length == n:
            return None
        rows = torch.arange(start, start + length)
    else:
        idx = table.local_indices(coords)  # a rectangular set: the rows along dim at 0 elsewhere
        rows = (idx.movedim(dim, -1).reshape(-1, idx.shape[dim])[0] // math.prod(table.shape[dim + 1:])) % n
        if len(rows) == n:
            return None
    pos = torch.full((n,), -1, dtype=torch.long)
    pos[rows] = torch.arange(len(rows))
    return pos.to(device)


def zero_unless(keep: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` where ``keep`` (broadcast along x's trailing dims), 0 elsewhere."""
    keep = keep.reshape(keep.shape + (1,) * (x.dim() - keep.dim()))
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _letters(index: tuple[int, ...]) -> str:
    """One einsum letter per dim of the indices."""
    return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:len(index)]


class Indexed(OpKind):
    """The family's shared declaration: operands (float values, int64 indices), the six index
    maps (module docstring) and the ``lookup`` strategy."""

    strategy = "lookup"
    #: the indexed dim V (a gather's table's, a scatter's result's), counted from the end
    indexed = -1

    def spec(self, values: tuple[int, ...], index: tuple[int, ...]) -> str:
        """The op as an einsum over its operands' dims (``registry.einsum_slots`` reads the six
        index maps of the module docstring off it; the indexed dim V is ``v``)."""
        raise NotImplementedError(self.kind)

    def slots(self, op: Op) -> int:
        return 6

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        shapes = [fusion.tensors[i].shape for i in op.inputs]
        return einsum_slots(self.spec(*shapes), shapes)[slot]


class Lookup(Indexed):
    """A gather: the ``lookup`` cost law, the table's sharding on the step, and ``take`` (the
    masked local lookup through it: ``runtime.cpu_steps.lookup``)."""

    cost = "lookup"
    carries_sharding = 0

    def take(self, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The lookup on tensors (the table holding every row of V)."""
        raise NotImplementedError(self.kind)

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return self.take(xs[0], xs[1])

    def ignores_padding(self, fusion: Fusion, op: Op, slot: int) -> tuple[int, ...]:
        """The table's indexed dim: only rows at the index values, all below V, are read."""
        return (len(fusion.tensors[op.inputs[0]].shape) + self.indexed,) if slot == 0 else ()

    def zeroes_padding(self, fusion: Fusion, op: Op, slot: int) -> tuple[int, ...]:
        """Every dim of the indices: their padding is read (it is carried to the result), so
        it must hold valid indices."""
        return tuple(range(len(fusion.tensors[op.inputs[1]].shape))) if slot == 1 else ()


@register("embedding")
class Embedding(Lookup):
    builders = {"embedding": embedding}
    indexed = -2

    def take(self, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(index, table)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """d weight = ``embedding_grad(g, ids, V)`` (the rows of g summed into the rows ids name,
        but the ``padding_idx`` row's); ids: no gradient."""
        weight, ids = xs
        return [f.embedding_grad(g, saved(ids), weight.shape[0], padding_idx=op.attrs.get("padding_idx")), None]

    def spec(self, table: tuple[int, ...], index: tuple[int, ...]) -> str:
        ids = _letters(index)
        return f"vh,{ids}->{ids}h"


@register("pick")
class Pick(Lookup):
    builders = {"pick": pick}

    def take(self, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.gather(table, -1, index.unsqueeze(-1)).squeeze(-1)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """d x = ``unpick(g, index, V)`` (g at the picked index, 0 elsewhere); index: no gradient.

        One op rather than ``where(eq(iota_V, index), g, 0)`` of existing ops: that needs a
        constant iota input the caller would have to feed, three ``[*B, V]`` temporaries and a
        compare per element, where ``unpick`` writes its block once; and its masked local
        scatter makes a vocab-sharded gradient from a whole ``g`` with no communication, the
        same law as ``embedding_grad``'s."""
        x, index = xs
        return [f.unpick(g, saved(index), x.shape[-1]), None]

    def spec(self, table: tuple[int, ...], index: tuple[int, ...]) -> str:
        batch = _letters(index)
        return f"{batch}v,{batch}->{batch}"


class Scatter(Indexed):
    """A scatter: ``put`` and ``written`` (the masked local scatter into the rows of the result's
    block through them: ``runtime.cpu_steps.lookup``), the padding laws, the memory-bound cost law.  Attribute ``shape``: the result's shape (the padding pass widens
    its scattered dim)."""

    cost = "mem"
    carries_result = True
    widens_new_dims = True

    #: its local step may take an accumulator (``codegen.scatter_add``)
    accumulates = True

    def put(self, out: torch.Tensor, g: torch.Tensor, index: torch.Tensor) -> None:
        """Add ``g`` into ``out`` at ``index`` along the scattered dim (every index in range)."""
        raise NotImplementedError(self.kind)

    def accumulator(self, step: StepLike) -> int | None:
        """A step reading ``(g, index, acc)`` adds into ``acc`` (``codegen.scatter_add``)."""
        return 2 if len(step.ins) == 3 else None

    @staticmethod
    def accumulator_fits(step: StepLike, xs: list[torch.Tensor]) -> bool:
        """No accumulator, or one of g's dtype and the shape of the step's result block (what
        the GPU steps add into)."""
        return len(xs) == 2 or (len(xs) == 3 and xs[2].dtype == xs[0].dtype
                                and tuple(xs[2].shape) == step.attr("dst").local_shape)

    def written(self, a: Mapping[str, Any], g: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The values scattered (``a``: the op's, or its step's, attributes): ``g``."""
        return g

    def scattered_dims(self, fusion: Fusion, op: Op) -> tuple[int, ...]:
        return (len(fusion.tensors[op.output].shape) + self.indexed,)

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        g, index = xs
        out = torch.zeros(tuple(a["shape"]), dtype=g.dtype, device=g.device)
        self.put(out, self.written(a, g, index), index)
        return out


@register("embedding_grad")
class EmbeddingGrad(Scatter):
    builders = {"embedding_grad": embedding_grad}
    indexed = -2

    def put(self, out: torch.Tensor, g: torch.Tensor, index: torch.Tensor) -> None:
        out.index_add_(0, index.reshape(-1), g.reshape(-1, g.shape[-1]))

    def written(self, a: Mapping[str, Any], g: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``g`` with the rows of ids ``padding_idx`` zeroed (they add nothing)."""
        pad = a.get("padding_idx")
        return g if pad is None else zero_unless(index != pad, g)

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """d g = ``embedding(g_out, ids)`` (each token's row of the result's gradient); ids: none.
        With a ``padding_idx`` the tokens of that row would take 0, which needs a constant the
        vjp cannot form: no backward."""
        if "padding_idx" in op.attrs:
            raise ReshardError("no backward for op embedding_grad with a padding_idx")
        return [f.embedding(g, saved(xs[1])), None]

    def spec(self, g: tuple[int, ...], index: tuple[int, ...]) -> str:
        tokens = _letters(index)
        return f"{tokens}h,{tokens}->vh"

    def reduced_dims(self, fusion: Fusion, op: Op, slot: int) -> dict[int, tuple[str, int]]:
        """The token dims of g and ids, summed over together (their padding: g's masked to 0 so
        it adds nothing, ids' to the valid index 0)."""
        return {d: ("sum", d) for d in range(len(fusion.tensors[op.inputs[1]].shape))}


@register("unpick")
class Unpick(Scatter):
    builders = {"unpick": unpick}

    def put(self, out: torch.Tensor, g: torch.Tensor, index: torch.Tensor) -> None:
        out.scatter_add_(-1, index.unsqueeze(-1), g.unsqueeze(-1))

    def spec(self, g: tuple[int, ...], index: tuple[int, ...]) -> str:
        batch = _letters(index)
        return f"{batch},{batch}->{batch}v"

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """d g = ``pick(g_out, index)`` (the element each g was written to); index: none."""
        return [f.pick(g, saved(xs[1])), None]

    def zeroes_padding(self, fusion: Fusion, op: Op, slot: int) -> tuple[int, ...]:
        """The index's dims: their padding is read (carried to the result's padding rows), so it
        must hold valid indices."""
        return tuple(range(len(fusion.tensors[op.inputs[1]].shape))) if slot == 1 else ()

