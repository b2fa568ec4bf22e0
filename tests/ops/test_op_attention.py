"""The fused ``attention`` op and its gradient (``reshard.ir.ops.attention``):

* the reference is torch's SDPA (no mask, causal, float mask, fully masked rows: 0s), and so is
  the decomposed form's;
* builder errors;
* on a GPU, the local steps (torch's fused kernels) match the CPU reference;
* grouped-query attention with a bool mask, and a trained mask, train as eager.

The ``attention`` rule family (the fused op's local strategies and the rewrite to its decomposed
forms, both sides on random tensors through the simulator): ``tests/rules/test_attention.py``."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.errors import ReshardError
from reshard.ir.ops.attention import (
    decomposed_attention,
    mask_of,
)
from reshard.ir.ops.registry import StepLike
from reshard.passes.autodiff import joint
from reshard.testing.attention_cases import DH, MASKS, ONE, TWO, B, H, L, o_scale
from reshard.testing.attention_cases import values as _values
from reshard.testing.train_loop import simulated_step_matches_eager


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
    from reshard.runtime.cpu_steps import CPU_STEPS
    vals = {n: t.to(dtype) for n, t in _values(kind).items()}
    g = torch.randn(B, H, L, DH, generator=torch.Generator().manual_seed(9)).to(dtype)
    xs = [vals[n] for n in "qkv"]
    mask = vals.get("mask")
    attrs = {"scale": DH ** -0.5, "safe": kind == "dead_row", "causal": kind == "causal"}
    step: StepLike = _Step(**attrs, causal_kernel=kind == "causal")
    cuda = [x.cuda() for x in xs] + ([] if mask is None else [mask.cuda()])
    got = CPU_STEPS["attention"].run(step, cuda)
    gotg = CPU_STEPS["attention_grad"].run(step, cuda[:3] + [g.cuda()] + cuda[3:])
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


@pytest.mark.gpu
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_gpu_gradient_step_stacks_what_the_cpu_step_stacks(kv_heads: int, causal: bool) -> None:
    """``attention_grad``'s GPU step (``runtime.gpu_steps.attention``: torch's SDPA backward, the
    gradients written into the stack by the strided copy kernel) gives the CPU step's value on
    the same CUDA tensors, q, k and v read through the step's ``views`` (``[b, s, h,
    d]`` buffers, as lowering hands them over) and k, v with fewer heads (GQA)."""
    from reshard.codegen.program import Step
    from reshard.runtime.cpu_steps import CPU_STEPS
    from reshard.runtime.gpu_local import gpu_local_step, step_kernels
    gen = torch.Generator().manual_seed(3)
    b, heads, seq, dh = 2, 4, 32, 16

    def buf(h: int) -> torch.Tensor:
        return torch.randn(b, seq, h, dh, generator=gen).to(torch.bfloat16).cuda()

    q, k, v = buf(heads), buf(kv_heads), buf(kv_heads)
    g = torch.randn(b, heads, seq, dh, generator=gen).to(torch.bfloat16).cuda()
    perm = (0, 2, 1, 3)
    step = Step.make("local", "o", ["q", "k", "v", "g"], op="apply", fop="attention_grad", scale=dh ** -0.5,
                     safe=False, causal=causal, causal_kernel=causal, views=(perm, perm, perm, ()))
    env = {"q": q, "k": k, "v": v, "g": g}
    assert len(step_kernels(step, env, 0)) >= 3  # (one copy per stacked piece)
    got = gpu_local_step(step, env, 0)
    want = CPU_STEPS["attention_grad"].run(step, [q, k, v, g])
    assert got.is_contiguous() and got.shape == want.shape == (heads // kv_heads + 2, b, kv_heads, seq, dh)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)  # (a backward kernel may sum in any order)


def test_mask_of_names_the_fused_ops_mask_operand() -> None:
    """``mask_of``: the mask after attention's three operands and its gradient's four; None
    without a mask and for other ops."""
    f = rs.Fusion()
    q, k, v, g = (f.input(n, (B, H, L, DH), "float32", ONE, [rs.Replicate()]) for n in "qkvg")
    m = f.input("m", (1, 1, L, L), "float32", ONE, [rs.Replicate()])
    f.attention(q, k, v, m)
    f.attention_grad(q, k, v, g, m, scale=1.0)
    f.attention(q, k, v)
    f.tanh(q)
    assert [mask_of(op) for op in f.ops[-4:]] == [m.id, m.id, None, None]
