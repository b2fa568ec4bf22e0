"""``attention``'s rules (``reshard.rules.attention``): the fused op's local strategies and the
rewrite that makes its decomposed forms alternatives in the e-graph, both sides on random tensors
through the simulator against the unsharded reference:

* plans of the fused op, forward and gradient (``joint``), sharded on batch, heads and q's
  sequence, on 1 and 2 ranks, match the unsharded reference and run the fused steps;
* the decomposed forms (``decomposed_attention``, ``decomposed_attention_grad``) planned as
  programs of their own equal the fused op's reference, and a sharding only the decomposed form
  allows (q and k split on the head dim D, the scores all-reduced before the softmax) is
  extracted and correct;
* Partial operands (``operand_strategies``): the result is linear in v, so v's
  ``Partial("sum")`` summands give the result's; the gradient ``attention_grad`` is linear in g,
  so g's give its, and a block of q's sequence (q and g split along L) gives a Partial sum too
  (its dq in its rows of zeros, its summands of dk and dv).  A plan that asks for the Partial
  result runs the fused op with no collective; every plan (the chosen one and random
  extractions) matches the unsharded reference, also with q's sequence split unevenly."""

from __future__ import annotations

import random

import pytest
import torch

import reshard as rs
from reshard.ir.ops.attention import (
    causal_mask,
    decomposed_attention,
    decomposed_attention_grad,
)
from reshard.plan import Saturated
from reshard.testing import programs as P
from reshard.testing.attention_cases import DH, MASKS, ONE, B, H, L, o_scale
from reshard.testing.attention_cases import mask as _mask
from reshard.testing.attention_cases import values as _values
from reshard.testing.autodiff_oracle import check_joint

TWO = rs.DeviceMesh([0, 1])
REP, PART = [rs.Replicate()], [rs.Partial("sum")]
SHAPE = (2, 2, 4, 8)


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



def _plans(f: rs.Fusion) -> list[rs.Plan]:
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    rng = random.Random(0)
    return [sat.plan(), *(sat.plan(perturb=rng) for _ in range(3))]


def _collectives(plan: rs.Plan) -> list[str]:
    return [s.kind for s in plan.steps if s.kind != "local"]


@pytest.mark.parametrize("kind", ["attention", "attention_grad"])
def test_partial_operand_gives_a_partial_result_locally(kind: str) -> None:
    f = rs.Fusion()
    q, k = (f.input(n, SHAPE, "float32", TWO, REP) for n in "qk")
    v = f.input("v", SHAPE, "float32", TWO, PART if kind == "attention" else REP)
    if kind == "attention":
        out = f.attention(q, k, v)
    else:
        out = f.attention_grad(q, k, v, f.input("g", SHAPE, "float32", TWO, PART), scale=0.3)
    f.output(out, PART)
    inputs = P.random_inputs(f, seed=1)
    plans = _plans(f)
    assert _collectives(plans[0]) == [] and any(s.attr("fop") == kind for s in plans[0].steps)
    for plan in plans:
        P.assert_plan_matches_reference(plan, f, inputs)


def test_uneven_query_sequence_split_matches_the_reference() -> None:
    """q's L = 5 split on 2 ranks (padded inside the plan), a causal-free float mask."""
    f = rs.Fusion()
    q = f.input("q", (2, 2, 5, 8), "float32", TWO, [rs.Shard(2)])
    k, v = (f.input(n, (2, 2, 6, 8), "float32", TWO, REP) for n in "kv")
    mask = f.input("mask", (1, 1, 5, 6), "float32", TWO, REP)
    f.output(f.attention(q, k, v, mask), [rs.Shard(2)])
    inputs = P.random_inputs(f, seed=2)
    for plan in _plans(f):
        P.assert_plan_matches_reference(plan, f, inputs)


@pytest.mark.parametrize("causal", [False, True])
def test_gradient_of_a_query_sequence_block_is_partial(causal: bool) -> None:
    """q and g split along L, k and v whole: the gradient as a Partial sum (each rank's dq in
    its rows, its summands of dk and dv) with no collective; the mask split alike."""
    f = rs.Fusion()
    q, g = (f.input(n, SHAPE, "float32", TWO, [rs.Shard(2)]) for n in "qg")
    k, v = (f.input(n, SHAPE, "float32", TWO, REP) for n in "kv")
    mask = f.input("mask", (1, 1, SHAPE[2], SHAPE[2]), "float32", TWO, [rs.Shard(2)])
    f.output(f.attention_grad(q, k, v, g, mask, scale=0.3, causal=causal), PART)
    inputs = P.random_inputs(f, seed=4)
    if causal:
        inputs["mask"] = causal_mask(SHAPE[2], SHAPE[2], torch.float32).reshape(1, 1, SHAPE[2], SHAPE[2])
    plans = _plans(f)
    assert _collectives(plans[0]) == [] and any(s.attr("fop") == "attention_grad" for s in plans[0].steps)
    for plan in plans:
        P.assert_plan_matches_reference(plan, f, inputs)
