"""The lookups' vjps (``Embedding.vjp``, ``Pick.vjp`` in ``reshard.ir.ops.lookup``): built into a
Fusion by calling the hook, and through ``passes.autodiff.joint`` (a cross entropy over an
embedding), planned with vocab-parallel placements (the gradient at the parameter's / logits'
placement) and simulated against torch.autograd; the vocab-sharded gradients move nothing, on
even and uneven vocabularies."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard import Replicate, Shard
from reshard.frontend.converter import OPS, Converter
from reshard.passes.autodiff import joint
from reshard.ir.ops import op_kind
from reshard.testing import programs as P
from reshard.testing.autodiff_oracle import check_joint, loss_weights, weighted_loss

M2 = rs.DeviceMesh([0, 1], ("tp",))
M4 = rs.DeviceMesh([0, 1, 2, 3], ("tp",))
M2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


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


def test_embedding_vjp_keeps_padding_idx():
    """An embedding with ``padding_idx`` (nn.Embedding's): its vjp leaves that row's gradient 0,
    as torch does."""
    f = rs.Fusion()
    w = f.input("w", (16, 4), "float32", M2, [Shard(0)])
    ids = f.input("ids", (8,), "int64", M2, [Replicate()])
    g = f.input("g", (8, 4), "float32", M2, [Replicate()])
    dw, _ = vjp_of(f, f.embedding(w, ids, padding_idx=3), g)
    f.output(dw, [Shard(0)])
    gen = torch.Generator().manual_seed(2)
    inputs = {"w": torch.randn(16, 4, generator=gen), "ids": torch.tensor([3, 1, 3, 0, 15, 3, 7, 1]),
              "g": torch.randn(8, 4, generator=gen)}
    _, (got,) = simulate(f, inputs)
    w_t = inputs["w"].clone().requires_grad_()
    torch.nn.functional.embedding(inputs["ids"], w_t, padding_idx=3).backward(inputs["g"])
    torch.testing.assert_close(got, w_t.grad)


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


@pytest.mark.parametrize("kind,placements", [("unpick", [Shard(0)]), ("unpick", [Replicate()]),
                                             ("embedding_grad", [Shard(1)]), ("embedding_grad", [Replicate()])])
def test_scatter_vjps_match_autograd(kind, placements):
    """The scatters' own gradients (a scatter's result differentiated: a second derivative, or
    ``embedding_dense_backward`` called in a forward): ``pick`` / ``embedding`` of the result's
    gradient at the indices, through the reference and a plan, against torch.autograd (duplicate
    indices included)."""
    f = rs.Fusion()
    idx = f.input("idx", (6,), "int64", M2, [Replicate()])
    gen = torch.Generator().manual_seed(4)
    if kind == "unpick":
        g = f.input("g", (6,), "float64", M2, placements)
        y = f.unpick(g, idx, 5)
        values = {"g": torch.randn(6, generator=gen, dtype=torch.float64)}
    else:
        g = f.input("g", (6, 3), "float64", M2, placements)
        y = f.embedding_grad(g, idx, 5)
        values = {"g": torch.randn(6, 3, generator=gen, dtype=torch.float64)}
    values["idx"] = torch.tensor([4, 0, 4, 2, 4, 1])
    check_joint(f, weighted_loss(f, [y]), {**values, **loss_weights(f, 1)}, ["g"], plan=True)


def test_embedding_grad_with_padding_idx_has_no_backward():
    f = rs.Fusion()
    g = f.input("g", (6, 3), "float64", M2, [Replicate()])
    idx = f.input("idx", (6,), "int64", M2, [Replicate()])
    y = f.embedding_grad(g, idx, 5, padding_idx=0)
    with pytest.raises(rs.ReshardError, match="no backward for op embedding_grad with a padding_idx"):
        joint(f, weighted_loss(f, [y]), ["g"])


# ---- through joint: cross entropy + embedding, vocab-parallel ---------------------------------

def ce_embedding(mesh: rs.DeviceMesh, vocab: int, b: int = 64, h: int = 64) -> tuple[rs.Fusion, rs.Tensor]:
    """loss = mean cross entropy of ``tanh(embedding(w, ids)) @ head`` against ``labels``, written
    as the training converter writes it (logsumexp with a detached max, minus the target logit's
    ``pick``), with Megatron's vocab-parallel placements on the last (tp) mesh axis: ``w``
    Shard(0), ``head`` Shard(1); on a 2-D mesh the tokens sharded over the first (dp)."""
    f = rs.Fusion()
    rep = [Replicate()] * (mesh.ndim - 1)
    tokens = [Shard(0)] + rep[1:] + [Replicate()] if mesh.ndim > 1 else [Replicate()]
    w = f.input("w", (vocab, h), "float32", mesh, rep + [Shard(0)])
    head = f.input("head", (h, vocab), "float32", mesh, rep + [Shard(1)])
    ids = f.input("ids", (b,), "int64", mesh, tokens)
    labels = f.input("labels", (b,), "int64", mesh, tokens)
    logits = f.matmul(f.tanh(f.embedding(w, ids)), head)
    mx = f.detach(f.max(logits, 1))
    z = f.sub(logits, f.broadcast(mx, (b, vocab), (0,)))
    lse = f.add(mx, f.log(f.sum(f.exp(z), 1)))
    nll = f.sub(lse, f.pick(logits, labels))
    loss = f.mean(f.reshape(nll, (1, b)), 1, name="loss")
    f.output(loss, [Replicate()] * mesh.ndim)
    return f, loss


@pytest.mark.parametrize("mesh,vocab", [(M2, 50304), (M2, 50257), (M4, 50257), (M2x2, 50257)],
                         ids=["50304on2", "50257on2", "50257on4", "50257on2x2"])
def test_joint_cross_entropy_and_embedding_vocab_parallel(mesh, vocab):
    """``joint`` through the lookups' vjps: the loss and the gradients of the vocab-parallel
    embedding and lm head equal torch.autograd's (``F.embedding``, ``F.cross_entropy``); the
    gradients come out at the parameters' vocab shards with only [B]- and [B, H]-sized values
    communicated over tp (the embedding's gradient is a masked local scatter, the logits'
    gradient an unpick into the local vocab shard), the parameters never, a gradient at most
    reduced over dp at its tp shard's size; GPT-2's vocabulary (padded to 50304, and uneven:
    50257), at which gathering the parameters costs more than reducing activations."""
    f, loss = ce_embedding(mesh, vocab)
    j = joint(f, loss, ["w", "head"])
    gen = torch.Generator().manual_seed(3)
    inputs = {"w": torch.randn(vocab, 64, generator=gen), "head": torch.randn(64, vocab, generator=gen),
              "ids": torch.randint(0, vocab, (64,), generator=gen), "labels": torch.randint(0, vocab, (64,), generator=gen)}
    inputs["ids"][:3] = inputs["ids"][3]  # a repeated id accumulates
    plan = rs.optimize(j.fusion)
    w = inputs["w"].clone().requires_grad_()
    head = inputs["head"].clone().requires_grad_()
    want = torch.nn.functional.cross_entropy(torch.tanh(torch.nn.functional.embedding(inputs["ids"], w)) @ head,
                                             inputs["labels"])
    want.backward()
    for device in DEVICES:  # on a GPU: the local steps as generated kernels (the lookups with torch)
        got_loss, got_w, got_head = plan.simulate(inputs, device=device)
        torch.testing.assert_close(got_loss, want.reshape(1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_w, w.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_head, head.grad, rtol=1e-5, atol=1e-6)
    assert all(c.bytes <= 64 * 64 * 4 for c in plan.communications if c.axis == "tp"), plan.explain()
    assert not [c for c in plan.communications if c.tensor in ("w", "head")], plan.explain()
    shard = -(-vocab // mesh.shape[-1]) * 64 * 4
    assert all(c.kind == "allreduce" and c.axis == "dp" and c.bytes == shard
               for c in plan.communications if c.tensor in ("grad.w", "grad.head")), plan.explain()


class _Tail(torch.nn.Module):
    """GPT-2's ends: a token embedding (with a ``padding_idx``), an lm head, the cross entropy."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, hidden, padding_idx=1)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.head(torch.tanh(self.emb(ids))), labels)


def test_from_torch_module_gradients_vocab_parallel():
    """A module from ``from_torch`` (``padding_idx``, an ``ignore_index`` label, vocab 50257 on 2
    ranks) differentiated by ``joint``: the loss and the parameters' gradients equal the module's
    own backward (the padding row's gradient 0), planned vocab-parallel (only [B]- and
    [B, H]-sized reductions)."""
    vocab, b = 50257, 64
    torch.manual_seed(0)
    m = _Tail(vocab, 64)
    ids, labels = torch.randint(0, vocab, (b,)), torch.randint(0, vocab, (b,))
    ids[:4], labels[5] = 1, -100
    tp = rs.from_torch(m, (ids, labels), mesh=M2,
                       param_placements={"emb.weight": [Shard(0)], "head.weight": [Shard(0)]})
    f = tp.fusion
    j = joint(f, f.tensors[f.outputs[0][0]], ["emb.weight", "head.weight"])
    plan = rs.optimize(j.fusion)
    got_loss, got_emb, got_head = plan.simulate(tp.inputs(ids, labels))
    want = m(ids, labels)
    want.backward()
    torch.testing.assert_close(got_loss, want.detach())
    torch.testing.assert_close(got_emb, m.emb.weight.grad)
    torch.testing.assert_close(got_head, m.head.weight.grad)
    assert not got_emb[1].any()
    assert plan.communications and all(c.bytes <= b * 64 * 4 for c in plan.communications), plan.explain()


@pytest.mark.parametrize("train", [False, True])
def test_scale_grad_by_freq_is_rejected_only_when_training(train):
    """aten.embedding with ``scale_grad_by_freq``: the forward is the same; converting for
    training raises (its gradient divides by id counts, which embedding_grad does not)."""
    class Node:
        name, target, meta = "embedding", "aten.embedding.default", {}

    cv = Converter(M2, train=train)
    cv.node = Node()
    w = cv.f.input("w", (8, 4), "float32", M2, [Replicate()])
    ids = cv.f.input("ids", (3,), "int64", M2, [Replicate()])
    a = {"weight": w, "indices": ids, "padding_idx": -1, "scale_grad_by_freq": True}
    if train:
        with pytest.raises(rs.ReshardError, match="embedding.* with scale_grad_by_freq=True when training"):
            OPS["embedding"](cv, cv.node, a)
    else:
        e = OPS["embedding"](cv, cv.node, a)
        assert e.shape == (3, 4) and "padding_idx" not in cv.f.ops[-1].attrs
