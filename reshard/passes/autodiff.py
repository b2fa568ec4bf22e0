"""Reverse-mode autodiff over the Fusion IR: ``joint(fusion, loss)`` is one Fusion computing the
forward and the gradients of the loss, planned by ``optimize`` in one e-graph.

The law.  For ``loss = L(x_1, .., x_n)`` built from ops ``y = op(a_1, .., a_k)``, the gradient
``dL/dt`` of every value ``t`` is the sum over its uses of the vector-Jacobian products of the
ops that read it, seeded with ``dL/dL = 1`` (chain rule):

    dL/dt = sum over (op, slot) with a_slot = t of op.vjp(a, y, dL/dy)[slot]

Each op kind declares its vjp in its own module (``OpKind.vjp``); ``joint`` visits the ops in
reverse topological order (the Fusion's op order reversed, so every use of a value is summed in
(``add``) before its producer's vjp reads its gradient).  A vjp reads forward values only
through ``saved(t)`` (``ops.gradient``: the forward / backward boundary, one per value), so the
values the plan keeps across the passes are the ``saved`` results.  A value that only lays its
operand out again (``OpKind.saved_through``: a broadcast, a view in torch) is not kept: its
operand is, and the backward pass rebuilds it, ``saved(broadcast(x)) = broadcast(saved(x))``
(fewer bytes kept, and no broadcast materialized for the boundary: the fused chains that read
a broadcast read it through strides).

Which values get gradients: float values that depend on a ``wrt`` input and that the loss
depends on.  A vjp's None (int / bool operands, ``detach``, comparisons) stops the flow.  Ops
that a vjp built but no gradient output reads (the gradient of a frozen weight, of a detached
max) are left out of the joint Fusion.

The joint Fusion: the source's tensors and ops with the same ids, then the backward ops; its
outputs are the source's outputs, then one gradient per ``wrt`` input named ``grad.<input>``,
at ``grad_placements[input]`` or else at the input's own sharding with Partial axes made
Replicate (replicated when the input's sharding is open).  An input the loss does not depend
on gets zeros (the seed times 0, broadcast).  The seed (``grad_seed(loss)``) is named
``grad.<loss>``, saved values ``saved.<value>``, the gradient of a value ``grad.<value>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..ir.dtypes import dtype_kind
from ..ir.errors import ReshardError
from ..ir.fusion import Fusion, Tensor
from ..ir.names import grad_name, saved_name
from ..ir.ops import op_kind
from ..ir.sharding import Partial, Replicate, ShardingSpec, TensorSharding


@dataclass(frozen=True)
class Joint:
    """A Fusion computing the forward and the loss's gradients (``joint``)."""

    #: the forward ops (same tensor ids as the source), then the backward ops
    fusion: Fusion
    #: the loss tensor's name
    loss: str
    #: input name -> the name of its gradient output tensor (``grad.<input>``)
    grads: dict[str, str]


def joint(fusion: Fusion, loss: Tensor, wrt: Sequence[str] | None = None, *,
          grad_placements: Mapping[str, ShardingSpec] | None = None) -> Joint:
    """The forward of ``fusion`` and the gradients of ``loss`` (a float tensor of one element)
    with respect to the inputs named ``wrt`` (default: every float input), in one Fusion (the
    module docstring states the law, the outputs and the names)."""
    _check_loss(fusion, loss)
    params = _wrt(fusion, wrt)
    places = dict(grad_placements or {})
    unknown = sorted(set(places) - {p.name for p in params})
    if unknown:
        raise ReshardError(f"joint: grad_placements names {unknown}, which are not differentiated inputs "
                           f"(wrt: {[p.name for p in params]})")
    work = fusion.copy()
    finals, names = _backward(work, fusion, loss, params)
    jf = fusion.copy()
    copied = _copy_live(work, jf, len(fusion.tensors), finals, names)
    grads: dict[str, str] = {}
    for p in params:
        g = copied[finals[p.id].id]
        if g.name != grad_name(p.name):  # one gradient tensor shared by several inputs: a view each
            g = jf.reshape(g, g.shape, name=grad_name(p.name))
        jf.output(g, places[p.name] if p.name in places else _own_placement(p))
        grads[p.name] = g.name
    return Joint(jf, loss.name, grads)


def _check_loss(fusion: Fusion, loss: Tensor) -> None:
    if not isinstance(loss, Tensor) or loss.id >= len(fusion.tensors) or fusion.tensors[loss.id] is not loss:
        raise ReshardError(f"joint: loss {loss!r} is not a tensor of this Fusion")
    if dtype_kind(loss.dtype) != "float":
        raise ReshardError(f"joint: loss {loss!r} has dtype {loss.dtype}; a loss must be a float tensor")
    if loss.numel != 1:
        raise ReshardError(f"joint: loss {loss!r} has {loss.numel} elements; a loss must have one (shape () or (1,))")


def _wrt(fusion: Fusion, wrt: Sequence[str] | None) -> list[Tensor]:
    """The inputs to differentiate, in ``wrt``'s order (default: every float input)."""
    inputs = {fusion.tensors[i].name: fusion.tensors[i] for i in fusion.inputs}
    if wrt is None:
        return [t for t in inputs.values() if dtype_kind(t.dtype) == "float"]
    if isinstance(wrt, str) or not isinstance(wrt, Sequence):
        raise ReshardError(f"joint: wrt must be a sequence of input names, got {wrt!r}")
    out = []
    for name in wrt:
        if name not in inputs:
            raise ReshardError(f"joint: wrt names {name!r}, which is not an input of the Fusion "
                               f"(inputs: {sorted(inputs)})")
        if dtype_kind(inputs[name].dtype) != "float":
            raise ReshardError(f"joint: input {inputs[name]!r} is not a float tensor; it has no gradient")
        if inputs[name] in out:
            raise ReshardError(f"joint: wrt names input {name!r} twice")
        out.append(inputs[name])
    return out


def _own_placement(p: Tensor) -> TensorSharding | list[Replicate]:
    """A parameter's placement with its Partial axes made Replicate (open: replicated)."""
    if p.sharding is None:
        return [Replicate()] * p.mesh.ndim
    return replace(p.sharding, axes=tuple(Replicate() if isinstance(a, Partial) else a for a in p.sharding.axes))


def _flows(fusion: Fusion, loss: Tensor, params: list[Tensor]) -> set[int]:
    """The float values that depend on a parameter (not only through an op that stops the
    gradient, ``detach``) and that the loss depends on."""
    dep = {p.id for p in params}
    for op in fusion.ops:
        if not op_kind(op.kind).stops_gradient and any(i in dep for i in op.inputs):
            dep.add(op.output)
    used = {loss.id}
    for op in reversed(fusion.ops):
        if op.output in used:
            used.update(op.inputs)
    return {t for t in dep & used if dtype_kind(fusion.tensors[t].dtype) == "float"}


def _backward(work: Fusion, fusion: Fusion, loss: Tensor,
              params: list[Tensor]) -> tuple[dict[int, Tensor], dict[int, str]]:
    """Build every gradient in ``work`` (a forward copy): each parameter's final gradient (by
    input id), and names for the backward tensors that hold a value's gradient (by tensor id)."""
    flows = _flows(fusion, loss, params)
    seed = work.grad_seed(loss, name=grad_name(loss.name))
    grad: dict[int, Tensor] = {loss.id: seed}
    names = {seed.id: seed.name}
    kept: dict[int, Tensor] = {}

    def saved(t: Tensor) -> Tensor:
        if t.id not in kept:
            op = fusion.ops[fusion.producer[t.id]]
            if op_kind(op.kind).saved_through:  # the operand kept, the result rebuilt from it
                out = work._new(t.shape, t.dtype, t.mesh, saved_name(t.name))
                kept[t.id] = work._op(op.kind, [saved(work.tensors[op.inputs[0]])], out, **op.attrs)
            else:
                kept[t.id] = work.saved(t, name=saved_name(t.name))
        return kept[t.id]

    for op in reversed(fusion.ops):
        g = grad.get(op.output)
        if g is None or not any(i in flows for i in op.inputs):
            continue
        out = work.tensors[op.output]
        names.setdefault(g.id, grad_name(out.name))
        xs = [work.tensors[i] for i in op.inputs]
        try:
            gs = op_kind(op.kind).vjp(work, op, xs, out, g, saved)
        except ReshardError as e:
            raise ReshardError(f"joint: {e} (the op computing {out!r})") from None
        if len(gs) != len(xs):
            raise ReshardError(f"internal: the vjp of op {op.kind} gave {len(gs)} gradients for {len(xs)} operands")
        for i, (x, gx) in enumerate(zip(xs, gs)):
            if gx is None and x.id in flows and i in op_kind(op.kind).grad_free:
                raise ReshardError(f"joint: op {op.kind} gives no gradient for its operand {i} ({x!r}), but the "
                                   f"loss depends on it through a trained input (the op computing {out!r})")
            if gx is None or x.id not in flows:
                continue
            if gx.shape != x.shape or gx.dtype != x.dtype:
                raise ReshardError(f"internal: the vjp of op {op.kind} gave {gx!r} as the gradient of {x!r}")
            grad[x.id] = work.add(grad[x.id], gx) if x.id in grad else gx
    finals = {}
    for p in params:
        finals[p.id] = grad[p.id] if p.id in grad else _zeros(work, seed, p)
        names[finals[p.id].id] = grad_name(p.name)  # an input's name wins a shared tensor
    return finals, names


def _zeros(f: Fusion, seed: Tensor, like: Tensor) -> Tensor:
    """Zeros shaped like ``like``: the seed (ones) times 0, on ``like``'s mesh, broadcast (an
    input the loss does not depend on)."""
    z = f.scale(f.reshape(seed, ()) if seed.shape else seed, 0.0)
    if z.mesh != like.mesh:
        z = f.redistribute(z, [Replicate()] * like.mesh.ndim, mesh=like.mesh)
    if z.dtype != like.dtype:
        z = f.cast(z, like.dtype)
    return f.broadcast(z, like.shape, (), name=grad_name(like.name))


def _copy_live(work: Fusion, jf: Fusion, n: int, finals: dict[int, Tensor], names: dict[int, str]) -> dict[int, Tensor]:
    """Append to ``jf`` the backward ops of ``work`` (tensors from id ``n`` on) that the final
    gradients read, in order, named by ``names`` (else as they were named, or ``t<N>``);
    returns ``work``'s backward tensor ids -> their copies."""
    live: set[int] = set()
    stack = [g.id for g in finals.values()]
    while stack:
        t = stack.pop()
        if t >= n and t not in live:
            live.add(t)
            stack.extend(work.ops[work.producer[t]].inputs)
    copies: dict[int, Tensor] = {}
    for op in work.ops:
        if op.output < n or op.output not in live:
            continue
        t = work.tensors[op.output]
        name = names.get(t.id) or (None if t.name == f"t{t.id}" else t.name)
        new = jf._new(t.shape, t.dtype, t.mesh, name, t.sharding)
        jf._op(op.kind, [copies.get(i) or jf.tensors[i] for i in op.inputs], new, **op.attrs)
        copies[t.id] = new
    return copies
