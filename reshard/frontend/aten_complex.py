"""ATen ops on complex tensors, held as pairs of reals (``pairs``: shape ``S + (2,)``, the last
dim real and imaginary part).

**Law.**  Each handler computes, on the pairs, the pairs of torch's complex result:

* ``view_as_complex`` / ``view_as_real``: the identity (the pairs are the real view);
* views, copies and the ops linear over the reals (reshapes, expand, permutes, slices, joins,
  clone, detach, neg, sum, mean; and add / sub of complex operands) act on a complex value as
  on any tensor whose last dim is the pair dim: their real handler runs with the dim arguments
  counted in the complex rank (``permute`` keeps the pair dim last), so no dim of the complex
  value is ever the pair dim;
* a real operand of a complex op is the complex value ``(r, 0)`` (a pad of the pair dim), a
  Python scalar the constant pair ``(re, im)``; casts go between complex dtypes and from real
  to complex;
* ``mul``: ``complex_mul`` (``ir.ops.complex_pairs``: one op, its pair dim gathered, never
  sharded), or, by a real tensor or scalar, that real broadcast over the pair dim (``mul``,
  ``scale``); ``div`` by a real the same with ``div``;
* ``conj`` (``_conj``, ``conj_physical``): times the constant pair ``(1, -1)``;
  ``resolve_conj`` / ``resolve_neg``: the identity (the pairs hold the resolved values);
* ``real`` / ``imag``: a slice of the pair dim; ``abs``: ``sqrt(re^2 + im^2)``; ``angle``:
  ``atan2(im, re)``; ``polar(r, t)``: the pairs ``(r cos t, r sin t)``; ``complex(re, im)``: the
  pairs ``(re, im)``.

Any other op that reads or makes a complex value is a ``ReshardError`` naming it
(``Converter.run_node``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ..ir.fusion import DTYPES, Tensor
from .converter import COMPLEX_OPS, OPS, Converter, Handler, first, graph_args, is_num, opname
from .pairs import is_complex

#: ops whose real handler is right on the pairs once dims are counted in the complex rank
PAIRWISE = ("view", "reshape", "_unsafe_view", "view_copy", "unsqueeze", "squeeze", "flatten", "unflatten",
            "view_as", "reshape_as", "expand", "expand_as", "expand_copy", "broadcast_to", "permute", "transpose",
            "movedim", "slice", "narrow", "select", "split", "split_with_sizes", "chunk", "unbind", "cat", "concat",
            "stack", "clone", "contiguous", "alias", "lift_fresh_copy", "detach", "neg", "sum", "mean",
            "_assert_tensor_metadata")
#: argument names that count dims
DIM_ARGS = ("dim", "dim0", "dim1", "source", "destination")
#: ops whose dim argument counts the result's dims (one more than the operand's)
RESULT_DIM = ("stack", "unsqueeze")
#: pairwise ops of several tensor operands: all complex (torch would promote a real one)
JOINS = ("cat", "concat", "stack")


def complex_op(*names: str) -> Callable[[Handler], Handler]:
    """Register a handler of ops on complex values (``converter.COMPLEX_OPS``)."""
    def deco(fn: Handler) -> Handler:
        for n in names:
            COMPLEX_OPS[n] = fn
        return fn
    return deco


def complex_args(n: torch.fx.Node) -> set[str]:
    """The names of the node's arguments that are complex (tensors, lists of them, Python
    complex numbers)."""
    out = set()
    for name, v in graph_args(n).items():
        vals = v if isinstance(v, (list, tuple)) else [v]
        if any(isinstance(x, complex) or (isinstance(x, torch.fx.Node) and is_complex(x.meta.get("val")))
               for x in vals):
            out.add(name)
    return out


def _rank(n: torch.fx.Node) -> int:
    """The complex rank of the node's first complex operand."""
    return next(a.meta["val"].dim() for a in n.all_input_nodes if is_complex(a.meta.get("val")))


def _counted(d: Any, rank: int) -> Any:
    return [x % rank for x in d] if isinstance(d, (list, tuple)) else d % rank


def _pairwise(cv: Converter, n: Any, a: dict) -> Any:
    """The op's real handler on the pairs, its dims counted in the complex rank."""
    name = opname(n.target)
    if name in JOINS and not all(is_complex(t.meta.get("val")) for t in n.all_input_nodes):
        raise cv.fail(f"{n.target} of real and complex tensors (make the real ones complex first)")
    rank = _rank(n)
    a = dict(a)
    for k in DIM_ARGS:
        if a.get(k) is not None:
            a[k] = _counted(a[k], rank + (name in RESULT_DIM))
    if name == "permute":
        a["dims"] = [*_counted(a["dims"], rank), rank]
    if name in ("sum", "mean") and not a.get("dim"):
        if rank == 0:
            return cv.tensor(a["self"], "input")
        a["dim"] = list(range(rank))
    return OPS[name](cv, n, a)


for _name in PAIRWISE:
    COMPLEX_OPS[_name] = _pairwise


@complex_op("view_as_complex", "view_as_real", "resolve_conj", "resolve_neg")
def _identity(cv: Converter, n: Any, a: dict) -> Tensor:
    return cv.tensor(first(a), "input")


def promote(cv: Converter, x: Tensor) -> Tensor:
    """The real ``x`` as the complex ``(x, 0)``."""
    r = len(x.shape)
    return cv.f.pad(cv.reshape(x, x.shape + (1,)), r, 0, 1)


def pair(cv: Converter, z: complex, dtype: str) -> Tensor:
    """The Python number ``z`` as the constant pair ``(re, im)``, a ``(2,)`` input."""
    z = complex(z)
    value = torch.tensor([z.real, z.imag], dtype=DTYPES[dtype], device="meta" if cv.on_meta else "cpu")
    return cv.constant(value, ("pair", z.real, z.imag, dtype))


def operand(cv: Converter, n: Any, a: dict, key: str) -> Tensor:
    """Argument ``key`` as a complex operand at the result's pairs (shape and dtype)."""
    x, shape, dt = a[key], cv.out_shape(), cv.out_dtype()
    if isinstance(x, (int, float, complex)) and not isinstance(x, bool):
        return cv.f.broadcast_to(pair(cv, x, dt), shape)
    x = cv.cast(cv.tensor(x, key), dt)
    if key not in complex_args(n):
        x = promote(cv, x)
    return cv.f.broadcast_to(x, shape)


def real_operand(cv: Converter, x: Any, key: str) -> Tensor:
    """The real tensor ``x`` broadcast over the result's pairs (the same factor for both parts)."""
    shape, dt = cv.out_shape(), cv.out_dtype()
    x = cv.cast(cv.tensor(x, key), dt)
    return cv.f.broadcast_to(cv.reshape(x, x.shape + (1,)), shape)


@complex_op("_to_copy", "to", "_to_dtype", "type_as")
def _to(cv: Converter, n: Any, a: dict) -> Tensor:
    """Between complex dtypes, or a real tensor made complex ``(x, 0)``."""
    if not is_complex(n.meta.get("val")):
        raise cv.fail(f"{n.target}: a complex tensor cast to a real dtype (it would drop the imaginary part; "
                      "take .real or .abs() instead)")
    x = cv.tensor(first(a), "input")
    if next(iter(a)) not in complex_args(n):
        return promote(cv, cv.cast(x, cv.out_dtype()))
    return cv.cast(x, cv.out_dtype())


@complex_op("add", "sub", "rsub")
def _add(cv: Converter, n: Any, a: dict) -> Tensor:
    """Pairs added or subtracted (``rsub``: ``other - alpha self``); a real operand is ``(r, 0)``,
    ``alpha`` a real factor of the subtrahend (of ``other`` for add)."""
    alpha = a.get("alpha", 1)
    if isinstance(alpha, complex):
        raise cv.fail(f"{n.target} with a complex alpha {alpha!r}")
    x, y = operand(cv, n, a, "self"), operand(cv, n, a, "other")
    name = opname(n.target)
    if name == "rsub":  # other - alpha self
        x, y = y, x
    if alpha not in (None, 1):
        y = cv.f.scale(y, float(alpha))
    return cv.f.add(x, y) if name == "add" else cv.f.sub(x, y)


@complex_op("mul")
def _mul(cv: Converter, n: Any, a: dict) -> Tensor:
    """``complex_mul`` of two complex operands; by a real one, that real broadcast over the pairs."""
    cx = complex_args(n)
    z, w = ("self", "other") if "self" in cx else ("other", "self")  # z complex
    x = operand(cv, n, a, z)
    if w in cx:
        return cv.f.complex_mul(x, operand(cv, n, a, w))
    if is_num(a[w]):
        return cv.f.scale(x, float(a[w]))
    return cv.f.mul(x, real_operand(cv, a[w], w))


@complex_op("div")
def _div(cv: Converter, n: Any, a: dict) -> Tensor:
    """A complex value divided by a real tensor or scalar (a complex divisor is refused)."""
    if "other" in complex_args(n) or isinstance(a["other"], complex):
        raise cv.fail(f"unsupported op {n.target} with a complex divisor (complex tensors are pairs of reals; "
                      "division by a complex value is not supported)")
    if a.get("rounding_mode") is not None:
        raise cv.fail(f"unsupported op {n.target} (rounding_mode={a['rounding_mode']!r}) on complex tensors")
    x = operand(cv, n, a, "self")
    if is_num(a["other"]):
        return cv.f.scale(x, 1.0 / float(a["other"]))
    return cv.f.div(x, real_operand(cv, a["other"], "other"))


@complex_op("conj", "_conj", "conj_physical")
def _conj(cv: Converter, n: Any, a: dict) -> Tensor:
    x = operand(cv, n, a, "self")
    return cv.f.mul(x, cv.f.broadcast_to(pair(cv, complex(1, -1), x.dtype), x.shape))


def part(cv: Converter, x: Tensor, k: int) -> Tensor:
    """Part ``k`` (0: real, 1: imaginary) of the pairs ``x``: the pair dim dropped."""
    last = len(x.shape) - 1
    return cv.reshape(cv.f.slice(x, last, k, k + 1), x.shape[:-1])


@complex_op("real", "imag")
def _part(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    return cv.reshape(part(cv, x, int(opname(n.target) == "imag")), cv.out_shape())


@complex_op("abs")
def _abs(cv: Converter, n: Any, a: dict) -> Tensor:
    """``sqrt(re^2 + im^2)`` (its gradient at 0 is NaN, torch's is 0)."""
    x = cv.tensor(a["self"], "input")
    re, im = part(cv, x, 0), part(cv, x, 1)
    return cv.reshape(cv.f.sqrt(cv.f.add(cv.f.mul(re, re), cv.f.mul(im, im))), cv.out_shape())


@complex_op("angle")
def _angle(cv: Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    return cv.reshape(cv.f.atan2(part(cv, x, 1), part(cv, x, 0)), cv.out_shape())


def from_parts(cv: Converter, re: Tensor, im: Tensor) -> Tensor:
    """The pairs ``(re, im)`` of two real tensors at the result's complex shape."""
    shape, dt = cv.out_shape(), cv.out_dtype()
    re, im = (cv.f.broadcast_to(cv.cast(t, dt), shape[:-1]) for t in (re, im))
    return cv.f.cat([cv.reshape(t, t.shape + (1,)) for t in (re, im)], len(shape) - 1)


@complex_op("complex")
def _complex(cv: Converter, n: Any, a: dict) -> Tensor:
    return from_parts(cv, cv.tensor(a["real"], "real"), cv.tensor(a["imag"], "imag"))


@complex_op("polar")
def _polar(cv: Converter, n: Any, a: dict) -> Tensor:
    r, t = cv.tensor(a["abs"], "abs"), cv.tensor(a["angle"], "angle")
    shape = cv.out_shape()[:-1]
    r, t = cv.f.broadcast_to(r, shape), cv.f.broadcast_to(t, shape)
    return from_parts(cv, cv.f.mul(r, cv.f.cos(t)), cv.f.mul(r, cv.f.sin(t)))
