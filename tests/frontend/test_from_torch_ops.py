"""Everyday functions through ``from_torch`` (issue 30): each traced on 2 ranks, with its inputs
replicated and sharded along the rows, and simulated against eager; differentiable ones also
trained (``train=True``) against autograd.  Handlers convert some directly (clamp, leaky_relu,
var / std, logsumexp, vector norms, group_norm, one_hot, roll, broadcast_tensors); the others
go through torch's decomposition of the op (``frontend.decomposed``: the losses, softplus, mish,
hardswish, einsum, baddbmm, cosine_similarity, frac, celu and selu, ...).  Step functions
(sign, floor, ceil, trunc) train to torch's zero gradient."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import reshard as rs

MESH = rs.DeviceMesh([0, 1], ("tp",))
G = torch.Generator().manual_seed(0)
X, Y = torch.randn(4, 6, generator=G), torch.randn(4, 6, generator=G)
IDS = torch.randint(0, 6, (4,), generator=G)
W3, B3 = torch.randn(6, generator=G), torch.randn(6, generator=G)
BAG_IDS, BAG_OFFSETS = torch.tensor([1, 2, 3, 0, 3, 2, 2, 0]), torch.tensor([0, 4, 4])  # bag 1 empty
#: histc's edge cases in row 0: both ends of [-1, 1], two inner bin edges, a value outside, NaN
HIST_X = torch.cat([torch.tensor([[-1.0, 1.0, 0.2, -0.6, 2.5, float("nan")]]), X[1:]])

def _masked_assign(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Writes through bool masks of one value each (``where``): over the whole shape, the rows,
    the columns, and added to the rows (``accumulate``)."""
    z = x * 1
    z[y > 0.5] = -0.5
    z[y[:, 0] > 0] = 0.25
    z[:, y[0] > 0] = 2.0
    z.index_put_((y[:, 1] > 0,), torch.tensor(1.0), accumulate=True)
    return z


#: name -> (function, its arguments); the first argument is the trained one
CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]] = {
    "mse_loss": (F.mse_loss, (X, Y)),
    "mse_loss_broadcast": (lambda x, y: F.mse_loss(x, y[:, :1].expand(4, 6), reduction="sum"), (X, Y)),
    "l1_loss": (F.l1_loss, (X, Y)),
    "smooth_l1_loss": (lambda x, y: F.smooth_l1_loss(x, y, beta=0.5), (X, Y)),
    "huber_loss": (lambda x, y: F.huber_loss(x, y, reduction="none"), (X, Y)),
    "clamp": (lambda x: x.clamp(-0.5, 0.5), (X,)),
    "clamp_tensor": (lambda x, y: torch.clamp(x, min=y, max=y + 1), (X, Y)),
    "clamp_min_max": (lambda x: torch.clamp_max(torch.clamp_min(x, -0.2), 0.3), (X,)),
    "relu6_hardtanh": (lambda x: F.relu6(x * 4) + F.hardtanh(x, -0.2, 0.5), (X,)),
    "minimum_min": (lambda x, y: torch.minimum(x, y) + x.min(-1, keepdim=True).values + x.min(), (X, Y)),
    "log1p": (lambda x: torch.log1p(x.abs()), (X,)),
    "softplus": (lambda x: F.softplus(x, beta=2.0, threshold=1.0), (X,)),
    "mish": (F.mish, (X,)),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), (X,)),
    "hardswish": (F.hardswish, (X * 3,)),
    "hardsigmoid": (F.hardsigmoid, (X * 3,)),
    "var_std": (lambda x: x.var(-1) + x.std(-1, unbiased=False), (X,)),
    "var_mean": (lambda x: torch.var_mean(x, 0, correction=0, keepdim=True)[0] * torch.std_mean(x, 0)[1], (X,)),
    "logsumexp": (lambda x: torch.logsumexp(x, -1, keepdim=True) + torch.logsumexp(x, (0, 1)), (X,)),
    "normalize": (lambda x: F.normalize(x, dim=-1), (X,)),
    "cosine_similarity": (F.cosine_similarity, (X, Y)),
    "vector_norms": (lambda x: torch.linalg.vector_norm(x, 1, -1) + torch.linalg.vector_norm(x, float("inf"), -1)
                     + x.norm(dim=-1), (X,)),
    "einsum": (lambda x, y: torch.einsum("ij,kj->ik", x, y), (X, Y)),
    "baddbmm": (lambda x, y: torch.baddbmm(x[None, :, :4], x[None], y[None].transpose(1, 2), beta=0.5, alpha=2.0),
                (X, Y)),
    "bce_with_logits": (lambda x, y: F.binary_cross_entropy_with_logits(x, torch.sigmoid(y)), (X, Y)),
    "kl_div": (lambda x, y: F.kl_div(F.log_softmax(x, -1), F.softmax(y, -1), reduction="batchmean"), (X, Y)),
    "group_norm": (lambda x: F.group_norm(x.reshape(4, 6, 1), 3, W3, B3, eps=1e-3), (X,)),
    "roll": (lambda x: x.roll(2, -1) + x.roll((1, -1), (0, 1)), (X,)),
    "flip": (lambda x: x.flip(-1) * 2 + x.flip((0, 1)), (X,)),
    "cat_empty": (lambda x: torch.cat([torch.zeros(0), x, torch.zeros(4, 0)], -1), (X,)),  # dropped
    # results with no elements are values (folded): a slice past the end, a sum over it, an empty contraction
    "empty_slice_cat": (lambda x: torch.cat([x[:, 6:], x * 2, x[:, 3:3].exp()], -1), (X,)),
    "empty_reduced": (lambda x: x + x[:, 6:].sum(-1, keepdim=True) + x[:, :0] @ x[:0, :], (X,)),
    "cumprod": (lambda x: torch.cumprod(x, -1), (X,)),
    "sort_values": (lambda x: torch.sort(x, -1, descending=True).values + torch.sort(x, dim=0, stable=True).values,
                    (X,)),
    "topk_values": (lambda x: torch.topk(x, 2, -1, largest=False).values.sum(-1) * 2
                    + torch.topk(x, 3, 0).values.sum(0)[:4], (X,)),
    "embedding_bag": (lambda w, i, o: F.embedding_bag(i, w, o, mode="mean", padding_idx=2)
                      + F.embedding_bag(i, w, o, mode="sum", per_sample_weights=torch.linspace(0.5, 1.0, 8))
                      + F.embedding_bag(i, w, torch.cat([o, o.new_tensor([8])]), include_last_offset=True),
                      (X, BAG_IDS, BAG_OFFSETS)),
    "sign": (torch.sign, (X,)),  # a zero gradient
    "floor_ceil_trunc_frac": (lambda x: torch.floor(x * 3) + torch.ceil(x * 3) * 2 - torch.trunc(x * 3)
                              + torch.frac(x * 3), (X,)),
    "sin_cos": (lambda x: torch.sin(x * 2) + torch.cos(x), (X,)),
    "expm1": (torch.expm1, (X,)),
    "elu_celu_selu": (lambda x: F.elu(x) + F.celu(x, 0.5) + F.selu(x), (X,)),
    "log2": (lambda x: torch.log2(x.abs() + 0.1), (X,)),
    "atan2": (torch.atan2, (X, Y)),
    "remainder": (lambda x, y: torch.remainder(x * 3, y) + (x * 3) % -1.5 + torch.remainder(y, x), (X, Y)),
    "masked_assign": (_masked_assign, (X, Y)),
    "transposes": (lambda x, y: x @ y.T + (x.reshape(2, 2, 6) @ y.reshape(2, 2, 6).mT).reshape(4, 2)[:, :1]
                   + x @ y.reshape(1, 4, 6).mH[0] + x.reshape(1, 4, 6).adjoint()[0].sum(0), (X, Y)),
}
#: cases without a backward (int inputs, index results) or returning (values, indices)
FORWARD_ONLY: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
    "one_hot": (lambda i: F.one_hot(i, 6), (IDS,)),
    "sort": (lambda x: torch.sort(x, -1, descending=True), (X,)),
    "topk": (lambda x: torch.topk(x, 2, -1, largest=False), (X,)),
    "argmax_argmin": (lambda x: (x.argmax(-1), x.argmin(-1, keepdim=True), x.argmax()), (X,)),
    "max_min_indices": (lambda x: (x.max(-1).indices, *x.min(-1, keepdim=True)), (X,)),
    # counts per bin; the second as a mixture's router counts its tokens per expert (ids as floats)
    "histc": (lambda x: (torch.histc(x, 5, -1, 1), torch.histc((x.nan_to_num() * 2).round().clamp(0, 3), 4, 0, 4)),
              (HIST_X,)),
    # counts of indices known to lie below minlength (a mixture's tokens per expert), and weighted
    "bincount": (lambda x: (torch.bincount(torch.topk(x, 2, -1).indices.flatten(), minlength=6),
                            torch.bincount(x.argmax(-1), weights=x.max(-1).values, minlength=7),
                            torch.bincount(x.argmin(-1), weights=x.min(-1).values.half(), minlength=6)), (X,)),
}


class Fn(torch.nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.fn(*args)


@pytest.mark.parametrize("sharded", [False, True], ids=["replicated", "rows"])
@pytest.mark.parametrize("name", [*CASES, *FORWARD_ONLY])
def test_matches_eager(name: str, sharded: bool) -> None:
    fn, args = {**CASES, **FORWARD_ONLY}[name]
    spec = [rs.Shard(0) if sharded and a.dim() else rs.Replicate() for a in args]
    tp = rs.from_torch(Fn(fn), args, spec, mesh=MESH)
    got = rs.optimize(tp.fusion).simulate(tp.inputs(*args))
    want = fn(*args)
    want = tuple(want) if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.reshape(g.shape), rtol=1e-5, atol=1e-6)


def test_along_a_sharded_dim_gathers_it_and_other_dims_stay_sharded() -> None:
    """A row-wise sort of rows sharded runs locally; sorting along the sharded dim gathers it."""
    for dim, local in ((-1, True), (0, False)):
        tp = rs.from_torch(Fn(lambda x: torch.sort(x, dim).values), (X,), [rs.Shard(0)], [rs.Shard(0)], MESH)
        plan = rs.optimize(tp.fusion)
        assert (plan.communications == ()) == local
        torch.testing.assert_close(plan.simulate(tp.inputs(X))[0], torch.sort(X, dim).values)


class Histc(torch.nn.Module):
    def forward(self, i: torch.Tensor) -> torch.Tensor:
        return torch.histc(i, 4, 0, 4)


def test_histc_of_integers_counts_as_a_gpu_does() -> None:
    """``histc`` of int32 ids (a mixture's load-balancing loss on a GPU; torch's CPU kernel has
    no integer form, so the program is traced on the meta device, and its float form is the
    reference): int32 counts, values outside ``[0, 4]`` in no bin, 4 in the last; replicated
    and split."""
    ids = torch.tensor([[0, 1, 2, 3, 3, 4], [5, -1, 2, 2, 0, 1]], dtype=torch.int32)
    want = torch.histc(ids.float(), 4, 0, 4).to(torch.int32)
    for spec in (rs.Replicate(), rs.Shard(0)):
        tp = rs.from_torch(Histc(), (ids.to("meta"),), [spec], mesh=MESH)
        got, = rs.optimize(tp.fusion).simulate(tp.inputs(ids))
        assert got.dtype == torch.int32 and torch.equal(got, want), (spec, got)


def test_bincount_of_values_not_known_bounded_is_refused() -> None:
    """bincount's length is the largest value + 1: of ids read from an input it depends on the
    values (the refusal says what converts)."""
    ids = torch.tensor([0, 2, 2, 5])
    with pytest.raises(rs.ReshardError, match="bincount's length is the largest value"):
        rs.from_torch(Fn(lambda i: torch.bincount(i, minlength=8)), (ids,), mesh=MESH)


def test_bincount_dtype_is_torchs_kernels_whatever_the_exported_node_says(monkeypatch) -> None:
    """torch 2.11's fake bincount says int64 with float weights (its kernels: float32 for float32
    weights, else float64): the exported nodes made to say int64, as there, convert to the
    kernels' dtypes and values."""
    export = torch.export.export

    def as_torch_2_11(*args, **kwargs):
        ep = export(*args, **kwargs)
        for n in ep.graph.nodes:
            if n.op == "call_function" and n.target == torch.ops.aten.bincount.default:
                v = n.meta["val"]
                with v.fake_mode:
                    n.meta["val"] = v.new_empty(v.shape, dtype=torch.int64)
        return ep

    monkeypatch.setattr(torch.export, "export", as_torch_2_11)
    fn, args = FORWARD_ONLY["bincount"]
    tp = rs.from_torch(Fn(fn), args, mesh=MESH)
    got = rs.optimize(tp.fusion).simulate(tp.inputs(*args))
    want = fn(*args)
    assert [g.dtype for g in got] == [torch.int64, torch.float32, torch.float64]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.reshape(g.shape), rtol=1e-5, atol=1e-6)


class Trained(torch.nn.Module):
    """``fn(x * w, *rest)`` weighted by a ramp and summed: each output element's gradient differs."""

    def __init__(self, fn: Callable[..., torch.Tensor], x: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        self.w = torch.nn.Parameter(torch.rand(x.shape, generator=torch.Generator().manual_seed(1)) + 0.5)

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        out = self.fn(x * self.w, *rest)
        ramp = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) / out.numel() + 0.5
        return (out * ramp).sum()


@pytest.mark.parametrize("name", list(CASES))
def test_trains_like_autograd(name: str) -> None:
    fn, args = CASES[name]
    m = Trained(fn, args[0])
    tp = rs.from_torch(m, args, [rs.Shard(0)] * len(args), mesh=MESH, train=True)
    loss = m(*args)
    loss.backward()
    got_loss, got_w = rs.optimize(tp.fusion).simulate(tp.inputs(*args, state=m))
    torch.testing.assert_close(got_loss, loss.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_w, m.w.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn, says", [
    (lambda x: torch.addmm(x[0], x[:, :0], x[:0, :]), "addmm reads a tensor with no elements (shape (4, 0))"),
    (lambda x: (x * 2)[:, 6:], "has no elements (shape (4, 0)); the Fusion IR holds no empty values"),
], ids=["operand", "output"])
def test_an_empty_value_where_the_ir_needs_one_is_refused_by_name(fn: Callable[..., torch.Tensor], says: str) -> None:
    """An op whose result has elements reading an empty operand it cannot drop, and an empty
    output: a ``ReshardError`` saying so (an empty result is otherwise folded)."""
    with pytest.raises(rs.ReshardError, match=re.escape(says)):
        rs.from_torch(Fn(fn), (X,), mesh=MESH)


class Rrelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rrelu(x) * 2


def test_a_decomposition_into_an_unsupported_op_names_both() -> None:
    """rrelu decomposes into rrelu_with_noise_functional, which has neither a handler nor a
    decomposition."""
    with pytest.raises(rs.ReshardError) as ei:
        rs.from_torch(Rrelu(), (X,), mesh=MESH)
    msg = str(ei.value)
    assert "unsupported op aten.rrelu.default: converting torch's decomposition of it failed" in msg
    assert "unsupported op aten.rrelu_with_noise_functional.default (torch has no decomposition of it)" in msg
    assert "test_from_torch_ops.py:" in msg and "return F.rrelu(x) * 2" in msg
