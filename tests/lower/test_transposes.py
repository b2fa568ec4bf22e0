"""``codegen.transposes``: a transposing permute of a matmul's result read by nothing else is the
matmul of the swapped operands with both flags flipped (``permute_T(A @ B) = B^T @ A^T``), and
plans lowered with it compute what the plans lowered without it compute, and eager's gradients."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.codegen import transposes as TR
from reshard.codegen.program import Step
from reshard.runtime.local_ops import run_local
from reshard.testing.train_loop import simulated_step_matches_eager


def _mm(out: str, ins: list[str], **attrs) -> Step:
    return Step.make("local", out, ins, op="apply", fop="matmul", **attrs)


def _perm(out: str, x: str, perm: tuple[int, ...]) -> Step:
    return Step.make("local", out, [x], op="apply", fop="permute", perm=perm)


META = {"a": ((6, 4), "float32"), "g": ((6, 5), "float32"), "m": ((4, 5), "float32"), "p": ((5, 4), "float32"),
        "w": ((5, 4), "float32"), "ab": ((2, 6, 4), "float32"), "gb": ((2, 6, 5), "float32"),
        "mb": ((2, 4, 5), "float32"), "pb": ((2, 5, 4), "float32")}


@pytest.mark.parametrize("flags", [None, (True, False), (False, True), (True, True)])
def test_permuted_matmul_result_is_the_swapped_matmul(flags):
    """``(op_a(A) @ op_b(B))^T = op_b(B)^T @ op_a(A)^T``: one matmul writing the permute's buffer,
    reading (B, A) with the flags (not tb, not ta); the same values."""
    ta, tb = flags or (False, False)
    a_shape = (6, 4)[::-1] if ta else (6, 4)
    b_shape = (4, 5)[::-1] if tb else (4, 5)
    meta = {"x": (a_shape, "float32"), "y": (b_shape, "float32"), "m": ((6, 5), "float32"), "p": ((5, 6), "float32")}
    steps = [_mm("m", ["x", "y"], **({"transposed": flags} if flags else {})), _perm("p", "m", (1, 0))]
    (s,) = TR.read_through(steps, meta, {"x", "y", "p"})
    assert s.out == "p" and s.ins == ("y", "x") and s.attr("fop") == "matmul"
    assert s.attr("transposed", (False, False)) == (not tb, not ta)
    assert (s.attr("transposed") is None) == (ta and tb)  # all False: no attribute, as lowering writes it
    x, y = torch.randn(a_shape, dtype=torch.float64), torch.randn(b_shape, dtype=torch.float64)
    env = {"x": x, "y": y}
    want = run_local(steps[1], {"m": run_local(steps[0], env, 0)}, 0)
    torch.testing.assert_close(run_local(s, env, 0), want)


def test_batched_operands_swap_too():
    steps = [_mm("mb", ["ab", "gb"], transposed=(True, False)), _perm("pb", "mb", (0, 2, 1))]
    (s,) = TR.read_through(steps, META, {"ab", "gb", "pb"})
    assert s.ins == ("gb", "ab") and s.attr("transposed") == (True, False)
    env = {"ab": torch.randn(2, 6, 4, dtype=torch.float64), "gb": torch.randn(2, 6, 5, dtype=torch.float64)}
    want = run_local(steps[1], {"mb": run_local(steps[0], env, 0)}, 0)
    torch.testing.assert_close(run_local(s, env, 0), want)


@pytest.mark.parametrize("case", ["read elsewhere", "kept", "broadcast operand", "not a transpose"])
def test_the_permute_stays_where_the_law_does_not_apply(case):
    meta = dict(META)
    steps = [_mm("m", ["a", "g"], transposed=(True, False)), _perm("p", "m", (1, 0))]
    keep = {"a", "g", "p"}
    if case == "read elsewhere":
        steps.append(Step.make("allgather", "z", ["m"], axis=0, dim=0))
        keep.add("z")
    elif case == "kept":
        keep.add("m")
    elif case == "broadcast operand":  # a batched lhs and a 2-D rhs: the 2-D one would move to the left
        meta.update(a=((2, 6, 4), "float32"), m=((2, 4, 5), "float32"), p=((2, 5, 4), "float32"), g=((4, 5), "float32"))
        steps = [_mm("m", ["a", "g"], transposed=(True, False)), _perm("p", "m", (0, 2, 1))]
    else:
        meta.update(m=((2, 4, 5), "float32"), p=((4, 2, 5), "float32"), a=((2, 6, 4), "float32"),
                    g=((2, 6, 5), "float32"))
        steps = [_mm("m", ["a", "g"], transposed=(True, False)), _perm("p", "m", (1, 0, 2))]
    assert TR.read_through(steps, meta, keep) == steps


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 24), torch.nn.Linear(24, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x))).pow(2).mean()


def _plan() -> tuple[_MLP, torch.Tensor, rs.TrainingPlan]:
    torch.manual_seed(0)
    model, x = _MLP(), torch.randn(2, 8, 16)
    return model, x, rs.plan_training(model, (x,), mesh=rs.DeviceMesh([0], ("tp",)))


def _values(model: _MLP, x: torch.Tensor, tp: rs.TrainingPlan) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    return {**dict(zip(tp.user_inputs, (x,))), **{n: params[n].detach() for n in tp.state_inputs}, **tp.constants}


def test_weight_gradients_are_one_matmul_and_match_the_unswapped_plan(monkeypatch):
    """A linear layer's weight gradient is one matmul writing ``[out, in]`` (no permute step
    copies a matmul's result); the plan computes eager's gradients and the values the plan
    lowered without the swap computes (CPU simulator, random tensors)."""
    model, x, tp = _plan()
    steps = tp.plan.program.steps
    made = {s.out: s for s in steps}
    assert not [s.out for s in steps if s.attr("fop") == "permute" and made.get(s.ins[0]) is not None
                and made[s.ins[0]].attr("fop") == "matmul"]
    with monkeypatch.context() as m:
        m.setattr(TR, "_transposed_results", lambda steps, meta, keep: steps)
        _, _, plain = _plan()
    assert len([s for s in plain.plan.program.steps if s.attr("fop") == "permute"]) >= 2
    assert len(steps) < len(plain.plan.program.steps)
    assert tp.plan.cost == plain.plan.cost  # a codegen decision: the modeled cost is extraction's
    vals = _values(model, x, tp)
    got, want = tp.plan.simulate(vals), plain.plan.simulate(_values(model, x, plain))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    model(x).backward()
    params = dict(model.named_parameters())
    for (fqn, _), g in zip(tp.grads.items(), got[1:]):
        torch.testing.assert_close(g.reshape(params[fqn].shape), params[fqn].grad, rtol=1e-4, atol=1e-6)


def _att(out: str, ins: list[str], fop: str = "attention") -> Step:
    return Step.make("local", out, ins, op="apply", fop=fop, scale=0.5, safe=False, causal_kernel=False)


def test_attention_reads_its_operands_through_permutes_and_writes_its_result_permuted():
    """q read through two permutes (composed), k through an identity step and a permute, v as it
    is; the result's permute keeping the last dim is the step writing it permuted (``out_perm``):
    one step, the same values."""
    f32 = "float32"
    meta = {"x": ((2, 3, 4, 8), f32), "x1": ((4, 2, 3, 8), f32), "q": ((2, 4, 3, 8), f32),
            "y": ((2, 3, 4, 8), f32), "y1": ((2, 4, 3, 8), f32), "k": ((2, 4, 3, 8), f32), "v": ((2, 4, 3, 8), f32),
            "o": ((2, 4, 3, 8), f32), "p": ((2, 3, 4, 8), f32)}
    steps = [_perm("x1", "x", (2, 0, 1, 3)), _perm("q", "x1", (1, 0, 2, 3)),
             _perm("y1", "y", (0, 2, 1, 3)), Step.make("local", "k", ["y1"], op="apply", fop="saved"),
             _att("o", ["q", "k", "v"]), _perm("p", "o", (0, 2, 1, 3))]
    (s,) = TR.read_through(steps, meta, {"x", "y", "v", "p"})
    assert s.out == "p" and s.ins == ("x", "y", "v") and s.attr("fop") == "attention"
    assert s.attr("views") == ((0, 2, 1, 3), (0, 2, 1, 3), ()) and s.attr("out_perm") == (0, 2, 1, 3)
    env = {b: torch.randn(meta[b][0], dtype=torch.float64) for b in "xyv"}
    want = dict(env)
    for t in steps:
        want[t.out] = run_local(t, want, 0)
    got = run_local(s, env, 0)
    assert got.is_contiguous()
    torch.testing.assert_close(got, want["p"])


def test_attention_plans_read_through_permutes_and_match_the_plain_plan(monkeypatch):
    """Multi-head self-attention (``[b, s, h, d] -> [b, h, s, d]`` permutes around SDPA),
    trained: no permute step feeds or follows the fused steps; loss and gradients are eager's
    and the plan lowered without the views computes the same values."""
    torch.manual_seed(0)
    model, x = _SelfAttention(), torch.randn(2, 8, 16)
    tp = rs.plan_training(model, (x,), mesh=rs.DeviceMesh([0], ("tp",)))
    steps = tp.plan.program.steps
    att = [s for s in steps if s.attr("fop") in ("attention", "attention_grad")]
    assert len(att) == 2 and all(s.attr("views") for s in att) and att[0].attr("out_perm") == (0, 2, 1, 3)
    with monkeypatch.context() as m:
        m.setattr(TR, "_attention_views", lambda s, made, meta: s)
        m.setattr(TR, "_permuted_attention", lambda steps, meta, keep: steps)
        plain = rs.plan_training(model, (x,), mesh=rs.DeviceMesh([0], ("tp",)))
    n_perm = [len([s for s in p.plan.program.steps if s.attr("fop") == "permute"]) for p in (tp, plain)]
    assert n_perm[0] + 4 <= n_perm[1]  # q, k, v and the gradient read through, the result written permuted
    got, want = tp.plan.simulate(_values(model, x, tp)), plain.plan.simulate(_values(model, x, plain))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    simulated_step_matches_eager(model, tp, x)


class _SelfAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(16, 48, bias=False), torch.nn.Linear(16, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, 4, 4).transpose(1, 2) for t in self.qkv(x).split(16, -1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, 16)).pow(2).mean()
