"""``along``: ops that read a whole dim of their operand, one function of ``ALONG_FNS`` each:
``flip``, ``cumprod``, ``sort`` / ``argsort`` (values / indices), ``topk`` / ``topk_indices``,
``prod``, ``argmax`` / ``argmin`` (the dim kept, of extent 1), ``is_max`` (1 where an element
equals the max along the dim, else 0, in the operand's dtype: the tie mask of ``max``'s gradient).

Index map: the dim has no image (every result element along it reads the whole operand dim,
so a sharded one is gathered first); the other dims read themselves, so they may stay sharded
(a row-wise sort of row-sharded data runs locally).  The result's dim is the operand's
(``flip``, ``cumprod``, ``sort``, ``argsort``, ``is_max``), ``k`` long (``topk``) or 1 long
(``prod``, ``argmax``, ``argmin``).  Linearity: ``flip`` moves elements, so a Partial sum or max
stays Partial; the others keep none.  Dtypes: float and int operands (``flip``: any); indices
are int64.  No generated kernel: on a GPU the step runs with torch.

Gradients (``OpKind.vjp``): ``flip``: ``flip(g)``; ``cumprod``: for an operand with no zero,
``gx_i = (sum_{j >= i} g_j y_j) / x_i``, the suffix sum written with the prefix sum as
``total - cumsum(v) + v`` (torch's formula also covers zeros); ``prod``: ``g y / x`` (no zero
either); the index results and ``is_max`` (constant almost everywhere) have none; ``sort`` and
``topk``: ``g`` scattered back to where each value came from, ``gx[..., i_j] = g[..., j]`` along
the dim (``i``: the op's indices, ``argsort`` / ``topk_indices`` of the saved operand with the
same parameters; distinct, so the scatter is the sum over ``j`` of ``unpick(g_j, i_j, n)``: an
``[*B, k, n]`` temporary).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import check_kind
from ..errors import ReshardError
from .reductions import sum_over
from .registry import Image, OpKind, identity_map, register

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

Name = str | None
Saved = Callable[["Tensor"], "Tensor"]


def _d_flip(f: Fusion, op: Op, xs: list[Tensor], y: Tensor, g: Tensor, saved: Saved) -> list[Tensor | None]:
    return [along(f, "flip", g, op.attrs["dim"])]


def _d_cumprod(f: Fusion, op: Op, xs: list[Tensor], y: Tensor, g: Tensor, saved: Saved) -> list[Tensor | None]:
    """``(total - cumsum(v) + v) / x``, ``v = g y``."""
    d = op.attrs["dim"]
    v = f.mul(g, saved(y))
    kept = tuple(k for k in range(len(g.shape)) if k != d)  # a 1-D v sums to ()
    total = f.broadcast(sum_over(f, v, (d,)), g.shape, kept)
    return [f.div(f.add(f.sub(total, f.cumsum(v, d)), v), saved(xs[0]))]


def _d_prod(f: Fusion, op: Op, xs: list[Tensor], y: Tensor, g: Tensor, saved: Saved) -> list[Tensor | None]:
    """``g y / x`` (y broadcast along the dim; an operand with no zero, as ``cumprod``)."""
    x, d = xs[0], op.attrs["dim"]
    kept = tuple(k for k in range(len(x.shape)) if k != d)
    if not kept:  # a (1,) result of a 1-D operand
        return [f.div(f.broadcast_to(f.mul(g, saved(y)), x.shape), saved(x))]
    gy = f.reshape(f.mul(g, saved(y)), tuple(x.shape[k] for k in kept))
    return [f.div(f.broadcast(gy, x.shape, kept), saved(x))]


#: the function giving the indices of a selection's values
INDICES = {"sort": "argsort", "topk": "topk_indices"}


def _d_select(f: Fusion, op: Op, xs: list[Tensor], y: Tensor, g: Tensor, saved: Saved) -> list[Tensor | None]:
    """``sort`` / ``topk``: ``g`` summed into the positions its values came from along the dim
    (``unpick`` at the indices, summed over the result's dim, moved back)."""
    x, d = xs[0], op.attrs["dim"]
    last = len(x.shape) - 1
    idx = along(f, INDICES[op.attrs["fn"]], saved(x), d, **along_params(op.attrs))
    gl, il = (t if d == last else f.movedim(t, d, -1) for t in (g, idx))
    gx = sum_over(f, f.unpick(gl, il, x.shape[d]), (last,))
    return [gx if d == last else f.movedim(gx, -1, d)]


def _no_gradient(f: Fusion, op: Op, xs: list[Tensor], y: Tensor, g: Tensor, saved: Saved) -> list[Tensor | None]:
    return [None]


@dataclass(frozen=True)
class Along:
    """One function along a dim: ``torch(x, dim, **params)``, the result's extent along the dim
    from the operand's and the params, its dtype (None: the operand's), the dtype kinds it
    takes, the Partial ops it keeps and its vjp (``_no_gradient`` for an index result)."""

    torch: Callable[..., torch.Tensor]
    grad: Callable[..., list[Any]]
    extent: Callable[[int, Mapping[str, Any]], int] = lambda n, p: n
    result: str | None = None
    kinds: tuple[str, ...] = ("float", "int")
    keeps: tuple[str, ...] = ()


def _sort(x: torch.Tensor, dim: int, descending: bool = False, stable: bool = False) -> torch.return_types.sort:
    return torch.sort(x, dim=dim, descending=descending, stable=stable)


def _topk(x: torch.Tensor, dim: int, k: int, largest: bool = True) -> torch.return_types.topk:
    return torch.topk(x, k, dim=dim, largest=largest, sorted=True)


ALONG_FNS: dict[str, Along] = {
    "flip": Along(lambda x, dim: torch.flip(x, (dim,)), kinds=("float", "int", "bool"), keeps=("sum", "max"),
                  grad=_d_flip),
    "cumprod": Along(lambda x, dim: torch.cumprod(x, dim, dtype=x.dtype), grad=_d_cumprod),
    "sort": Along(lambda x, dim, **p: _sort(x, dim, **p).values, grad=_d_select),
    "argsort": Along(lambda x, dim, **p: _sort(x, dim, **p).indices, result="int64", grad=_no_gradient),
    "topk": Along(lambda x, dim, **p: _topk(x, dim, **p).values, extent=lambda n, p: p["k"], grad=_d_select),
    "topk_indices": Along(lambda x, dim, **p: _topk(x, dim, **p).indices, extent=lambda n, p: p["k"], result="int64",
                          grad=_no_gradient),
    "prod": Along(lambda x, dim: torch.prod(x, dim, keepdim=True, dtype=x.dtype), extent=lambda n, p: 1,
                  grad=_d_prod),
    "argmax": Along(lambda x, dim: torch.argmax(x, dim, keepdim=True), extent=lambda n, p: 1, result="int64",
                    grad=_no_gradient),
    "argmin": Along(lambda x, dim: torch.argmin(x, dim, keepdim=True), extent=lambda n, p: 1, result="int64",
                    grad=_no_gradient),
    "is_max": Along(lambda x, dim: (x == x.amax(dim, keepdim=True)).to(x.dtype), grad=_no_gradient),
}
#: the parameters each function takes beyond the dim, with their defaults
PARAMS: dict[str, dict[str, Any]] = {"sort": {"descending": False, "stable": False},
                                     "argsort": {"descending": False, "stable": False},
                                     "topk": {"k": None, "largest": True}, "topk_indices": {"k": None, "largest": True}}


def along(f: Fusion, fn: str, t: Tensor, dim: int, *, name: Name = None, **params: Any) -> Tensor:
    """``fn`` (a name of ``ALONG_FNS``) of ``t`` along ``dim``, with its ``params``
    (``descending``, ``stable``: sort; ``k``, ``largest``: topk)."""
    f._check(t, fn)
    if fn not in ALONG_FNS:
        raise ReshardError(f"along: unknown function {fn!r}; supported: {tuple(ALONG_FNS)}")
    spec = ALONG_FNS[fn]
    check_kind(fn, t, spec.kinds)
    d = f._dim(t, dim, fn)
    known = PARAMS.get(fn, {})
    if set(params) - set(known):
        raise ReshardError(f"{fn} of {t!r}: unknown parameters {sorted(set(params) - set(known))}; "
                           f"takes {sorted(known)}")
    params = {**known, **params}
    if fn.startswith("topk") and not (isinstance(params["k"], int) and 0 < params["k"] <= t.shape[d]):
        raise ReshardError(f"{fn} of {t!r} along dim {d}: k must be an int in [1, {t.shape[d]}], got {params['k']!r}")
    shape = list(t.shape)
    shape[d] = spec.extent(shape[d], params)
    return f._op("along", [t], f._new(shape, spec.result or t.dtype, t.mesh, name), fn=fn, dim=d, **params)


def _method(fn: str) -> Callable[..., Any]:
    def method(f: Fusion, t: Tensor, dim: int, *, name: Name = None, **params: Any) -> Tensor:
        return along(f, fn, t, dim, name=name, **params)
    method.__name__ = method.__qualname__ = fn
    method.__doc__ = f"``{fn}`` of ``t`` along ``dim`` (``ALONG_FNS``)."
    return method


def along_params(a: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters (``PARAMS``) of function ``a["fn"]`` among the attributes ``a``."""
    return {k: a[k] for k in PARAMS.get(a["fn"], {})}


@register("along")
class AlongDim(OpKind):
    builders = {"along": along, **{fn: _method(fn) for fn in ALONG_FNS}}

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        return ALONG_FNS[a["fn"]].torch(xs[0], a["dim"], **along_params(a))

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        return identity_map(fusion.tensors[op.inputs[slot]].shape, (op.attrs["dim"],))

    def keeps(self, op: Op) -> tuple[str, ...]:
        return ALONG_FNS[op.attrs["fn"]].keeps

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor, saved: Saved) -> list[Tensor | None]:
        return ALONG_FNS[op.attrs["fn"]].grad(f, op, xs, out, g, saved)
