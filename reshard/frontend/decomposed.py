"""ATen ops without a handler, converted through torch's decomposition of them.

**Law.**  A node whose op has no handler (``converter.OPS``) is replaced by torch's
decomposition of that op alone: the op, on stand-ins of its tensor operands' shapes and dtypes
(meta tensors; the device arguments of the graph then say the CPU, where the program's values
live) and its other arguments as they are, is exported (``torch.export``: a functional graph)
and decomposed by ``run_decompositions`` with a table holding only that op (its entry
in ``torch.export.default_decompositions()``: a CompositeImplicitAutograd op's own
decomposition, or else torch's registered one; for a core ATen op, which that table leaves
alone, its entry in ``torch._decomp.decomposition_table``), so every other op stays as the
converter knows it.  The decomposed graph is converted on the node's operands like a higher-order op's body
(``Converter.run_body``; its nodes cite the node's source line), each of its ops by its handler
or, without one, by this same fallback: ``mish -> softplus -> exp, log1p, where``.  A
decomposition that keeps the op (``sort``: none exists), that fails, or that holds an op the
converter cannot convert is a ``ConvertError`` naming the node's op ("unsupported op ...") and
what failed.  The decomposed graph of each (op, non-tensor arguments, operand shapes and
dtypes) is made once per process.

So ``decompose=True`` (the whole program in core ATen) is not needed to reach an op that only
its decomposition supports (``F.mse_loss``, ``softplus``, ``einsum``, ``cosine_similarity``,
``binary_cross_entropy_with_logits``, ``kl_div``, ``baddbmm``, ...), and the handlers keep the
ops they convert better than the decompositions do (``scaled_dot_product_attention``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._decomp import decomposition_table
from torch.utils import _pytree as pytree

from .converter import FALLBACK, ConvertError, Converter, opname

_CACHE: dict[Any, torch.fx.GraphModule | str] = {}
#: the meta a decomposed graph's nodes take from the node they stand for (errors cite its line)
_SITE = ("stack_trace", "nn_module_stack")


def _key(x: Any) -> Any:
    """A hashable stand-in of a non-tensor argument (its repr where it is not hashable)."""
    try:
        hash(x)
        return (type(x).__name__, x)
    except TypeError:
        return repr(x)


def _decomposition(node: torch.fx.Node) -> torch.fx.GraphModule | str:
    """The graph of ``node``'s op decomposed once, with the node's tensor operands as its
    placeholders in pytree order; or why there is none."""
    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    at = [i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node)]
    vals = [flat[i].meta.get("val") for i in at]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return "an operand is not a tensor"
    key = (node.target, tuple(_key(a) for i, a in enumerate(flat) if i not in at),
           tuple((tuple(v.shape), v.dtype) for v in vals), tuple(at), str(spec))
    if key not in _CACHE:
        _CACHE[key] = _trace(node.target, flat, spec, at, vals)
    return _CACHE[key]


def _trace(target: Any, flat: list[Any], spec: Any, at: list[int], vals: list[torch.Tensor]
           ) -> torch.fx.GraphModule | str:
    class One(torch.nn.Module):
        def forward(self, *ts: torch.Tensor) -> Any:
            args = list(flat)
            for i, t in zip(at, ts):
                args[i] = t
            a, k = pytree.tree_unflatten(args, spec)
            return target(*a, **k)

    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if op != target:
            del table[op]
    if target not in table and target in decomposition_table:  # a core ATen op: torch's own decomposition
        table[target] = decomposition_table[target]
    if target not in table:
        return "torch has no decomposition of it"
    try:
        stand_ins = tuple(torch.empty(v.shape, dtype=v.dtype, device="meta") for v in vals)
        ep = torch.export.export(One(), stand_ins).run_decompositions(table)
    except Exception as e:  # noqa: BLE001 - torch's decompositions fail in many ways
        return f"decomposing it failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if any(n.target == target for n in ep.graph.nodes):
        return "torch's decomposition keeps it"
    if len(ep.graph_signature.input_specs) != len(vals):
        return "torch's decomposition of it reads constants"
    for n in ep.graph.nodes:  # values it makes (scalar_tensor, full) live on the CPU, as the program's
        if n.kwargs.get("device") == torch.device("meta"):
            n.kwargs = {**n.kwargs, "device": torch.device("cpu")}
    return ep.graph_module


def _convert(cv: Converter, node: torch.fx.Node) -> Any:
    gm = _decomposition(node)
    if isinstance(gm, str):
        raise cv.fail(f"unsupported op {node.target} ({gm})")
    for n in gm.graph.nodes:
        n.meta.update({k: node.meta[k] for k in _SITE if k in node.meta})
    flat, _ = pytree.tree_flatten((node.args, node.kwargs))
    operands = [cv.env[a.name] for a in flat if isinstance(a, torch.fx.Node)]
    many = len(node.target._schema.returns) > 1
    used = {u.args[1] for u in node.users if u in cv.live} if many else {0}
    try:
        out = cv.run_body(gm, operands, used)
    except ConvertError as e:
        inner = str(e).removeprefix("from_torch: ").split(" (node ")[0]
        raise cv.fail(f"unsupported op {node.target}: converting torch's decomposition of it failed: {inner} "
                      f"({opname(e.target) if e.target is not None else 'no op'})") from None
    return out if many else out[0]


FALLBACK.append(_convert)
