"""The loss without a second logits buffer (issue 28, item 3), on the CPU.

Cross entropy over logits ``x = h @ W.T`` (``[tokens, vocab]``, vocab-parallel on a tp mesh:
``[tokens, vocab / tp]`` per rank) holds one logits-sized buffer at a time, forward and
backward, on 1 rank and with a vocab-parallel lm_head on 2:

* forward: the target logit is read first, so ``exp(x - max)`` writes into the logits' memory
  (``frontend.aten_lookup``; ``codegen.alloc``'s ``into``) and is what the backward keeps;
* backward: the target column's gradient ``unpick(g, target)`` is added into the softmax
  gradient's buffer instead of written into a zeroed block beside it (``codegen.scatter_add``).

Measured on the simulator, step by step: no rank holds two storages of the logits' local size
at once (and its measured peak is the allocation plan's, ``plan.peak_bytes``).  The plans' loss and
gradients are autograd's.  The rewrite ``a + scatter(g, i) -> scatter into a`` is checked on its
own: programs adding ``unpick`` / ``embedding_grad`` results, on 1 rank and vocab-sharded on 2,
planned and under random extraction costs, against the unsharded reference."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

import reshard as rs
from reshard.plan import Saturated
from reshard.runtime.local_ops import run_local, step_results
from reshard.runtime.simulator import simulate

from reshard.testing import programs as P

pytestmark = pytest.mark.hf

T = pytest.importorskip("transformers")

#: vocab large relative to hidden and tokens, so the logits dominate (even: no padding on tp 2)
BATCH, SEQ, VOCAB, HID = 2, 64, 32768, 64
MESH1 = rs.DeviceMesh([0], ("tp",))
MESH2 = rs.DeviceMesh([0, 1], ("tp",))


def gpt2() -> torch.nn.Module:
    cfg = T.GPT2Config(vocab_size=VOCAB, n_embd=HID, n_layer=1, n_head=2, n_positions=64, bos_token_id=0,
                       eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    return T.GPT2LMHeadModel(cfg)


def llama() -> torch.nn.Module:
    return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=VOCAB, hidden_size=HID, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                            max_position_embeddings=64, use_cache=False))


MODELS: dict[str, Callable[[], torch.nn.Module]] = {f.__name__: f for f in (gpt2, llama)}
#: the vocab-parallel parameters (GPT-2's lm_head is tied to wte)
VOCAB_PARALLEL = {"gpt2": ("transformer.wte.weight",), "llama": ("model.embed_tokens.weight", "lm_head.weight")}


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :3] = -100  # ignored positions
    return {"input_ids": ids, "labels": labels}


def _plan(name: str, mesh: rs.DeviceMesh) -> tuple[torch.nn.Module, rs.TrainingPlan]:
    torch.manual_seed(0)
    model = MODELS[name]()
    pp = {n: [rs.Shard(0)] for n in VOCAB_PARALLEL[name]} if mesh.size > 1 else None
    return model, rs.plan_training(model, mesh=mesh, example_kwargs=_batch(), param_placements=pp, cache=False)


def logits_sized_live(plan: rs.Plan, logits_bytes: int) -> int:
    """The most step-made storages of at least ``logits_bytes`` a rank holds at once, measured
    on the simulator (zeros for inputs: the memory does not depend on the values): at each
    local step, the distinct storages of its rank's buffers before the step's drops, its result
    included."""
    inputs = {b: torch.zeros(shape, dtype=getattr(torch, dt)) for b, (shape, dt) in plan.lowered.local_inputs.items()}
    fed = {x.untyped_storage().data_ptr() for x in inputs.values()}
    most = 0

    def step(s: Any, env: dict, rank: int) -> torch.Tensor:
        nonlocal most
        out = run_local(s, env, rank)
        held = {x.untyped_storage().data_ptr(): x.untyped_storage().nbytes() for x in (*env.values(), *step_results(out))
                if isinstance(x, torch.Tensor)}
        most = max(most, sum(1 for p, n in held.items() if n >= logits_bytes and p not in fed))
        return out

    simulate(plan.program, {r: inputs for r in plan.program.mesh_ranks}, step)
    return most


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("mesh", [MESH1, MESH2], ids=["1rank", "tp2"])
def test_one_logits_buffer_and_autograds_gradients(name: str, mesh: rs.DeviceMesh) -> None:
    model, tp = _plan(name, mesh)
    plan = tp.plan
    logits_bytes = BATCH * SEQ * (VOCAB // mesh.size) * 4
    assert logits_sized_live(plan, logits_bytes) == 1
    # the logits' forward buffer is what the backward keeps: one saved logits-sized storage
    assert plan.saved_bytes < 2 * logits_bytes
    stats = simulated_matches_autograd(model, tp, _batch())
    assert max(stats["peak_bytes"].values()) == plan.peak_bytes


def simulated_matches_autograd(model: torch.nn.Module, tp: rs.TrainingPlan, batch: dict[str, torch.Tensor]) -> dict:
    """The plan's loss and gradients on the simulator are autograd's for ``batch`` (keyword
    inputs); returns the simulation's stats."""
    params = dict(model.named_parameters(remove_duplicate=False))
    values = {**dict(zip(tp.user_inputs, batch.values())), **{n: params[n].detach() for n in tp.state_inputs},
              **tp.constants}
    stats: dict = {}
    outs = tp.plan.simulate(values, stats=stats)
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    torch.testing.assert_close(outs[0].reshape(()), loss.detach(), rtol=1e-4, atol=1e-6)
    for (fqn, _), got in zip(tp.grads.items(), outs[1:]):
        torch.testing.assert_close(got.reshape(params[fqn].shape), params[fqn].grad, rtol=1e-3, atol=1e-5,
                                   msg=lambda m, fqn=fqn: f"{fqn}: {m}")
    return stats


def _accumulated(kind: str, mesh: rs.DeviceMesh) -> rs.Fusion:
    """``a + scatter(g, i)`` (``unpick`` along a vocab dim, or ``embedding_grad`` into
    ``[vocab, hidden]`` rows), then a consumer; the scatter's result vocab-split on a mesh of 2."""
    f = rs.Fusion()
    rows, vocab, hid = 6, 16, 4
    rep = [rs.Replicate()] * mesh.ndim
    split = [rs.Shard(1 if kind == "unpick" else 0)] if mesh.size > 1 else rep
    if kind == "unpick":
        x = f.input("x", (rows, vocab), "float32", mesh, split)
        g = f.input("g", (rows,), "float32", mesh, rep)
        i = f.input("i", (rows,), "int64", mesh, rep)
        a = f.exp(x)
        s = f.add(f.scale(a, 0.5), f.unpick(g, i, vocab))
    else:
        x = f.input("x", (vocab, hid), "float32", mesh, split)
        g = f.input("g", (rows, hid), "float32", mesh, rep)
        i = f.input("i", (rows,), "int64", mesh, rep)
        s = f.add(f.embedding_grad(g, i, vocab), f.tanh(x))
    f.output(f.mul(s, s), split)
    return f


@pytest.mark.parametrize("kind", ["unpick", "embedding_grad"])
@pytest.mark.parametrize("mesh", [MESH1, MESH2], ids=["1rank", "tp2"])
def test_scatter_adds_into_its_summand(kind: str, mesh: rs.DeviceMesh) -> None:
    """The add and its scatter are one step adding into the other summand's memory (an unpick on
    whole rows: one kernel computing the summand and adding g at the index), and every
    plan of the program (the chosen one, random extractions) computes the reference's values
    (indices repeated and at either end of the vocab)."""
    f = _accumulated(kind, mesh)
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    inputs = P.random_inputs(f, seed=2)
    inputs["i"] = torch.tensor([0, 15, 3, 3, 8, 15])
    rng = random.Random(0)
    plans = [sat.plan(), *(sat.plan(perturb=rng) for _ in range(4))]
    for plan in plans:
        P.assert_plan_matches_reference(plan, f, inputs)
    if kind == "unpick" and mesh.size == 1:  # whole rows: one kernel with its summand (``codegen.unpick_chains``)
        assert not any(s.attr("fop") == kind for s in plans[0].steps)
        assert [o[0] for s in plans[0].steps for o in s.attr("ops") or () if o[0] == "at_index"] == ["at_index"]
        return
    merged = [s for s in plans[0].steps if s.attr("fop") == kind]
    assert len(merged) == 1 and len(merged[0].ins) == 3 and merged[0].attr("into") == 2
    assert not any(s.attr("fn") == "add" or "add" in str(s.attr("ops")) for s in plans[0].steps)
