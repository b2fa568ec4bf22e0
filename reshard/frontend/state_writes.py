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
its functional form).

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

__all__ = ["check_state_writes", "data_write", "functional"]

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
    """``ep`` itself when no op of it writes in place, else ``ep`` functionalized (torch's
    ``run_decompositions`` with no decompositions: module docstring).  Law: the program computes
    the same values; only the form of its writes changes.  Call after ``check_state_writes``."""
    if not _writes(ep.graph_module):
        return ep
    try:
        return ep.run_decompositions({})
    except Exception as e:  # whatever functionalization raises
        raise ReshardError(f"from_torch: the program writes tensors in place and torch could not rewrite it "
                           f"without (run_decompositions): {type(e).__name__}: {e}") from e


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
