"""The converter: one torch.export graph -> one reshard ``Fusion``, node by node.

``Converter`` holds the Fusion being built, the environment (graph node name -> its value:
a Fusion ``Tensor``, a Python scalar, a tuple of them, or a folded constant: a
``torch.Tensor``; see ``folding``), the constant inputs and the naming of results.  The
ATen op handlers live in the ``aten_*`` modules, one module per family, each registered
in ``OPS`` by ``@op("name", ...)`` (the ATen op's name without its overload).

Scalars: a 0-dim torch value (a loss, a full reduction, a scalar constant) is a 0-dim Fusion
value, shape ``()``.  Complex values are pairs of reals (``pairs``): a node
that reads or makes one is converted by its handler in ``COMPLEX_OPS`` (``aten_complex``),
and its result's shape and dtype (``meta``) are those of its pairs.
"""

from __future__ import annotations

import operator
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.fx

from ..ir.errors import ReshardError
from ..ir.fusion import DTYPES, Fusion, Tensor, dtype_name
from ..ir.mesh import DeviceMesh
from ..ir.sharding import Replicate
from . import folding
from .pairs import as_pairs, is_complex


class ConvertError(ReshardError):
    """A graph node the converter cannot turn into Fusion ops; ``target``: the node's op (an
    ``OpOverload``; None outside a node)."""

    def __init__(self, msg: str, target: Any = None) -> None:
        super().__init__(msg)
        self.target = target


def where(node: Any) -> str:
    """``node 'name' (aten op) in module 'm' at file:line (code)``, as much as the node knows;
    when that line is in torch's own code (``nn.Dropout``'s ``F.dropout``), also the innermost
    line outside it that called it: ``called from file:line (code)``."""
    s = f"node {node.name!r}"
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path = list(stack.values())[-1]
        path = path[0] if isinstance(path, tuple) else path
        if path:
            s += f" in module {path!r}"
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = []  # (file, line, code), innermost first
    for i in range(len(trace) - 1, -1, -1):
        m = re.match(r'\s*File "(.+)", line (\d+), in (\S+)', trace[i])
        if m:
            frames.append((m.group(1), m.group(2), trace[i + 1].strip() if i + 1 < len(trace) else ""))
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    for k, (file, line, code) in enumerate(frames):
        if k == 0 or not file.startswith(torch_dir):
            s += f" {'at' if k == 0 else 'called from'} {file}:{line}" + (f" ({code})" if code else "")
        if not file.startswith(torch_dir):
            break
    return s


def module_paths(node: Any) -> list[str]:
    """The paths of the modules a graph node runs in, outermost first (the root module: "")."""
    stack = node.meta.get("nn_module_stack") or {}
    return [v[0] if isinstance(v, tuple) else v for v in stack.values()]


def opname(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    schema = getattr(target, "_schema", None)
    if schema is None:
        return getattr(target, "__name__", str(target))
    return schema.name.split("::")[-1]


class Converter:
    """``on_meta``: the program was traced on the meta device (constants are meta tensors).
    ``train``: converting for training (``passes.autodiff``): ``aten.detach`` is ``f.detach``.
    The max that softmax and logsumexp subtract is read through ``f.detach`` always (their values
    do not depend on it, so its gradient is zero and need not be formed, also where ``joint``
    differentiates a program converted for the forward pass)."""

    def __init__(self, mesh: DeviceMesh, on_meta: bool = False, train: bool = False) -> None:
        self.f = Fusion()
        self.mesh = mesh
        self.on_meta = on_meta
        self.train = train
        self.env: dict[str, Any] = {}
        self.consts: dict[Any, Tensor] = {}
        #: Fusion tensor id -> the value of that constant input
        self.known_values: dict[int, torch.Tensor] = {}
        #: id of a lifted constant's value -> its name (its FQN)
        self.constant_names: dict[int, str] = {}
        self.const_names: list[str] = []
        self.values: dict[str, torch.Tensor] = {}
        self.taken: set[str] = set()
        self.node: Any = None
        #: module path -> the last graph node that runs in it (its result is named by the path)
        self.last_in: dict[str, Any] = {}
        #: the nodes of the graph being converted that the results depend on (``run_graph``)
        self.live: set[torch.fx.Node] = set()
        #: Fusion tensor id -> the graph node whose conversion made it
        self.origin: dict[int, Any] = {}

    # -- helpers ----------------------------------------------------------------------------
    def fail(self, msg: str) -> ConvertError:
        target = self.node.target if self.node is not None else None
        return ConvertError(f"from_torch: {msg} ({where(self.node)})", target)

    def meta(self) -> torch.Tensor:
        """The node's result as the Fusion holds it (a complex one: its pairs)."""
        v = self.node.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise self.fail(f"{opname(self.node.target)}: expected a tensor result")
        return as_pairs(v)

    def out_shape(self) -> tuple[int, ...]:
        """The result's shape (``()`` for a 0-dim result)."""
        return tuple(int(s) for s in self.meta().shape)

    def out_dtype(self) -> str:
        return self.dtype(self.meta().dtype)

    def dtype(self, dt: torch.dtype) -> str:
        try:
            return dtype_name(dt, "from_torch")
        except ReshardError:
            raise self.fail(f"{opname(self.node.target)}: dtype {dt} is not supported (supported: "
                            f"{sorted(DTYPES)})") from None

    def const(self, value: float, dtype: str) -> Tensor:
        """A replicated 0-dim input holding the scalar ``value``."""
        return self.constant(torch.tensor(value, dtype=DTYPES[dtype]), (float(value), dtype))

    def constant(self, value: torch.Tensor, key: Any, name: str | None = None) -> Tensor:
        """A replicated input holding ``value``, one per ``key``; named ``name`` or ``_c<N>``; a
        complex value as its pairs."""
        if key not in self.consts:
            if value.numel() == 0:
                raise self.fail(f"{opname(self.node.target)} reads a tensor with no elements (shape "
                                f"{tuple(value.shape)}) as an operand; its result has elements, and the Fusion IR holds "
                                "no empty values (cat drops them; an op reading only constants is folded)")
            name = name or self.fresh("_c")
            value = as_pairs(value.detach())
            t = self.f.input(name, tuple(value.shape), self.dtype(value.dtype), self.mesh,
                             [Replicate()] * self.mesh.ndim)
            self.values[name] = value
            self.const_names.append(name)
            self.known_values[t.id] = value
            self.consts[key] = t
        return self.consts[key]

    def known(self, x: Any) -> torch.Tensor | None:
        """The value of ``x`` when it is a constant (folded, or a constant input), else None."""
        if isinstance(x, torch.Tensor):
            return x
        return self.known_values.get(x.id) if isinstance(x, Tensor) else None

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
        path = (module_paths(node) or [""])[-1]
        if path and self.last_in.get(path) is node:
            return self.unique(path)
        return self.unique(f"{path}.{opname(node.target)}" if path else opname(node.target))

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
        """``x`` as a Fusion tensor: a folded constant becomes a replicated constant input (one
        per folded value, named as ``constant_names`` says or ``_c<N>``)."""
        if isinstance(x, torch.Tensor):
            return self.constant(x, ("folded", id(x)), self.constant_names.get(id(x)))
        if not isinstance(x, Tensor):
            raise self.fail(f"{opname(self.node.target)}: {what} must be a tensor, got {x!r}")
        return x

    def cast(self, x: Tensor, dtype: str) -> Tensor:
        return x if x.dtype == dtype else self.f.cast(x, dtype)

    def operand(self, x: Any, shape: tuple[int, ...], dtype: str) -> Tensor:
        """A tensor or Python scalar as a ``shape``/``dtype`` tensor (broadcast, cast)."""
        if isinstance(x, (int, float, bool)):
            return self.f.broadcast_to(self.const(x, dtype), shape)
        x = self.tensor(x, "operand")
        return self.f.broadcast_to(self.cast(x, dtype), shape)

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """``x`` reshaped to ``shape`` (``()``: 0-dim)."""
        shape = tuple(int(s) for s in shape)
        return x if x.shape == shape else self.f.reshape(x, shape)

    def dims(self, x: Tensor, dim: Any) -> tuple[int, ...]:
        """The dims ``dim`` names (an int, a sequence; None or empty: all), sorted; a 0-dim ``x``
        has none, and takes dim 0 or -1 as torch does."""
        if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
            return tuple(range(len(x.shape)))
        ds = (dim,) if isinstance(dim, int) else tuple(dim)
        n = len(x.shape)
        for d in ds:
            if not -max(n, 1) <= d < max(n, 1):
                raise self.fail(f"dim {d} out of range for {x!r}")
        return tuple(sorted({d % n for d in ds})) if n else ()

    def reduce(self, fn: str, x: Tensor, dims: tuple[int, ...]) -> tuple[Tensor, tuple[int, ...]]:
        """``fn`` over ``dims``; returns the result and, for broadcasting it back over x's
        shape, the dims of x its dims sit at (reducing every dim gives a 0-dim result, at no
        dim).  No dims (a 0-dim ``x``): ``x`` itself, as torch's reductions of a 0-dim tensor."""
        keep = tuple(d for d in range(len(x.shape)) if d not in dims)
        return (self.f.reduce(fn, x, dims) if dims else x), keep

    def back(self, r: Tensor, like: Tensor, at: tuple[int, ...]) -> Tensor:
        """``r`` (a ``reduce`` of a tensor shaped like ``like``) broadcast back over ``like``'s shape;
        ``r`` itself when nothing was reduced (a 0-dim ``like``)."""
        return r if r.shape == like.shape else self.f.broadcast(r, like.shape, at)

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        """``torch.matmul`` semantics (1-D operands, a 0-dim dot product of two, broadcast batch dims)."""
        f = self.f
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

    def softmax(self, x: Tensor, dim: int, safe: bool = False) -> Tensor:
        """softmax over ``dim``; ``safe``: a row that is all -inf gives 0s, not NaN (torch's
        ``_safe_softmax``, what attention with a mask computes)."""
        (d,) = self.dims(x, dim)
        f = self.f
        m, at = self.shift(x, (d,))
        e = f.exp(f.sub(x, self.back(m, x, at)))
        s, _ = self.reduce("sum", e, (d,))
        p = f.div(e, self.back(s, e, at))
        if not safe:
            return p
        some = f.ne(m, self.operand(float("-inf"), m.shape, m.dtype))
        return f.where(self.back(some, p, at), p, self.operand(0.0, p.shape, p.dtype))

    def logsumexp(self, x: Tensor, dim: Any) -> tuple[Tensor, tuple[int, ...]]:
        """log(sum(exp(x - m))) + m over ``dim`` (a dim or several), m the max (the reduced
        tensor and its dims in x, as ``reduce``): each reduction is one that a sharded ``dim``
        turns into a Partial (max, then sum), so vocab-parallel logits need no gather."""
        ds = self.dims(x, dim)
        f = self.f
        m, at = self.shift(x, ds)
        s, _ = self.reduce("sum", f.exp(f.sub(x, self.back(m, x, at))), ds)
        return f.add(f.log(s), m), at

    def shift(self, x: Tensor, dims: tuple[int, ...]) -> tuple[Tensor, tuple[int, ...]]:
        """The max of ``x`` over ``dims`` that softmax and logsumexp subtract (and logsumexp adds
        back), as ``reduce``, read through ``f.detach`` (the class docstring)."""
        m, at = self.reduce("max", x, dims)
        return self.f.detach(m), at

    def add_scalar(self, x: Tensor, c: float) -> Tensor:
        return x if c == 0 else self.f.add(x, self.f.broadcast_to(self.const(c, x.dtype), x.shape))

    # -- the graph --------------------------------------------------------------------------
    def run_graph(self, gm: torch.fx.GraphModule, live: set[torch.fx.Node]) -> None:
        """Convert the ``live`` call_function nodes of ``gm`` in order into ``self.env`` (its
        placeholders already there); a ``get_attr`` node is the submodule it names (the body of
        a higher-order op, ``HIGHER_ORDER``)."""
        outer = self.live
        self.live = live
        try:
            for node in gm.graph.nodes:
                if node.op == "call_function":
                    if node in live:
                        before = len(self.f.tensors)
                        out = self.run_node(node)
                        if isinstance(node.target, torch._ops.HigherOrderOperator):  # its body named them
                            self.env[node.name] = out
                            continue
                        self.env[node.name] = self.name_new(node, before, out)
                        self.origin.update((t, node) for t in range(before, len(self.f.tensors)))
                elif node.op == "get_attr":
                    self.env[node.name] = getattr(gm, str(node.target), None)
                elif node.op not in ("placeholder", "output"):
                    self.node = node
                    raise self.fail(f"unsupported graph node kind {node.op!r} ({node.target})")
        finally:
            self.live = outer

    def run_body(self, gm: torch.fx.GraphModule, operands: Sequence[Any], used: set[int]) -> tuple[Any, ...]:
        """The outputs of ``gm`` (a body: a higher-order op's, a decomposition's) on ``operands``,
        its placeholders' values in order, converted in an environment of its own: those at the
        ``used`` indices (the others None, and not converted)."""
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(operands):
            raise self.fail(f"{self.node.target}: {len(operands)} operands for a body of {len(placeholders)} inputs")
        outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        outer, node = self.env, self.node
        self.env = {p.name: v for p, v in zip(placeholders, operands)}
        try:
            self.run_graph(gm, live_nodes([o for i, o in enumerate(outs) if i in used]))
            return tuple((self.env[o.name] if isinstance(o, torch.fx.Node) else o) if i in used else None
                         for i, o in enumerate(outs))
        finally:
            self.env, self.node = outer, node

    def value(self, a: Any) -> Any:
        """A graph argument as a handler sees it: a folded constant stays a ``torch.Tensor``
        (``tensor`` makes it a constant input where a handler reads it), a 0-dim one
        becomes a Python scalar."""
        if isinstance(a, torch.fx.Node):
            v = self.env[a.name]
            if isinstance(v, torch.Tensor) and v.dim() == 0:
                if v.is_meta:
                    raise self.fail(f"the scalar {a.name!r} was computed from meta tensors and has no value; "
                                    "trace with real values for it")
                return v.item()
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(self.value(x) for x in a)
        return a

    def args(self, node: Any) -> dict[str, Any]:
        """The node's arguments by schema name as handlers see them (``value``); one not given
        is its default (None without one)."""
        given = graph_args(node)
        return {arg.name: self.value(given[arg.name]) if arg.name in given
                else arg.default_value if arg.has_default_value() else None
                for arg in node.target._schema.arguments}

    def run_node(self, node: Any) -> Any:
        self.node = node
        if folding.foldable(node, self.env):
            try:
                return folding.evaluate(node, self.env, self.on_meta)
            except Exception as e:  # whatever the ATen op raises
                raise self.fail(f"evaluating the constant {node.target} failed: {type(e).__name__}: {e}") from e
        if (empty := folding.empty_result(node, self.on_meta)) is not None:
            return empty
        if node.target is operator.getitem:
            seq, i = self.value(node.args[0]), node.args[1]
            if not isinstance(seq, (tuple, list)):
                raise self.fail(f"getitem of a non-tuple {seq!r}")
            r = seq[i]
            if r is None and not node.users:  # e.g. the unused indices of max.dim
                return None
            if r is None:
                raise self.fail(f"unsupported op {node.args[0].target}: output {i} of this multi-output op is not "
                                "supported (only the main result)")
            return r
        name = opname(node.target)
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            if name not in HIGHER_ORDER:
                raise self.fail(f"unsupported higher-order op {name} (supported: {sorted(HIGHER_ORDER)})")
            return HIGHER_ORDER[name](self, node)
        if is_complex([node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]):
            handler = COMPLEX_OPS.get(name)
            if handler is None or not hasattr(node.target, "_schema"):
                raise self.fail(f"unsupported op {node.target} on complex tensors (complex tensors are pairs of "
                                f"reals; supported: {', '.join(sorted(COMPLEX_OPS))})")
        else:
            handler = OPS.get(name)
            if handler is None and hasattr(node.target, "_schema") and FALLBACK:
                return FALLBACK[0](self, node)
            if handler is None or not hasattr(node.target, "_schema"):
                raise self.fail(f"unsupported op {node.target}")
        out = handler(self, node, self.args(node))
        val = node.meta.get("val")
        if isinstance(out, Tensor) and isinstance(val, torch.Tensor):
            val = as_pairs(val)
            sized = all(type(d) is int for d in val.shape)  # (a length torch leaves to the values: bincount)
            if sized and tuple(val.shape) != out.shape or name not in OWN_DTYPE and self.dtype(val.dtype) != out.dtype:
                raise self.fail(f"internal: {name} produced {out!r}, torch says {tuple(val.shape)} {val.dtype}")
        return out


def graph_args(node: torch.fx.Node) -> dict[str, Any]:
    """An ATen node's arguments by schema name as the graph holds them (nodes, constants),
    positional or keyword; an argument not given is absent."""
    out: dict[str, Any] = {}
    for i, arg in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
    return out


def live_nodes(roots: Sequence[Any]) -> set[torch.fx.Node]:
    """The nodes ``roots`` (graph nodes; other values are ignored) depend on, themselves included."""
    todo = [r for r in roots if isinstance(r, torch.fx.Node)]
    live = set(todo)
    while todo:
        for a in todo.pop().all_input_nodes:
            if a not in live:
                live.add(a)
                todo.append(a)
    return live


# ---- op handlers -----------------------------------------------------------------------------
Handler = Callable[[Converter, Any, dict[str, Any]], Any]
OPS: dict[str, Handler] = {}
#: the handlers of ops that read or make a complex value (``aten_complex``), by ATen op name
COMPLEX_OPS: dict[str, Handler] = {}
#: a higher-order op's name -> its handler ``(converter, node) -> value`` (``higher_order``)
HIGHER_ORDER: dict[str, Callable[[Converter, Any], Any]] = {}
#: the conversion of an ATen op that has no handler, ``(converter, node) -> value``: through
#: torch's decomposition of it (``decomposed``)
FALLBACK: list[Callable[[Converter, Any], Any]] = []


#: ops whose handler gives the result torch's kernels give, not the dtype the exported node says
#: (``bincount``: torch 2.11's fake kernel says int64 with float weights, its kernels float32 / float64)
OWN_DTYPE: set[str] = set()


def op(*names: str, own_dtype: bool = False) -> Callable[[Handler], Handler]:
    """Register ``fn`` as the handler of the ATen ops ``names``; ``own_dtype``: see ``OWN_DTYPE``."""
    def deco(fn: Handler) -> Handler:
        for n in names:
            OPS[n] = fn
            if own_dtype:
                OWN_DTYPE.add(n)
        return fn
    return deco


def first(a: dict[str, Any]) -> Any:
    return next(iter(a.values()))


def items_read(cv: Converter, n: Any) -> set[int]:
    """The items of a multi-output node's result that a live node reads."""
    return {u.args[1] for u in n.users if u in cv.live}


def is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)

