"""Memory as part of the plan (issue 28, item 1), on 1 rank, for tiny Hugging Face GPT-2, Llama
and a Qwen2 with tied embeddings (random weights, ``plan_training`` of the model's own loss):

* the allocation plan's peak (``plan.peak_bytes``, ``codegen.alloc``) is the simulator's
  measured peak of the distinct storages a rank holds (elementwise steps writing into dying
  operands' memory included);
* no step copies a parameter into a new buffer (tied and transposed weights are read in
  place: the backward of ``x @ W.T`` reads ``W``, ``codegen.transposes``);
* the plan keeps no more bytes for the backward pass than autograd saves for the same batch
  (``torch.autograd.graph.saved_tensors_hooks``, distinct storages other than the parameters
  and inputs; attention through the math kernel, the same local work as the plan's), given
  autograd's figure as the memory budget;
* the plan's loss and gradients are eager's."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

import reshard as rs
from reshard.codegen.alloc import allocate
from reshard.plan import Saturated
from reshard.runtime.local_ops import run_local, step_results
from reshard.runtime.simulator import simulate

from reshard.testing import programs as P

T = pytest.importorskip("transformers")
from benchmarks.train_memory_cpu import autograd_saved  # noqa: E402

pytestmark = pytest.mark.hf

BATCH, SEQ, VOCAB, HID = 2, 16, 256, 64
MESH1 = rs.DeviceMesh([0], ("tp",))


def gpt2() -> torch.nn.Module:
    cfg = T.GPT2Config(vocab_size=VOCAB, n_embd=HID, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                       eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    return T.GPT2LMHeadModel(cfg)


def _decoder(cls: Any, **kw: Any) -> Any:
    return cls(vocab_size=VOCAB, hidden_size=HID, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, use_cache=False, **kw)


def llama() -> torch.nn.Module:
    return T.LlamaForCausalLM(_decoder(T.LlamaConfig))


def qwen2_tied() -> torch.nn.Module:
    return T.Qwen2ForCausalLM(_decoder(T.Qwen2Config, tie_word_embeddings=True))


MODELS: dict[str, Callable[[], torch.nn.Module]] = {f.__name__: f for f in (gpt2, llama, qwen2_tied)}


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def _plan(name: str, **kw: Any) -> tuple[torch.nn.Module, rs.TrainingPlan]:
    torch.manual_seed(0)
    model = MODELS[name]()
    return model, rs.plan_training(model, mesh=MESH1, example_kwargs=_batch(), **kw)


def _values(model: torch.nn.Module, tp: rs.TrainingPlan) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters(remove_duplicate=False))
    return {**dict(zip(tp.user_inputs, _batch().values())), **{n: params[n].detach() for n in tp.state_inputs},
            **tp.constants}


@pytest.fixture(scope="module", params=sorted(MODELS))
def planned(request: pytest.FixtureRequest) -> tuple[str, torch.nn.Module, rs.TrainingPlan]:
    return (request.param, *_plan(request.param))


def test_peak_bytes_is_the_simulators_measured_peak(planned: tuple) -> None:
    name, model, tp = planned
    plan, stats = tp.plan, {}
    plan.simulate(_values(model, tp), stats=stats)
    assert stats["peak_bytes"] == {0: plan.peak_bytes}
    assert stats["saved_peak_bytes"] == {0: plan.saved_bytes}
    assert plan.saved_bytes < plan.peak_bytes
    assert any(s.attr("into") is not None for s in plan.steps)  # elementwise steps reuse dying memory


def test_no_parameter_is_copied(planned: tuple) -> None:
    """No step reads a parameter's buffer and writes a fresh buffer of the same elements
    (a transposed, broadcast or plain copy): parameters are read in place or through views."""
    name, model, tp = planned
    plan = tp.plan
    params = {b for b, n, _ in plan.lowered.inputs if n in tp.state_inputs}
    meta = dict(plan.lowered.local_inputs)
    alloc = allocate(plan.program, {**meta, **_shapes(plan)}, 0)
    copies = [s for i, s in enumerate(plan.program.steps)
              if s.kind == "local" and s.attr("fop") in ("permute", "broadcast", "movedim", "cast") and
              set(s.ins) & params and alloc.storage[s.out] == i]
    assert not copies, [(s.out, s.attr("fop"), s.ins) for s in copies]


def test_tied_lm_head_has_no_transposed_copy() -> None:
    """The tied embedding of GPT-2 is read by the lm_head's forward and backward matmuls as it
    is (transposed through a view): no step reads it but the embedding and the matmuls."""
    model, tp = _plan("gpt2")
    (buf,) = [b for b, n, _ in tp.plan.lowered.inputs if n == "lm_head.weight"]
    readers = {s.attr("fop") for s in tp.plan.program.steps if buf in s.ins}
    assert readers <= {"embedding", "matmul", "saved", "embedding_grad"}, readers


def test_saved_bytes_within_autograds(planned: tuple) -> None:
    """Planned with autograd's saved bytes as the memory budget, the plan keeps at most those
    (recomputing where it must), and still computes eager's loss and gradients."""
    name, model, tp = planned
    budget = autograd_saved(model, _batch())
    if tp.plan.saved_bytes > budget:
        _, tp = _plan(name, memory_budget=budget)
    assert tp.plan.saved_bytes <= budget
    stats: dict = {}
    outs = tp.plan.simulate(_values(model, tp), stats=stats)
    assert max(stats["saved_peak_bytes"].values()) == tp.plan.saved_bytes
    assert stats["peak_bytes"] == {0: tp.plan.peak_bytes}
    loss = model(**_batch()).loss
    loss.backward()
    torch.testing.assert_close(outs[0].reshape(()), loss.detach(), rtol=1e-4, atol=1e-6)
    params = dict(model.named_parameters(remove_duplicate=False))
    for (fqn, _), got in zip(tp.grads.items(), outs[1:]):
        torch.testing.assert_close(got.reshape(params[fqn].shape), params[fqn].grad, rtol=1e-3, atol=1e-5,
                                   msg=lambda m, fqn=fqn: f"{fqn}: {m}")


def test_in_place_only_into_dying_memory() -> None:
    """``y = x * 2`` may take ``t = exp(x)``'s memory only where nothing reads ``t`` later:
    ``u = t + y`` reads it, so ``y`` gets its own buffer, and ``u`` may take ``t``'s or ``y``'s."""
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", MESH1, [rs.Replicate()])
    t = f.exp(x)
    y = f.scale(t, 2.0)
    f.output(f.neg(f.add(t, y)), [rs.Replicate()])
    plan = rs.optimize(f, cache=False)
    made = {s.out: s for s in plan.steps}
    for s in plan.steps:
        into = s.attr("into")
        if into is not None:
            dying = s.ins[into]
            assert all(dying not in later.ins for later in plan.steps[plan.steps.index(s) + 1:])
            assert dying in made and dying not in plan.program.inputs
    stats: dict = {}
    (got,) = plan.simulate({"x": torch.ones(4, 8)}, stats=stats)
    torch.testing.assert_close(got, -(torch.ones(4, 8).exp() * 3))
    assert stats["peak_bytes"] == {0: plan.peak_bytes}


@pytest.mark.parametrize("build", P.ALL, ids=lambda b: b.__name__)
def test_peak_bytes_on_every_rank_of_the_suite(build: Callable[[], rs.Fusion]) -> None:
    """Every suite program (collectives, remaps that are views or copies, Partial inputs, 2-D and
    4-rank meshes), planned and under random costs: the allocation plan's peak is the largest
    the simulator measures on any rank, and its saved bytes likewise."""
    f = build()
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    inputs, rng = P.random_inputs(f, seed=1), random.Random(0)
    for plan in (sat.plan(), *(sat.plan(perturb=rng) for _ in range(3))):
        stats: dict = {}
        plan.simulate(inputs, generator=torch.Generator().manual_seed(0), stats=stats)
        assert max(stats["peak_bytes"].values()) == plan.peak_bytes
        assert max(stats["saved_peak_bytes"].values()) == plan.saved_bytes


def _shapes(plan: rs.Plan) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every step buffer's local (shape, dtype), from one simulated run (``run_local``)."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}

    def step(s: Any, env: dict, rank: int) -> torch.Tensor:
        x = run_local(s, env, rank)
        for b, t in zip(s.outs, step_results(x), strict=True):
            out[b] = (tuple(t.shape), str(t.dtype).removeprefix("torch."))
        return x

    inputs = {b: torch.zeros(shape, dtype=getattr(torch, dt)) for b, (shape, dt) in plan.lowered.local_inputs.items()}
    simulate(plan.program, {0: inputs}, step)
    return out


def test_fused_attention_saves_no_probabilities() -> None:
    """GPT-2 at a sequence long against its width (seq 64, hidden 32, 4 heads): attention runs
    as the fused op forward and backward (``attention``, ``attention_grad``), no saved buffer is
    the ``[batch, heads, seq, seq]`` probabilities, and the plan keeps no more than autograd
    saves (whose math kernel keeps them), with no memory budget; loss and gradients are eager's."""
    torch.manual_seed(0)
    seq = 64
    model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=seq,
                                           bos_token_id=0, eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0,
                                           embd_pdrop=0.0))
    ids = torch.randint(0, VOCAB, (BATCH, seq), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids}
    tp = rs.plan_training(model, mesh=MESH1, example_kwargs=batch)
    plan = tp.plan
    assert {"attention", "attention_grad"} <= {s.attr("fop") for s in plan.steps if s.kind == "local"}
    shapes = _shapes(plan)
    assert not [b for b in plan.program.saved_buffers if shapes[b][0] == (BATCH, 4, seq, seq)]
    assert plan.saved_bytes <= autograd_saved(model, batch)
    params = dict(model.named_parameters(remove_duplicate=False))
    values = {**dict(zip(tp.user_inputs, batch.values())), **{n: params[n].detach() for n in tp.state_inputs},
              **tp.constants}
    outs = plan.simulate(values)
    loss = model(**batch).loss
    loss.backward()
    torch.testing.assert_close(outs[0].reshape(()), loss.detach(), rtol=1e-4, atol=1e-6)
    for (fqn, _), got in zip(tp.grads.items(), outs[1:]):
        torch.testing.assert_close(got.reshape(params[fqn].shape), params[fqn].grad, rtol=1e-3, atol=1e-5)
