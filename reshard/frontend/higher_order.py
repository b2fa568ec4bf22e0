"""torch.export's wrapper higher-order ops, inlined.

``torch.export`` records a region of ``forward`` run under a grad mode or an autocast state
(``with torch.no_grad():``, ``torch.set_grad_enabled(False)``, ``torch.autocast(...,
enabled=False)``: Hugging Face's rotary embedding) as one higher-order op whose body is a
submodule reached by a ``get_attr`` node:

    wrap_with_set_grad_enabled(enabled, body, *operands)
    wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *operands)

and its results as ``getitem``s of the op's tuple.  **Law.**  The op's results are the body's
outputs on the operands: the converter converts the body's graph, its placeholders bound to the
operands' values (Fusion tensors, constants, scalars), in an environment of its own
(``Converter.run_body``); only the outputs some live ``getitem`` reads are converted.  Each
node converts at the dtype torch recorded for it, which under autocast is the autocast dtype (a
handler casts its operands to its result's dtype, as autocast does).  A grad-disabled region's
results carry no gradient: when converting for training they are read through ``f.detach``
(torch's tensors computed under ``no_grad`` do not require grad).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from ..ir.fusion import Tensor
from .converter import HIGHER_ORDER, Converter


def _inline(cv: Converter, node: torch.fx.Node, at: int, grad: bool) -> tuple[Any, ...]:
    """The results of ``node``'s body (its argument ``at``) on the arguments after it; read
    through ``f.detach`` when converting for training and ``grad`` is False (module docstring)."""
    body = cv.env.get(node.args[at].name) if isinstance(node.args[at], torch.fx.Node) else None
    if not isinstance(body, torch.fx.GraphModule):
        raise cv.fail(f"{node.target}: its body (argument {at}) is not a graph module")
    operands = [cv.env[a.name] if isinstance(a, torch.fx.Node) else a for a in node.args[at + 1:]]
    used = {u.args[1] for u in node.users if u.target is operator.getitem and u in cv.live}
    results = cv.run_body(body, operands, used)
    if cv.train and not grad:
        results = tuple(cv.f.detach(r, name=cv.unique(f"{r.name}.detach")) if isinstance(r, Tensor) else r
                        for r in results)
    return results


def _set_grad_enabled(cv: Converter, node: torch.fx.Node) -> tuple[Any, ...]:
    """``wrap_with_set_grad_enabled(enabled, body, *operands)``."""
    return _inline(cv, node, 1, grad=bool(node.args[0]))


def _autocast(cv: Converter, node: torch.fx.Node) -> tuple[Any, ...]:
    """``wrap_with_autocast(device_type, dtype, enabled, cache_enabled, body, *operands)``."""
    return _inline(cv, node, 4, grad=True)


HIGHER_ORDER["wrap_with_set_grad_enabled"] = _set_grad_enabled
HIGHER_ORDER["wrap_with_autocast"] = _autocast
