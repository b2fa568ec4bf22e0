"""In-place writes to a program's inputs, parameters and buffers: a ``ReshardError``.

``torch.export``'s graph keeps in-place ATen ops (``add_``, ``copy_``, ``mul_``; those under
``torch.no_grad()`` in a ``wrap_with_set_grad_enabled`` subgraph), while the converter reads
every parameter, buffer and input as one value: a write to one (an optimizer step, a running
statistic, ``weight.data.mul_(...)`` inside ``forward``) would be lost.  The law checked: no op
whose schema marks an operand as written (``Tensor(a!)``) writes a placeholder, or a view of one
(an operand that the op's result aliases, ``Tensor(a)``: ``select``, ``view``, ``t``, ``split``'s
items, ...).  ``from_torch`` checks the exported graph before any decomposition (a functional
graph has lost the in-place ops and their source lines).  The error names the op, the
parameter, buffer or input and the source line.  Writes to intermediate values are lawful
(T5's ``shift_right`` fills a new tensor through slices of it) but the converter reads every
node as a value, so a write through a view, or a read of a tensor after an in-place op on it,
would be lost: ``functional`` rewrites such a program with torch's functionalization (each
write through a view a ``slice_scatter`` / ``select_scatter`` of the base, each in-place op
its functional form), unless every write is to a value nothing else aliases
(``local_writes``: a router's ``weights /= weights.sum()``, an accumulator's ``+=``): then
each write's node simply becomes its functional op, as torch.export already gives later reads
the write's node (functionalization traces the program again: 14 s of a 32-layer
Mixtral-8x7B's 26 s export).

A write through ``.data`` (``self.fc.weight.data.mul_(0.9)``) never reaches a graph: export
fails on it ("a fake tensor in the exported program constant's list").  ``data_write`` then
runs ``forward`` once more, eagerly, under a ``TorchFunctionMode`` that stops at the first
in-place op (a method named ``*_``, ``__setitem__``, ``__i*__``) on a tensor sharing storage
with a parameter, buffer or input, before it writes: the error names that op, what it writes
and the user's line.
"""

from __future__ import annotations

import inspect
import operator
import os
import traceback
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.overrides import TorchFunctionMode

from ..ir.errors import ReshardError
from .converter import opname, where

__all__ = ["check_state_writes", "data_write", "functional", "local_writes"]

_ADVICE = ("reshard reads parameters, buffers and inputs as values: update them outside the model (an "
           "optimizer step on the module's parameters), or compute a new tensor")


def check_state_writes(ep: Any) -> None:
    """Raise ``ReshardError`` when the exported program ``ep`` updates one of its inputs,
    parameters or buffers in place (module docstring)."""
    from torch.export.graph_signature import InputKind

    sig = ep.graph_signature
    kinds = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer", InputKind.USER_INPUT: "input"}
    what = {s.arg.name: f"{kinds[s.kind]} {s.target or s.arg.name!r}" for s in sig.input_specs
            if s.kind in kinds and hasattr(s.arg, "name")}
    gm = ep.graph_module
    _check_graph(gm, {n: what[n.name] for n in gm.graph.nodes if n.op == "placeholder" and n.name in what})


def _check_graph(gm: torch.fx.GraphModule, aliases: dict[torch.fx.Node, str]) -> None:
    """``aliases``: node -> the state it is (a view of); grows as views of it appear."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:  # an item of a list of views (split, unbind)
            if node.args[0] in aliases:
                aliases[node] = aliases[node.args[0]]
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            _check_subgraphs(gm, node, aliases)
            continue
        view = any(r.alias_info is not None for r in schema.returns)
        for arg, spec in _schema_operands(node, schema):
            if not isinstance(arg, torch.fx.Node) or arg not in aliases or spec.alias_info is None:
                continue
            if _written(spec):
                raise ReshardError(f"from_torch: in-place update of {aliases[arg]} by {opname(node.target)} "
                                   f"({where(node)}); {_ADVICE}")
            if view:
                aliases[node] = aliases[arg]


def _written(spec: Any) -> bool:
    """Does the op write this schema argument in place (``Tensor(a!)``)?"""
    return spec.alias_info is not None and spec.alias_info.is_write


#: in-place ops that resize or re-point a tensor's storage: the Fusion IR holds values, not storage
STORAGE_OPS = ("resize_", "resize_as_", "set_")


def _writes(gm: torch.fx.GraphModule) -> bool:
    """Does some op of ``gm`` or of a subgraph it holds write an operand in place
    (``Tensor(a!)``)?  Raises ``ReshardError`` at an op of ``STORAGE_OPS``."""
    found = False
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is not None and opname(node.target) in STORAGE_OPS:
            raise ReshardError(f"from_torch: unsupported op {node.target}: it resizes or re-points a tensor's "
                               f"storage, and the Fusion IR holds values, not storage ({where(node)})")
        if schema is not None and any(_written(a) for a in schema.arguments):
            found = True
        if node.op == "get_attr" and isinstance(sub := getattr(gm, str(node.target), None), torch.fx.GraphModule):
            found |= _writes(sub)
    return found


def functional(ep: Any) -> Any:
    """``ep`` itself when no op of it writes in place; ``ep`` with each write its functional
    form (``local_writes``) when every write is to a value nothing else aliases; else ``ep``
    functionalized (torch's ``run_decompositions`` with no decompositions: module docstring).
    Law: the program computes the same values; only the form of its writes changes.  Call
    after ``check_state_writes``."""
    if not _writes(ep.graph_module):
        return ep
    local = local_writes(ep.graph_module)
    if local is not None:
        for node, functional_op in local:
            node.target = functional_op
        ep.graph_module.recompile()
        return ep
    try:
        return ep.run_decompositions({})
    except Exception as e:  # whatever functionalization raises
        raise ReshardError(f"from_torch: the program writes tensors in place and torch could not rewrite it "
                           f"without (run_decompositions): {type(e).__name__}: {e}") from e


def local_writes(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, Any]] | None:
    """Each in-place node of ``gm`` with its functional overload (``div_.Tensor`` ->
    ``div.Tensor``) when every write can simply become its functional form; None when one
    cannot.  torch.export gives the value a write leaves the write's node: later reads of the
    tensor read that node.  So a write is local, and its functional form computes the same
    values, when it writes only its first operand, that operand is made by an op that returns
    no alias (not a view, not a placeholder; or by a write that is local itself), no other node
    reads the operand through an alias (a view of it, another write, an op without a schema,
    the graph's output), and the op has a functional overload.  A subgraph that writes makes
    the whole graph not local."""
    out: list[tuple[torch.fx.Node, Any]] = []
    local: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and isinstance(sub := getattr(gm, str(node.target), None), torch.fx.GraphModule) \
                and _writes(sub):
            return None
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        written = [(arg, spec) for arg, spec in _schema_operands(node, schema) if _written(spec)]
        if not written:
            continue
        (x, spec), = written if len(written) == 1 else ((None, None),)
        if spec is not schema.arguments[0] or not isinstance(x, torch.fx.Node) or not (x in local or _fresh(x)):
            return None
        if any(u is not node and _aliases(u, x) for u in x.users):
            return None
        functional_op = _functional_overload(node.target)
        if functional_op is None:
            return None
        out.append((node, functional_op))
        local.add(node)
    return out


def _fresh(x: torch.fx.Node) -> bool:
    """Is ``x`` made by an op that returns no alias of an operand (an item of such an op's
    results included)?"""
    if x.op != "call_function":
        return False
    if x.target is operator.getitem:
        return isinstance(x.args[0], torch.fx.Node) and _fresh(x.args[0])
    schema = getattr(x.target, "_schema", None)
    return schema is not None and all(r.alias_info is None for r in schema.returns)


def _aliases(user: torch.fx.Node, x: torch.fx.Node) -> bool:
    """Does ``user`` read ``x`` through an alias (a view's or a write's operand), or in a way
    not known (no schema: a higher-order op, the output)?"""
    if user.op != "call_function":
        return True
    schema = getattr(user.target, "_schema", None)
    if schema is None:
        return user.target is not operator.getitem
    return any(arg is x and spec.alias_info is not None for arg, spec in _schema_operands(user, schema))


def _functional_overload(target: Any) -> Any:
    """``aten.<name>_.<overload>``'s ``aten.<name>.<overload>``, or None."""
    schema = target._schema
    name, overload = schema.name.split("::")[-1], schema.overload_name or "default"
    if not name.endswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    return None if packet is None else getattr(packet, overload, None)


def _schema_operands(node: torch.fx.Node, schema: Any) -> list[tuple[Any, Any]]:
    """(argument value, schema argument) for the node's positional and keyword arguments."""
    out = list(zip(node.args, schema.arguments))
    by_name = {a.name: a for a in schema.arguments}
    out += [(v, by_name[k]) for k, v in node.kwargs.items() if k in by_name]
    return out


def _check_subgraphs(gm: torch.fx.GraphModule, node: torch.fx.Node, aliases: dict[torch.fx.Node, str]) -> None:
    """A higher-order op (``wrap_with_set_grad_enabled(enabled, submod, *operands)``,
    ``wrap_with_autocast``, ...): the operands after its subgraph are the subgraph's
    placeholders, in order."""
    args = list(node.args)
    for i, a in enumerate(args):
        if isinstance(a, torch.fx.Node) and a.op == "get_attr":
            sub = getattr(gm, str(a.target), None)
            if not isinstance(sub, torch.fx.GraphModule):
                continue
            operands = [x for x in args[i + 1:] if isinstance(x, torch.fx.Node)]
            inner = [n for n in sub.graph.nodes if n.op == "placeholder"]
            _check_graph(sub, {p: aliases[x] for p, x in zip(inner, operands) if x in aliases})


#: torch.export's failure on a write through ``.data`` (an untraceable update of a parameter)
DATA_WRITE = "fake tensor in the exported program constant's list"


class _StopAtWrite(TorchFunctionMode):
    """Raise ``ReshardError`` at the first in-place op on a tensor whose storage is one of
    ``owners`` (storage -> what it is), before it runs."""

    def __init__(self, owners: dict[int, str]) -> None:
        super().__init__()
        self.owners = owners

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        in_place = (name.endswith("_") and not name.startswith("__")) or name == "__setitem__" or \
            (name.startswith("__i") and name.endswith("__"))
        target = args[0] if args else None
        if in_place and isinstance(target, torch.Tensor) and _storage(target) in self.owners:
            raise ReshardError(f"from_torch: in-place update of {self.owners[_storage(target)]} by {name}"
                               f"{_user_line()}; {_ADVICE}")
        return func(*args, **(kwargs or {}))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _user_line() -> str:
    """`` at file:line (code)`` of the innermost frame outside torch and this module."""
    skip = (os.path.dirname(torch.__file__) + os.sep, __file__)
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(skip[0]) and frame.filename != skip[1]:
            return f" at {frame.filename}:{frame.lineno}" + (f" ({frame.line.strip()})" if frame.line else "")
    return ""


def data_write(module: torch.nn.Module, args: Sequence[torch.Tensor]) -> ReshardError | None:
    """The error for ``module(*args)`` writing a parameter, buffer or input in place where
    ``torch.export`` cannot see it (module docstring); None when the forward writes none."""
    owners = {_storage(t): f"buffer {n!r}" for n, t in module.named_buffers()}
    owners.update({_storage(p): f"parameter {n!r}" for n, p in module.named_parameters()})
    try:
        names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        names = []
    for i, x in enumerate(args):
        owners.setdefault(_storage(x), f"input {names[i] if i < len(names) else i!r}")
    try:
        with torch.no_grad(), _StopAtWrite(owners):
            module(*args)
    except ReshardError as e:
        return e
    except Exception:  # noqa: BLE001 - the forward failing for another reason: no finding
        return None
    return None
