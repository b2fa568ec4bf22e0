"""Complex tensors through ``from_torch`` (issue 30): held as pairs of reals (``frontend.pairs``,
``frontend.aten_complex``).  ``view_as_complex`` / ``view_as_real`` round trips, complex
arithmetic, complex inputs, buffers and outputs, planned on 2 ranks against eager torch; a
Llama-style attention with torchtitan's ``view_as_complex`` rotary embedding, heads sharded at
tp 2, forward against the module and training against torch.autograd; unsupported complex ops
are errors naming the op."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import reshard as rs

MESH = rs.DeviceMesh([0, 1], ("tp",))


def _pairs(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t.resolve_conj()) if t.is_complex() else t


def check(fn: Callable, args: tuple, in_placements: list | None = None, out_placements: list | None = None,
          module: torch.nn.Module | None = None) -> rs.Plan:
    """``fn(*args)`` planned on 2 ranks and simulated equals eager torch (a complex result as
    its pairs); so does the reference interpreter.  Returns the plan."""
    want = fn(*args)
    want = [_pairs(w) for w in (want if isinstance(want, tuple) else (want,))]
    tp = rs.from_torch(module or fn, args, in_placements, out_placements, MESH)
    plan = rs.optimize(tp.fusion)
    for outs in (tp.reference(*args), plan.simulate(tp.inputs(*args))):
        assert len(outs) == len(want)
        for got, w in zip(outs, want):
            torch.testing.assert_close(got, w.reshape(got.shape), rtol=1e-5, atol=1e-5)
    return plan


X = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(0))
Y = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(1))


def round_trips(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    z = torch.view_as_complex(x.reshape(4, 6, 4, 2))  # [4, 6, 4] complex
    w = z.transpose(0, 1)[1:5].reshape(4, 4, 4)
    return (torch.view_as_real(z).flatten(2), torch.view_as_real(w), torch.view_as_real(z[:, -1]),
            torch.view_as_real(torch.cat([z, z[..., :1]], -1)), torch.view_as_real(torch.stack([z, z], -1)),
            torch.view_as_real(z.unsqueeze(-1).expand(4, 6, 4, 3)), torch.view_as_real(z.permute(2, 0, 1)))


def test_view_round_trips_are_views():
    """``view_as_complex`` and ``view_as_real`` are identities on the pairs; views of a complex
    value (negative dims counted in its rank) keep the pair dim last."""
    plan = check(round_trips, (X,), [[rs.Shard(0)]])
    assert "complex_mul" not in {s.attr("fop") for s in plan.steps}


def arithmetic(x: torch.Tensor, y: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, ...]:
    z, w = (torch.view_as_complex(t.reshape(4, 6, 4, 2)) for t in (x, y))
    return (z * w, z * r, r * z, z * 2.5, z * (1 - 2j), z + w, z - 2 * w, z + 1.5, 1 + z, 1 - z, z - r, torch.rsub(z, w, alpha=3), torch.add(z, r, alpha=-2), -z,
            z.conj(), (z * w.conj()).resolve_conj(), z.real, z.imag, z.abs(), z.angle(), z / r, z / 4,
            z.sum(-1), z.mean(0), z.to(torch.complex128), x.to(torch.complex64),
            torch.polar(r.abs() + 0.1, r), torch.complex(r, 2 * r))


@pytest.mark.parametrize("placements", [[rs.Shard(0)], [rs.Shard(1)], [rs.Replicate()]], ids=["S0", "S1", "R"])
def test_complex_arithmetic_matches_torch(placements):
    r = torch.randn(4, 6, 4, generator=torch.Generator().manual_seed(2))
    check(arithmetic, (X, Y, r), [placements, placements, placements])


def test_complex_inputs_and_outputs_are_pairs():
    """A complex argument is given complex and fed as its pairs; placements name its own dims
    (Shard(-1) is its last complex dim, not the pair dim); a complex output is its pairs."""
    z = torch.view_as_complex(X.reshape(4, 6, 4, 2))

    def square(z: torch.Tensor) -> torch.Tensor:
        return z * z

    tp = rs.from_torch(square, (z,), [[rs.Shard(-1)]], [[rs.Shard(-1)]], MESH)
    (x,) = [tp.fusion.tensors[i] for i in tp.fusion.inputs]
    assert x.shape == (4, 6, 4, 2) and x.dtype == "float32" and x.sharding.local_shape == (4, 6, 2, 2)
    assert tp.fusion.outputs[0][1].local_shape == (4, 6, 2, 2)
    check(square, (z,), [[rs.Shard(-1)]])


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """torchtitan's (and Meta's Llama's) complex rotary frequencies."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ndim = x.ndim
    seqlen = x.shape[1]
    freqs_cis = freqs_cis[0:seqlen]
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchtitan's ``apply_rotary_emb``, verbatim."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


@pytest.mark.parametrize("kind", ["persistent", "non-persistent", "attribute"])
def test_complex_buffer_becomes_pairs(kind):
    """``freqs_cis`` as a persistent buffer (a Fusion input, fed as its pairs), a
    non-persistent one (a constant) or a plain tensor attribute (a lifted constant)."""
    class Rope(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            f = precompute_freqs_cis(8, 16)
            if kind == "attribute":
                self.freqs_cis = f
            else:
                self.register_buffer("freqs_cis", f, persistent=kind == "persistent")

        def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return apply_rotary_emb(q, k, self.freqs_cis[: q.shape[1]])

    q, k = X.reshape(2, 6, 2, 8), Y.reshape(2, 6, 2, 8)
    m = Rope()
    heads = [[rs.Shard(2)], [rs.Shard(2)]]
    plan = check(m, (q, k), heads, heads, module=m)
    assert plan.communications == ()  # head-sharded: local


class Attention(torch.nn.Module):
    """torchtitan's Llama attention (GQA left out), rope by ``apply_rotary_emb`` with its
    ``freqs_cis`` buffer."""

    def __init__(self, dim: int = 32, n_heads: int = 4, max_seq: int = 16) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.register_buffer("freqs_cis", precompute_freqs_cis(self.head_dim, max_seq), persistent=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=self.freqs_cis[:seqlen])
        xq, xk, xv = (t.transpose(1, 2) for t in (xq, xk, xv))
        out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


#: Megatron's placements at tp 2: q, k, v column-parallel (heads sharded), o row-parallel
MEGATRON = {"wq.weight": [rs.Shard(0)], "wk.weight": [rs.Shard(0)], "wv.weight": [rs.Shard(0)],
            "wo.weight": [rs.Shard(1)]}
XA = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))


def test_llama_attention_with_complex_rope_forward():
    torch.manual_seed(0)
    m = Attention().eval()
    tp = rs.from_torch(m, (XA,), None, None, MESH, param_placements=MEGATRON)
    plan = rs.optimize(tp.fusion)
    (got,) = plan.simulate(tp.inputs(XA))
    torch.testing.assert_close(got, m(XA), rtol=1e-5, atol=1e-5)
    assert [c.kind for c in plan.communications] == ["allreduce"]  # only wo's partial sums: rope runs per head
    f = tp.fusion
    muls = [n for n in plan.lowered.nodes if n.head.op is not None and f.ops[n.head.op].kind == "complex_mul"]
    assert len(muls) == 2 and all(n.sharding.local_shape == (2, 8, 2, 4, 2) for n in muls)  # 2 of 4 heads


class LossOf(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((self.model(x) - target) ** 2).mean()


def test_llama_attention_with_complex_rope_trains():
    """``plan_training`` at tp 2 (heads sharded): the loss and every parameter's gradient equal
    torch.autograd's through the complex rope."""
    torch.manual_seed(0)
    eager = LossOf(Attention())
    module = LossOf(Attention())
    module.load_state_dict(eager.state_dict())
    target = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(4))
    placements = {f"model.{k}": v for k, v in MEGATRON.items()}
    plan = rs.plan_training(module, (XA, target), MESH, param_placements=placements)
    model = rs.parallelize(module, plan=plan, simulate=True)
    loss = model(XA, target)
    loss.backward()
    want = eager(XA, target)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    for (n, p), (_, q) in zip(module.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("fn,op", [
    (lambda x: torch.view_as_real(torch.exp(torch.view_as_complex(x.reshape(4, 6, 4, 2)))), "aten.exp"),
    (lambda x: torch.view_as_real(torch.view_as_complex(x.reshape(4, 6, 4, 2)) / torch.view_as_complex(
        x.reshape(4, 6, 4, 2))), "aten.div"),
    (lambda x: torch.view_as_complex(x.reshape(4, 6, 4, 2)).to(torch.float32), "aten.to"),
], ids=["exp", "complex-divisor", "to-real"])
def test_unsupported_complex_op_is_an_error_naming_it(fn, op):
    with pytest.raises(rs.ReshardError, match=rf"{op}.*complex.*test_complex\.py:\d+"):
        rs.from_torch(fn, (X,), None, None, MESH)
