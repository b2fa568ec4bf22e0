"""``input`` (a program input; built by ``Fusion.input``) and ``redistribute`` (the same value
with another sharding, on the same or another mesh).

A redistribute is an identity op (``gradient.Identity``) to every layer but the e-graph, where ``search.encode``
states it (``redist`` and, across meshes, ``crossmesh``) and resharding rules implement it;
lowered, its result is its operand's buffer.

Gradients (``OpKind.vjp``): an input has no operands; a redistribute passes ``g`` through,
unconstrained (the optimizer places it), and a cross-mesh one sends it back to the operand's
mesh (at the operand's sharding when it has one, else replicated).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..dtypes import check_partial
from ..errors import ReshardError
from ..mesh import DeviceMesh
from ..sharding import Replicate, ShardingSpec, TensorSharding
from .gradient import Identity
from .registry import OpKind, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None


def redistribute(f: Fusion, t: Tensor, placements: ShardingSpec, mesh: DeviceMesh | None = None, *,
                 pin: bool = False, name: Name = None) -> Tensor:
    """The same global value with sharding ``placements`` (on ``mesh``, default t's).

    The requested sharding is one alternative: the communication may move past the ops
    that follow when that is cheaper (after a reduction, a narrowing cast, ...).
    ``pin=True`` makes the value materialize with exactly that sharding at this point.
    Another ``mesh`` makes a cross-mesh transfer (seed 001): it must have the shape of
    t's mesh and none of its devices; the optimizer chooses how the value moves
    (broadcast, scatter, parallel send/recv, with resharding on either side)."""
    f._check(t, "redistribute")
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
    check_partial(t.dtype, ts, f"redistribute of {t!r}")
    attrs = {"pin": True} if pin else {}
    return f._op("redistribute", [t], f._new(t.shape, t.dtype, mesh, name, ts), sharding=ts, **attrs)


@register("input")
class Input(OpKind):
    """Fed by the caller (``run_reference``'s inputs, the plan's input nodes)."""

    strategy = "input"

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        return []


@register("redistribute")
class Redistribute(Identity):
    """The identity whose result has the sharding the user asks for (or another mesh's)."""

    builders = {"redistribute": redistribute}

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        x = xs[0]
        if x.mesh == out.mesh:
            return [g]
        return [redistribute(f, g, x.sharding or [Replicate()] * x.mesh.ndim, mesh=x.mesh)]
