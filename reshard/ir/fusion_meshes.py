"""The meshes a Fusion's tensors live on, checked: one mesh, or several of one shape with
disjoint devices (a cross-mesh program).  Read by encoding (the e-graph's mesh) and by lowering
(a multi-mesh program's stacked meshes)."""

from __future__ import annotations

from .errors import ReshardError
from .fusion import Fusion
from .mesh import DeviceMesh


def fusion_meshes(fusion: Fusion) -> list[DeviceMesh]:
    """The meshes of a Fusion's tensors, in order of first use.  Several meshes must have
    the same shape (then every per-axis rule holds on each of them) and disjoint devices."""
    meshes = list(dict.fromkeys(t.mesh for t in fusion.tensors))
    for other in meshes[1:]:
        if other.shape != meshes[0].shape:
            raise ReshardError(f"optimize: the Fusion uses meshes of different shapes {meshes[0]!r} and {other!r}; "
                               "cross-mesh programs need meshes of one shape")
    seen: dict[int, DeviceMesh] = {}
    for m in meshes:
        for r in m.ranks:
            if r in seen:
                raise ReshardError(f"optimize: meshes {seen[r]!r} and {m!r} share device {r}; the meshes of a "
                                   "cross-mesh program must have disjoint devices")
            seen[r] = m
    return meshes
