"""Placements, loop-domain shardings, and the shard/unshard oracle.

A ``TensorSharding`` gives, for each mesh axis, one of:

* ``Replicate()``: every device along the axis holds the same values;
* ``Partial(op)``: the global value is ``op``-reduction of the devices' values;
* an IterDomain (``reshard.ir.ids``) of extent = axis size: the device with coordinate c
  along the axis holds the elements whose ID value is c.

The **local tensor** of a device is the set of elements selected by all its bound IDs,
in global row-major order, shaped per dim by how many indices of that dim it holds
(so ``Shard(d)`` gives DTensor's local tensor).  A sharding must select a rectangular
set of equal size on every device; uneven or non-rectangular shardings are rejected
with ``ReshardError``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Union

import torch

from .errors import ReshardError
from .ids import ID, Inner, Outer, Root, check_roots, evaluate, extent, root_dims
from .mesh import DeviceMesh


@dataclass(frozen=True)
class Replicate:
    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Shard:
    dim: int

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


Placement = Union[Replicate, Shard, Partial]
AxisPlacement = Union[Replicate, Partial, ID]


def _is_id(p: object) -> bool:
    return isinstance(p, (Root, Outer, Inner)) or type(p).__name__ == "Merge"


@dataclass(frozen=True)
class TensorSharding:
    """Distribution of one tensor of ``shape`` over ``mesh``: one AxisPlacement per axis."""

    mesh: DeviceMesh
    shape: tuple[int, ...]
    axes: tuple[AxisPlacement, ...]

    def __post_init__(self) -> None:
        where = f"sharding {self}"
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

    # ---- construction --------------------------------------------------------------
    @staticmethod
    def from_placements(shape: Sequence[int], placements: Sequence[Placement], mesh: DeviceMesh,
                        where: str = "tensor") -> "TensorSharding":
        """DTensor placements -> loop-domain form.  Several axes sharding one dim split it
        outer-to-inner in mesh-axis order (DTensor's contiguous blocks)."""
        shape = tuple(int(s) for s in shape)
        placements = list(placements)
        if len(placements) != mesh.ndim:
            raise ReshardError(f"{where}: {len(placements)} placements {placements} for a {mesh.ndim}-D mesh")
        cur: dict[int, ID] = {}
        axes: list[AxisPlacement] = []
        for a, p in enumerate(placements):
            n = mesh.shape[a]
            if isinstance(p, Shard):
                d = p.dim + len(shape) if p.dim < 0 else p.dim
                if not 0 <= d < len(shape):
                    raise ReshardError(f"{where}: Shard({p.dim}) on a {len(shape)}-D tensor of shape {shape}")
                x = cur.get(d, Root(d, shape[d]))
                if extent(x) % n:
                    raise ReshardError(
                        f"{where}: dim {d} (size {shape[d]}, {extent(x)} per shard before axis "
                        f"{mesh.axis_names[a]!r}) is not divisible by mesh axis {mesh.axis_names[a]!r} of size {n}; "
                        "uneven sharding is not supported")
                axes.append(Outer(x, n))
                cur[d] = Inner(x, n)
            elif isinstance(p, (Replicate, Partial)):
                axes.append(p)
            else:
                raise ReshardError(f"{where}: {p!r} is not a placement (Shard/Replicate/Partial)")
        return TensorSharding(mesh, shape, tuple(axes))

    @staticmethod
    def of(spec: "ShardingSpec", shape: Sequence[int], mesh: DeviceMesh, where: str = "tensor") -> "TensorSharding":
        """Accept a TensorSharding or a placement list."""
        if isinstance(spec, TensorSharding):
            if spec.mesh != mesh or spec.shape != tuple(shape):
                raise ReshardError(f"{where}: sharding {spec} is for shape {spec.shape} on {spec.mesh}, "
                                   f"tensor has shape {tuple(shape)} on {mesh}")
            return spec
        return TensorSharding.from_placements(shape, spec, mesh, where)

    # ---- facts ---------------------------------------------------------------------
    def __str__(self) -> str:
        return "[" + ", ".join(self.describe_axis(a) for a in range(len(self.axes))) + "]"

    def describe_axis(self, a: int) -> str:
        p = self.axes[a]
        if isinstance(p, Replicate):
            return "R"
        if isinstance(p, Partial):
            return f"P({p.op})"
        if isinstance(p, Outer) and isinstance(p.x, Root):
            return f"S({p.x.dim})"
        return str(p)

    @property
    def partial_axes(self) -> tuple[int, ...]:
        return tuple(a for a, p in enumerate(self.axes) if isinstance(p, Partial))

    @property
    def bound_axes(self) -> tuple[int, ...]:
        return tuple(a for a, p in enumerate(self.axes) if _is_id(p))

    @cached_property
    def local_shape(self) -> tuple[int, ...]:
        """Shape of every device's local tensor (validated equal and rectangular)."""
        bound = [(a, self.axes[a]) for a in self.bound_axes]
        if not bound:
            return self.shape
        blocks = self._block_local_shape()
        if blocks is not None:
            return blocks
        dims = sorted(set().union(*(root_dims(x) for _, x in bound)))
        sub = [self.shape[d] for d in dims]
        if math.prod(sub) > 1 << 24:
            raise ReshardError(f"sharding {self}: bound IterDomains span {math.prod(sub)} index points; too large")
        index = [torch.zeros(1, dtype=torch.long)] * len(self.shape)
        for j, d in enumerate(dims):
            view = [1] * len(dims)
            view[j] = self.shape[d]
            index[d] = torch.arange(self.shape[d]).view(view)
        values = [evaluate(x, index).expand(sub) for _, x in bound]
        per = math.prod(sub) // math.prod(self.mesh.shape[a] for a, _ in bound)
        local = list(self.shape)
        first = None
        for coords in _coord_product([self.mesh.shape[a] for a, _ in bound]):
            mask = torch.ones(sub, dtype=torch.bool)
            for c, v in zip(coords, values):
                mask &= v == c
            sel = mask.nonzero()
            if sel.shape[0] != per:
                raise ReshardError(f"sharding {self}: device at coordinates {coords} holds {sel.shape[0]} "
                                   f"elements of {math.prod(sub)}, expected {per} (bound IDs overlap?)")
            counts = [int(sel[:, j].unique().numel()) for j in range(len(dims))]
            if math.prod(counts) != per:
                raise ReshardError(f"sharding {self}: the elements a device holds are not a rectangular block")
            if first is None:
                first = counts
            elif counts != first:
                raise ReshardError(f"sharding {self}: devices hold blocks of different shapes")
        for j, d in enumerate(dims):
            local[d] = first[j]
        return tuple(local)

    def _block_local_shape(self) -> tuple[int, ...] | None:
        """The local shape without enumerating elements when every bound IterDomain is a
        DTensor-style block split (``Shard`` placements: on each dim, the axes binding it
        split it outer-to-inner in mesh-axis order) -- always rectangular and even.  None
        for any other sharding (checked by enumeration)."""
        cur: dict[int, ID] = {}
        local = list(self.shape)
        for a in self.bound_axes:
            x = self.axes[a]
            if not isinstance(x, Outer):
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
            x = self.axes[a]
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
        stride = 1
        for d in reversed(range(k)):
            start, length = ranges[d]
            view = [1] * k
            view[d] = length
            out = out + (torch.arange(start, start + length, dtype=torch.long) * stride).view(view)
            stride *= self.shape[d]
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


def _coord_product(sizes: list[int]):
    import itertools
    return itertools.product(*[range(s) for s in sizes])


def _as_sharding(spec: ShardingSpec, shape: Sequence[int], mesh: DeviceMesh | None) -> TensorSharding:
    if isinstance(spec, TensorSharding):
        return spec
    if mesh is None:
        raise ReshardError("shard/unshard with placements needs a mesh")
    return TensorSharding.from_placements(shape, spec, mesh)


def shard(global_tensor: torch.Tensor, sharding: ShardingSpec, mesh: DeviceMesh | None = None,
          *, generator: torch.Generator | None = None) -> dict[int, torch.Tensor]:
    """Split a global tensor into each rank's local tensor.

    Partial axes: by default the device at coordinate 0 of every partial axis holds the value
    and the others hold the reduction identity's neighbour (0 for sum, the value for max).
    With ``generator``, sum-partials are random summands and max-partials random lower
    bounds, so tests exercise real partial values.
    """
    ts = _as_sharding(sharding, global_tensor.shape, mesh)
    if tuple(global_tensor.shape) != ts.shape:
        raise ReshardError(f"shard: tensor of shape {tuple(global_tensor.shape)} for a sharding of shape {ts.shape}")
    flat = global_tensor.reshape(-1)
    out: dict[int, torch.Tensor] = {}
    parts: dict[tuple, list[int]] = {}
    for r in ts.mesh.ranks:
        c = ts.mesh.coords(r)
        out[r] = flat[ts.local_indices(c)].clone()
        key = tuple(0 if a in ts.partial_axes else x for a, x in enumerate(c))
        parts.setdefault(key, []).append(r)
    for group in parts.values():
        if len(group) == 1:
            continue
        ops = {ts.axes[a].op for a in ts.partial_axes}
        if len(ops) != 1:
            raise ReshardError(f"shard: sharding {ts} mixes Partial ops {sorted(ops)}")
        op = ops.pop()
        value = out[group[0]]
        if op == "sum":
            if generator is None:
                summands = [value] + [torch.zeros_like(value) for _ in group[1:]]
            else:
                summands = [torch.randn(value.shape, generator=generator).to(value.dtype) for _ in group[1:]]
                summands.insert(0, value - sum(summands))
        else:
            if generator is None:
                summands = [value.clone() for _ in group]
            else:
                summands = [value] + [value - torch.rand(value.shape, generator=generator).to(value.dtype)
                                      for _ in group[1:]]
        for r, s in zip(group, summands):
            out[r] = s
    return out


def unshard(locals_by_rank: dict[int, torch.Tensor], sharding: ShardingSpec, mesh: DeviceMesh | None = None,
            *, shape: Sequence[int] | None = None, check_replicas: bool = True,
            rtol: float = 1e-4, atol: float = 1e-5) -> torch.Tensor:
    """Rebuild the global tensor from every rank's local tensor.

    Partial axes are reduced; replicated copies are checked to agree (a plan that leaves
    replicas inconsistent is wrong) unless ``check_replicas=False``.
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
    ops = sorted({ts.axes[a].op for a in ts.partial_axes})
    if len(ops) > 1:
        raise ReshardError(f"unshard: sharding {ts} mixes Partial ops {ops}")
    any_local = locals_by_rank[ts.mesh.ranks[0]]
    groups: dict[tuple, list[int]] = {}
    for r in ts.mesh.ranks:
        loc = locals_by_rank[r]
        if tuple(loc.shape) != ts.local_shape:
            raise ReshardError(f"unshard: rank {r} local shape {tuple(loc.shape)}, sharding {ts} expects {ts.local_shape}")
        key = tuple(0 if a in ts.partial_axes else x for a, x in enumerate(ts.mesh.coords(r)))
        groups.setdefault(key, []).append(r)
    flat = torch.empty(math.prod(ts.shape), dtype=any_local.dtype)
    written: dict[tuple, torch.Tensor] = {}
    for key, group in groups.items():
        vals = [locals_by_rank[r] for r in group]
        if len(vals) == 1:
            value = vals[0]
        elif ts.axes[ts.partial_axes[0]].op == "sum":
            value = torch.stack([v.double() if v.is_floating_point() else v for v in vals]).sum(0).to(vals[0].dtype)
        else:
            value = torch.stack(vals).amax(0)
        bound_key = tuple(key[a] for a in ts.bound_axes)
        if bound_key in written:
            if check_replicas and not torch.allclose(written[bound_key].double(), value.double(), rtol=rtol, atol=atol):
                raise ReshardError(f"unshard: replicas at mesh coordinates {key} disagree for sharding {ts}")
            continue
        written[bound_key] = value
        flat[ts.local_indices(key).reshape(-1)] = value.reshape(-1)
    return flat.view(ts.shape)


# ---- serialization (host programs carry shardings as plain nested tuples) ----------
def id_to_spec(x: ID) -> tuple:
    if isinstance(x, Root):
        return ("root", x.dim, x.extent)
    if isinstance(x, Outer):
        return ("outer", id_to_spec(x.x), x.parts)
    if isinstance(x, Inner):
        return ("inner", id_to_spec(x.x), x.parts)
    return ("merge", id_to_spec(x.x), id_to_spec(x.y))


def id_from_spec(s: tuple) -> ID:
    from .ids import Merge
    if s[0] == "root":
        return Root(s[1], s[2])
    if s[0] == "outer":
        return Outer(id_from_spec(s[1]), s[2])
    if s[0] == "inner":
        return Inner(id_from_spec(s[1]), s[2])
    if s[0] == "merge":
        return Merge(id_from_spec(s[1]), id_from_spec(s[2]))
    raise ReshardError(f"not an IterDomain spec: {s!r}")


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
    return (tuple(m.shape), tuple(m.ranks), tuple(m.axis_names), tuple(ts.shape), tuple(axes))


def _tuplify(x: object) -> object:
    return tuple(_tuplify(v) for v in x) if isinstance(x, (list, tuple)) else x


def sharding_from_spec(spec: tuple) -> TensorSharding:
    return _sharding_from_spec(_tuplify(spec))


_SPEC_CACHE: dict[tuple, TensorSharding] = {}


def _sharding_from_spec(spec: tuple) -> TensorSharding:
    if spec not in _SPEC_CACHE:
        mshape, ranks, names, shape, axes = spec
        flat = list(ranks)
        nested: object = flat
        for s in reversed(mshape[1:]):
            nested = [nested[i:i + s] for i in range(0, len(nested), s)]  # type: ignore[index]
        mesh = DeviceMesh(nested, names)
        out: list[AxisPlacement] = []
        for a in axes:
            out.append(Replicate() if a[0] == "R" else Partial(a[1]) if a[0] == "P" else id_from_spec(a[1]))
        _SPEC_CACHE[spec] = TensorSharding(mesh, tuple(shape), tuple(out))
    return _SPEC_CACHE[spec]
