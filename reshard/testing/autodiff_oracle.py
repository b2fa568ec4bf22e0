"""Shared helpers of the autodiff tests (``tests/*/test_*autodiff*.py``): a weighted loss over a
Fusion's outputs, torch.autograd's gradients through the ops' torch references (the oracle),
and the check that ``joint``'s gradients (reference, or a plan's simulation) match them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

import reshard as rs
from reshard.passes.autodiff import Joint, joint
from reshard.ir.fusion import DTYPES, Tensor
from reshard.ir.interpreter import apply_op


def weighted_loss(f: rs.Fusion, outs: Sequence[Tensor]) -> Tensor:
    """``sum_k sum(outs[k] * w_k)`` as a (1,) tensor on ``outs[0]``'s mesh, the weights ``w_k``
    new replicated inputs ``_lw<k>`` (fed by ``loss_weights``); each term is moved to that mesh
    first when it lives on another."""
    total = None
    for k, t in enumerate(outs):
        w = f.input(f"_lw{k}", t.shape, t.dtype, t.mesh, [rs.Replicate()] * t.mesh.ndim)
        prod = f.reshape(f.mul(t, w), (1, t.numel))
        term = f.reshape(f.sum(prod, 1), (1,))
        if term.mesh != outs[0].mesh:
            term = f.redistribute(term, [rs.Replicate()] * term.mesh.ndim, mesh=outs[0].mesh)
        total = term if total is None else f.add(total, term)
    return total


def loss_weights(f: rs.Fusion, seed: int) -> dict[str, torch.Tensor]:
    """Random values for ``weighted_loss``'s weight inputs."""
    gen = torch.Generator().manual_seed(seed)
    return {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=gen, dtype=torch.float64)
            .to(DTYPES[f.tensors[i].dtype]) for i in f.inputs if f.tensors[i].name.startswith("_lw")}


def torch_grads(f: rs.Fusion, loss: Tensor, inputs: dict[str, torch.Tensor],
                wrt: Sequence[str]) -> list[torch.Tensor]:
    """torch.autograd.grad of ``loss`` by the inputs ``wrt``, through each op's torch
    ``reference`` (zeros for an input the loss does not depend on, or only through ``detach``)."""
    env: dict[int, torch.Tensor] = {}
    leaves: dict[str, torch.Tensor] = {}
    for op in f.ops:
        t = f.tensors[op.output]
        if op.kind == "input":
            env[t.id] = inputs[t.name].to(DTYPES[t.dtype]).detach().requires_grad_(t.name in wrt)
            leaves[t.name] = env[t.id]
        else:
            env[t.id] = apply_op(op, [env[i] for i in op.inputs], t.dtype)
    ins = [leaves[n] for n in wrt]
    if not env[loss.id].requires_grad:  # (the loss reads the inputs through ``detach`` only)
        return [torch.zeros_like(x) for x in ins]
    gs = torch.autograd.grad(env[loss.id].sum(), ins, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(ins, gs)]


def check_joint(f: rs.Fusion, loss: Tensor, inputs: dict[str, torch.Tensor], wrt: Sequence[str] | None = None,
                *, plan: bool = False, rtol: float = 1e-9, atol: float = 1e-9) -> Joint:
    """``joint(f, loss, wrt)``'s gradients (run by ``run_reference``, and with ``plan`` by
    ``optimize(...).simulate``) equal torch.autograd's; the forward outputs equal ``f``'s."""
    j = joint(f, loss, wrt)
    names = list(j.grads)
    want = torch_grads(f, loss, inputs, names)
    runs = [rs.run_reference(j.fusion, inputs)]
    if plan:
        runs.append(rs.optimize(j.fusion).simulate(inputs, generator=torch.Generator().manual_seed(7)))
    fwd = rs.run_reference(f, inputs)
    for outs in runs:
        assert len(outs) == len(fwd) + len(names)
        for got, ref in zip(outs, fwd):
            torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, equal_nan=True)
        for name, got, ref in zip(names, outs[len(fwd):], want):
            torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, msg=lambda m: f"grad of {name}: {m}")
    return j
