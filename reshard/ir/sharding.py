"""Placements, loop-domain shardings, and the shard/unshard oracle.

A ``TensorSharding`` gives, for each mesh axis, one of:

* ``Replicate()``: every device along the axis holds the same local tensor;
* ``Partial(op)``: the global value is the ``op``-reduction of the devices' values;
* an IterDomain (``reshard.ir.ids``) of extent = axis size: the device with coordinate c
  along the axis holds the elements whose ID value is c.

The **local tensor** of a device is the set of elements selected by all its bound IDs,
in global row-major order, shaped per dim by how many indices of that dim it holds
(so ``Shard(d)`` gives DTensor's local tensor).  A sharding must select a rectangular
set of equal size on every device; non-rectangular shardings are rejected with
``ReshardError``.

**Uneven dims** (DTensor's ``torch.chunk`` semantics).  ``Shard`` placements on a dim of
extent ``n`` that the product ``P`` of the mesh axes sharding it does not divide give DTensor's
``torch.chunk`` pieces, possibly empty: with one axis, rank ``r`` holds
``[r*c, min((r+1)*c, n))``, ``c = ceil(n/P)``; several axes on one dim chunk it in mesh-axis
order (the first axis chunks ``n``, the next one chunks each piece, ...: 5 rows on 2x2 give
pieces 2, 1, 1, 1).  reshard stores such a sharding in its **padded** form: the IDs live on the
padded extent ``N = P*c`` (every block holds ``c`` indices, an even block sharding, so
``local_shape`` and all the algebra stay even) and ``true_shape`` records ``n``; block ``b``
holds its piece as a prefix (``ir.uneven``: the dim's layout, :attr:`TensorSharding.layouts`).
The local tensor a user sees (``shard``, ``unshard``, ``Plan.run``) is that prefix of the padded
block along every dim (:meth:`TensorSharding.local_extent`).

**Semantics** (DTensor's).  Write ``L(c)`` for the local tensor of the device at mesh
coordinates ``c``.  The coordinates on the bound axes choose a block of the global tensor.
Along a Replicate axis the copies are identical: ``L(c)`` does not depend on ``c``'s
Replicate coordinates, whatever the other axes hold (Partial ones included).  The block is
the ``op``-reduction of ``L(c)`` over all coordinates of the Partial axes (the others
fixed).  On a 2x2 mesh, ``[Partial("sum"), Replicate()]`` means ``L(x, 0) == L(x, 1)`` and
value ``= L(0, y) + L(1, y)``; the summands vary along the Partial axis only.  ``shard``
builds local tensors that satisfy this, ``unshard`` checks it (replicas compared with NaN
equal to NaN) and reduces, and every rewrite rule is a law under it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Union

import torch

from .errors import ReshardError
from .fused_shard import FusedShard, as_fused_shard
from .ids import ID, Inner, Merge, Outer, Root, check_roots, evaluate, extent, root_dims
from .mesh import DeviceMesh
from .strides import row_major_strides
from .uneven import Runs, compact, embed, held, nested_runs


@dataclass(frozen=True)
class Replicate:
    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Shard:
    dim: int

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int) or isinstance(self.dim, bool):
            raise ReshardError(f"Shard: dim must be an int, got {self.dim!r}")

    def __repr__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True)
class Partial:
    op: str = "sum"

    def __post_init__(self) -> None:
        if self.op not in ("sum", "max"):
            raise ReshardError(f"Partial: reduce op must be 'sum' or 'max', got {self.op!r}")

    def __repr__(self) -> str:
        return f"Partial({self.op!r})"


Placement = Union[Replicate, Shard, Partial, FusedShard]
AxisPlacement = Union[Replicate, Partial, ID]
_PLACEMENT_TYPES = (Shard, Replicate, Partial)
_EXAMPLES = {"Shard": "Shard(0)", "Replicate": "Replicate()", "Partial": "Partial('sum')"}


def _dtensor_kind(p: object) -> str | None:
    """"shard" / "replicate" / "partial" / "unsupported" for a ``torch.distributed.tensor``
    placement instance, else None."""
    if isinstance(p, type) or not (type(p).__module__ or "").startswith("torch.distributed"):
        return None
    return {"Shard": "shard", "Replicate": "replicate", "Partial": "partial"}.get(type(p).__name__, "unsupported")


def _check_unsplit(placements: Sequence[object], where: str) -> None:
    """A 0-dim tensor (one element, no dim to split) takes no ``Shard`` / ``FusedShard`` placement
    (reshard's or ``torch.distributed.tensor``'s, ``_StridedShard`` included)."""
    for a, p in enumerate(placements):
        if isinstance(p, (Shard, FusedShard)) or (_dtensor_kind(p) in ("shard", "unsupported")
                                                  and "Shard" in type(p).__name__):
            raise ReshardError(f"{where}: placement {p!r} on mesh axis {a} shards a 0-dim tensor, which has no "
                               "dim to split; a 0-dim value takes Replicate() or Partial() on every mesh axis")


def is_placement(p: object) -> bool:
    """A reshard placement or a ``torch.distributed.tensor`` one (instances only)."""
    return isinstance(p, (*_PLACEMENT_TYPES, FusedShard)) or _dtensor_kind(p) is not None


def as_placement(p: object, ndim: int, where: str) -> Placement:
    """``p`` as a reshard placement of a tensor with ``ndim`` dims: reshard placements are
    kept (a negative ``Shard`` dim counted from the end), ``torch.distributed.tensor``
    ``Shard(d)`` / ``Replicate()`` / ``Partial("sum" | "max")`` are converted.  A placement
    class given instead of an instance (``Shard``, ``Partial``) and anything else is a
    ``ReshardError`` saying what to pass."""
    if isinstance(p, type) and (issubclass(p, _PLACEMENT_TYPES) or (p.__module__ or "").startswith("torch.distributed")):
        example = _EXAMPLES.get(p.__name__, f"{p.__name__}(...)")
        raise ReshardError(f"{where}: {p.__name__} is a placement class, not a placement; instantiate it, "
                           f"e.g. {example}")
    if isinstance(p, _PLACEMENT_TYPES):
        return Shard(p.dim % ndim) if isinstance(p, Shard) and -ndim <= p.dim < 0 else p
    fused = as_fused_shard(p, ndim, where)  # FusedShard, DTensor's _StridedShard
    if fused is not None:
        return fused
    kind = _dtensor_kind(p)
    if kind == "shard":
        d = int(p.dim)  # type: ignore[attr-defined]
        return Shard(d % ndim if -ndim <= d < 0 else d)
    if kind == "replicate":
        return Replicate()
    if kind == "partial":
        op = str(getattr(p, "reduce_op", "sum"))
        if op not in ("sum", "max"):
            raise ReshardError(f"{where}: DTensor Partial(reduce_op={op!r}) is not supported; reshard has "
                               "Partial('sum') and Partial('max')")
        return Partial(op)
    if kind == "unsupported":
        raise ReshardError(f"{where}: unsupported placement {p!r} ({type(p).__module__}.{type(p).__name__}); "
                           "use Shard(d), Replicate() or Partial('sum' | 'max')")
    raise ReshardError(f"{where}: {p!r} is not a placement; use Shard(d), Replicate() or Partial('sum' | 'max') "
                       "(reshard's or torch.distributed.tensor's)")


def _inners(x: ID) -> list[Inner]:
    """Every ``Inner`` split inside ID ``x``."""
    if isinstance(x, Root):
        return []
    if isinstance(x, Merge):
        return _inners(x.x) + _inners(x.y)
    return ([x] if isinstance(x, Inner) else []) + _inners(x.x)


def _digit(x: ID) -> tuple[int, int, int] | None:
    """``(d, stride, extent)`` when ``x`` splits one dim ``d`` only (Outer/Inner over a Root):
    its value is then ``(i_d // stride) % extent``; None when it merges."""
    if isinstance(x, Root):
        return x.dim, 1, x.extent
    if not isinstance(x, (Outer, Inner)):
        return None
    below = _digit(x.x)
    if below is None:
        return None
    d, stride, n = below
    return (d, stride * (n // x.parts), x.parts) if isinstance(x, Outer) else (d, stride, n // x.parts)


def _is_id(p: object) -> bool:
    return isinstance(p, (Root, Outer, Inner)) or type(p).__name__ == "Merge"


class _Named:
    """``sharding <s>`` in an error message about ``s``, formatted only when one is raised
    (formatting a sharding reads its placements: most of the time it takes to make one)."""

    __slots__ = ("sharding",)

    def __init__(self, sharding: "TensorSharding") -> None:
        self.sharding = sharding

    def __str__(self) -> str:
        return f"sharding {self.sharding}"


@dataclass(frozen=True)
class TensorSharding:
    """Distribution of one tensor of ``shape`` over ``mesh``: one AxisPlacement per axis."""

    mesh: DeviceMesh
    #: the extents the IDs live on: the padded extent of an uneven dim (``true_shape``)
    shape: tuple[int, ...]
    axes: tuple[AxisPlacement, ...]
    #: the global (DTensor) shape when some dim is uneven (a block sharding padded to ``shape``);
    #: None when every dim is even
    true_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        where = _Named(self)
        if len(self.axes) != self.mesh.ndim:
            raise ReshardError(f"{where}: {len(self.axes)} placements for a {self.mesh.ndim}-D mesh {self.mesh}")
        for a, p in enumerate(self.axes):
            if isinstance(p, (Replicate, Partial)):
                continue
            if not _is_id(p):
                raise ReshardError(f"{where}: axis {a} placement {p!r} is not Replicate/Partial/IterDomain")
            check_roots(p, self.shape, where)
            if extent(p) != self.mesh.shape[a]:
                raise ReshardError(
                    f"{where}: IterDomain {p} of extent {extent(p)} bound to mesh axis "
                    f"{self.mesh.axis_names[a]!r} of size {self.mesh.shape[a]}")
        self.local_shape  # validates rectangular, even selection
        if self.true_shape is not None:
            self._check_true_shape(where)

    def _check_true_shape(self, where: "_Named") -> None:
        """An uneven sharding is a block sharding whose padded extent of each uneven dim is
        ``P * ceil(n / P)`` (``P``: the product of the axes sharding it)."""
        true = tuple(self.true_shape)  # type: ignore[arg-type]
        if true == self.shape:
            object.__setattr__(self, "true_shape", None)
            return
        if len(true) != len(self.shape) or self._block_local_shape() is None:
            raise ReshardError(f"{where}: a true shape {true} needs a block sharding (Shard placements) of "
                               f"{len(self.shape)} dims")
        for d, (n, e) in enumerate(zip(true, self.shape)):
            parts = e // self._block_local_shape()[d]
            if not 0 < n <= e or e != parts * -(-n // parts):
                raise ReshardError(f"{where}: dim {d} of true extent {n} is padded to {e}, not to "
                                   f"{parts} * ceil({n}/{parts})")

    # ---- construction --------------------------------------------------------------
    @staticmethod
    def from_placements(shape: Sequence[int], placements: Sequence[Placement], mesh: DeviceMesh,
                        where: str = "tensor") -> "TensorSharding":
        """DTensor placements -> loop-domain form.  Several axes sharding one dim split it
        outer-to-inner in mesh-axis order (DTensor's contiguous blocks).  ``placements``: one
        per mesh axis, reshard's or ``torch.distributed.tensor``'s (``as_placement``); a
        single placement stands for the list of it on a 1-D mesh."""
        shape = tuple(int(s) for s in shape)
        if is_placement(placements) or isinstance(placements, type):
            placements = [placements]  # type: ignore[list-item]
        if isinstance(placements, (str, bytes)) or not isinstance(placements, Sequence):
            raise ReshardError(f"{where}: placements must be a sequence of placements, one per mesh axis "
                               f"(e.g. [Shard(0)]), or a TensorSharding; got {placements!r}")
        if not shape:
            _check_unsplit(placements, where)
        placements = [as_placement(p, len(shape), where) for p in placements]
        if len(placements) != mesh.ndim:
            raise ReshardError(f"{where}: {len(placements)} placements {placements} for a {mesh.ndim}-D mesh")
        padded = list(shape)
        for d in range(len(shape)):
            sizes = [mesh.shape[a] for a, p in enumerate(placements)
                     if isinstance(p, Shard) and (p.dim + len(shape) if p.dim < 0 else p.dim) == d]
            padded[d] = _padded_extent(shape[d], sizes)
            if padded[d] != shape[d] and any(isinstance(p, FusedShard) and p.dim % len(shape) == d for p in placements):
                raise ReshardError(f"{where}: dim {d} (size {shape[d]}) is sharded unevenly and by a FusedShard; "
                                   "uneven fused shards are not supported")
        cur: dict[int, ID] = {}
        axes: list[AxisPlacement] = []
        for a, p in enumerate(placements):
            n = mesh.shape[a]
            if isinstance(p, Shard):
                d = p.dim + len(shape) if p.dim < 0 else p.dim
                if not 0 <= d < len(shape):
                    raise ReshardError(f"{where}: Shard({p.dim}) on a {len(shape)}-D tensor of shape {shape}")
                x = cur.get(d, Root(d, padded[d]))
                axes.append(Outer(x, n))
                cur[d] = Inner(x, n)
            elif isinstance(p, FusedShard):
                bound, cur[p.dim] = p.split(cur.get(p.dim, Root(p.dim, shape[p.dim])), n, where)
                axes.append(bound)
            else:
                axes.append(p)
        return TensorSharding(mesh, tuple(padded), tuple(axes), shape if tuple(padded) != shape else None)

    @staticmethod
    def of(spec: "ShardingSpec", shape: Sequence[int], mesh: DeviceMesh, where: str = "tensor") -> "TensorSharding":
        """Accept a TensorSharding or a placement list."""
        if isinstance(spec, TensorSharding):
            if spec.mesh != mesh or spec.global_shape != tuple(shape):
                raise ReshardError(f"{where}: sharding {spec} is for shape {spec.global_shape} on {spec.mesh}, "
                                   f"tensor has shape {tuple(shape)} on {mesh}")
            return spec
        return TensorSharding.from_placements(shape, spec, mesh, where)

    # ---- facts ---------------------------------------------------------------------
    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        """Computed once: host programs' steps carry shardings, and the runtime's caches
        are keyed by them (``runtime.remap_fast``)."""
        return hash((self.mesh, self.shape, self.axes, self.true_shape))

    def __getstate__(self) -> dict:
        """Pickled without the cached hash: string hashes differ between processes."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __str__(self) -> str:
        return "[" + ", ".join(self.describe_axis(a) for a in range(len(self.axes))) + "]"

    # ---- uneven dims ---------------------------------------------------------------
    @property
    def global_shape(self) -> tuple[int, ...]:
        """The global tensor's shape (DTensor's): ``true_shape`` when uneven, else ``shape``."""
        return self.true_shape or self.shape

    @property
    def padded_dims(self) -> dict[int, tuple[int, int]]:
        """Each uneven dim -> (true extent n, padded extent N)."""
        if self.true_shape is None:
            return {}
        return {d: (n, e) for d, (n, e) in enumerate(zip(self.true_shape, self.shape)) if n != e}

    @property
    def even(self) -> "TensorSharding":
        """The same placements on the padded shape, with no true shape: what a plan runs on."""
        return self if self.true_shape is None else TensorSharding(self.mesh, self.shape, self.axes)

    @cached_property
    def layouts(self) -> dict[int, Runs]:
        """Each uneven dim -> its layout (``ir.uneven``): where DTensor's nested ``torch.chunk``
        pieces sit in the padded extent, the axes binding the dim chunking it in mesh order."""
        if self.true_shape is None:
            return {}
        sizes: dict[int, list[int]] = {}
        for a in self.bound_axes:
            (d,) = root_dims(self.axes[a])  # an uneven sharding is a block sharding (_check_true_shape)
            sizes.setdefault(d, []).append(self.mesh.shape[a])
        return {d: nested_runs(n, sizes[d]) for d, (n, _) in self.padded_dims.items()}

    def local_extent(self, coords: Sequence[int]) -> tuple[int, ...]:
        """The DTensor local shape of the device at mesh ``coords``: how many true indices its
        block of the padded shape holds along each dim (a prefix of the block; possibly none);
        ``local_shape`` for an even sharding."""
        if self.true_shape is None:
            return self.local_shape
        ranges = self.block_ranges(coords)
        assert ranges is not None  # an uneven sharding is a block sharding (_check_true_shape)
        runs = self.layouts
        return tuple(held(runs[d], start, length) if d in runs else length
                     for d, (start, length) in enumerate(ranges))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Global tensor ``x`` (``global_shape``) laid out in the padded ``shape`` (zeros at
        padding; ``ir.uneven.embed`` along each uneven dim)."""
        for d, runs in self.layouts.items():
            x = embed(x, d, runs, self.shape[d])
        return x

    def compact(self, x: torch.Tensor) -> torch.Tensor:
        """The global tensor held by padded ``x`` (``shape``): the inverse of :meth:`embed`."""
        for d, runs in self.layouts.items():
            x = compact(x, d, runs)
        return x.contiguous()

    @cached_property
    def placements(self) -> tuple[Placement, ...] | None:
        """The placements (``Replicate``, ``Partial``, ``Shard``, ``FusedShard``) that
        ``from_placements`` turns into this sharding, or None when its IDs are no such list
        (cyclic, merged dims, ...).  Law: ``from_placements(shape, ts.placements)`` gives every
        device the same elements as ``ts`` whenever it is not None (equal, up to an ID bound whole,
        ``x`` for ``outer(x, extent(x))``).  Read axis by axis as ``from_placements`` builds them: each
        bound ID must be the next split of one dim's remaining ID."""
        cur: dict[int, ID] = {}
        out: list[Placement] = []
        for a, p in enumerate(self.axes):
            if not _is_id(p):
                out.append(p)
                continue
            n = self.mesh.shape[a]
            found = None
            for d, e in enumerate(self.shape):
                x = cur.get(d, Root(d, e))
                for groups in (1, *sorted({q.parts for q in _inners(p)})):
                    if extent(x) % (groups * n) == 0:
                        bound, rest = FusedShard(d, groups).split(x, n, "placements")
                        if bound == p or (groups == 1 and p == x and extent(x) == n):  # outer(x, ext x) = x
                            found, cur[d] = (Shard(d) if groups == 1 else FusedShard(d, groups)), rest
                            break
                if found is not None:
                    break
            if found is None:
                return None
            out.append(found)
        return tuple(out)

    def describe_axis(self, a: int) -> str:
        """Axis ``a`` in short: ``R``, ``P(sum)``, ``S(d)``, ``FS(d,groups)`` (a ``FusedShard``),
        or the raw IterDomain when the sharding is no placement list (``placements``)."""
        p = self.axes[a]
        if isinstance(p, Replicate):
            return "R"
        if isinstance(p, Partial):
            return f"P({p.op})"
        q = None if self.placements is None else self.placements[a]
        if isinstance(q, Shard):
            return f"S({q.dim})"
        if isinstance(q, FusedShard):
            return f"FS({q.dim},{q.groups})"
        return str(p)

    @property
    def partial_axes(self) -> tuple[int, ...]:
        return tuple(a for a, p in enumerate(self.axes) if isinstance(p, Partial))

    @property
    def bound_axes(self) -> tuple[int, ...]:
        return tuple(a for a, p in enumerate(self.axes) if _is_id(p))

    @cached_property
    def local_shape(self) -> tuple[int, ...]:
        """Shape of every device's local tensor (validated equal and rectangular): without
        enumerating elements for block shardings (``_block_local_shape``) and, within the
        enumeration's size limit, for splits of single dims (``_digit_local_shape``)."""
        if not self.bound_axes:
            return self.shape
        blocks = self._block_local_shape()
        if blocks is not None:
            return blocks
        span = math.prod(self.shape[d] for d in set().union(*(root_dims(self.axes[a]) for a in self.bound_axes)))
        if span > 1 << 24:
            raise ReshardError(f"sharding {self}: bound IterDomains span {span} index points; too large")
        digits = self._digit_local_shape()
        return digits if digits is not None else self._enumerated_local_shape()

    def _enumerated_local_shape(self) -> tuple[int, ...]:
        """``local_shape`` by enumerating every device's elements over the bound dims.

        The bound IDs are grouped by the dims they read (two IDs reading a common dim are in one
        group): a device's selection is the product over groups of what each group's IDs select
        on its own dims, so it is rectangular and equal on every device iff each group's is, and
        each group is checked by enumerating its own dims only (a FusedShard of a weight's columns
        with its rows split on another axis: two 1-D enumerations, not one of the whole matrix)."""
        bound = [(a, self.axes[a]) for a in self.bound_axes]
        local = list(self.shape)
        for group in _dim_groups(bound):
            for d, n in self._group_local_extents(group).items():
                local[d] = n
        return tuple(local)

    def _group_local_extents(self, group: list[tuple[int, ID]]) -> dict[int, int]:
        """Per dim the bound IDs of ``group`` read, how many of its indices every device holds;
        ``ReshardError`` unless every device (a coordinate per axis of ``group``) holds a
        rectangular block of one shape.  Vectorized: each element's device is one number (its
        coordinates in row-major order), and a device's count along a dim is how many distinct
        (device, index) pairs it has there.  Enumerated on coarse cells (``_cells``): the IDs
        read dim d only through ``i_d // g_d``, so each cell of ``g_d`` consecutive indices
        lies on one device and the counts are the cells' times ``g_d`` (a ``[4, 4194304]``
        gradient's merged-dim shardings: 16.7M index points 0.65 s, 512 cells at once)."""
        dims = sorted(set().union(*(root_dims(x) for _, x in group)))
        cell = _cells(group, {d: self.shape[d] for d in dims})
        sub = [self.shape[d] // cell[d] for d in dims]
        sizes = [self.mesh.shape[a] for a, _ in group]
        devices = math.prod(sizes)
        index = [torch.zeros(1, dtype=torch.long)] * len(self.shape)
        for j, d in enumerate(dims):
            view = [1] * len(dims)
            view[j] = sub[j]
            index[d] = (torch.arange(sub[j]) * cell[d]).view(view)  # (each cell's first index)
        key = torch.zeros(sub, dtype=torch.long)
        for (_, x), n in zip(group, sizes):
            key = key * n + evaluate(x, index).expand(sub)
        key = key.reshape(-1)
        per = math.prod(sub) // devices
        held = torch.bincount(key, minlength=devices)
        axes = [self.mesh.axis_names[a] for a, _ in group]
        bad = (held != per).nonzero()
        if bad.numel():
            dev, k = int(bad[0, 0]), math.prod(cell.values())
            raise ReshardError(f"sharding {self}: device at coordinates {_coords(dev, sizes)} of axes {axes} holds "
                               f"{int(held[dev]) * k} elements of {math.prod(sub) * k}, expected {per * k} "
                               f"(bound IDs overlap?)")
        counts = [held] if len(dims) == 1 else []  # (one dim: every index point is a distinct index)
        for j, e in enumerate(sub if len(dims) > 1 else ()):
            view = [1] * len(dims)
            view[j] = e
            at = torch.arange(e).view(view).expand(sub).reshape(-1)
            # the (device, index) pairs present: a [devices, e] histogram's nonzero cells
            pairs = torch.bincount(key * e + at, minlength=devices * e).view(devices, e)
            counts.append((pairs > 0).sum(dim=1))
        sizes_held = torch.stack(counts)  # [dims, devices]
        rect = sizes_held.prod(dim=0) != per
        if rect.any():
            raise ReshardError(f"sharding {self}: the elements a device holds are not a rectangular block")
        if (sizes_held != sizes_held[:, :1]).any():
            raise ReshardError(f"sharding {self}: devices hold blocks of different shapes")
        return {d: int(sizes_held[j, 0]) * cell[d] for j, d in enumerate(dims)}

    def _block_local_shape(self) -> tuple[int, ...] | None:
        """The local shape without enumerating elements when every bound IterDomain is a
        DTensor-style block split (``Shard`` placements: on each dim, the axes binding it
        split it outer-to-inner in mesh-axis order) -- always rectangular and even.  None
        for any other sharding (checked by enumeration)."""
        cur: dict[int, ID] = {}
        local = list(self.shape)
        for a in self.bound_axes:
            x = self._as_block(a)
            if x is None:
                return None
            dims = root_dims(x)
            if len(dims) != 1:
                return None
            (d,) = dims
            y = cur.get(d, Root(d, self.shape[d]))
            if x != Outer(y, x.parts) or extent(y) % x.parts:
                return None
            cur[d] = Inner(y, x.parts)
            local[d] //= x.parts
        return tuple(local)

    def _as_block(self, a: int) -> Outer | None:
        """The block split axis ``a`` binds: its ``Outer``, or, for a whole dim's ``Root`` of the
        axis's size (each device holds one index of it: ``Root(d, n)`` = ``Outer(Root(d, n), n)``),
        that ``Outer``; None for any other IterDomain."""
        x = self.axes[a]
        if isinstance(x, Outer):
            return x
        if isinstance(x, Root) and x.extent == self.mesh.shape[a]:
            return Outer(x, x.extent)
        return None

    def _digit_local_shape(self) -> tuple[int, ...] | None:
        """The local shape without enumerating elements when every bound IterDomain is a split
        of one dim, a digit ``(i_d // stride) % extent`` of its index (``_digit``), and on each
        dim the digits bound are disjoint ranges of one mixed radix (sorted by stride, each
        stride a multiple of the stride times extent below it): every device then holds, on
        that dim, the indices with those digits fixed, ``shape[d]`` over the product of their
        extents, a rectangular block of the same shape everywhere.  None for any other
        sharding (checked by enumeration)."""
        ranges: dict[int, list[tuple[int, int]]] = {}
        for a in self.bound_axes:
            digit = _digit(self.axes[a])
            if digit is None:
                return None
            ranges.setdefault(digit[0], []).append(digit[1:])
        local = list(self.shape)
        for d, digits in ranges.items():
            end = 1
            for stride, n in sorted(digits):
                if stride % end:
                    return None
                end = stride * n
                local[d] //= n
        return tuple(local)

    def block_ranges(self, coords: Sequence[int]) -> tuple[tuple[int, int], ...] | None:
        """Per dim ``(start, length)`` of the global index range the device at mesh ``coords``
        holds, when the sharding is a block sharding (the structure ``_block_local_shape``
        accepts: on each dim, the axes binding it are ``Outer`` splits outer-to-inner in
        mesh-axis order, so each axis ``a`` of size ``p`` narrows the dim's current range of
        length ``L`` to ``[start + coords[a] * L // p, ... + L // p)``).  None otherwise."""
        if self._block_local_shape() is None:
            return None
        start = [0] * len(self.shape)
        length = list(self.shape)
        for a in self.bound_axes:
            x = self._as_block(a)
            (d,) = root_dims(x)
            length[d] //= x.parts
            start[d] += int(coords[a]) * length[d]
        return tuple(zip(start, length))

    def local_indices(self, coords: Sequence[int]) -> torch.Tensor:
        """Flat global indices of the local tensor of the device at mesh ``coords``, shaped
        ``local_shape`` (int64).  Block shardings (:meth:`block_ranges`) take an outer sum of
        per-dim ranges times the global strides (O(local numel)); any other sharding
        evaluates its bound IterDomains over the whole global index (:meth:`_mask_local_indices`)."""
        if len(coords) != self.mesh.ndim or any(not 0 <= int(c) < n for c, n in zip(coords, self.mesh.shape)):
            raise ReshardError(f"sharding {self}: {tuple(coords)} are not coordinates of mesh {self.mesh}")
        ranges = self.block_ranges(coords)
        if ranges is None:
            return self._mask_local_indices(coords)
        k = len(self.shape)
        out = torch.zeros((1,) * k, dtype=torch.long)
        strides = row_major_strides(self.shape)
        for d in reversed(range(k)):
            start, length = ranges[d]
            view = [1] * k
            view[d] = length
            out = out + (torch.arange(start, start + length, dtype=torch.long) * strides[d]).view(view)
        return out.expand(self.local_shape).contiguous()

    def _mask_local_indices(self, coords: Sequence[int]) -> torch.Tensor:
        """:meth:`local_indices` by a mask over the whole global tensor (any sharding)."""
        k = len(self.shape)
        index = []
        for d, s in enumerate(self.shape):
            view = [1] * k
            view[d] = s
            index.append(torch.arange(s).view(view))
        mask = torch.ones(self.shape, dtype=torch.bool)
        for a in self.bound_axes:
            mask &= evaluate(self.axes[a], index) == coords[a]
        return mask.flatten().nonzero().flatten().view(self.local_shape)


ShardingSpec = Union[TensorSharding, Sequence[Placement]]


def _dim_groups(bound: list[tuple[int, ID]]) -> list[list[tuple[int, ID]]]:
    """``bound`` (axis, ID) pairs grouped so that IDs reading a common dim share a group (the
    connected components of "reads a dim of"), each group in axis order."""
    groups: list[tuple[set[int], list[tuple[int, ID]]]] = []
    for a, x in bound:
        dims, members = set(root_dims(x)), [(a, x)]
        for g in [g for g in groups if g[0] & dims]:
            groups.remove(g)
            dims |= g[0]
            members += g[1]
        groups.append((dims, sorted(members, key=lambda m: m[0])))
    return [members for _, members in groups]


def _cells(group: list[tuple[int, ID]], extents: dict[int, int]) -> dict[int, int]:
    """Per dim d of ``extents`` (dim -> extent), the largest ``g_d`` dividing the extent such
    that every ID of ``group`` reads ``i_d`` only through ``i_d // g_d`` (``_resolution``).

    Law: then two indices of one cell (equal ``i_d // g_d``, the other dims equal) give every
    ID the same value, so they lie on the same device, and what a device holds is its cells
    with all their ``g_d`` indices each: rectangular iff its cells are, ``g_d`` times as long."""
    need: dict[int, int] = {}
    for _, x in group:
        _resolution(x, 1, need)
    return {d: math.gcd(need.get(d, e), e) for d, e in extents.items()}


def _resolution(x: ID, r: int, need: dict[int, int]) -> None:
    """Record in ``need`` (dim -> a gcd) resolutions ``g`` such that ``x(i) // r`` reads each
    root dim ``d`` of ``x`` only through ``i_d // need[d]``.  Laws (``s = ext(x) / p``):
    ``outer(x, p) // r = x // (s r)``; ``inner(x, p) // r = (x % s) // r`` reads ``x`` only
    through ``x // gcd(r, s)``; ``merge(x, y) // r`` with ``ext(y) | r`` is ``x // (r / ext(y))``,
    else it reads ``x`` whole and ``y`` through ``y // gcd(r, ext(y))`` (for ``h | r`` and
    ``h | m``, ``(h a + t) // r = a // (r / h)`` when ``0 <= t < h``)."""
    if isinstance(x, Root):
        need[x.dim] = math.gcd(need.get(x.dim, 0), r)
    elif isinstance(x, Outer):
        _resolution(x.x, extent(x.x) // x.parts * r, need)
    elif isinstance(x, Inner):
        _resolution(x.x, math.gcd(r, extent(x.x) // x.parts), need)
    else:
        ey = extent(x.y)
        if r % ey == 0:
            _resolution(x.x, r // ey, need)
            _resolution(x.y, ey, need)
        else:
            _resolution(x.x, 1, need)
            _resolution(x.y, math.gcd(r, ey), need)


def _coords(flat: int, sizes: list[int]) -> tuple[int, ...]:
    """Row-major coordinates of ``flat`` in a grid of ``sizes``."""
    out = []
    for n in reversed(sizes):
        out.append(flat % n)
        flat //= n
    return tuple(reversed(out))


def _coord_product(sizes: list[int]):
    import itertools
    return itertools.product(*[range(s) for s in sizes])


def _as_sharding(spec: ShardingSpec, shape: Sequence[int], mesh: DeviceMesh | None) -> TensorSharding:
    if isinstance(spec, TensorSharding):
        return spec
    if mesh is None:
        raise ReshardError("shard/unshard with placements needs a mesh")
    return TensorSharding.from_placements(shape, spec, mesh)


def _partial_op(ts: TensorSharding, who: str) -> str | None:
    """The reduce op of ``ts``'s Partial axes (None without any); mixed ops are rejected."""
    ops = sorted({ts.axes[a].op for a in ts.partial_axes})  # type: ignore[union-attr]
    if len(ops) > 1:
        raise ReshardError(f"{who}: sharding {ts} mixes Partial ops {ops}")
    return ops[0] if ops else None


def _summands(value: torch.Tensor, n: int, op: str | None, generator: torch.Generator | None
              ) -> list[torch.Tensor]:
    """``n`` local tensors whose ``op``-reduction is ``value`` (the first one is ``value`` or
    built from it; NaN and inf stay where they are).  Without ``generator``: ``value`` then
    zeros (sum), or ``value`` ``n`` times (max); with it: random summands (sum), or ``value``
    then random lower bounds of it (max)."""
    if n == 1:
        return [value]
    if op == "sum":
        if generator is None:
            return [value] + [torch.zeros_like(value) for _ in range(n - 1)]
        rest = [torch.randn(value.shape, generator=generator).to(value.dtype) for _ in range(n - 1)]
        return [value - sum(rest)] + rest
    if generator is None:
        return [value.clone() for _ in range(n)]
    return [value] + [value - torch.rand(value.shape, generator=generator).to(value.dtype) for _ in range(n - 1)]


def shard(global_tensor: torch.Tensor, sharding: ShardingSpec, mesh: DeviceMesh | None = None,
          *, generator: torch.Generator | None = None) -> dict[int, torch.Tensor]:
    """Split a global tensor into each rank's local tensor (see the module docstring for
    what a sharding means).

    The coordinates on the bound (``Shard`` / IterDomain) axes choose the block of elements.
    Along a ``Replicate`` axis every device holds the same local tensor, whatever the other
    axes hold (DTensor's meaning: ``[Partial("sum"), Replicate()]`` on a 2x2 mesh gives
    ``L(x, 0) == L(x, 1)`` and the block is ``L(0, y) + L(1, y)``).  Along the ``Partial``
    axes the block is split into summands (sum) or upper-bounded values (max) that vary with
    the Partial axes' coordinates only: by default the device at coordinate 0 of every
    Partial axis holds the block and the others hold 0 (sum) or the block too (max); with
    ``generator`` the summands are random and the max-partials random lower bounds, so
    tests exercise real partial values.  NaN and inf are kept in the coordinate-0 summand.
    Uneven dims give DTensor's ``torch.chunk`` pieces (possibly empty): the global tensor is
    laid out in the padded shape (``ts.embed``: zeros at padding), sharded, and each local
    block clipped to ``ts.local_extent`` (module docstring).
    """
    ts = _as_sharding(sharding, global_tensor.shape, mesh)
    if tuple(global_tensor.shape) != ts.global_shape:
        raise ReshardError(f"shard: tensor of shape {tuple(global_tensor.shape)} for a sharding of shape "
                           f"{ts.global_shape}")
    if ts.true_shape is not None:
        blocks = shard(ts.embed(global_tensor), ts.even, generator=generator)
        return {r: trim_local(x, ts, ts.mesh.coords(r)) for r, x in blocks.items()}
    op = _partial_op(ts, "shard")
    partial_coords = list(_coord_product([ts.mesh.shape[a] for a in ts.partial_axes]))
    flat = global_tensor.reshape(-1)
    blocks: dict[tuple, dict[tuple, torch.Tensor]] = {}
    out: dict[int, torch.Tensor] = {}
    for r in ts.mesh.ranks:
        c = ts.mesh.coords(r)
        block = tuple(c[a] for a in ts.bound_axes)
        if block not in blocks:
            value = flat[ts.local_indices(c)]
            blocks[block] = dict(zip(partial_coords, _summands(value, len(partial_coords), op, generator)))
        out[r] = blocks[block][tuple(c[a] for a in ts.partial_axes)].clone()
    return out


def _first_difference(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> str:
    """Where ``a`` and ``b`` first differ (for messages)."""
    bad = (~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)).nonzero()
    if bad.numel() == 0:
        return "no element differs"
    i = tuple(int(v) for v in bad[0])
    return f"{int(bad.shape[0])} of {a.numel()} elements differ, first at local index {i}: {a[i].item()!r} vs {b[i].item()!r}"


def unshard(locals_by_rank: dict[int, torch.Tensor], sharding: ShardingSpec, mesh: DeviceMesh | None = None,
            *, shape: Sequence[int] | None = None, check_replicas: bool = True,
            rtol: float = 1e-4, atol: float = 1e-5) -> torch.Tensor:
    """Rebuild the global tensor from every rank's local tensor (the inverse of ``shard``).

    Along a ``Replicate`` axis the local tensors must be identical copies (DTensor's meaning,
    whatever the other axes hold, Partial ones included): every rank is compared with the
    rank at coordinate 0 of all Replicate axes (``torch.isclose`` with ``rtol``/``atol``;
    NaN equals NaN and inf equals inf of the same sign, so NaN and inf flow through plans as
    through the reference), and a mismatch is a ``ReshardError`` naming both ranks (a plan or
    an input that leaves replicas inconsistent is wrong) unless ``check_replicas=False``
    (then the coordinate-0 copy is used).  The Partial axes are then reduced (sum in float64
    for floating dtypes, or max) over the Partial coordinates of each block.  Uneven dims take
    DTensor's local tensors (``ts.local_extent``), zero-padded to the block, and the true
    indices of the result are kept (``ts.compact``).
    """
    if isinstance(sharding, TensorSharding):
        ts = sharding
    else:
        if shape is None:
            raise ReshardError("unshard with placements needs the global shape")
        ts = _as_sharding(sharding, shape, mesh)
    missing = [r for r in ts.mesh.ranks if r not in locals_by_rank]
    if missing:
        raise ReshardError(f"unshard: no local tensor for ranks {missing}")
    if ts.true_shape is not None:
        blocks = {r: pad_local(locals_by_rank[r], ts, ts.mesh.coords(r), "unshard") for r in ts.mesh.ranks}
        full = unshard(blocks, ts.even, check_replicas=check_replicas, rtol=rtol, atol=atol)
        return ts.compact(full)
    op = _partial_op(ts, "unshard")
    for r in ts.mesh.ranks:
        loc = locals_by_rank[r]
        if tuple(loc.shape) != ts.local_shape:
            raise ReshardError(f"unshard: rank {r} local shape {tuple(loc.shape)}, sharding {ts} expects {ts.local_shape}")
    replicated = [a for a, p in enumerate(ts.axes) if isinstance(p, Replicate)]
    groups: dict[tuple, list[int]] = {}  # block -> the ranks at Replicate coordinate 0, in Partial order
    for r in ts.mesh.ranks:
        c = ts.mesh.coords(r)
        first = tuple(0 if a in replicated else x for a, x in enumerate(c))
        if first == c:
            groups.setdefault(tuple(c[a] for a in ts.bound_axes), []).append(r)
        elif check_replicas:
            r0 = ts.mesh.rank_at(first)
            a0, b = locals_by_rank[r0].double(), locals_by_rank[r].double()
            if not torch.allclose(a0, b, rtol=rtol, atol=atol, equal_nan=True):
                axes = [ts.mesh.axis_names[a] for a in replicated if c[a]]
                raise ReshardError(
                    f"unshard: replicas at mesh coordinates {first} (rank {r0}) and {c} (rank {r}) disagree for "
                    f"sharding {ts}: along Replicate axes {axes} every device must hold the same local tensor "
                    f"({_first_difference(a0, b, rtol, atol)})")
    first_local = locals_by_rank[ts.mesh.ranks[0]]
    flat = torch.empty(math.prod(ts.shape), dtype=first_local.dtype, device=first_local.device)
    for group in groups.values():
        vals = [locals_by_rank[r] for r in group]
        if len(vals) == 1:
            value = vals[0]
        elif op == "sum":
            value = torch.stack([v.double() if v.is_floating_point() else v for v in vals]).sum(0).to(first_local.dtype)
        else:
            value = torch.stack(vals).amax(0)
        flat[ts.local_indices(ts.mesh.coords(group[0])).reshape(-1)] = value.reshape(-1)
    return flat.view(ts.shape)


def pad_to(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``x`` zero-padded at the end of each dim to ``shape`` (each extent >= x's)."""
    pads: list[int] = []
    for have, want in reversed(list(zip(x.shape, shape))):
        pads += [0, int(want) - int(have)]
    return torch.nn.functional.pad(x, pads) if any(pads) else x


def pad_local(local: torch.Tensor, ts: TensorSharding, coords: Sequence[int], where: str) -> torch.Tensor:
    """A DTensor local tensor of the device at ``coords`` (shape ``ts.local_extent(coords)``)
    as the padded block a plan runs on (``ts.local_shape``): zeros appended along uneven dims."""
    want = ts.local_extent(coords)
    if tuple(local.shape) != want:
        raise ReshardError(f"{where}: the device at mesh coordinates {tuple(coords)} has a local tensor of shape "
                           f"{tuple(local.shape)}; sharding {ts} of global shape {ts.global_shape} gives it "
                           f"{want} (DTensor's torch.chunk pieces)")
    return pad_to(local, ts.local_shape)


def trim_local(block: torch.Tensor, ts: TensorSharding, coords: Sequence[int]) -> torch.Tensor:
    """The padded block of the device at ``coords`` clipped to its DTensor local tensor
    (``ts.local_extent(coords)``; the inverse of ``pad_local``)."""
    want = ts.local_extent(coords)
    if tuple(block.shape) == want:
        return block
    return block[tuple(slice(0, n) for n in want)].contiguous()


def _padded_extent(n: int, sizes: list[int]) -> int:
    """The padded extent of a dim of extent ``n`` sharded by mesh axes of ``sizes``:
    ``P * ceil(n / P)`` (``n`` when ``P`` divides it)."""
    total = math.prod(sizes)
    return total * -(-n // total)


# ---- serialization (a host program's JSON writes its sharding table with these) ----------
def id_to_spec(x: ID) -> tuple:
    if isinstance(x, Root):
        return ("root", x.dim, x.extent)
    if isinstance(x, Outer):
        return ("outer", id_to_spec(x.x), x.parts)
    if isinstance(x, Inner):
        return ("inner", id_to_spec(x.x), x.parts)
    return ("merge", id_to_spec(x.x), id_to_spec(x.y))


def sharding_to_spec(ts: TensorSharding) -> tuple:
    """A hashable, JSON-friendly description of ``ts`` (mesh included)."""
    axes = []
    for p in ts.axes:
        if isinstance(p, Replicate):
            axes.append(("R",))
        elif isinstance(p, Partial):
            axes.append(("P", p.op))
        else:
            axes.append(("B", id_to_spec(p)))
    m = ts.mesh
    spec = (tuple(m.shape), tuple(m.ranks), tuple(m.axis_names), tuple(ts.shape), tuple(axes))
    return spec if ts.true_shape is None else spec + (tuple(ts.true_shape),)
