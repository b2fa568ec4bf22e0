"""reshard.from_torch: torch.export graphs of nn.Modules / functions -> Fusion -> optimized
plans whose simulation matches the module's own output."""

from __future__ import annotations

import functools
import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import reshard as rs
from reshard.frontend import to_reshard_placements
from reshard.plan import Saturated

dt = pytest.importorskip("torch.distributed.tensor.placement_types")

MESH = rs.DeviceMesh([0, 1], ("tp",))
SEQ, HID, HEADS = 8, 16, 4


class Block(nn.Module):
    """Pre-norm transformer block: LayerNorm -> fused QKV -> softmax attention -> out proj;
    RMSNorm -> MLP (bias, gelu); residuals."""

    def __init__(self, hidden: int = HID, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm = nn.RMSNorm(hidden, eps=1e-6)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, h = x.shape
        q, k, v = self.qkv(self.ln(x)).split(h, dim=-1)
        q, k, v = (t.view(s, self.heads, h // self.heads).transpose(0, 1) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(0, 1).reshape(s, h))
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def _block() -> tuple[Block, torch.Tensor]:
    torch.manual_seed(0)
    m = Block().eval()
    with torch.no_grad():  # non-trivial norm affine parameters
        for p in (m.ln.weight, m.ln.bias, m.norm.weight):
            p.add_(0.1 * torch.randn_like(p))
    return m, torch.randn(SEQ, HID)


#: Megatron tensor parallelism: column-parallel qkv/fc1 (weights [out, in] sharded on out),
#: row-parallel proj/fc2; norms and remaining biases replicated (the default)
def _weights(S, R):  # noqa: N803
    return {"qkv.weight": [S(0)], "qkv.bias": [S(0)], "proj.weight": [S(1)], "fc1.weight": [S(0)],
            "fc1.bias": [S(0)], "fc2.weight": [S(1)], "ln.weight": [R()]}


@pytest.mark.parametrize("kind", ["reshard", "dtensor"])
def test_transformer_block_sequence_parallel(kind):
    S, R = (rs.Shard, rs.Replicate) if kind == "reshard" else (dt.Shard, dt.Replicate)
    m, x = _block()
    tp = rs.from_torch(m, (x,), [S(0)], [S(0)], MESH, param_placements=_weights(S, R))
    assert tp.user_inputs == ("x",)
    assert set(tp.state_inputs) == {n for n, _ in m.named_parameters()}
    assert tp.input_names[:1] == ("x",) and len(tp.input_names) == len(tp.fusion.inputs)
    kinds = {op.kind for op in tp.fusion.ops}
    assert {"matmul", "broadcast", "reduce", "permute", "reshape", "slice"} <= kinds
    plan = rs.optimize(tp.fusion)
    assert plan.report.saturated and plan.communications
    shard = {name: [str(ts) for ts in tss] for name, tss in plan.input_shardings.items()}
    assert shard["x"] == ["[S(0)]"] and shard["fc1.weight"] == ["[S(0)]"] and shard["fc2.weight"] == ["[S(1)]"]
    with torch.no_grad():
        expected = m(x)
    (y,) = plan.simulate(tp.inputs(x))
    torch.testing.assert_close(y, expected)
    # a new call with other inputs / other weights (state=) reuses the program
    x2 = torch.randn(SEQ, HID)
    m2, _ = _block()
    with torch.no_grad():
        m2.fc2.weight.mul_(-1.5)
        expected2 = m2(x2)
    (y2,) = plan.simulate(tp.inputs(x2, state=m2))
    torch.testing.assert_close(y2, expected2)


def test_core_aten_decomposition_converts_too():
    """decompose=True: native_layer_norm, addmm, bmm, expand, _softmax, pow, add.Scalar, ..."""
    m, x = _block()
    tp = rs.from_torch(m, (x,), [rs.Shard(0)], [rs.Shard(0)], MESH, decompose=True)
    targets = {str(n.target) for n in tp.exported.graph.nodes if n.op == "call_function"}
    assert {"aten.native_layer_norm.default", "aten.addmm.default", "aten._softmax.default"} <= targets
    with torch.no_grad():
        expected = m(x)
    (y,) = rs.optimize(tp.fusion).simulate(tp.inputs(x))
    torch.testing.assert_close(y, expected)


def test_transformer_block_random_plans_are_correct():
    """Soundness on the traced program: random extractions also match the module."""
    m, x = _block()
    tp = rs.from_torch(m, (x,), [rs.Shard(0)], [rs.Shard(0)], MESH, param_placements=_weights(rs.Shard, rs.Replicate))
    sat = Saturated.build(tp.fusion, rs.CostProfile(), rs.Limits())
    with torch.no_grad():
        expected = m(x)
    rng = random.Random(0)
    for i in range(3):
        (y,) = sat.plan(perturb=rng).simulate(tp.inputs(x), generator=torch.Generator().manual_seed(i))
        torch.testing.assert_close(y, expected)


def misc_ops(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A function (not a module) with the remaining supported ops."""
    h = torch.addmm(b, x, w.t(), alpha=0.5)                        # addmm, t
    h = h - h.mean(-1, keepdim=True)                                # keepdim reduction + broadcast
    h = torch.maximum(h, -torch.max(h, dim=-1, keepdim=True).values)  # max.dim, maximum
    h = h * torch.rsqrt(h.pow(2).sum(-1, keepdim=True) + 1.0)       # pow, scalar add
    a, c = h.chunk(2, dim=1)                                        # chunk -> slices
    g = torch.cat([torch.tanh(a), F.silu(c) * 2.0, torch.sigmoid(a) / 4], dim=1)
    q = g.view(2, 4, 18).permute(1, 0, 2)                           # [4, 2, 18]
    att = F.scaled_dot_product_attention(q, q, q, is_causal=True)   # sdpa (causal mask constant)
    y = F.relu(att).amax(dim=-1) + 1 - torch.exp(-att.abs().sum(-1))
    z = torch.stack([y, -y], dim=0).to(torch.float64)               # stack, cast
    return z, g[:, 2:10].contiguous()


def test_function_with_misc_ops_matches_torch():
    torch.manual_seed(1)
    x, w, b = torch.randn(8, 6), torch.randn(12, 6), torch.randn(12)
    tp = rs.from_torch(misc_ops, (x, w, b), [[rs.Shard(0)], None, [rs.Replicate()]],
                       [[rs.Replicate()], [rs.Shard(0)]], MESH)
    assert tp.user_inputs == ("x", "w", "b") and tp.constant_inputs  # eps-like scalars and the mask
    ref = misc_ops(x, w, b)
    for got, want in zip(tp.reference(x, w, b), ref):
        torch.testing.assert_close(got, want)
    plan = rs.optimize(tp.fusion)
    outs = plan.simulate(tp.inputs(x, w, b))
    assert [o.dtype for o in outs] == [torch.float64, torch.float32]
    for got, want in zip(outs, ref):
        torch.testing.assert_close(got, want)


class Lgammas(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.lgamma(x.abs() + 1) * 2


class Digammas(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.digamma(self.lin(x).abs() + 1)


@pytest.mark.parametrize("mod,op", [(Lgammas(), "lgamma"), (Digammas(), "digamma")])
def test_unsupported_op_names_op_and_source_line(mod, op):
    with pytest.raises(rs.ReshardError) as ei:
        rs.from_torch(mod, (torch.randn(4, 4),), [rs.Shard(0)], [rs.Shard(0)], MESH)
    msg = str(ei.value)
    assert f"unsupported op aten.{op}" in msg and "decompose=True" not in msg
    assert "test_from_torch.py:" in msg and f"torch.{op}(" in msg  # the user's line and its code


def _fn_with_lgamma(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x)
    return torch.lgamma(y + 2)


def _fn_with_lgamma_of(x: torch.Tensor, shift: float) -> torch.Tensor:
    return torch.lgamma(x + shift)


@pytest.mark.parametrize("fn,line", [
    (_fn_with_lgamma, r"return torch\.lgamma\(y \+ 2\)"),
    (functools.partial(_fn_with_lgamma_of, shift=2.0), r"return torch\.lgamma\(x \+ shift\)"),
], ids=["function", "partial"])
def test_unsupported_op_in_a_function_names_its_line(fn, line):
    """The user's line, not ``from_torch``'s call of the function (torch 2.11 records only the
    frames named ``forward``: ``named_forward``); a ``functools.partial`` too."""
    with pytest.raises(rs.ReshardError, match=rf"unsupported op aten\.lgamma.*test_from_torch\.py:\d+ \({line}\)"):
        rs.from_torch(fn, (torch.randn(4, 4),), None, None, MESH)


def test_dtensor_placements_convert():
    assert to_reshard_placements([dt.Shard(-1)], (4, 6), MESH).axes == to_reshard_placements(
        [rs.Shard(1)], (4, 6), MESH).axes
    assert str(to_reshard_placements(dt.Partial("max"), (4, 6), MESH)) == "[P(max)]"
    assert str(to_reshard_placements([dt.Partial()], (4, 6), MESH)) == "[P(sum)]"
    assert str(to_reshard_placements(dt.Replicate(), (4, 6), MESH)) == "[R]"
    assert to_reshard_placements(None, (4, 6), MESH) is None
    with pytest.raises(rs.ReshardError, match="avg"):
        to_reshard_placements([dt.Partial("avg")], (4, 6), MESH)
    with pytest.raises(rs.ReshardError, match="sequence of placements"):
        to_reshard_placements("Shard(0)", (4, 6), MESH)
    mesh2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
    ts = to_reshard_placements([dt.Shard(0), dt.Partial()], (4, 6), mesh2)
    assert str(ts) == "[S(0), P(sum)]"


def test_placement_and_input_errors():
    m, x = _block()
    with pytest.raises(rs.ReshardError, match="'nope.weight'.*known"):
        rs.from_torch(m, (x,), [rs.Shard(0)], [rs.Shard(0)], MESH, param_placements={"nope.weight": [rs.Shard(0)]})
    with pytest.raises(rs.ReshardError, match="2 entries for 1"):
        rs.from_torch(m, (x,), [[rs.Shard(0)], [rs.Shard(0)]], [rs.Shard(0)], MESH)
    with pytest.raises(rs.ReshardError, match="only tensor arguments"):
        rs.from_torch(lambda x, k: x * k, (x, 3), None, None, MESH)
    with pytest.raises(rs.ReshardError, match="mesh is required"):
        rs.from_torch(m, (x,), None, None, None)
    tp = rs.from_torch(lambda a: a * 2.0, (x,), None, None, MESH)
    with pytest.raises(rs.ReshardError, match="0 arguments given, the program takes 1"):
        tp.inputs()


# ---- issue 20: folding, attention masks, GQA, view ops, the meta device ---------------------------
class RopeAttention(nn.Module):
    """Rotary attention with GQA and a causal mask computed in the forward (as Hugging Face's
    models do): the mask, positions and cos/sin depend on no input or parameter and fold."""

    def __init__(self, hidden: int = HID, heads: int = HEADS, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.kv = nn.Linear(hidden, 2 * kv_heads * self.dim, bias=False)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, self.dim, 2).float() / self.dim),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[0]
        pos = torch.arange(s)
        freqs = pos[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = pos[None, :] <= pos[:, None]                        # bool, True: attend
        q = self.q(x).view(s, self.heads, self.dim).transpose(0, 1)
        k, v = self.kv(x).view(s, 2, self.kv_heads, self.dim).permute(1, 2, 0, 3).unbind(0)

        def rot(t: torch.Tensor) -> torch.Tensor:
            h = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., h:], t[..., :h]], dim=-1) * sin
        y = F.scaled_dot_product_attention(rot(q), rot(k), v, attn_mask=mask, enable_gqa=True)
        return y.transpose(0, 1).reshape(s, -1)


def test_constants_fold_and_gqa_attention_matches():
    torch.manual_seed(0)
    m, x = RopeAttention().eval(), torch.randn(SEQ, HID)
    tp = rs.from_torch(m, (x,), [rs.Shard(0)], [rs.Shard(0)], MESH,
                       param_placements={"q.weight": [rs.Shard(0)], "kv.weight": [rs.Shard(0)]})
    fns = {op.attrs.get("fn") for op in tp.fusion.ops}
    assert not {"cos", "sin"} & fns and "inv_freq" not in tp.state_inputs  # folded
    consts = {tp.fusion.tensors[i].name: tp.fusion.tensors[i].shape for i in tp.fusion.inputs
              if tp.fusion.tensors[i].name in tp.constant_inputs}
    # cos/sin; the bool mask is the causal one: attention's additive causal mask, at the scores' rank
    assert (SEQ, HID // HEADS) in consts.values() and (1, SEQ, SEQ) in consts.values()
    assert [op.attrs["causal"] for op in tp.fusion.ops if op.kind == "attention"] == [True]
    with torch.no_grad():
        want = m(x)
    torch.testing.assert_close(tp.reference(x)[0], want)
    (y,) = rs.optimize(tp.fusion).simulate(tp.inputs(x))
    torch.testing.assert_close(y, want)


def view_ops(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """movedim, ravel, repeat, tile, atleast_*, log_softmax, constant pad, where/masked_fill
    on float comparisons need H2's ops; these are the float-only ones."""
    a = torch.movedim(x, 0, 2) * 2                                  # [3, 4, 2]
    b = torch.ravel(x).view(4, 6)
    c = x.repeat(2, 1, 3)                                           # [4, 3, 12]
    d = torch.tile(x[0], (2,))                                      # [3, 8]
    e = torch.atleast_3d(x[0, 0]) + torch.atleast_2d(x[1, 1])      # [1, 4, 1] + [1, 4] -> [1, 4, 4]
    g = F.log_softmax(x, dim=-1)
    h = F.pad(x, (1, 2), value=-3.0) + F.pad(x, (1, 2))             # value and zero padding
    i = F.pad(x, (-1, 0, 1, 1))                                     # a negative amount cuts
    return a, b, c, d, e, g, h, i


def test_view_ops_match_torch():
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(2))
    tp = rs.from_torch(view_ops, (x,), [rs.Shard(0)], None, MESH)
    ref = view_ops(x)
    for got, want in zip(tp.reference(x), ref):
        torch.testing.assert_close(got, want)
    for got, want in zip(rs.optimize(tp.fusion).simulate(tp.inputs(x)), ref):
        torch.testing.assert_close(got, want)


def test_meta_device_module_plans_without_values():
    with torch.device("meta"):
        m = Block().eval()
    x = torch.empty(SEQ, HID, device="meta")
    tp = rs.from_torch(m, (x,), [rs.Shard(0)], [rs.Shard(0)], MESH, param_placements=_weights(rs.Shard, rs.Replicate))
    plan = rs.optimize(tp.fusion)
    real, xr = _block()
    tp_real = rs.from_torch(real, (xr,), [rs.Shard(0)], [rs.Shard(0)], MESH,
                            param_placements=_weights(rs.Shard, rs.Replicate))
    assert plan.digest() == rs.optimize(tp_real.fusion).digest()  # the same plan as with values
    with pytest.raises(rs.ReshardError, match="meta device"):
        tp.inputs(xr)  # no values
    (y,) = plan.simulate(tp.inputs(xr, state=real))  # real weights given: the meta-traced plan runs
    with torch.no_grad():
        torch.testing.assert_close(y, real(xr))


def int_ops(ids: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """int64 / bool tensors: comparisons, logical ops, where, masked_fill, cumsum, int pad;
    gelu(approximate="tanh")."""
    keep = (ids != 3) & ~(ids > 6) | (ids == 0)                      # ne, gt, eq, &, ~, |
    pos = torch.cumsum(keep.long(), dim=-1) - 1                      # cumsum of a bool -> int64
    y = torch.where(keep[..., None], F.gelu(x, approximate="tanh"), 0.0)
    z = x.masked_fill(~keep[..., None], -1.0)
    labels = F.pad(ids, (0, 1), value=-100)[:, 1:]                   # HF's label shift
    return pos, y, z, labels


def test_int_and_bool_ops_match_torch():
    g = torch.Generator().manual_seed(3)
    ids, x = torch.randint(0, 8, (2, 8), generator=g), torch.randn(2, 8, 4, generator=g)
    tp = rs.from_torch(int_ops, (ids, x), [[rs.Shard(0)], [rs.Shard(0)]], None, MESH)
    ref = int_ops(ids, x)
    outs = rs.optimize(tp.fusion).simulate(tp.inputs(ids, x))
    for got, want in zip(outs, ref):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_cross_entropy_reductions_and_ignore_index_match_torch():
    g = torch.Generator().manual_seed(4)
    logits, target = torch.randn(6, 10, generator=g), torch.randint(0, 10, (6,), generator=g)
    target[1] = -100

    def losses(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.cross_entropy(x, t), F.cross_entropy(x, t, reduction="sum"),
                F.cross_entropy(x, t, reduction="none"), F.cross_entropy(x, torch.where(t < 0, 4, t), ignore_index=4),
                F.nll_loss(F.log_softmax(x, -1), t))
    tp = rs.from_torch(losses, (logits, target), [[rs.Shard(1)], [rs.Replicate()]], None, MESH)
    for got, want in zip(rs.optimize(tp.fusion).simulate(tp.inputs(logits, target)), losses(logits, target)):
        torch.testing.assert_close(got, want)


class WeightedLosses(nn.Module):
    """Cross entropy with class weights (a buffer or, ``buffer=False``, a folded constant),
    label smoothing, both, at each reduction; nll_loss with weights."""

    def __init__(self, weight: torch.Tensor, buffer: bool) -> None:
        super().__init__()
        if buffer:
            self.register_buffer("w", weight)
        else:
            self.w = weight

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = []
        for reduction in ("mean", "sum", "none"):
            out += [F.cross_entropy(x, t, weight=self.w, reduction=reduction),
                    F.cross_entropy(x, t, label_smoothing=0.2, reduction=reduction),
                    F.cross_entropy(x, torch.where(t < 0, 2, t), weight=self.w, label_smoothing=0.3, ignore_index=2,
                                    reduction=reduction),
                    F.nll_loss(F.log_softmax(x, 1), t, weight=self.w, reduction=reduction)]
        return tuple(out)


@pytest.mark.parametrize("shape,buffer", [((6, 10), True), ((3, 10, 2), False)], ids=["rows-buffer", "nd-constant"])
def test_cross_entropy_weights_and_label_smoothing_match_torch(shape, buffer):
    """Torch's weighted mean (divided by the sum of w[target] over the rows not ignored) and
    label smoothing, ignored rows included, on logits sharded along the classes over 2 ranks:
    the plan's values are torch's."""
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(*shape, generator=g), torch.rand(10, generator=g) + 0.5
    t = torch.randint(0, 10, shape[:1] + shape[2:], generator=g)
    t.view(-1)[1], t.view(-1)[3] = -100, 2  # ignored (2: where ignore_index=2)
    m = WeightedLosses(w, buffer)
    tp = rs.from_torch(m, (x, t), [[rs.Shard(1)], [rs.Replicate()]], None, MESH)
    plan = rs.optimize(tp.fusion)
    for got, want in zip(plan.simulate(tp.inputs(x, t, state=m)), m(x, t), strict=True):
        torch.testing.assert_close(got, want)


def test_weighted_smoothed_cross_entropy_stays_vocab_parallel():
    """Class weights and label smoothing keep the vocab-parallel form: on logits sharded along
    a large vocabulary over 2 ranks only row-sized values are communicated, never the
    logits, and the loss is torch's."""
    rows, vocab = 16, 131072  # the unweighted loss is vocab-parallel from 16 rows on, too
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(rows, vocab, generator=g), torch.rand(vocab, generator=g)
    t = torch.randint(0, vocab, (rows,), generator=g)
    t[1] = -100
    m = WeightedLosses(w, buffer=True)
    loss = lambda x, t: F.cross_entropy(x, t, weight=m.w, label_smoothing=0.1)  # noqa: E731
    tp = rs.from_torch(loss, (x, t), [[rs.Shard(1)], [rs.Replicate()]], None, MESH)
    plan = rs.optimize(tp.fusion)
    torch.testing.assert_close(plan.simulate(tp.inputs(x, t))[0], loss(x, t))
    assert plan.communications and all(c.bytes <= rows * 4 for c in plan.communications), plan.explain()


def test_cross_entropy_with_class_probabilities_is_an_error():
    x = torch.randn(4, 5)
    with pytest.raises(rs.ReshardError, match="class probabilities"):
        rs.from_torch(lambda x, p: F.cross_entropy(x, p), (x, x.softmax(1)), mesh=MESH)


class SmoothedHead(nn.Module):
    """An lm head and cross entropy with class weights (a buffer) and label smoothing."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(HID, 10)
        self.register_buffer("w", torch.rand(10, generator=torch.Generator().manual_seed(7)) + 0.5)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(torch.tanh(x)), t, weight=self.w, label_smoothing=0.1)


def test_weighted_smoothed_cross_entropy_training_matches_autograd():
    """``train=True``, the head sharded along the classes on 2 ranks: the loss and the head's
    gradients are torch.autograd's (the class weights, a buffer, get none)."""
    torch.manual_seed(0)
    m, x, t = SmoothedHead(), torch.randn(SEQ, HID), torch.randint(0, 10, (SEQ,))
    t[2] = -100
    tp = rs.from_torch(m, (x, t), mesh=MESH, param_placements={"head.weight": [rs.Shard(0)],
                                                                 "head.bias": [rs.Shard(0)]}, train=True)
    assert tp.grads == {n: f"grad.{n}" for n in ("head.weight", "head.bias")}
    loss, *grads = rs.optimize(tp.fusion).simulate(tp.inputs(x, t, state=m))
    want = m(x, t)
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0], m.head.weight.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grads[1], m.head.bias.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
def test_one_sample_cross_entropy_with_a_0_dim_target_matches_torch(train):
    """One sample (logits [C] through the head, a 0-dim target), class weights and label
    smoothing, the head sharded along the classes on 2 ranks: the loss (and, ``train=True``,
    the head's gradients) are torch's; the 0-dim target is given 0-dim."""
    torch.manual_seed(0)
    m, x, t = SmoothedHead(), torch.randn(HID), torch.tensor(3)
    tp = rs.from_torch(m, (x, t), mesh=MESH, param_placements={"head.weight": [rs.Shard(0)],
                                                                 "head.bias": [rs.Shard(0)]}, train=train)
    assert [tp.fusion.tensors[i].shape for i in tp.fusion.inputs[:2]] == [(HID,), ()]
    loss, *grads = rs.optimize(tp.fusion).simulate(tp.inputs(x, t, state=m))
    want = m(x, t)
    torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)
    if train:
        want.backward()
        torch.testing.assert_close(grads[0], m.head.weight.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(grads[1], m.head.bias.grad, rtol=1e-4, atol=1e-6)
    with pytest.raises(rs.ReshardError, match=r"'t' has shape \(1,\), the program was traced with \(\)"):
        tp.inputs(x, t.reshape(1), state=m)


def test_scalar_tensor_input_matches_torch():
    """A 0-dim temperature (an argument) and a 0-dim scale (a parameter) scale a softmax over
    rows sharded on 2 ranks; the temperature may be Partial (its sum over the ranks)."""
    class Tempered(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.tensor(1.5))

        def forward(self, x: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x / temperature, -1) * self.scale

    m, x, temp = Tempered(), torch.randn(SEQ, HID), torch.tensor(0.7)
    for placement in (rs.Replicate(), rs.Partial()):
        tp = rs.from_torch(m, (x, temp), [[rs.Shard(0)], [placement]], [rs.Shard(0)], MESH)
        assert [t.shape for t in map(tp.fusion.tensor, tp.fusion.inputs) if t.name in ("temperature", "scale")] == [(), ()]
        with torch.no_grad():
            torch.testing.assert_close(rs.optimize(tp.fusion).simulate(tp.inputs(x, temp))[0], m(x, temp))
    with pytest.raises(rs.ReshardError, match=r"placements of 'temperature'.*shards a 0-dim tensor"):
        rs.from_torch(m, (x, temp), [[rs.Shard(0)], [rs.Shard(0)]], None, MESH)


class Tied(nn.Module):
    """Two linears sharing one weight (as GPT-2's lm head shares the token embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(HID, HID, bias=False), nn.Linear(HID, HID, bias=False)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


@pytest.mark.parametrize("name", ["a.weight", "b.weight"])
def test_tied_parameter_takes_placements_under_either_name(name):
    torch.manual_seed(0)
    m, x = Tied().eval(), torch.randn(SEQ, HID)
    tp = rs.from_torch(m, (x,), None, None, MESH, param_placements={name: [rs.Shard(0)]})
    (w,) = [tp.fusion.tensors[i] for i in tp.fusion.inputs if tp.fusion.tensors[i].name in tp.state_inputs]
    assert str(w.sharding) == "[S(0)]"
    with torch.no_grad():
        torch.testing.assert_close(rs.optimize(tp.fusion).simulate(tp.inputs(x))[0], m(x))
    with pytest.raises(rs.ReshardError, match="tied alias"):
        rs.from_torch(m, (x,), None, None, MESH,
                      param_placements={"a.weight": [rs.Shard(0)], "b.weight": [rs.Shard(1)]})


def masked_attention(q: torch.Tensor, keep: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A bool mask computed from an input (rows 0 and 5 masked entirely: zeros, as torch's
    safe softmax), and indexing by constant aranges (``table[rows, cols]``)."""
    mask = (keep[:, None] > 0) & (keep[None, :] > 0)
    y = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    rows, cols = torch.arange(2)[:, None, None], torch.arange(1, 4)[None, None, :]
    return y, table[rows, cols] * 2


def test_computed_mask_and_constant_index_match_torch():
    g = torch.Generator().manual_seed(5)
    q, keep, table = torch.randn(2, 8, 4, generator=g), torch.ones(8, dtype=torch.int64), torch.randn(3, 5, generator=g)
    keep[0] = keep[5] = 0
    tp = rs.from_torch(masked_attention, (q, keep, table), [[rs.Shard(0)], [rs.Replicate()], [rs.Replicate()]],
                       None, MESH)
    ref = masked_attention(q, keep, table)
    assert not ref[0].isnan().any()
    for got, want in zip(rs.optimize(tp.fusion).simulate(tp.inputs(q, keep, table)), ref):
        torch.testing.assert_close(got, want)


class WritesThroughViews(nn.Module):
    """Writes to values the module makes (lawful; T5's ``shift_right``): a new tensor filled
    through slices of it and a ``select``, an in-place op whose operand is read afterwards, and
    an int tensor written the same way and read by a lookup."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(8, 3, generator=torch.Generator().manual_seed(5)))

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        y = x.new_zeros(x.shape)
        y[:, 1:] = x[:, :-1].clone()
        y[:, 0] = 0.5
        z = x * 2
        z.add_(1)
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1]
        shifted.masked_fill_(shifted == 7, 1)
        return (y + z).sum(-1, keepdim=True) * F.embedding(shifted, self.table).sum(-1)


@pytest.mark.parametrize("train", [False, True])
def test_writes_to_intermediate_values_are_kept(train):
    """Each write reaches the values read after it (the program is functionalized before
    conversion, ``state_writes.functional``): the plan equals eager, forward and, trained, the
    table's gradient (before, the writes through views were dropped: zeros)."""
    g = torch.Generator().manual_seed(4)
    x, ids = torch.randn(4, 6, generator=g), torch.randint(0, 8, (4, 6), generator=g)
    ids[0, 2] = 7
    m = WritesThroughViews()
    loss = m(x, ids).sum() if train else None
    if train:
        class Loss(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = m

            def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
                return self.m(x, ids).sum()
        module: nn.Module = Loss()
        loss.backward()
    else:
        module = m
    tp = rs.from_torch(module, (x, ids), [rs.Shard(0), rs.Shard(0)], None, MESH, train=train)
    got = rs.optimize(tp.fusion).simulate(tp.inputs(x, ids, state=module))
    if train:
        torch.testing.assert_close(got[0], loss.detach().reshape(got[0].shape))
        torch.testing.assert_close(got[1], m.table.grad)
    else:
        torch.testing.assert_close(got[0], m(x, ids))


class LocalWrites(nn.Module):
    """Writes to values nothing else aliases: a router's renormalized top-k weights (``/=``,
    then ``*=`` on that), a loop's accumulator (``+=`` into ``zeros``), a masked fill of a new
    value (``index_put_``), a copy into an empty tensor; with ``view``, a slice of a written
    value is read after a later write to it (an alias: torch's functionalization needed)."""

    def __init__(self, view: bool) -> None:
        super().__init__()
        self.view = view
        self.w = nn.Parameter(torch.rand(6, generator=torch.Generator().manual_seed(6)) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.w
        v, _ = torch.topk(x.softmax(-1), 2, -1)
        v /= v.sum(-1, keepdim=True)
        v *= 3
        acc = torch.zeros(x.shape[0])
        for k in range(3):
            acc += x[:, k]
        z = x * 1
        z[z > 0.5] = 0.5
        buf = torch.empty_like(x)
        buf.copy_(x.exp())
        out = v.sum(-1) + acc + z.sum(-1) + buf.sum(-1)
        if self.view:
            head = z[:, :2]
            z.mul_(2)
            out = out + head.sum(-1)
        return out.sum()


@pytest.mark.parametrize("view", [False, True], ids=["local", "through-a-view"])
def test_local_writes_become_their_functional_ops_without_functionalization(monkeypatch, view: bool) -> None:
    """Writes to values nothing else aliases become their functional ops in place
    (``state_writes.local_writes``): torch's functionalization, a second trace of the program,
    is not run; a view read after a write still goes through it.  Forward and trained, as
    eager and autograd."""
    from reshard.frontend import state_writes, torch_export

    retraced = []

    def spied(ep):
        out = state_writes.functional(ep)
        retraced.append(out is not ep)  # (the local writes rewrite ``ep`` itself)
        return out

    monkeypatch.setattr(torch_export, "functional", spied)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(7))
    m = LocalWrites(view)
    for train in (False, True):
        tp = rs.from_torch(m, (x,), [rs.Shard(0)], None, MESH, train=train)
        got = rs.optimize(tp.fusion).simulate(tp.inputs(x, state=m))
        m.zero_grad()
        loss = m(x)
        loss.backward()
        torch.testing.assert_close(got[0], loss.detach().reshape(got[0].shape))
        if train:
            torch.testing.assert_close(got[1], m.w.grad)
    assert retraced == [view, view]
