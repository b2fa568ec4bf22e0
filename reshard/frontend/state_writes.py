"""In-place writes to a program's inputs, parameters and buffers: a ``ReshardError``.

``torch.export``'s graph keeps in-place ATen ops (``add_``, ``copy_``, ``mul_``; those under
``torch.no_grad()`` in a ``wrap_with_set_grad_enabled`` subgraph), while the converter reads
every parameter, buffer and input as one value: a write to one (an optimizer step, a running
statistic, ``weight.data.mul_(...)`` inside ``forward``) would be lost.  The law checked: no op
whose schema marks an operand as written (``Tensor(a!)``) writes a placeholder, or a view of one
(an operand that the op's result aliases, ``Tensor(a)``: ``select``, ``view``, ``t``, ``split``'s
items, ...).  ``from_torch`` checks the exported graph before any decomposition (a functional
graph has lost the in-place ops and their source lines).  The error names the op, the
parameter, buffer or input and the source line.  Writes to intermediate values are not
checked here: the converter rejects in-place ops it reaches.
"""

from __future__ import annotations

import operator
from typing import Any

import torch.fx

from ..ir.errors import ReshardError
from .converter import opname, where

__all__ = ["check_state_writes"]

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
            if spec.alias_info.is_write:
                raise ReshardError(f"from_torch: in-place update of {aliases[arg]} by {opname(node.target)} "
                                   f"({where(node)}); {_ADVICE}")
            if view:
                aliases[node] = aliases[arg]


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
