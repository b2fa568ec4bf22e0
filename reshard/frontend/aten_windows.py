"""Sliding windows: ``convolution`` (through its matmul form), ``avg_pool1d/2d/3d``, the
adaptive average pools whose input divides into the output; ``strided`` (``slice`` with a
step).

**Laws.**  ``strided(x, d, start, stop, step)``: every ``step``-th element of ``x[start:stop]``
along ``d``: the range padded to a multiple of ``step``, reshaped ``[count, step]`` and its
first column kept (slice, pad, reshape: no new op).  ``windows(x, kernel, stride, padding,
dilation)``: for each kernel offset ``o`` (row-major over the spatial dims), the strided slice
of ``x`` (padded with ``padding`` zeros) that the windows' elements at ``o`` read, each
``[N, C, *out]`` with ``out = (size + 2 pad - dilation (k - 1) - 1) // stride + 1``.

``convolution(x, w, b)`` (groups ``g``): the windows stacked into ``[N, g, C/g * K, prod(out)]``
(channel-major, then offset: the order of ``w [Cout, C/g, *k]`` flattened), times ``w`` as
``[g, Cout/g, C/g * K]``: a batched ``matmul`` (+ ``b``), so a sharded batch stays sharded and a
sharded ``Cout`` is the weight's shard; its gradients are those of slice, pad, cat and matmul.
``avg_pool``: the sum of the windows over the divisor (``divisor_override``, the kernel's size,
or without ``count_include_pad`` the window's elements inside the input: the same windows of
ones).  ``adaptive_avg_pool`` of ``n`` into ``m`` with ``m`` dividing ``n``: ``avg_pool`` of
kernel and stride ``n / m``.  ``max_pool{2,3}d_with_indices`` (a handler of its own: torch
2.11 has no decomposition of it): the windows stacked along a new dim ``K`` (padding read as
``-inf``: ``where`` of the windows of ones), its ``max`` the values and its ``argmax`` ``k``
(the first maximum, as torch's scan) the offset, whose index in the input plane is
``base[p] + sum_i ((k // prod(kernel[i+1:])) % kernel[i]) * dilation_i * plane_stride_i``
(``base``: each output position's window corner, ``p * stride - padding``, a constant).
Transposed convolution and ``ceil_mode`` that changes the output size are ``ReshardError``s
naming the op.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from ..ir.fusion import Tensor
from ..ir.strides import row_major_strides
from .converter import Converter, items_read, op


def strided(cv: Converter, x: Tensor, d: int, start: int, stop: int, step: int) -> Tensor:
    """``x[start:stop:step]`` along ``d`` (0 <= start <= stop <= size)."""
    f = cv.f
    count = max(0, -(-(stop - start) // step))
    x = f.slice(x, d, start, stop) if (start, stop) != (0, x.shape[d]) else x
    if step == 1 or count == 0:
        return x
    if x.shape[d] < count * step:
        x = f.pad(x, d, 0, count * step - x.shape[d])
    elif x.shape[d] > count * step:
        x = f.slice(x, d, 0, count * step)
    x = cv.reshape(x, x.shape[:d] + (count, step) + x.shape[d + 1:])
    return cv.reshape(f.slice(x, d + 1, 0, 1), x.shape[:d] + (count,) + x.shape[d + 2:])


def _ints(v: Any, n: int, default: int) -> list[int]:
    v = [default] if v is None or (isinstance(v, (list, tuple)) and not v) else v
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(e) for e in (v * n if len(v) == 1 else v)]


def windows(cv: Converter, x: Tensor, kernel: list[int], stride: list[int], padding: list[int],
            dilation: list[int]) -> tuple[list[Tensor], tuple[int, ...]]:
    """The module docstring's windows of ``x [N, C, *S]`` (row-major over the kernel offsets),
    and the output's spatial shape."""
    lead = len(x.shape) - len(kernel)
    for i, p in enumerate(padding):
        if p:
            x = cv.f.pad(x, lead + i, p, p)
    out = tuple((x.shape[lead + i] - dilation[i] * (k - 1) - 1) // stride[i] + 1 for i, k in enumerate(kernel))
    if any(o < 1 for o in out):
        raise cv.fail(f"{cv.node.target}: the windows leave no output ({out})")
    views = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        v = x
        for i, o in enumerate(offset):
            start = o * dilation[i]
            v = strided(cv, v, lead + i, start, start + (out[i] - 1) * stride[i] + 1, stride[i])
        views.append(v)
    return views, out


@op("convolution", "conv1d", "conv2d", "conv3d", "_convolution")
def _convolution(cv: Converter, n: Any, a: dict) -> Tensor:
    """The module docstring's matmul form."""
    f = cv.f
    x, w = cv.tensor(a["input"], "input"), cv.tensor(a["weight"], "weight")
    nd = len(w.shape) - 2
    if a.get("transposed"):
        raise cv.fail(f"unsupported op {n.target} (a transposed convolution)")
    if isinstance(a.get("padding"), str):
        raise cv.fail(f"unsupported op {n.target} with padding={a['padding']!r} (give the amounts)")
    batched = len(x.shape) == nd + 2
    if not batched:
        x = cv.reshape(x, (1,) + x.shape)
    g = int(a.get("groups") or 1)
    views, out = windows(cv, x, list(w.shape[2:]), _ints(a.get("stride"), nd, 1), _ints(a.get("padding"), nd, 0),
                         _ints(a.get("dilation"), nd, 1))
    batch, cin, cout, k = x.shape[0], x.shape[1], w.shape[0], len(views)
    cols = f.cat([cv.reshape(v, (batch, cin, 1, math.prod(out))) for v in views], 2) if k > 1 else \
        cv.reshape(views[0], (batch, cin, 1, math.prod(out)))
    cols = cv.reshape(cols, (batch, g, cin // g * k, math.prod(out)))
    wm = f.broadcast(cv.reshape(w, (g, cout // g, cin // g * k)), (batch, g, cout // g, cin // g * k), (1, 2, 3))
    y = cv.reshape(f.matmul(wm, cv.cast(cols, w.dtype)), (batch, cout) + out)
    if a.get("bias") is not None:
        y = f.add(y, f.broadcast(cv.tensor(a["bias"], "bias"), y.shape, (1,)))
    return cv.reshape(y, cv.out_shape())


def _pool_dims(cv: Converter, n: Any, a: dict, nd: int) -> tuple[list[int], list[int], list[int]]:
    kernel = _ints(a["kernel_size"], nd, 1)
    stride = _ints(a.get("stride"), nd, 0)
    stride = kernel if not any(stride) else stride
    return kernel, stride, _ints(a.get("padding"), nd, 0)


def avg_pool(cv: Converter, n: Any, x: Tensor, kernel: list[int], stride: list[int], padding: list[int],
             count_include_pad: bool = True, divisor: int | None = None) -> Tensor:
    """The module docstring's average pool of ``x`` over its last ``len(kernel)`` dims."""
    f = cv.f
    views, out = windows(cv, x, kernel, stride, padding, [1] * len(kernel))
    total = views[0]
    for v in views[1:]:
        total = f.add(total, v)
    if divisor or count_include_pad or not any(padding):
        return f.scale(total, 1.0 / (divisor or math.prod(kernel)))
    ones = cv.operand(1.0, x.shape[-len(kernel):], x.dtype)
    counts = windows(cv, ones, kernel, stride, padding, [1] * len(kernel))[0]
    count = counts[0]
    for c in counts[1:]:
        count = f.add(count, c)
    return f.div(total, f.broadcast(count, total.shape, tuple(range(len(total.shape) - len(kernel), len(total.shape)))))


@op("avg_pool1d", "avg_pool2d", "avg_pool3d")
def _avg_pool(cv: Converter, n: Any, a: dict) -> Tensor:
    """``avg_pool`` (``ceil_mode`` only where it leaves the output size as it is)."""
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    nd = int(n.target._schema.name[-2])
    kernel, stride, padding = _pool_dims(cv, n, a, nd)
    y = avg_pool(cv, n, x, kernel, stride, padding, bool(a.get("count_include_pad", True)), a.get("divisor_override"))
    if y.shape != cv.out_shape():
        raise cv.fail(f"unsupported op {n.target} with ceil_mode=True where it adds a partial window")
    return y


@op("adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d")
def _adaptive_avg_pool(cv: Converter, n: Any, a: dict) -> Tensor:
    """``avg_pool`` with kernel and stride ``size / output_size`` (an output size dividing the
    input's)."""
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    size = [int(s) for s in a["output_size"]]
    sizes = list(x.shape[-len(size):])
    if any(s % o for s, o in zip(sizes, size)):
        raise cv.fail(f"unsupported op {n.target}: output size {size} does not divide the input's {sizes} "
                      "(windows of unequal sizes)")
    k = [s // o for s, o in zip(sizes, size)]
    return cv.reshape(avg_pool(cv, n, x, k, k, [0] * len(k)), cv.out_shape())


@op("max_pool2d_with_indices", "max_pool3d_with_indices")
def _max_pool(cv: Converter, n: Any, a: dict) -> tuple[Tensor | None, Tensor | None]:
    """(values, indices into each input plane, flattened): the module docstring's law; each
    converted only where read."""
    f = cv.f
    x = cv.tensor(a["self"], "input")
    nd = int(n.target._schema.name[-len("d_with_indices") - 1])
    kernel, stride, padding = _pool_dims(cv, n, a, nd)
    dilation = _ints(a.get("dilation"), nd, 1)
    views, out = windows(cv, x, kernel, stride, padding, dilation)
    lead, plane = len(x.shape) - nd, x.shape[-nd:]
    if any(padding):  # a padded element is no candidate
        inside = windows(cv, cv.operand(1.0, plane, x.dtype), kernel, stride, padding, dilation)[0]
        low = cv.operand(float("-inf"), views[0].shape, x.dtype)
        spatial = tuple(range(lead, len(views[0].shape)))
        views = [f.where(f.broadcast(f.gt(w, cv.operand(0.5, out, x.dtype)), v.shape, spatial), v, low)
                 for v, w in zip(views, inside)]
    shape = x.shape[:lead] + (1,) + out
    stack = cv.reshape(views[0], shape) if len(views) == 1 else f.cat([cv.reshape(v, shape) for v in views], lead)
    if tuple(n.meta["val"][0].shape) != x.shape[:lead] + out:
        raise cv.fail(f"unsupported op {n.target} with ceil_mode=True where it adds a partial window")
    read = items_read(cv, n)
    values = cv.reshape(f.max(stack, lead), x.shape[:lead] + out) if 0 in read else None
    if 1 not in read:
        return values, None
    k = cv.reshape(f.argmax(stack, lead), x.shape[:lead] + out)
    plane_strides = row_major_strides(plane)
    corners = [torch.arange(o) * s - p for o, s, p in zip(out, stride, padding)]
    base = sum(c.reshape((-1,) + (1,) * (nd - 1 - i)) * ps for i, (c, ps) in enumerate(zip(corners, plane_strides)))
    base = torch.as_tensor(base).to(device="meta" if cv.on_meta else "cpu", dtype=torch.int64)
    index = f.broadcast_to(cv.constant(base, ("pool corners", out, tuple(stride), tuple(padding), plane)), k.shape)
    for i, kstride in enumerate(row_major_strides(kernel)):
        o = f.floor_divide(k, cv.operand(kstride, k.shape, "int64"))
        o = f.remainder(o, cv.operand(kernel[i], k.shape, "int64"))
        index = f.add(index, f.mul(o, cv.operand(dilation[i] * plane_strides[i], k.shape, "int64")))
    return values, index
