"""The fused ``attention`` op and its gradient (``reshard.ir.ops.attention``), and the rewrite
that makes their decomposed forms alternatives in the e-graph (``reshard.rules.attention``):

* the reference is torch's SDPA (no mask, causal, float mask, fully masked rows: 0s);
* plans of the fused op, forward and gradient (``joint``), sharded on batch, heads and q's
  sequence, on 1 and 2 ranks, match the unsharded reference and run the fused steps;
* both sides of the rewrite on random tensors through the simulator: the decomposed forms
  (``decomposed_attention``, ``decomposed_attention_grad``) planned as programs of their own
  equal the fused op's reference, and a sharding only the decomposed form allows (q and k
  split on the head dim D, the scores all-reduced before the softmax) is extracted and correct;
* on a GPU, the local steps (torch's fused kernels) match the CPU reference."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.errors import ReshardError
from reshard.ir.ops.attention import causal_mask, decomposed_attention, decomposed_attention_grad
from reshard.ir.ops.registry import StepLike
from reshard.passes.autodiff import joint
from reshard.testing.autodiff_oracle import check_joint
from reshard.testing.train_loop import simulated_step_matches_eager

ONE = rs.DeviceMesh([0])
TWO = rs.DeviceMesh([0, 1])
B, H, L, DH = 2, 2, 4, 8
MASKS = ["none", "causal", "float", "dead_row"]


def _mask(kind: str, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """An additive mask [1, 1, L, L] (or [B, 1, L, L] for ``dead_row``: batch 1's row 2 masked
    entirely); None for ``none``."""
    if kind == "none":
        return None
    if kind == "causal":
        return causal_mask(L, L, dtype).reshape(1, 1, L, L)
    gen = torch.Generator().manual_seed(3)
    if kind == "float":
        return torch.randn(1, 1, L, L, generator=gen).to(dtype)
    m = torch.zeros(B, 1, L, L, dtype=dtype)
    m[1, 0, 2] = float("-inf")
    return m


def _values(kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {n: torch.randn(B, H, L, DH, generator=gen) for n in "qkv"}
    mask = _mask(kind)
    return out if mask is None else {**out, "mask": mask}


def _fusion(kind: str, mesh: rs.DeviceMesh, qkv: list, mask_place: list | None = None) -> tuple[rs.Fusion, object]:
    """attention(q, k, v[, mask]) with q, k, v fed at ``qkv`` (three placement lists), the
    loss ``sum(o * w)``; returns the Fusion and the loss."""
    f = rs.Fusion()
    q, k, v = (f.input(n, (B, H, L, DH), "float32", mesh, p) for n, p in zip("qkv", qkv))
    m = _mask(kind)
    mask = None if m is None else f.input("mask", tuple(m.shape), "float32", mesh,
                                          mask_place or [rs.Replicate()] * mesh.ndim)
    o = f.attention(q, k, v, mask, causal=kind == "causal", safe=kind == "dead_row", name="o")
    w = f.input("w", o.shape, "float32", mesh, [rs.Replicate()] * mesh.ndim)
    loss = f.sum(f.reshape(f.mul(o, w), (1, o.numel)), 1, name="loss")
    f.output(loss, [rs.Replicate()] * mesh.ndim)
    return f, loss


@pytest.mark.parametrize("kind", MASKS)
def test_reference_is_torch_sdpa_and_the_decomposed_form(kind: str) -> None:
    vals = _values(kind)
    f = rs.Fusion()
    q, k, v = (f.input(n, (B, H, L, DH), "float32", ONE, [rs.Replicate()]) for n in "qkv")
    mask = None if "mask" not in vals else f.input("mask", tuple(vals["mask"].shape), "float32", ONE, [rs.Replicate()])
    o = f.attention(q, k, v, mask, causal=kind == "causal", safe=kind == "dead_row")
    d = decomposed_attention(f, q, k, v, mask, o_scale(f, o), kind == "dead_row")
    f.output(o, [rs.Replicate()])
    f.output(d, [rs.Replicate()])
    got, dec = rs.run_reference(f, vals)
    want = torch.nn.functional.scaled_dot_product_attention(vals["q"], vals["k"], vals["v"],
                                                            attn_mask=vals.get("mask"))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(dec, want)
    if kind == "dead_row":
        assert torch.equal(got[1, :, 2], torch.zeros(H, DH))


def o_scale(f: rs.Fusion, o: object) -> float:
    """The scale of the attention op computing ``o``."""
    return f.ops[f.producer[o.id]].attrs["scale"]


def test_builder_errors() -> None:
    f = rs.Fusion()
    q = f.input("q", (B, H, L, DH), "float32", ONE, [rs.Replicate()])
    k = f.input("k", (B, H, L + 1, DH), "float32", ONE, [rs.Replicate()])
    v = f.input("v", (B, H, L, DH), "float32", ONE, [rs.Replicate()])
    m = f.input("m", (1, 2, L, L), "float32", ONE, [rs.Replicate()])
    with pytest.raises(ReshardError, match="do not fit"):
        f.attention(q, k, v)
    with pytest.raises(ReshardError, match="causal=True needs the causal mask"):
        f.attention(q, v, v, causal=True)
    with pytest.raises(ReshardError, match="must be an additive float32 mask of shape"):
        f.attention(q, v, v, f.input("m3", (L, L), "float32", ONE, [rs.Replicate()]))
    with pytest.raises(ReshardError, match="must be an additive"):
        f.attention(q, v, v, f.input("m4", (1, 1, L, L), "bfloat16", ONE, [rs.Replicate()]))
    with pytest.raises(ReshardError, match="one shape"):
        f.attention_grad(q, v, v, m, scale=1.0)
    g = rs.Fusion()
    q, k, v = (g.input(n, (B, H, L, DH), "float32", ONE, [rs.Replicate()]) for n in "qkv")
    g.output(g.attention(q, k, v, g.input("mask", (1, 1, L, L), "float32", ONE, [rs.Replicate()]), causal=True),
             [rs.Replicate()])
    with pytest.raises(ReshardError, match="not the causal mask"):
        rs.run_reference(g, _values("float"))


SHARDINGS = {  # q, k, v placements on a 1-axis mesh; the mask's when it has that dim
    "batch": ([rs.Shard(0)] * 3, [rs.Shard(0)]),
    "heads": ([rs.Shard(1)] * 3, [rs.Replicate()]),
    "qseq": ([rs.Shard(2), rs.Replicate(), rs.Replicate()], [rs.Shard(2)]),
}


@pytest.mark.parametrize("mesh", [ONE, TWO], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("where", sorted(SHARDINGS))
@pytest.mark.parametrize("kind", MASKS)
def test_fused_plans_forward_and_gradient_match_the_reference(kind: str, where: str, mesh: rs.DeviceMesh) -> None:
    """joint's gradients by the reference and by the plan's simulation equal torch.autograd's
    through the op's reference; the plan runs the fused forward and gradient steps."""
    qkv, mplace = SHARDINGS[where]
    m = _mask(kind)
    mask_place = None if m is None or (where == "batch" and m.shape[0] == 1) else mplace
    f, loss = _fusion(kind, mesh, [[p] for p in qkv], mask_place)
    vals = {**_values(kind), "w": torch.randn(B, H, L, DH, generator=torch.Generator().manual_seed(5))}
    j = check_joint(f, loss, vals, ["q", "k", "v"], plan=True, rtol=1e-5, atol=1e-5)
    fops = {s.attr("fop") for s in rs.optimize(j.fusion).steps if s.kind == "local"}
    assert {"attention", "attention_grad"} <= fops


def _d_sharded(train: bool, d: int = 256) -> tuple[rs.Fusion, object]:
    """q and k split on the head dim D on two ranks, v whole: q [1, 1, 4, d] (L = S = 4)."""
    f = rs.Fusion()
    q = f.input("q", (1, 1, 4, d), "float32", TWO, [rs.Shard(3)])
    k = f.input("k", (1, 1, 4, d), "float32", TWO, [rs.Shard(3)])
    v = f.input("v", (1, 1, 4, d), "float32", TWO, [rs.Replicate()])
    o = f.attention(q, k, v, scale=0.1, name="o")
    if not train:
        f.output(o, [rs.Replicate()])
        return f, o
    loss = f.sum(f.reshape(f.mul(o, o), (1, o.numel)), 1, name="loss")
    f.output(loss, [rs.Replicate()])
    return f, loss


def test_a_sharding_only_the_decomposed_form_allows_is_extracted() -> None:
    """The head dim D sharded: the fused op has no strategy for it, the decomposed form's q·k^T
    is Partial and all-reduced before the softmax; extraction takes it (no gather of q or k): at
    D = 2^20 gathering q and k (8 MiB each) costs more than the decomposed steps and one
    all-reduce of the [1, 1, 4, 4] scores."""
    f, _ = _d_sharded(False, 1 << 20)
    plan = rs.optimize(f)
    fops = [s.attr("fop") for s in plan.steps if s.kind == "local"]
    assert "attention" not in fops and "matmul" in fops
    assert [c.kind for c in plan.communications] == ["allreduce"]
    vals = {n: torch.randn(1, 1, 4, 1 << 20, generator=torch.Generator().manual_seed(i)) / 64
            for i, n in enumerate("qkv")}
    torch.testing.assert_close(plan.simulate(vals)[0], rs.run_reference(f, vals)[0])


def test_the_gradient_of_a_d_sharded_attention_matches() -> None:
    f, loss = _d_sharded(True)
    vals = {n: torch.randn(1, 1, 4, 256, generator=torch.Generator().manual_seed(i)) for i, n in enumerate("qkv")}
    check_joint(f, loss, vals, ["q", "k", "v"], plan=True, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mesh", [ONE, TWO], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("kind", MASKS)
def test_decomposed_forms_planned_equal_the_fused_reference(kind: str, mesh: rs.DeviceMesh) -> None:
    """The rewrite's right-hand sides as programs of their own (heads sharded): the decomposed
    attention and gradient, planned and simulated, equal the fused ops' references."""
    f = rs.Fusion()
    place = [rs.Shard(1)] if mesh is TWO else [rs.Replicate()]
    q, k, v, g = (f.input(n, (B, H, L, DH), "float32", mesh, place) for n in "qkvg")
    m = _mask(kind)
    mask = None if m is None else f.input("mask", tuple(m.shape), "float32", mesh, [rs.Replicate()])
    safe = kind == "dead_row"
    fused = f.attention(q, k, v, mask, causal=kind == "causal", safe=safe)
    scale = o_scale(f, fused)
    stacked = f.attention_grad(q, k, v, g, mask, scale=scale, causal=kind == "causal", safe=safe)
    dec = [decomposed_attention(f, q, k, v, mask, scale, safe), *decomposed_attention_grad(f, q, k, v, g, mask,
                                                                                            scale, safe)]
    for t in dec:
        f.output(t, place)
    vals = {**_values(kind), "g": torch.randn(B, H, L, DH, generator=torch.Generator().manual_seed(9))}
    plan = rs.optimize(f)
    assert not {"attention", "attention_grad"} & {s.attr("fop") for s in plan.steps if s.kind == "local"}
    got = plan.simulate(vals)
    want_o = rs.run_reference(_only(f, fused), vals)[0]
    want_g = rs.run_reference(_only(f, stacked), vals)[0]
    torch.testing.assert_close(got[0], want_o, rtol=1e-5, atol=1e-5)
    for i in range(3):
        torch.testing.assert_close(got[1 + i], want_g[i], rtol=1e-5, atol=1e-5)


def _only(f: rs.Fusion, t: object) -> rs.Fusion:
    """``f`` with ``t`` as its one output."""
    out = f.copy()
    out.outputs = []
    out.output(out.tensors[t.id], [rs.Replicate()] * t.mesh.ndim)
    return out


class _Step:
    def __init__(self, **attrs: object) -> None:
        self.attrs = tuple(attrs.items())

    def attr(self, name: str, default: object = None) -> object:
        return dict(self.attrs).get(name, default)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", MASKS)
def test_gpu_local_steps_match_the_reference(kind: str, dtype: torch.dtype) -> None:
    """The local steps on a GPU (torch's flash / memory-efficient / cuDNN kernels, the causal
    ones with no mask) match the CPU reference, forward and gradient."""
    from reshard.ir.ops import op_kind
    vals = {n: t.to(dtype) for n, t in _values(kind).items()}
    g = torch.randn(B, H, L, DH, generator=torch.Generator().manual_seed(9)).to(dtype)
    xs = [vals[n] for n in "qkv"]
    mask = vals.get("mask")
    attrs = {"scale": DH ** -0.5, "safe": kind == "dead_row", "causal": kind == "causal"}
    step: StepLike = _Step(**attrs, causal_kernel=kind == "causal")
    cuda = [x.cuda() for x in xs] + ([] if mask is None else [mask.cuda()])
    got = op_kind("attention").local(step, cuda)
    gotg = op_kind("attention_grad").local(step, cuda[:3] + [g.cuda()] + cuda[3:])
    ref = [x.double() for x in xs] + ([] if mask is None else [mask.double()])
    want = op_kind("attention").reference(attrs, ref, "float64")
    wantg = op_kind("attention_grad").reference(attrs, ref[:3] + [g.double()] + ref[3:], "float64")
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(got.cpu().double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(gotg.cpu().double(), wantg, rtol=tol * 2, atol=tol * 2)


class _GQA(torch.nn.Module):
    """Self-attention with 4 query heads and 2 key/value heads (``enable_gqa``) and a bool mask
    fed at run time: the frontend repeats the kv heads (a broadcast and a reshape) and makes the
    mask additive (``where(mask, 0, -inf)``) before the fused op."""

    def __init__(self) -> None:
        super().__init__()
        self.q = torch.nn.Linear(16, 16, bias=False)
        self.kv = torch.nn.Linear(16, 16, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 4, 4).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return (y * y).sum()


def test_gqa_with_a_bool_mask_trains_as_eager() -> None:
    """GQA and a run-time bool mask with a row masked entirely (batch 1, row 2), trained on two
    ranks with the heads sharded: the plan runs the fused ops; loss and gradients are eager's."""
    torch.manual_seed(0)
    module = _GQA()
    x = torch.randn(2, 4, 16)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool).tril()
    mask[1, 0, 2] = False
    tp = rs.plan_training(module, (x, mask), TWO, param_placements={"q.weight": [rs.Shard(0)],
                                                                     "kv.weight": [rs.Replicate()]})
    assert {"attention", "attention_grad"} <= {s.attr("fop") for s in tp.plan.steps if s.kind == "local"}
    simulated_step_matches_eager(module, tp, x, mask)


class _LearnedBias(torch.nn.Module):
    """SDPA whose float mask is a trained parameter (a learned position bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16) * 0.2)
        self.bias = torch.nn.Parameter(torch.randn(1, 2, 8, 8) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (x @ self.w).reshape(2, 8, 2, 8).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(h, h, h, attn_mask=self.bias)
        return (y * y).sum()


def test_a_trained_mask_gets_its_gradient_through_the_decomposed_form() -> None:
    """The fused op gives its mask no gradient: ``from_torch`` builds the decomposed form for a
    mask autograd would differentiate (loss and both gradients are eager's), and ``joint`` of a
    fused op whose mask the loss depends on through a trained input is an error, not a zero."""
    torch.manual_seed(0)
    module = _LearnedBias()
    x = torch.randn(2, 8, 16)
    tp = rs.plan_training(module, (x,), TWO)
    assert not {"attention", "attention_grad"} & {s.attr("fop") for s in tp.plan.steps if s.kind == "local"}
    simulated_step_matches_eager(module, tp, x)
    f = rs.Fusion()
    q, k, v = (f.input(n, (B, H, L, DH), "float32", ONE, [rs.Replicate()]) for n in "qkv")
    bias = f.input("bias", (1, 1, L, L), "float32", ONE, [rs.Replicate()])
    loss = f.sum(f.reshape(f.attention(q, k, v, bias), (B * H * L * DH,)), 0)
    with pytest.raises(ReshardError, match="gives no gradient for its operand 3"):
        joint(f, loss, ["q", "bias"])
