"""Mixtures of experts through ``from_torch`` (``reshard.frontend.moe``): Hugging Face's experts
modules exported in their dense form, every token through every expert.  The dense form is
the module's own forward (values and every gradient, an expert no token reaches included);
it is swapped in only while exporting; Mixtral (with its load-balancing loss: ``histc``) and
Qwen2-MoE (a shared expert beside the routed ones) train like eager with their experts split
over tp (expert parallel), Qwen2-MoE on a dp x tp mesh too."""

from __future__ import annotations

import re

import pytest
import torch

import reshard as rs
from reshard.frontend.moe import dense_experts, dense_forward, is_experts_module
from reshard.summary import parts

pytestmark = pytest.mark.hf

pytest.importorskip("transformers")

from reshard.testing.hf_models import ARCHITECTURES, MESH2, MESH22, VOCAB, LossOf, R, S, megatron  # noqa: E402
from reshard.testing.train_loop import simulated_step_matches_eager  # noqa: E402


def _experts(name: str) -> torch.nn.Module:
    """The first experts module of the one-layer tiny ``name``, in float64, running the class's
    own loop over the experts (transformers' ``"eager"`` experts implementation)."""
    torch.manual_seed(0)
    model = ARCHITECTURES[name](1).double()
    model.config._experts_implementation = "eager"
    return next(m for m in model.modules() if is_experts_module(m))


#: Mixtral: [gate; up] stacked [E, out, in]; GPT-OSS: transposed [E, in, out], biases, its own
#: clamped gate over interleaved columns
@pytest.mark.parametrize("name", ["mixtral", "gpt_oss"])
def test_dense_form_is_the_experts_own_forward(name: str) -> None:
    """``dense_forward`` equals the module's forward (its loop over the experts a batch reaches)
    and so do the gradients of the tokens, the routing weights and each expert's weights; expert
    3, reached by no token, gets exactly zero from both."""
    m = _experts(name)
    g = torch.Generator().manual_seed(1)
    tokens, hidden = 10, next(p for p in m.parameters()).shape[-1 if not m.is_transposed else 1]
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    idx = torch.stack([torch.randperm(3, generator=g)[:2] for _ in range(tokens)])  # experts 0-2 only
    w = torch.softmax(torch.randn(tokens, 2, generator=g, dtype=torch.float64), -1)
    outs, grads = [], []
    for fn in (m.forward, lambda *a: dense_forward(m, *a)):
        m.zero_grad(set_to_none=True)
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(xi, idx, wi)
        (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
        outs.append(out.detach())
        grads.append({"x": xi.grad, "weights": wi.grad, **{n: p.grad for n, p in m.named_parameters()}})
    torch.testing.assert_close(outs[1], outs[0])
    for k, want in grads[0].items():
        torch.testing.assert_close(grads[1][k], want, msg=lambda s, k=k: f"{k}: {s}")
    for n, p in m.named_parameters():
        assert torch.all(grads[1][n][3] == 0), n


def test_dense_experts_swaps_only_inside_the_block() -> None:
    """Inside, each experts module of the model runs the dense form (their count is the
    block's value); after, their class's forward again, the model's output as before."""
    torch.manual_seed(0)
    model = ARCHITECTURES["mixtral"](2).eval()
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    experts = [m for m in model.modules() if is_experts_module(m)]
    with torch.no_grad():
        before = model(ids).logits
        with dense_experts(model) as n:
            assert n == len(experts) == 2
            assert all(m.forward.__func__ is dense_forward for m in experts)
            inside = model(ids).logits
        after = model(ids).logits
    assert all("forward" not in m.__dict__ for m in experts)
    torch.testing.assert_close(inside, before, rtol=1e-5, atol=1e-6)
    assert torch.equal(after, before)


class Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def test_a_mixture_forward_matches_eager() -> None:
    """Mixtral's logits (eval), its experts split over tp: as eager's."""
    torch.manual_seed(0)
    module = Logits(ARCHITECTURES["mixtral"](1)).eval()
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    tp = rs.from_torch(module, (ids,), mesh=MESH2, param_placements=megatron(module, MESH2))
    got, = rs.optimize(tp.fusion).simulate(tp.inputs(ids))
    with torch.no_grad():
        torch.testing.assert_close(got, module(ids), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("aux, dtype", [(False, torch.float32), (True, torch.float32), (True, torch.bfloat16)],
                         ids=["no-loss", "load-balancing-loss", "load-balancing-loss-bf16"])
def test_a_mixtures_layers_are_one_stack(aux: bool, dtype: torch.dtype) -> None:
    """Five Mixtral layers are a regular stack after the gradients are bucketed, so layer reuse
    plans three of them (``ir.layers``): each layer reads the same constants (one-hot routing:
    ``one_hot``'s shared arange; an ``arange`` made in each layer's forward was a constant per
    layer, and no two layers had the same form); with the load-balancing loss, each layer's
    term of it (summed after the layers) joins its layer (per-layer terms), in bfloat16 too
    (the final norm's backward, read by the last layer alone, stays outside)."""
    from reshard.plan import StackProgram

    torch.manual_seed(0)
    model = ARCHITECTURES["mixtral"](5).to(dtype)
    model.config.output_router_logits = aux
    module = LossOf(model).train()
    ids = torch.randint(3, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    prog = rs.from_torch(module, (ids, ids), mesh=MESH2, param_placements=megatron(module, MESH2), train=True)
    stack = StackProgram.of(prog.fusion)
    assert stack is not None and stack.stack.depth == 5


@pytest.mark.slow
def test_a_mixture_with_its_load_balancing_loss_plans_three_layers_and_trains_like_eager() -> None:
    """Five Mixtral layers with the load-balancing loss: planned with layer reuse (layers 0, 1,
    2 and 4 planned, a middle layer's plan repeated, its term of the loss with it), one
    training step as eager's."""
    torch.manual_seed(0)
    module = LossOf(ARCHITECTURES["mixtral"](5)).train()
    g = torch.Generator().manual_seed(0)
    ids, labels = (torch.randint(3, VOCAB, (2, 16), generator=g) for _ in range(2))
    plan = rs.plan_training(module, (ids, labels), mesh=MESH2, param_placements=megatron(module, MESH2),
                            cache=False)
    assert plan.plan.report.layers is not None and plan.plan.report.layers[:2] == (5, (0, 1, 2, 4))
    passes = parts(plan.plan)
    assert not [p.name for ps in passes.values() for p in ps if re.match(r"(t|_c)\d+(\.|$)", p.name)]  # no constant's
    forward = passes["forward"]
    layers = {p.name: p for p in forward if p.layer is not None}
    for k in range(4):  # each router's count of its choices (a term of the loss) is in its layer's part
        names = {plan.plan.fusion.tensors[n.value].name for n in layers[f"model.model.layers.{k}"].nodes}
        assert any(n.startswith(("model.histc", "model.bincount")) for n in names), k  # (transformers 5.17: bincount)
    assert [layers[f"model.model.layers.{k}"].ref for k in range(5)] == [None, None, *["model.model.layers.1"] * 2,
                                                                          None]
    simulated_step_matches_eager(module, plan, ids, labels)


@pytest.mark.slow
@pytest.mark.parametrize("name, mesh", [("mixtral", MESH2), ("qwen2_moe", MESH22)], ids=["mixtral-tp2", "qwen2_moe-2x2"])
def test_mixtures_train_like_eager(name: str, mesh: rs.DeviceMesh) -> None:
    """One training step (the loss with its load-balancing term, every gradient) as eager's,
    the stacked experts split along the experts over tp; on 2 x 2 the batch split over dp."""
    torch.manual_seed(0)
    module = LossOf(ARCHITECTURES[name](1)).train()
    g = torch.Generator().manual_seed(0)
    ids, labels = (torch.randint(3, VOCAB, (2, 16), generator=g) for _ in range(2))
    params = megatron(module, mesh)
    experts = [n for n, p in module.named_parameters() if ".experts." in n and p.dim() == 3]
    assert experts and all(params[n][-1] == S(0) for n in experts)
    ins = None if mesh.ndim == 1 else [[S(0), R()], [S(0), R()]]
    plan = rs.plan_training(module, (ids, labels), mesh=mesh, param_placements=params, input_placements=ins,
                            cache=False)
    simulated_step_matches_eager(module, plan, ids, labels)
