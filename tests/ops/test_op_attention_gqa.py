"""Grouped-query attention (``reshard.ir.ops.attention``: k and v with fewer heads than q) and the
pass that folds a repeat of the kv heads into it (``reshard.passes.gqa``):

* the op's reference is torch's SDPA with ``enable_gqa``; its gradient ``attention_grad``, read
  back (``read_back``), is autograd's dq and the summed dk, dv; the decomposed forms equal both;
* plans of the op, forward and gradient, with batch, heads or q's sequence split, match the
  unsharded reference and run the fused steps on the kv heads as they are;
* a repeat of the kv heads feeding attention (``repeat_heads``, the frontend's) is folded: the
  plan has no broadcast and no group sum, forward and backward; where the heads are split into
  more parts than there are kv heads, the plan is still exact;
* Hugging Face's Llama (GQA) trains through the folded plan as eager, and its program makes no
  repeated copy of k or v."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.errors import ReshardError
from reshard.ir.ops import op_kind
from reshard.ir.ops.attention import (
    decomposed_attention,
    decomposed_attention_grad,
    read_back,
    repeat_heads,
)
from reshard.passes.gqa import with_gqa
from reshard.testing.attention_cases import MASKS, ONE, TWO
from reshard.testing.attention_cases import mask as _mask
from reshard.testing.autodiff_oracle import check_joint

B, H, HKV, L, DH = 2, 4, 2, 4, 8
REP = [rs.Replicate()]


def _values(kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {"q": torch.randn(B, H, L, DH, generator=gen), "k": torch.randn(B, HKV, L, DH, generator=gen),
           "v": torch.randn(B, HKV, L, DH, generator=gen), "g": torch.randn(B, H, L, DH, generator=gen)}
    m = _mask(kind)
    return out if m is None else {**out, "mask": m}


def _qkv(f: rs.Fusion, mesh: rs.DeviceMesh, places: tuple[list, list, list]) -> tuple:
    q = f.input("q", (B, H, L, DH), "float32", mesh, places[0])
    k = f.input("k", (B, HKV, L, DH), "float32", mesh, places[1])
    v = f.input("v", (B, HKV, L, DH), "float32", mesh, places[2])
    return q, k, v


@pytest.mark.parametrize("kind", MASKS)
def test_reference_gradient_and_decomposed_forms_are_torch_sdpa_with_enable_gqa(kind: str) -> None:
    vals = _values(kind)
    mask = vals.get("mask")
    qkv = [vals[n].clone().requires_grad_(True) for n in "qkv"]
    want = torch.nn.functional.scaled_dot_product_attention(*qkv, attn_mask=mask, enable_gqa=True)
    dwant = torch.autograd.grad(want, qkv, vals["g"])
    f = rs.Fusion()
    q, k, v = _qkv(f, ONE, (REP, REP, REP))
    g = f.input("g", (B, H, L, DH), "float32", ONE, REP)
    m = None if mask is None else f.input("mask", tuple(mask.shape), "float32", ONE, REP)
    o = f.attention(q, k, v, m, causal=kind == "causal", safe=kind == "dead_row")
    scale = f.ops[f.producer[o.id]].attrs["scale"]
    st = f.attention_grad(q, k, v, g, m, scale=scale, causal=kind == "causal", safe=kind == "dead_row")
    assert st.shape == (H // HKV + 2, B, HKV, L, DH)
    outs = [o, decomposed_attention(f, q, k, v, m, scale, kind == "dead_row"), *read_back(f, st, q, k),
            *decomposed_attention_grad(f, q, k, v, g, m, scale, kind == "dead_row")]
    for t in outs:
        f.output(t, REP)
    got = rs.run_reference(f, vals)
    for t in got[:2]:
        torch.testing.assert_close(t, want.detach(), rtol=1e-5, atol=1e-6)
    for t, w in zip(got[2:], dwant * 2):
        torch.testing.assert_close(t, w, rtol=1e-5, atol=1e-5)


def test_builder_errors() -> None:
    f = rs.Fusion()
    q, k, v = _qkv(f, ONE, (REP, REP, REP))
    k3 = f.input("k3", (B, 3, L, DH), "float32", ONE, REP)
    with pytest.raises(ReshardError, match="batch dims differ"):
        f.attention(q, k3, k3)
    with pytest.raises(ReshardError, match="batch dims differ"):
        f.attention(q, k, q)
    with pytest.raises(ReshardError, match="may have fewer heads"):
        f.attention_grad(q, k, v, k, scale=1.0)


SHARDINGS = {  # q, k, v placements on two ranks
    "batch": ([rs.Shard(0)],) * 3,
    "heads": ([rs.Shard(1)],) * 3,
    "qseq": ([rs.Shard(2)], REP, REP),
    "vpartial": (REP, REP, [rs.Partial("sum")]),  # v's summands on the ranks (attention is linear in v)
}


@pytest.mark.parametrize("where", sorted(SHARDINGS))
@pytest.mark.parametrize("kind", ["causal", "dead_row"])
def test_plans_forward_and_gradient_match_the_reference(kind: str, where: str) -> None:
    """joint's gradients of ``sum(attention(q, k, v) * w)`` by the plan's simulation equal
    torch.autograd's through the op's reference (dk, dv summed over each kv head's group); the
    plan runs the fused steps."""
    m = _mask(kind)
    f = rs.Fusion()
    q, k, v = _qkv(f, TWO, SHARDINGS[where])
    mask = None if m is None else f.input("mask", tuple(m.shape), "float32", TWO, REP)
    o = f.attention(q, k, v, mask, causal=kind == "causal", safe=kind == "dead_row", name="o")
    w = f.input("w", o.shape, "float32", TWO, REP)
    loss = f.sum(f.reshape(f.mul(o, w), (1, o.numel)), 1, name="loss")
    f.output(loss, REP)
    vals = {**_values(kind), "w": torch.randn(B, H, L, DH, generator=torch.Generator().manual_seed(5))}
    del vals["g"]
    j = check_joint(f, loss, vals, ["q", "k", "v"], plan=True, rtol=1e-5, atol=1e-5)
    fops = {s.attr("fop") for s in rs.optimize(j.fusion).steps if s.kind == "local"}
    assert {"attention", "attention_grad"} <= fops


def _repeated(mesh: rs.DeviceMesh, heads: int = H, kv: int = HKV) -> tuple[rs.Fusion, object]:
    """``sum(attention(q, repeat(k), repeat(v)) * w)`` with the heads of q, k and v split on
    every axis of ``mesh`` (the frontend's form of ``enable_gqa``)."""
    f = rs.Fusion()
    split = [rs.Shard(1)] * mesh.ndim
    q = f.input("q", (B, heads, L, DH), "float32", mesh, split)
    k, v = (f.input(n, (B, kv, L, DH), "float32", mesh, REP * mesh.ndim) for n in "kv")
    mask = f.input("mask", (1, 1, L, L), "float32", mesh, REP * mesh.ndim)
    o = f.attention(q, repeat_heads(f, k, heads), repeat_heads(f, v, heads), mask, causal=True, name="o")
    w = f.input("w", o.shape, "float32", mesh, REP * mesh.ndim)
    loss = f.sum(f.reshape(f.mul(o, w), (1, o.numel)), 1, name="loss")
    f.output(loss, REP * mesh.ndim)
    return f, loss


@pytest.mark.parametrize("mesh", [ONE, TWO], ids=["1rank", "2ranks"])
def test_a_repeat_of_the_kv_heads_is_folded_into_the_op(mesh: rs.DeviceMesh) -> None:
    """``with_gqa`` adds the grouped-query form as an alternative of the forward value and of
    each gradient; the plan takes it (no broadcast, no group sum) and matches the reference."""
    f, loss = _repeated(mesh)
    vals = {**{n: t for n, t in _values("causal").items() if n != "g"},
            "w": torch.randn(B, H, L, DH, generator=torch.Generator().manual_seed(5))}
    j = check_joint(f, loss, vals, ["q", "k", "v"], plan=True, rtol=1e-5, atol=1e-5)
    folded = with_gqa(j.fusion)
    alts = [op for op in folded.ops if op.kind == "alternative"]
    assert len(alts) == 4  # the forward value, dq, dk, dv
    plan = rs.optimize(j.fusion)
    local = [s for s in plan.steps if s.kind == "local"]
    assert {"attention", "attention_grad"} <= {s.attr("fop") for s in local}
    assert not [s for s in local if s.attr("fop") == "broadcast" and len(s.attr("shape")) == 5]  # the repeat
    assert not [s for s in local if s.attr("fop") == "reduce" and s.attr("dims") == (2,)]  # its gradient's sum


def test_heads_split_past_the_kv_heads_plan_the_repeated_form() -> None:
    """4 q heads and 2 kv heads on 4 ranks with the heads split: the kv heads do not split in
    4, so the grouped-query form has no head-split plan (``operand_strategies``' uneven splits
    are dropped): whichever form extraction takes, the plan matches the reference."""
    four = rs.DeviceMesh([0, 1, 2, 3])
    f, loss = _repeated(four)
    vals = {**{n: t for n, t in _values("causal").items() if n != "g"},
            "w": torch.randn(B, H, L, DH, generator=torch.Generator().manual_seed(5))}
    check_joint(f, loss, vals, ["q", "k", "v"], plan=True, rtol=1e-5, atol=1e-5)


def test_index_maps_of_the_kv_heads() -> None:
    """k's kv head dim reads the result's heads by group (``Outer``); the gradient's stacked
    result keeps k's dims, q's heads have no image there."""
    f = rs.Fusion()
    q, k, v = _qkv(f, ONE, (REP, REP, REP))
    o = f.attention(q, k, v)
    st = f.attention_grad(q, k, v, o, scale=1.0)
    att, grad = f.ops[f.producer[o.id]], f.ops[f.producer[st.id]]
    assert str(op_kind("attention").index_map(f, att, 1)[1]) == f"outer(i1[{H}],{HKV})"
    assert op_kind("attention_grad").index_map(f, grad, 0)[1] is None
    assert str(op_kind("attention_grad").index_map(f, grad, 1)[1]) == f"i2[{HKV}]"


@pytest.mark.hf
def test_llama_trains_as_eager_and_its_kernels_make_no_repeated_kv_copy() -> None:
    """Hugging Face's Llama (8 q heads, 4 kv heads) on 1 rank: the step's generated-kernel
    launches (``scripts/gpu_profile_step.py --count``'s proxy: the program walked on meta
    tensors, each kernel-path step's launches recorded) hold no broadcast (the repeat of k and
    v) and no sum over a group of heads (its gradient); the fused steps read k and v with their
    4 heads; loss and gradients are eager's."""
    pytest.importorskip("transformers")
    from reshard.codegen.program import Step
    from reshard.runtime.cpu_steps.attention import viewed
    from reshard.runtime.gpu_local import KernelKit, kernel_path, run_kernels
    from reshard.runtime.local_ops import run_local
    from reshard.runtime.simulator import simulate
    from reshard.testing import hf_models as HF

    torch.manual_seed(0)
    model = HF.llama()
    ids = torch.randint(0, HF.VOCAB, (2, HF.SEQ), generator=torch.Generator().manual_seed(1))
    tp = rs.plan_training(model, mesh=rs.DeviceMesh([0], ("tp",)), example_kwargs={"input_ids": ids, "labels": ids})
    params = dict(model.named_parameters(remove_duplicate=False))
    values = {**dict(zip(tp.user_inputs, (ids, ids))), **{n: params[n].detach() for n in tp.state_inputs},
              **tp.constants}
    p = tp.plan
    per_rank = {r: {k: v.to("meta") for k, v in p.plan_locals(r, bufs, "test").items()}
                for r, bufs in p._shard_inputs(values, None, "test").items()}
    launched: list[str] = []
    kv_heads: list[int] = []

    def walk(step: Step, env: dict, rank: int) -> object:
        xs = [env[b] for b in step.ins]
        if step.attr("fop") in ("attention", "attention_grad"):
            kv_heads.append(viewed(step, xs)[1].shape[-3])
        if step.attr("op") != "apply" or not kernel_path(step, xs):
            return run_local(step, env, rank)
        kit = KernelKit(record=[], rank=rank)
        out = run_kernels(kit, step, xs)
        launched.extend([step.attr("fop")] * len(kit.launched))
        group_sums = step.attr("fop") == "reduce" and len(xs[0].shape) == 5
        assert not group_sums, step
        return out

    simulate(p.program, per_rank, walk)
    assert launched and "broadcast" not in launched
    assert kv_heads == [HF.KV_HEADS, HF.KV_HEADS]
    wrapped = rs.parallelize(model, plan=tp, simulate=True)
    loss = wrapped(input_ids=ids, labels=ids)
    loss.backward()
    got = {n: q.grad.clone() for n, q in wrapped.module.named_parameters()}
    model.zero_grad()
    want = model(input_ids=ids, labels=ids, use_cache=False).loss
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
    for n, q in model.named_parameters():
        torch.testing.assert_close(got[n], q.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", MASKS)
def test_float32_gqa_on_a_gpu_runs_a_fused_kernel_and_matches_the_reference(kind: str) -> None:
    """torch's fused kernel that reads fewer kv heads (flash) takes no float32: the local steps
    repeat the kv heads there, so a fused kernel runs (SDPA's math path disallowed here raises
    otherwise), forward and gradient, and both match the float64 reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from reshard.runtime.cpu_steps import CPU_STEPS
    from tests.ops.test_op_attention import _Step
    vals = _values(kind)
    xs, mask, g = [vals[n] for n in "qkv"], vals.get("mask"), vals["g"]
    attrs = {"scale": DH ** -0.5, "safe": kind == "dead_row", "causal": kind == "causal"}
    step = _Step(**attrs, causal_kernel=kind == "causal")
    cuda = [x.cuda() for x in xs] + ([] if mask is None else [mask.cuda()])
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        got = CPU_STEPS["attention"].run(step, cuda)
        gotg = CPU_STEPS["attention_grad"].run(step, cuda[:3] + [g.cuda()] + cuda[3:])
    ref = [x.double() for x in xs] + ([] if mask is None else [mask.double()])
    want = op_kind("attention").reference(attrs, ref, "float64")
    wantg = op_kind("attention_grad").reference(attrs, ref[:3] + [g.double()] + ref[3:], "float64")
    torch.testing.assert_close(got.cpu().double(), want, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(gotg.cpu().double(), wantg, rtol=4e-3, atol=4e-3)
