"""The lookups' vjps (``Embedding.vjp``, ``Pick.vjp`` in ``reshard.ir.ops.lookup``): built into a
Fusion by calling the hook, planned with vocab-parallel placements (the gradient at the
parameter's / logits' placement) and simulated against torch.autograd; the vocab-sharded
gradients move nothing, on even and uneven vocabularies."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard import Replicate, Shard
from reshard.ir.ops import op_kind
from tests import programs as P

M2 = rs.DeviceMesh([0, 1], ("tp",))
M4 = rs.DeviceMesh([0, 1, 2, 3], ("tp",))


def vjp_of(f: rs.Fusion, y: rs.Tensor, g: rs.Tensor) -> list:
    """The vjp of the op that produced ``y`` for the gradient ``g`` (forward values read as they
    are: ``saved`` is the identity)."""
    op = f.ops[f.producer[y.id]]
    xs = [f.tensors[i] for i in op.inputs]
    return op_kind(op.kind).vjp(f, op, xs, y, g, lambda t: t)


def simulate(f: rs.Fusion, inputs: dict[str, torch.Tensor]) -> tuple[rs.Plan, tuple[torch.Tensor, ...]]:
    """The plan and its simulated outputs, checked against the reference."""
    plan = rs.optimize(f)
    P.assert_plan_matches_reference(plan, f, inputs)
    return plan, plan.simulate(inputs)


@pytest.mark.parametrize("mesh,vocab", [(M2, 64), (M2, 11), (M4, 13)], ids=["64on2", "11on2", "13on4"])
def test_embedding_vjp_vocab_parallel(mesh, vocab):
    """d weight of a vocab-parallel embedding, at the weight's Shard(0): the masked local scatter
    of the whole g (0 bytes); ids get no gradient."""
    f = rs.Fusion()
    w = f.input("w", (vocab, 8), "float32", mesh, [Shard(0)])
    ids = f.input("ids", (2, 5), "int64", mesh, [Replicate()])
    g = f.input("g", (2, 5, 8), "float32", mesh, [Replicate()])
    dw, dids = vjp_of(f, f.embedding(w, ids), g)
    assert dids is None
    f.output(dw, [Shard(0)])
    gen = torch.Generator().manual_seed(0)
    inputs = {"w": torch.randn(vocab, 8, generator=gen), "ids": torch.randint(0, vocab, (2, 5), generator=gen),
              "g": torch.randn(2, 5, 8, generator=gen)}
    inputs["ids"][0, :3] = 2  # duplicate ids accumulate
    plan, (got,) = simulate(f, inputs)
    w_t = inputs["w"].clone().requires_grad_()
    torch.nn.functional.embedding(inputs["ids"], w_t).backward(inputs["g"])
    torch.testing.assert_close(got, w_t.grad)
    assert plan.comm_bytes == 0, plan.explain()


@pytest.mark.parametrize("mesh,vocab", [(M2, 64), (M2, 11), (M4, 13)], ids=["64on2", "11on2", "13on4"])
def test_pick_vjp_vocab_parallel(mesh, vocab):
    """d x of the target-logit pick of vocab-sharded logits, at x's Shard(1): 0 bytes; the index
    gets no gradient."""
    f = rs.Fusion()
    x = f.input("x", (6, vocab), "float32", mesh, [Shard(1)])
    idx = f.input("idx", (6,), "int64", mesh, [Replicate()])
    g = f.input("g", (6,), "float32", mesh, [Replicate()])
    dx, didx = vjp_of(f, f.pick(x, idx), g)
    assert didx is None
    f.output(dx, [Shard(1)])
    gen = torch.Generator().manual_seed(1)
    inputs = {"x": torch.randn(6, vocab, generator=gen), "idx": torch.randint(0, vocab, (6,), generator=gen),
              "g": torch.randn(6, generator=gen)}
    plan, (got,) = simulate(f, inputs)
    x_t = inputs["x"].clone().requires_grad_()
    torch.gather(x_t, -1, inputs["idx"][:, None])[:, 0].backward(inputs["g"])
    torch.testing.assert_close(got, x_t.grad)
    assert plan.comm_bytes == 0, plan.explain()
