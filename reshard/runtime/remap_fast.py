"""Fast execution of ``remap`` steps: strided views and copies instead of index gathers.

A remap step's affine form (:func:`reshard.codegen.remap_form.remap_form`: shape, strides,
offset of its index, verified element by element) runs as ``flat.as_strided(...)``: a view
for a contiguous range, else one strided copy (``.contiguous()``, a device copy kernel) of
exactly the bytes the result needs, with no index tensor read at all.  An index with no
such form keeps the gather, with the index cached on the device that uses it (built once
per (remap, device), never per call).
"""

from __future__ import annotations

import torch

from ..codegen.remap_form import remap_form, remap_is_view
from ..codegen.remap_index import StridedMap, remap_index
from ..ir.tensor_cache import BoundedCache, tensor_lru

__all__ = ["remap_take", "remap_step", "device_index"]

def device_index(key: tuple, device: torch.device) -> torch.Tensor:
    """``remap_index(*key)`` on ``device``, copied there once and kept (a ``tensor_lru``
    cache: a CUDA graph that reads it keeps it through ``tensor_cache.retained``)."""
    return _on_device(key, str(device))


@tensor_lru(max_entries=1024)
def _on_device(key: tuple, device: str) -> torch.Tensor:
    return remap_index(*key).to(device)


_STEPS: BoundedCache[tuple[int, int], tuple] = BoundedCache(4096)


def remap_step(step, x: torch.Tensor, rank: int) -> torch.Tensor:
    """Run the ``remap`` step ``step`` (a :class:`reshard.codegen.program.Step`) for ``rank``
    on its input ``x`` (:func:`remap_take`).  What the step resolves to (its key, output
    shape and strided form) is remembered per (step object, rank), so a repeated call costs
    a dict lookup plus the view or copy: at the sizes of a real block the host time per call,
    not the copy, is what is left of a remap."""
    memo = _STEPS.get((id(step), rank))
    if memo is None or memo[0] is not step:
        src, dst, mode = step.attr("src"), step.attr("dst"), step.attr("mode")
        key = (mode, src, dst, step.attr("axis", -1), src.mesh.coords(rank))
        shape = tuple(dst.local_shape) if mode in ("slice", "gather", "a2a_recv") else (-1,)
        memo = _STEPS[(id(step), rank)] = (step, key, shape, remap_form(*key), remap_is_view(*key))
    _, key, shape, sm, view = memo
    return _apply(x, key, shape, sm, view)


def remap_take(x: torch.Tensor, key: tuple, shape: tuple[int, ...]) -> torch.Tensor:
    """Apply the remap ``key = (mode, src, dst, axis, coords)`` to the local buffer ``x``.

    Same result as gathering ``x.reshape(-1)[remap_index(*key)]`` into ``shape``: a view for
    a contiguous range of a block form (``remap_is_view``: what the allocation plan assumes),
    a copy for any other range or affine index, else the gather with a device-cached index.
    """
    return _apply(x, key, shape, remap_form(*key), remap_is_view(*key))


def _apply(x: torch.Tensor, key: tuple, shape: tuple[int, ...], sm: StridedMap | None, view: bool) -> torch.Tensor:
    flat = x.reshape(-1)
    if sm is None:
        return flat[device_index(key, flat.device)].view(shape)
    if sm.is_range:
        out = flat[sm.offset:sm.offset + sm.numel].view(shape)
        return out if view else out.clone()
    v = flat.as_strided(sm.shape, sm.strides, flat.storage_offset() + sm.offset)
    return v.contiguous().view(shape)
