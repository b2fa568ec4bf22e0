"""Constant folding: graph nodes that depend on no user input and no parameter are evaluated
at conversion time.

**Law.**  A value is *constant* when it is a lifted tensor constant, a non-persistent buffer
(rope's ``inv_freq``, BERT's ``position_ids``), a Python scalar, or the result of a
deterministic ATen op whose every tensor argument is constant (ops with no tensor argument,
such as ``arange`` or ``full``, included), or of an op that reads only the shape and dtype of
its operand (``SHAPE_ONLY``: ``full_like``, ``new_ones``, ...; its operand may be any value).  A constant node is
evaluated once, by running its ATen op on the constants' values, and never becomes a Fusion
op: the program computes the same values as the module for every user input and parameter,
since a constant node reads neither.  Where a non-constant node reads a constant, the value
enters the Fusion as a replicated input (``_c<N>``, supplied by ``TorchProgram.inputs``); a
0-dim constant enters as a Python scalar.  Ops that draw random numbers
(``nondeterministic_seeded``) are never folded.  Hugging Face's causal-mask and rotary
cos/sin code folds this way.

**Empty values.**  A node whose result has a size-0 dim is constant too, whatever it reads: a
tensor with no elements is determined by its shape and dtype alone (``empty_result``).  So an
empty value never becomes a Fusion value (the IR holds positive sizes only): ``cat`` drops it
as an operand, an op reading only constants folds (a sum over an empty dim is zeros, a product
of a ``[m, 0]`` and a ``[0, n]`` block is zeros), and where a converted op would have to take
it as an operand, ``Converter.constant`` refuses it by name.

On the meta device the constants are meta tensors (shapes only): every device argument of a
folded op is the meta device, so an op that would move a value to another device keeps it
on the meta device.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx


def is_folded(v: Any) -> bool:
    """Is ``v`` (a graph node's value) a constant: a torch tensor, or a tuple of them (None
    for results nothing reads)?  Fusion tensors and tuples of them are not."""
    if isinstance(v, (list, tuple)):
        return any(isinstance(x, torch.Tensor) for x in v) and all(x is None or isinstance(x, torch.Tensor)
                                                                   for x in v)
    return isinstance(v, torch.Tensor)


#: ops whose result depends on their tensor operand's shape and dtype only
SHAPE_ONLY = frozenset({"full_like", "zeros_like", "ones_like", "new_full", "new_zeros", "new_ones"})


def _opname(target: Any) -> str:
    schema = getattr(target, "_schema", None)
    return schema.name.split("::")[-1] if schema is not None else ""


def foldable(node: torch.fx.Node, env: dict[str, Any]) -> bool:
    """Does ``node`` compute a constant (the law above)?"""
    if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
        return False
    if _opname(node.target) in SHAPE_ONLY:
        return True
    reads: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), reads.append)
    if not reads:
        return hasattr(node.target, "_schema")  # arange, full, scalar_tensor, ...
    return all(is_folded(env.get(a.name)) for a in reads)


def empty_result(node: torch.fx.Node, on_meta: bool) -> torch.Tensor | None:
    """The value of ``node`` when its result is one tensor with no elements (see "Empty
    values"): the empty tensor of its shape and dtype; else None."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(type(d) is int for d in val.shape) or 0 not in val.shape:
        return None  # (a data-dependent size is not known to be 0)
    return torch.empty(tuple(val.shape), dtype=val.dtype, device="meta" if on_meta else "cpu")


def evaluate(node: torch.fx.Node, env: dict[str, Any], on_meta: bool) -> Any:
    """Run ``node``'s op on the constants' values (devices: meta when ``on_meta``); the
    operand of a ``SHAPE_ONLY`` op that is not a constant is a stand-in of its shape and dtype."""
    def resolve(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            v = env[a.name]
            if is_folded(v):
                return v
            val = a.meta["val"]
            return torch.zeros(val.shape, dtype=val.dtype, device="meta" if on_meta else "cpu")
        if isinstance(a, (list, tuple)):
            return type(a)(resolve(x) for x in a)
        if isinstance(a, dict):
            return {k: resolve(v) for k, v in a.items()}
        if on_meta and isinstance(a, torch.device):
            return torch.device("meta")
        return a
    args, kwargs = resolve(node.args), resolve(node.kwargs)
    if on_meta and "device" in kwargs:
        kwargs["device"] = torch.device("meta")
    with torch.no_grad():
        return node.target(*args, **kwargs)
