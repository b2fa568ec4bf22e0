"""``reshard.from_torch``: a PyTorch module or function -> a reshard ``Fusion``.

The module is traced with ``torch.export.export`` (ATen graph with static shapes) and each
ATen node is decomposed into Fusion ops:

=====================================  ==================================================
ATen ops                               Fusion ops
=====================================  ==================================================
linear, matmul, mm, bmm, addmm         permute (weight) + matmul (+ broadcast bias, add);
                                       batch dims broadcast like ``torch.matmul``
add, sub, mul, div, maximum, rsub      binary, operands broadcast (``Fusion.broadcast_to``)
                                       and cast to the result dtype; ``* c``, ``/ c`` by a
                                       Python scalar: ``scale``; ``+ c``: a constant input
neg exp tanh gelu relu silu sigmoid    unary (gelu: approximate="none" only)
sqrt rsqrt abs, pow by 1/2/3/±0.5/-1,  unary / binary
reciprocal
view reshape _unsafe_view (un)squeeze  reshape (identity when the shape is unchanged)
flatten unflatten, expand              broadcast
permute transpose t                    permute
slice narrow select split chunk        slice (+ reshape); split/chunk/unbind: tuples
unbind, cat stack                      cat
sum mean amax (keepdim, all dims)      reduce (+ reshape for keepdim)
softmax / _softmax / _safe_softmax     max, broadcast, sub, exp, sum, broadcast, div
layer_norm, rms_norm                   mean, sub, mul, mean, add eps, rsqrt, mul (w, b)
scaled_dot_product_attention           q @ k^T, scale, (+ mask), softmax, @ v
_to_copy to type_as                    cast (identity when the dtype is unchanged)
clone contiguous alias detach dropout  identity (dropout only in eval or with p = 0)
(eval)
=====================================  ==================================================

Module parameters and buffers become Fusion inputs named by their FQN (``"fc1.weight"``);
lifted tensor constants and scalar constants that the IR cannot hold as attributes (the
``eps`` of a norm, ``x + 1``) become replicated inputs named ``_c0``, ``_c1``, ... whose
values ``TorchProgram.inputs`` supplies.  Any other ATen op raises ``ReshardError`` naming
the op, the graph node and the user's source line.

Placements (``in_placements``, ``out_placements``, ``param_placements``) take reshard
placements, ``torch.distributed.tensor`` placements (``Shard``, ``Replicate``,
``Partial("sum" | "max")``), a ``TensorSharding``, or None (inputs only: the optimizer
chooses how that input is fed).
"""

from __future__ import annotations

import inspect
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.fx

from ..ir.errors import ReshardError
from ..ir.fusion import DTYPES, Fusion, Tensor, dtype_name
from ..ir.interpreter import run_reference
from ..ir.mesh import DeviceMesh
from ..ir.sharding import Replicate, TensorSharding, is_placement

__all__ = ["TorchProgram", "from_torch", "to_reshard_placements"]

# ---- placements ---------------------------------------------------------------------------

def to_reshard_placements(spec: Any, shape: Sequence[int], mesh: DeviceMesh, where: str = "tensor"
                          ) -> TensorSharding | None:
    """A placement spec -> ``TensorSharding`` on ``mesh`` (None stays None: open).

    ``spec``: a ``TensorSharding``; a sequence of placements, one per mesh axis, each a
    reshard placement or a ``torch.distributed.tensor`` one; or, on a 1-D mesh, a single
    placement (``TensorSharding.of``, which converts placements by ``as_placement``)."""
    return None if spec is None else TensorSharding.of(spec, tuple(shape), mesh, where)


def _per_item(specs: Any, names: Sequence[str], what: str, noun: str) -> dict[str, Any]:
    """``specs`` (None, a sequence with one spec per name, a single spec when there is one
    name, or a mapping) -> {name: spec}."""
    if specs is None:
        return {}
    if isinstance(specs, Mapping):
        return dict(specs)
    if isinstance(specs, TensorSharding) or is_placement(specs):
        specs = [specs]
    if not isinstance(specs, Sequence) or isinstance(specs, (str, bytes)):
        raise ReshardError(f"from_torch: {what} must be a sequence (one spec per {noun}), "
                           f"a mapping name -> spec, or None; got {specs!r}")
    specs = list(specs)
    if len(names) == 1 and specs and all(is_placement(p) for p in specs) and len(specs) != 1:
        specs = [specs]  # the single item's own placement list
    if len(specs) != len(names):
        raise ReshardError(f"from_torch: {what} has {len(specs)} entries for {len(names)} "
                           f"{noun}s {list(names)}")
    return dict(zip(names, specs))


# ---- the result ---------------------------------------------------------------------------

@dataclass
class TorchProgram:
    """A traced torch program as a reshard ``Fusion``.

    ``input_names``: the Fusion's inputs: user inputs in call order, then parameters and
    buffers (FQNs), then constants.  ``inputs(*args)`` builds the dict that
    ``Plan.simulate`` / ``reshard.run_reference`` take, from the call's arguments and the
    module's state (captured at export, or ``state=`` a module / state dict).

    >>> tp = reshard.from_torch(block, (x,), [Shard(0)], [Shard(0)], mesh)
    >>> plan = reshard.optimize(tp.fusion)
    >>> (y,) = plan.simulate(tp.inputs(x))
    """

    fusion: Fusion
    user_inputs: tuple[str, ...]
    state_inputs: tuple[str, ...]
    constant_inputs: tuple[str, ...]
    values: dict[str, torch.Tensor] = field(repr=False)
    exported: Any = field(default=None, repr=False)

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.user_inputs + self.state_inputs + self.constant_inputs

    def inputs(self, *args: torch.Tensor, state: Mapping[str, torch.Tensor] | torch.nn.Module | None = None
               ) -> dict[str, torch.Tensor]:
        """Global input tensors by Fusion input name for a call with ``args``."""
        if len(args) != len(self.user_inputs):
            raise ReshardError(f"TorchProgram.inputs: {len(args)} arguments given, the program takes "
                               f"{len(self.user_inputs)} ({list(self.user_inputs)})")
        if isinstance(state, torch.nn.Module):
            state = {**dict(state.named_parameters()), **dict(state.named_buffers())}
        state = state or {}
        shapes = {self.fusion.tensors[i].name: self.fusion.tensors[i].shape for i in self.fusion.inputs}
        out: dict[str, torch.Tensor] = {}
        for name, a in zip(self.user_inputs, args):
            if not isinstance(a, torch.Tensor):
                raise ReshardError(f"TorchProgram.inputs: argument {name!r} is a {type(a).__name__}, not a tensor")
            out[name] = a.detach()
        for name in self.state_inputs:
            out[name] = (state[name] if name in state else self.values[name]).detach()
        for name in self.constant_inputs:
            out[name] = self.values[name]
        for name, v in out.items():
            if name in shapes and tuple(v.shape) != shapes[name]:
                raise ReshardError(f"TorchProgram.inputs: {name!r} has shape {tuple(v.shape)}, the program was "
                                   f"traced with {shapes[name]}")
        return {k: v for k, v in out.items() if k in shapes}

    def reference(self, *args: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, ...]:
        """``reshard.run_reference`` of the Fusion on this call (global tensors)."""
        return run_reference(self.fusion, self.inputs(*args, state=state))


# ---- conversion ---------------------------------------------------------------------------

def _where(node: Any) -> str:
    """``node 'name' (aten op) in module 'm' at file:line (code)``, as much as the node knows."""
    s = f"node {node.name!r}"
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path = list(stack.values())[-1]
        path = path[0] if isinstance(path, tuple) else path
        if path:
            s += f" in module {path!r}"
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    for i in range(len(trace) - 1, -1, -1):
        m = re.match(r'\s*File "(.+)", line (\d+), in (\S+)', trace[i])
        if m:
            code = trace[i + 1].strip() if i + 1 < len(trace) else ""
            s += f" at {m.group(1)}:{m.group(2)}" + (f" ({code})" if code else "")
            break
    return s


def _module_paths(node: Any) -> list[str]:
    """The paths of the modules a graph node runs in, outermost first (the root module: "")."""
    stack = node.meta.get("nn_module_stack") or {}
    return [v[0] if isinstance(v, tuple) else v for v in stack.values()]


def _opname(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    schema = getattr(target, "_schema", None)
    if schema is None:
        return getattr(target, "__name__", str(target))
    return schema.name.split("::")[-1]


class _Converter:
    def __init__(self, mesh: DeviceMesh) -> None:
        self.f = Fusion()
        self.mesh = mesh
        self.env: dict[str, Any] = {}
        self.consts: dict[tuple, Tensor] = {}
        self.const_names: list[str] = []
        self.values: dict[str, torch.Tensor] = {}
        self.taken: set[str] = set()
        self.node: Any = None
        #: module path -> the last graph node that runs in it (its result is named by the path)
        self.last_in: dict[str, Any] = {}

    # -- helpers ----------------------------------------------------------------------------
    def fail(self, msg: str) -> ReshardError:
        return ReshardError(f"from_torch: {msg} ({_where(self.node)})")

    def meta(self) -> torch.Tensor:
        v = self.node.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise self.fail(f"{_opname(self.node.target)}: expected a tensor result")
        return v

    def out_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.meta().shape)

    def out_dtype(self) -> str:
        return self.dtype(self.meta().dtype)

    def dtype(self, dt: torch.dtype) -> str:
        try:
            return dtype_name(dt, "from_torch")
        except ReshardError:
            raise self.fail(f"{_opname(self.node.target)}: dtype {dt} is not supported (supported: "
                            f"{sorted(DTYPES)})") from None

    def const(self, value: float, dtype: str) -> Tensor:
        """A replicated (1,) input holding the scalar ``value``."""
        key = (float(value), dtype)
        if key not in self.consts:
            name = self.fresh("_c")
            t = self.f.input(name, (1,), dtype, self.mesh, [Replicate()] * self.mesh.ndim)
            self.values[name] = torch.tensor([float(value)], dtype=DTYPES[dtype])
            self.const_names.append(name)
            self.consts[key] = t
        return self.consts[key]

    def fresh(self, prefix: str) -> str:
        i = 0
        while f"{prefix}{i}" in self.taken:
            i += 1
        self.taken.add(f"{prefix}{i}")
        return f"{prefix}{i}"

    def unique(self, name: str) -> str:
        """``name``, or ``name_1``, ``name_2``, ... when taken; marked taken."""
        k, out = 0, name
        while out in self.taken:
            k += 1
            out = f"{name}_{k}"
        self.taken.add(out)
        return out

    def value_name(self, node: Any) -> str:
        """What a node's result is called: the path of the innermost module it runs in when it
        is that module's last node (``fc1``, ``layers.0.attn``), else that path and the ATen
        op (``layers.0.add``; the same in every layer, so repeated layers read alike)."""
        path = (_module_paths(node) or [""])[-1]
        if path and self.last_in.get(path) is node:
            return self.unique(path)
        return self.unique(f"{path}.{_opname(node.target)}" if path else _opname(node.target))

    def name_new(self, node: Any, before: int, out: Any) -> Any:
        """Name the tensors that converting ``node`` created (ids from ``before``; inputs keep
        their names): its result(s) ``value_name(node)`` (a tuple's items ``<name>.<i>``), the
        intermediates ``<name>.<op>`` (``ln.mean``).  Returns ``out`` with the renamed tensors."""
        f = self.f
        inputs = set(f.inputs)
        new = [t for t in f.tensors[before:] if t.id not in inputs]
        if not new:
            return out
        base = self.value_name(node)
        results: dict[int, str] = {}
        for i, t in enumerate(out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, Tensor):
                results.setdefault(t.id, base if isinstance(out, Tensor) else self.unique(f"{base}.{i}"))
        renamed: dict[int, Tensor] = {}
        for t in new:
            op = f.ops[f.producer[t.id]]
            fn = op.attrs.get("fn")
            name = results.get(t.id) or self.unique(f"{base}.{fn if isinstance(fn, str) else op.kind}")
            renamed[t.id] = f.tensors[t.id] = replace(t, name=name)  # the Fusion is not handed out yet

        def rebind(v: Any) -> Any:
            if isinstance(v, Tensor):
                return renamed.get(v.id, v)
            return type(v)(rebind(x) for x in v) if isinstance(v, (tuple, list)) else v
        return rebind(out)

    def tensor(self, x: Any, what: str) -> Tensor:
        if not isinstance(x, Tensor):
            raise self.fail(f"{_opname(self.node.target)}: {what} must be a tensor, got {x!r}")
        return x

    def cast(self, x: Tensor, dtype: str) -> Tensor:
        return x if x.dtype == dtype else self.f.cast(x, dtype)

    def operand(self, x: Any, shape: tuple[int, ...], dtype: str) -> Tensor:
        """A tensor or Python scalar as a ``shape``/``dtype`` tensor (broadcast, cast)."""
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return self.f.broadcast_to(self.const(x, dtype), shape)
        x = self.tensor(x, "operand")
        return self.f.broadcast_to(self.cast(x, dtype), shape)

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        shape = tuple(int(s) for s in shape)
        if not shape:
            raise self.fail("0-dim tensors are not supported by the Fusion IR (keep a dim, e.g. keepdim=True)")
        return x if x.shape == shape else self.f.reshape(x, shape)

    def dims(self, x: Tensor, dim: Any) -> tuple[int, ...]:
        if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
            return tuple(range(len(x.shape)))
        ds = (dim,) if isinstance(dim, int) else tuple(dim)
        n = len(x.shape)
        for d in ds:
            if not -n <= d < n:
                raise self.fail(f"dim {d} out of range for {x!r}")
        return tuple(sorted({d % n for d in ds}))

    def reduce(self, fn: str, x: Tensor, dims: tuple[int, ...]) -> tuple[Tensor, tuple[int, ...]]:
        """``fn`` over ``dims``; returns the result and, for broadcasting it back over x's
        shape, the dims of x its dims sit at (reducing every dim gives a (1,) tensor,
        broadcast back through an extent-1 dim)."""
        keep = tuple(d for d in range(len(x.shape)) if d not in dims)
        if keep:
            return self.f.reduce(fn, x, dims), keep
        y = self.f.reduce(fn, self.f.reshape(x, (1,) + x.shape), tuple(d + 1 for d in dims))
        return y, (0,)

    def back(self, r: Tensor, like: Tensor, at: tuple[int, ...]) -> Tensor:
        return self.f.broadcast(r, like.shape, at)

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        """``torch.matmul`` semantics (1-D operands, broadcast batch dims)."""
        f = self.f
        if len(a.shape) == 1 and len(b.shape) == 1:
            raise self.fail("a dot product of two 1-D tensors is 0-dim, which the Fusion IR cannot hold")
        sq_a, sq_b = len(a.shape) == 1, len(b.shape) == 1
        if sq_a:
            a = f.reshape(a, (1,) + a.shape)
        if sq_b:
            b = f.reshape(b, b.shape + (1,))
        if len(b.shape) > 2:
            try:
                batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
            except RuntimeError as e:
                raise self.fail(f"matmul batch dims do not broadcast: {a!r} @ {b!r}") from e
            a = f.broadcast_to(a, batch + a.shape[-2:])
            b = f.broadcast_to(b, batch + b.shape[-2:])
        y = f.matmul(a, b)
        if sq_a:
            y = self.reshape(y, y.shape[:-2] + y.shape[-1:])
        if sq_b:
            y = self.reshape(y, y.shape[:-1])
        return y

    def softmax(self, x: Tensor, dim: int) -> Tensor:
        (d,) = self.dims(x, dim)
        f = self.f
        m, at = self.reduce("max", x, (d,))
        e = f.exp(f.sub(x, self.back(m, x, at)))
        s, at = self.reduce("sum", e, (d,))
        return f.div(e, self.back(s, e, at))

    def add_scalar(self, x: Tensor, c: float) -> Tensor:
        return x if c == 0 else self.f.add(x, self.f.broadcast_to(self.const(c, x.dtype), x.shape))

    # -- the graph --------------------------------------------------------------------------
    def value(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.value(x) for x in a)
        return a

    def args(self, node: Any) -> dict[str, Any]:
        schema = node.target._schema
        out: dict[str, Any] = {}
        for i, arg in enumerate(schema.arguments):
            if i < len(node.args):
                out[arg.name] = self.value(node.args[i])
            elif arg.name in node.kwargs:
                out[arg.name] = self.value(node.kwargs[arg.name])
            elif arg.has_default_value():
                out[arg.name] = arg.default_value
            else:
                out[arg.name] = None
        return out

    def run_node(self, node: Any) -> Any:
        self.node = node
        if node.target is operator.getitem:
            seq, i = self.value(node.args[0]), node.args[1]
            if not isinstance(seq, (tuple, list)):
                raise self.fail(f"getitem of a non-tuple {seq!r}")
            r = seq[i]
            if r is None and not node.users:  # e.g. the unused indices of max.dim
                return None
            if r is None:
                raise self.fail(f"output {i} of a multi-output op is not supported (only the main result)")
            return r
        name = _opname(node.target)
        handler = _OPS.get(name)
        if handler is None or not hasattr(node.target, "_schema"):
            raise self.fail(f"unsupported op {node.target}")
        out = handler(self, node, self.args(node))
        val = node.meta.get("val")
        if isinstance(out, Tensor) and isinstance(val, torch.Tensor):
            if tuple(val.shape) != out.shape or self.dtype(val.dtype) != out.dtype:
                raise self.fail(f"internal: {name} produced {out!r}, torch says {tuple(val.shape)} {val.dtype}")
        return out


# ---- op handlers -----------------------------------------------------------------------------
Handler = Callable[[_Converter, Any, dict[str, Any]], Any]
_OPS: dict[str, Handler] = {}


def _op(*names: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for n in names:
            _OPS[n] = fn
        return fn
    return deco


def _first(a: dict[str, Any]) -> Any:
    return next(iter(a.values()))


@_op("linear")
def _linear(cv: _Converter, n: Any, a: dict) -> Tensor:
    x, w, b = cv.tensor(a["input"], "input"), cv.tensor(a["weight"], "weight"), a["bias"]
    if len(w.shape) != 2:
        raise cv.fail(f"linear: weight must be 2-D, got {w!r}")
    y = cv.matmul(cv.cast(x, cv.out_dtype()), cv.f.permute(cv.cast(w, cv.out_dtype()), (1, 0)))
    if b is not None:
        y = cv.f.add(y, cv.operand(b, y.shape, y.dtype))
    return y


@_op("matmul", "mm", "bmm")
def _matmul(cv: _Converter, n: Any, a: dict) -> Tensor:
    x, y = list(a.values())[:2]
    dt = cv.out_dtype()
    return cv.matmul(cv.cast(cv.tensor(x, "lhs"), dt), cv.cast(cv.tensor(y, "rhs"), dt))


@_op("addmm")
def _addmm(cv: _Converter, n: Any, a: dict) -> Tensor:
    dt = cv.out_dtype()
    y = cv.matmul(cv.cast(cv.tensor(a["mat1"], "mat1"), dt), cv.cast(cv.tensor(a["mat2"], "mat2"), dt))
    if a["alpha"] != 1:
        y = cv.f.scale(y, float(a["alpha"]))
    if a["beta"] == 0:
        return y
    bias = cv.operand(a["self"], y.shape, dt)
    if a["beta"] != 1:
        bias = cv.f.scale(bias, float(a["beta"]))
    return cv.f.add(y, bias)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _binary(cv: _Converter, fn: str, x: Any, y: Any, alpha: Any = 1) -> Tensor:
    shape, dt = cv.out_shape(), cv.out_dtype()
    if not shape:
        raise cv.fail("0-dim tensors are not supported by the Fusion IR")
    if alpha not in (None, 1):
        y = y * alpha if _is_num(y) else cv.f.scale(cv.cast(cv.tensor(y, "other"), dt), float(alpha))
    if _is_num(x) and _is_num(y):
        raise cv.fail(f"{fn} of two scalars")
    if fn in ("add", "sub") and _is_num(y):
        return cv.add_scalar(cv.operand(x, shape, dt), y if fn == "add" else -y)
    if fn == "add" and _is_num(x):
        return cv.add_scalar(cv.operand(y, shape, dt), x)
    if fn == "mul" and (_is_num(x) or _is_num(y)):
        c, t = (x, y) if _is_num(x) else (y, x)
        return cv.f.scale(cv.operand(t, shape, dt), float(c))
    if fn == "div" and _is_num(y):
        if y == 0:
            raise cv.fail("division by the scalar 0")
        return cv.f.scale(cv.operand(x, shape, dt), 1.0 / float(y))
    return cv.f.binary(fn, cv.operand(x, shape, dt), cv.operand(y, shape, dt))


@_op("add")
def _add(cv: _Converter, n: Any, a: dict) -> Tensor:
    return _binary(cv, "add", a["self"], a["other"], a.get("alpha", 1))


@_op("sub")
def _sub(cv: _Converter, n: Any, a: dict) -> Tensor:
    return _binary(cv, "sub", a["self"], a["other"], a.get("alpha", 1))


@_op("rsub")
def _rsub(cv: _Converter, n: Any, a: dict) -> Tensor:
    return _binary(cv, "sub", a["other"], a["self"], a.get("alpha", 1))


@_op("mul")
def _mul(cv: _Converter, n: Any, a: dict) -> Tensor:
    return _binary(cv, "mul", a["self"], a["other"])


@_op("div")
def _div(cv: _Converter, n: Any, a: dict) -> Tensor:
    if a.get("rounding_mode") is not None:
        raise cv.fail(f"unsupported op {n.target} (rounding_mode={a['rounding_mode']!r})")
    return _binary(cv, "div", a["self"], a["other"])


@_op("maximum")
def _maximum(cv: _Converter, n: Any, a: dict) -> Tensor:
    return _binary(cv, "maximum", a["self"], a["other"])


def _unary(fn: str) -> Handler:
    def h(cv: _Converter, n: Any, a: dict) -> Tensor:
        return cv.f.unary(fn, cv.cast(cv.tensor(_first(a), "input"), cv.out_dtype()))
    return h


for _fn in ("neg", "exp", "tanh", "relu", "silu", "sigmoid", "sqrt", "rsqrt", "abs"):
    _OPS[_fn] = _unary(_fn)


@_op("gelu")
def _gelu(cv: _Converter, n: Any, a: dict) -> Tensor:
    if a.get("approximate", "none") != "none":
        raise cv.fail(f"unsupported op {n.target} with approximate={a['approximate']!r} (only 'none')")
    return cv.f.gelu(cv.tensor(a["self"], "input"))


@_op("pow")
def _pow(cv: _Converter, n: Any, a: dict) -> Tensor:
    x, e = a["self"], a["exponent"]
    if not isinstance(x, Tensor) or not _is_num(e):
        raise cv.fail(f"unsupported op {n.target}: only tensor ** Python scalar")
    x = cv.cast(x, cv.out_dtype())
    f = cv.f
    table: dict[float, Callable[[], Tensor]] = {
        1.0: lambda: x, 2.0: lambda: f.mul(x, x), 3.0: lambda: f.mul(f.mul(x, x), x), 0.5: lambda: f.sqrt(x),
        -0.5: lambda: f.rsqrt(x), -1.0: lambda: f.div(cv.operand(1.0, x.shape, x.dtype), x),
        -2.0: lambda: f.div(cv.operand(1.0, x.shape, x.dtype), f.mul(x, x)),
    }
    if float(e) not in table:
        raise cv.fail(f"unsupported op {n.target} with exponent {e!r} (supported: {sorted(table)})")
    return table[float(e)]()


@_op("reciprocal")
def _reciprocal(cv: _Converter, n: Any, a: dict) -> Tensor:
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    return cv.f.div(cv.operand(1.0, x.shape, x.dtype), x)


@_op("view", "reshape", "_unsafe_view", "view_copy", "unsqueeze", "squeeze", "flatten", "unflatten", "view_as",
     "reshape_as")
def _reshape(cv: _Converter, n: Any, a: dict) -> Tensor:
    return cv.reshape(cv.tensor(_first(a), "input"), cv.out_shape())


@_op("expand", "expand_as", "broadcast_to", "expand_copy")
def _expand(cv: _Converter, n: Any, a: dict) -> Tensor:
    return cv.f.broadcast_to(cv.tensor(_first(a), "input"), cv.out_shape())


@_op("permute")
def _permute(cv: _Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    perm = tuple(d % len(x.shape) for d in a["dims"])
    return x if perm == tuple(range(len(x.shape))) else cv.f.permute(x, perm)


@_op("transpose")
def _transpose(cv: _Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    r = len(x.shape)
    d0, d1 = a["dim0"] % r, a["dim1"] % r
    if d0 == d1:
        return x
    perm = list(range(r))
    perm[d0], perm[d1] = d1, d0
    return cv.f.permute(x, perm)


@_op("t")
def _t(cv: _Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    return x if len(x.shape) < 2 else cv.f.permute(x, (1, 0))


def _slice(cv: _Converter, x: Tensor, dim: int, start: int, stop: int) -> Tensor:
    d = dim % len(x.shape)
    if start == 0 and stop == x.shape[d]:
        return x
    if start >= stop:
        raise cv.fail(f"empty slice [{start}:{stop}) of dim {d} of {x!r}")
    return cv.f.slice(x, d, start, stop)


def _clamp(i: Any, size: int, default: int) -> int:
    if i is None:
        return default
    i = int(i)
    if i < 0:
        i += size
    return min(max(i, 0), size)


@_op("slice")
def _slice_op(cv: _Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    if a.get("step", 1) not in (1, None):
        raise cv.fail(f"unsupported op {n.target} with step {a['step']} (only step 1)")
    d = a["dim"] % len(x.shape)
    size = x.shape[d]
    return _slice(cv, x, d, _clamp(a["start"], size, 0), _clamp(a["end"], size, size))


@_op("narrow")
def _narrow(cv: _Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    s = _clamp(a["start"], x.shape[d], 0)
    return _slice(cv, x, d, s, s + int(a["length"]))


@_op("select")
def _select(cv: _Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    i = int(a["index"]) % x.shape[d]
    return cv.reshape(_slice(cv, x, d, i, i + 1), cv.out_shape())


def _split_at(cv: _Converter, x: Tensor, dim: int, sizes: Sequence[int]) -> tuple[Tensor, ...]:
    d = dim % len(x.shape)
    out, s = [], 0
    for k in sizes:
        out.append(_slice(cv, x, d, s, s + k))
        s += k
    return tuple(out)


@_op("split")
def _split(cv: _Converter, n: Any, a: dict) -> tuple[Tensor, ...]:
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    k = a["split_size"]
    if isinstance(k, (list, tuple)):
        return _split_at(cv, x, d, k)
    e = x.shape[d]
    return _split_at(cv, x, d, [min(k, e - s) for s in range(0, e, k)])


@_op("split_with_sizes")
def _split_sizes(cv: _Converter, n: Any, a: dict) -> tuple[Tensor, ...]:
    return _split_at(cv, cv.tensor(a["self"], "input"), a["dim"], a["split_sizes"])


@_op("chunk")
def _chunk(cv: _Converter, n: Any, a: dict) -> tuple[Tensor, ...]:
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    e = x.shape[d]
    k = math.ceil(e / a["chunks"])
    return _split_at(cv, x, d, [min(k, e - s) for s in range(0, e, k)])


@_op("unbind")
def _unbind(cv: _Converter, n: Any, a: dict) -> tuple[Tensor, ...]:
    x = cv.tensor(a["self"], "input")
    d = a["dim"] % len(x.shape)
    rest = x.shape[:d] + x.shape[d + 1:]
    return tuple(cv.reshape(s, rest) for s in _split_at(cv, x, d, [1] * x.shape[d]))


@_op("cat", "concat")
def _cat(cv: _Converter, n: Any, a: dict) -> Tensor:
    dt = cv.out_dtype()
    ts = [cv.cast(cv.tensor(t, "cat operand"), dt) for t in a["tensors"]]
    return cv.f.cat(ts, a["dim"] % len(ts[0].shape))


@_op("stack")
def _stack(cv: _Converter, n: Any, a: dict) -> Tensor:
    dt = cv.out_dtype()
    ts = [cv.cast(cv.tensor(t, "stack operand"), dt) for t in a["tensors"]]
    d = a["dim"] % (len(ts[0].shape) + 1)
    return cv.f.cat([cv.f.reshape(t, t.shape[:d] + (1,) + t.shape[d:]) for t in ts], d)


def _reduction(fn: str) -> Handler:
    def h(cv: _Converter, n: Any, a: dict) -> Tensor:
        x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
        dims = cv.dims(x, a.get("dim"))
        y, _ = cv.reduce(fn, x, dims)
        return cv.reshape(y, cv.out_shape())  # keepdim / full reduction shapes
    return h


_OPS["sum"] = _reduction("sum")
_OPS["mean"] = _reduction("mean")
_OPS["amax"] = _reduction("max")


@_op("max")
def _max(cv: _Converter, n: Any, a: dict) -> Any:
    """max.dim -> (values, no indices); max.default -> full reduction; max.other -> maximum."""
    overload = n.target._overloadname
    if overload == "other":
        return _binary(cv, "maximum", a["self"], a["other"])
    if overload not in ("dim", "default"):
        raise cv.fail(f"unsupported op {n.target}")
    x = cv.tensor(a["self"], "input")
    y, _ = cv.reduce("max", x, cv.dims(x, a.get("dim")))
    if overload == "default":
        return cv.reshape(y, cv.out_shape())
    keep = tuple(1 if d == a["dim"] % len(x.shape) else e for d, e in enumerate(x.shape))
    return (cv.reshape(y, keep) if a.get("keepdim") else y), None


@_op("softmax", "_softmax", "_safe_softmax")
def _softmax(cv: _Converter, n: Any, a: dict) -> Tensor:
    x = cv.cast(cv.tensor(a["self"], "input"), cv.out_dtype())
    return cv.softmax(x, a["dim"])


def _norm(cv: _Converter, x: Tensor, k: int, eps: float, center: bool) -> Tensor:
    """(x - mean) * rsqrt(mean((x - mean)^2) + eps) over the last k dims (no centering for RMS)."""
    f = cv.f
    dims = tuple(range(len(x.shape) - k, len(x.shape)))
    if center:
        m, at = cv.reduce("mean", x, dims)
        x = f.sub(x, cv.back(m, x, at))
    v, at = cv.reduce("mean", f.mul(x, x), dims)
    return f.mul(x, cv.back(f.rsqrt(cv.add_scalar(v, eps)), x, at))


def _affine(cv: _Converter, y: Tensor, w: Any, b: Any) -> Tensor:
    if w is not None:
        y = cv.f.mul(y, cv.operand(w, y.shape, y.dtype))
    if b is not None:
        y = cv.f.add(y, cv.operand(b, y.shape, y.dtype))
    return y


@_op("layer_norm")
def _layer_norm(cv: _Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["input"], "input")
    k = len(a["normalized_shape"])
    return _affine(cv, _norm(cv, x, k, float(a["eps"]), True), a["weight"], a["bias"])


@_op("native_layer_norm")
def _native_layer_norm(cv: _Converter, n: Any, a: dict) -> tuple[Tensor, None, None]:
    """(normalized, mean, rstd): only the first result is supported."""
    y = _affine(cv, _norm(cv, cv.tensor(a["input"], "input"), len(a["normalized_shape"]), float(a["eps"]), True),
                a["weight"], a["bias"])
    return y, None, None


@_op("rms_norm")
def _rms_norm(cv: _Converter, n: Any, a: dict) -> Tensor:
    x = cv.tensor(a["input"], "input")
    eps = a["eps"] if a["eps"] is not None else torch.finfo(DTYPES[x.dtype]).eps
    return _affine(cv, _norm(cv, x, len(a["normalized_shape"]), float(eps), False), a["weight"], None)


@_op("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
     "_scaled_dot_product_flash_attention")
def _sdpa_kernel(cv: _Converter, n: Any, a: dict) -> tuple:
    """The fused SDPA kernels' schemas: (output, logsumexp, ...); only the output is supported."""
    if a.get("attn_bias") is not None:
        a = {**a, "attn_mask": a["attn_bias"]}
    return (_sdpa(cv, n, a),) + (None,) * (len(n.target._schema.returns) - 1)


@_op("scaled_dot_product_attention")
def _sdpa(cv: _Converter, n: Any, a: dict) -> Tensor:
    f = cv.f
    q, k, v = (cv.tensor(a[x], x) for x in ("query", "key", "value"))
    if a.get("dropout_p", 0.0) not in (0, 0.0):
        raise cv.fail(f"scaled_dot_product_attention with dropout_p={a['dropout_p']} is not supported")
    if a.get("enable_gqa"):
        raise cv.fail("scaled_dot_product_attention with enable_gqa=True is not supported")
    scale = a.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    kt = f.permute(k, tuple(range(len(k.shape) - 2)) + (len(k.shape) - 1, len(k.shape) - 2))
    s = f.scale(cv.matmul(q, kt), scale)
    mask = a.get("attn_mask")
    if a.get("is_causal"):
        if mask is not None:
            raise cv.fail("scaled_dot_product_attention with both attn_mask and is_causal")
        L, S = s.shape[-2], s.shape[-1]
        key = ("causal", L, S, s.dtype)
        if key not in cv.consts:  # one replicated -inf-above-the-diagonal mask per shape
            name = cv.fresh("_c")
            tri = torch.ones(L, S, dtype=torch.bool).tril()
            cv.values[name] = torch.zeros(L, S, dtype=DTYPES[s.dtype]).masked_fill(~tri, float("-inf"))
            cv.const_names.append(name)
            cv.consts[key] = f.input(name, (L, S), s.dtype, cv.mesh, [Replicate()] * cv.mesh.ndim)
        mask = cv.consts[key]
    if mask is not None:
        mask = cv.tensor(mask, "attn_mask")
        if mask.dtype not in ("float32", "bfloat16", "float16", "float64"):
            raise cv.fail("scaled_dot_product_attention: only float (additive) attn_mask is supported")
        s = f.add(s, cv.operand(mask, s.shape, s.dtype))
    return cv.matmul(cv.softmax(s, -1), v)


@_op("_to_copy", "to", "type_as", "_to_dtype")
def _to(cv: _Converter, n: Any, a: dict) -> Tensor:
    return cv.cast(cv.tensor(_first(a), "input"), cv.out_dtype())


@_op("clone", "contiguous", "alias", "detach", "lift_fresh_copy", "identity")
def _identity(cv: _Converter, n: Any, a: dict) -> Tensor:
    return cv.tensor(_first(a), "input")


@_op("dropout", "feature_dropout")
def _dropout(cv: _Converter, n: Any, a: dict) -> Tensor:
    if a.get("train") and a.get("p", 0) != 0:
        raise cv.fail(f"{n.target} in training mode (p={a['p']}); call module.eval() before from_torch")
    return cv.tensor(a["input"], "input")


@_op("_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size")
def _noop(cv: _Converter, n: Any, a: dict) -> None:
    return None


# ---- entry point ----------------------------------------------------------------------------

class _FnModule(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def _mesh_of(mesh: Any) -> DeviceMesh:
    if isinstance(mesh, DeviceMesh):
        return mesh
    if hasattr(mesh, "mesh") and hasattr(mesh, "mesh_dim_names"):  # torch.distributed DeviceMesh
        names = mesh.mesh_dim_names
        ranks = mesh.mesh.tolist()
        return DeviceMesh(ranks, tuple(names) if names else None)
    if isinstance(mesh, (list, tuple)):
        return DeviceMesh(list(mesh))
    raise ReshardError(f"from_torch: mesh must be a reshard.DeviceMesh (or a torch DeviceMesh), got {mesh!r}")


def from_torch(module_or_fn: torch.nn.Module | Callable[..., Any], example_inputs: Sequence[torch.Tensor],
               in_placements: Any = None, out_placements: Any = None, mesh: Any = None, *,
               param_placements: Mapping[str, Any] | None = None, decompose: bool = False) -> TorchProgram:
    """Trace ``module_or_fn(*example_inputs)`` with ``torch.export`` and decompose it into a
    reshard ``Fusion`` on ``mesh``.

    Args:
        in_placements: per user input (call order) a placement spec, or a mapping name ->
            spec that may also name parameters/buffers (by FQN); None = all Replicate.  A
            spec of None leaves that input's sharding to the optimizer.
        out_placements: per output (flattened, in order) a placement spec; None = Replicate.
        mesh: a ``reshard.DeviceMesh``.
        param_placements: mapping FQN -> spec for parameters and buffers (default Replicate).
        decompose: convert ``ep.run_decompositions()`` (core ATen) instead of the exported
            graph: more ops are covered (e.g. ``var``), the graph is longer.

    Returns a ``TorchProgram``: ``.fusion``, ``.input_names``, ``.inputs(*args)``.
    Raises ``ReshardError`` for an unsupported op (naming it, the graph node and the source
    line), a bad placement, or inputs that are not floating-point tensors.
    """
    if mesh is None:
        raise ReshardError("from_torch: a mesh is required (reshard.DeviceMesh([0, 1]), ...)")
    mesh = _mesh_of(mesh)
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise ReshardError(f"from_torch: example_inputs[{i}] is a {type(x).__name__}; only tensor arguments "
                               "are supported (bind other arguments with functools.partial)")
    if isinstance(module_or_fn, torch.nn.Module):
        module, arg_names = module_or_fn, None
    elif callable(module_or_fn):
        module = _FnModule(module_or_fn)
        # export records only frames named "forward" (and registered anchors) in stack traces;
        # register the function so errors can cite its lines (a private hook: optional)
        anchor = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
        if anchor is not None:
            anchor(module_or_fn)
        try:
            ps = [p.name for p in inspect.signature(module_or_fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            arg_names = ps[:len(example_inputs)] if len(ps) >= len(example_inputs) else None
        except (TypeError, ValueError):
            arg_names = None
    else:
        raise ReshardError(f"from_torch: expected an nn.Module or a callable, got {type(module_or_fn).__name__}")
    try:
        ep = torch.export.export(module, example_inputs)
        if decompose:
            ep = ep.run_decompositions()
    except Exception as e:  # torch.export's own errors are many types
        raise ReshardError(f"from_torch: torch.export.export failed: {type(e).__name__}: {e}") from e
    try:
        return _convert(ep, mesh, arg_names, in_placements, out_placements, param_placements or {})
    except ReshardError as e:
        if decompose or "unsupported op" not in str(e):
            raise
        raise ReshardError(f"{e}; from_torch(..., decompose=True) converts core ATen ops instead") from None


def _convert(ep: Any, mesh: DeviceMesh, arg_names: list[str] | None, in_placements: Any, out_placements: Any,
             param_placements: Mapping[str, Any]) -> TorchProgram:
    from torch.export.graph_signature import InputKind, OutputKind

    cv = _Converter(mesh)
    sig = ep.graph_signature
    graph = ep.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(sig.input_specs):
        raise ReshardError("from_torch: internal: placeholders and input specs differ")
    user, state, consts = [], [], []
    for node, spec in zip(placeholders, sig.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            nm = arg_names[len(user)] if arg_names else node.name
            user.append((node, nm))
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            state.append((node, spec.target))
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            consts.append((node, spec.target))
        else:
            raise ReshardError(f"from_torch: unsupported graph input {node.name!r} of kind {spec.kind.name}")
    user_names = [nm for _, nm in user]
    cv.taken |= set(user_names) | {t for _, t in state + consts}
    specs = _per_item(in_placements, user_names, "in_placements", "input")
    known = set(user_names) | {t for _, t in state}
    for k in list(specs) + list(param_placements):
        if k not in known:
            raise ReshardError(f"from_torch: placements given for {k!r}, which is not an input, parameter or "
                               f"buffer of the program; known: {sorted(known)}")
    specs = {**{t: param_placements[t] for _, t in state if t in param_placements}, **specs}

    state_used: list[str] = []
    for node, nm in user + state + consts:
        cv.node = node
        val = node.meta.get("val")
        kind = "user" if any(node is u for u, _ in user) else "state" if any(node is s for s, _ in state) else "const"
        if kind == "const":
            tv = ep.constants[nm]
            if tv.dim() == 0:  # a scalar constant folds into the ops that use it
                cv.env[node.name] = tv.item()
                continue
        if not node.users and kind != "user":
            continue
        if not isinstance(val, torch.Tensor):
            raise cv.fail(f"input {nm!r} is not a tensor")
        if val.dim() == 0:
            raise cv.fail(f"input {nm!r} is 0-dim; the Fusion IR needs at least one dim")
        dt = cv.dtype(val.dtype)
        shape = tuple(int(s) for s in val.shape)
        if kind == "const":
            ts: Any = [Replicate()] * mesh.ndim
            cv.values[nm] = ep.constants[nm].detach()
            cv.const_names.append(nm)
        else:
            default = [Replicate()] * mesh.ndim
            ts = to_reshard_placements(specs.get(nm, default), shape, mesh, f"from_torch: placements of {nm!r}")
            if kind == "state":
                v = ep.state_dict[nm] if nm in ep.state_dict else ep.constants[nm]
                cv.values[nm] = v.detach()
                state_used.append(nm)
        cv.env[node.name] = cv.f.input(nm, shape, dt, mesh, ts)

    outputs: list[Any] = []
    for node in graph.nodes:
        if node.op == "call_function":
            for path in _module_paths(node):
                cv.last_in[path] = node
    for node in graph.nodes:
        if node.op == "call_function":
            before = len(cv.f.tensors)
            cv.env[node.name] = cv.name_new(node, before, cv.run_node(node))
        elif node.op == "output":
            outputs = list(node.args[0]) if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
        elif node.op != "placeholder":
            cv.node = node
            raise cv.fail(f"unsupported graph node kind {node.op!r} ({node.target})")
    for spec in sig.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            raise ReshardError(f"from_torch: the program has a {spec.kind.name} output ({spec.target}); "
                               "in-place updates of buffers/inputs are not supported")
    outs = []
    for o in outputs:
        v = cv.value(o)
        if not isinstance(v, Tensor):
            raise ReshardError(f"from_torch: output {o} is not a tensor the Fusion computes ({v!r})")
        outs.append(v)
    ospecs = _per_item(out_placements, [f"output {i}" for i in range(len(outs))], "out_placements", "output")
    for i, t in enumerate(outs):
        where = f"from_torch: placements of output {i}"
        ts = to_reshard_placements(ospecs.get(f"output {i}", [Replicate()] * mesh.ndim), t.shape, mesh, where)
        if ts is None:
            raise ReshardError(f"{where}: outputs need a placement (None is only for inputs)")
        cv.f.output(t, ts)
    return TorchProgram(cv.f, tuple(user_names), tuple(state_used), tuple(cv.const_names), cv.values, ep)
