"""ATen ops along one dim (``ir.ops.along``): flip (one ``flip`` per dim), cumprod, sort and
topk (values and indices, each converted only where read), argmax / argmin (over all dims: of x
flattened)."""

from __future__ import annotations

import math
from typing import Any

from ..ir.fusion import Tensor
from .converter import Converter, items_read, op


@op("flip")
def _flip(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    for d in cv.dims(x, a["dims"]) if a["dims"] else ():
        x = cv.f.flip(x, d)
    return x


@op("cumprod")
def _cumprod(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    return cv.f.cumprod(x, a["dim"] % len(x.shape))


@op("sort")
def _sort(cv: Converter, n: Any, a: dict) -> tuple[Tensor | None, Tensor | None]:
    """(values, indices) along ``dim``; ``sort.stable`` passes ``stable``."""
    x = cv.tensor(a["self"], "input")
    p = {"descending": bool(a.get("descending")), "stable": bool(a.get("stable"))}
    read, d = items_read(cv, n), a["dim"] % len(x.shape)
    return (cv.f.sort(x, d, **p) if 0 in read else None, cv.f.argsort(x, d, **p) if 1 in read else None)


@op("topk")
def _topk(cv: Converter, n: Any, a: dict) -> tuple[Tensor | None, Tensor | None]:
    """(values, indices), sorted (``sorted=False`` leaves torch free to order them: sorted too)."""
    x = cv.tensor(a["self"], "input")
    p = {"k": int(a["k"]), "largest": bool(a.get("largest", True))}
    read, d = items_read(cv, n), a["dim"] % len(x.shape)
    return (cv.f.topk(x, d, **p) if 0 in read else None, cv.f.topk_indices(x, d, **p) if 1 in read else None)


@op("argmax", "argmin")
def _argmax(cv: Converter, n: Any, a: dict) -> Tensor:
    """Along ``dim`` (kept, of extent 1, then reshaped as torch's result); without a dim, of x
    flattened."""
    x = cv.tensor(a["self"], "input")
    fn = n.target._schema.name.split("::")[-1]
    if a.get("dim") is None:
        x, d = cv.reshape(x, (math.prod(x.shape),)), 0
    else:
        d = a["dim"] % len(x.shape)
    return cv.reshape(cv.f.along(fn, x, d), cv.out_shape())


def indices_of_max(cv: Converter, x: Tensor, d: int, keepdim: bool, fn: str) -> Tensor:
    """The indices ``max.dim`` / ``min.dim`` return: ``argmax`` / ``argmin`` along ``d``."""
    i = cv.f.along(fn, x, d)
    return i if keepdim else cv.reshape(i, x.shape[:d] + x.shape[d + 1:])
