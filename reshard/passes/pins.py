"""Copies of a Fusion with values pinned at given shardings.

``pin_values(fusion, pins)`` rebuilds ``fusion`` op by op; after each value named in
``pins`` it inserts pinned redistributes (``f.redistribute(v, spec, pin=True)``), one per
spec in order, and every consumer (and output) reads the last one.  The copy computes the
same outputs: a redistribute is the identity on global values.  Pinned redistributes keep
the value's name, so a plan's collectives still name the value they move.

Uses: a hand-written plan (Megatron-SP's activation shardings, ``benchmarks/real_models.py``)
planned and priced by reshard itself, and a small instance of a program replaying the
shardings a plan chose at real size (``reshard demo``).  ``placements_of`` says which
shardings carry over to other shapes: those DTensor placements express.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..ir.fusion import Fusion, Tensor
from ..ir.ids import Outer, Root
from ..ir.sharding import Partial, Placement, Replicate, Shard, ShardingSpec, TensorSharding


def pin_values(fusion: Fusion, pins: Mapping[str, Sequence[ShardingSpec]]) -> Fusion:
    """A copy of ``fusion`` whose values named in ``pins`` are each followed by pinned
    redistributes to their specs, in order (module docstring)."""
    out = Fusion()
    new: dict[int, Tensor] = {}
    for op in fusion.ops:
        t = fusion.tensors[op.output]
        if op.kind == "input":
            v = out.input(t.name, t.shape, t.dtype, t.mesh, t.sharding)
        else:
            v = out._op(op.kind, [new[i] for i in op.inputs], out._new(t.shape, t.dtype, t.mesh, t.name, t.sharding),
                        **op.attrs)
        for spec in pins.get(t.name, ()):
            v = out.redistribute(v, spec, pin=True, name=t.name)
        new[t.id] = v
    for tid, sharding in fusion.outputs:
        out.output(new[tid], sharding)
    return out


def placements_of(ts: TensorSharding) -> list[Placement] | None:
    """``ts`` as DTensor placements (Replicate, Partial, Shard of a whole dim), which mean
    the same on any shape that the sharded dims' axes divide; None for a loop-domain
    sharding that placements cannot express."""
    out: list[Placement] = []
    for p in ts.axes:
        if isinstance(p, (Replicate, Partial)):
            out.append(p)
        elif isinstance(p, Outer) and isinstance(p.x, Root) and p.x.dim not in {s.dim for s in out
                                                                                 if isinstance(s, Shard)}:
            out.append(Shard(p.x.dim))
        else:
            return None
    return out


__all__ = ["pin_values", "placements_of"]
