"""Explanations that scale (issue 29): the tiny Llama training plan explains in brief by default
(``reshard.summary``: at most 120 lines of at most 160 characters, repeated layers folded, the
full table on request), says why it changed a placement the user asked for (``reshard.whynot``)
and draws within 4000 px a side (``draw.part_boxes``)."""

from __future__ import annotations

import runpy
import struct
from pathlib import Path

import pytest
import torch

import reshard as rs
from reshard.explain import rows
from reshard.ir.collective_kinds import KIND
from reshard.plan_view import node_passes, pass_totals
from reshard.summary import SUMMARY_ABOVE, WIDTH, parts

pytestmark = pytest.mark.hf

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
E = runpy.run_path(str(ROOT / "examples" / "train_llama.py"), run_name="train_llama")


@pytest.fixture(scope="module")
def llama_plan() -> rs.Plan:
    """The 2-layer tiny Llama of ``examples/train_llama.py``, trained on tp 2 with Megatron placements."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=E["VOCAB"], hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    return rs.plan_training(model, mesh=rs.DeviceMesh([0, 1], ("tp",)), example_kwargs=E["batch"](0),
                            param_placements=E["megatron"](model)).plan


def test_tiny_llama_explains_in_120_lines_of_160_characters(llama_plan: rs.Plan) -> None:
    assert len(llama_plan.lowered.nodes) > SUMMARY_ABOVE
    text = llama_plan.explain()
    lines = text.splitlines()
    assert len(lines) <= 120 and max(map(len, lines)) <= WIDTH == 160, (len(lines), max(map(len, lines)))
    assert "forward pass:" in text and "backward pass:" in text and "plan.explain(full=True)" in text
    for c in llama_plan.communications:  # every collective of a layer shown in full is listed
        assert c.tensor in text
    full = llama_plan.explain(full=True).splitlines()
    assert len(full) > len(llama_plan.lowered.nodes)  # the table: one row per step


def test_op_and_collective_names_cannot_be_confused(llama_plan: rs.Plan) -> None:
    """The shape op ``broadcast`` shows as ``broadcast_to`` (``broadcast`` is a collective); a
    local slice says it is no collective."""
    table = list(zip(rows(llama_plan), llama_plan.lowered.nodes))
    assert any(r.op == "broadcast_to" for r, _ in table)
    assert all(r.op not in KIND or n.head.communicates for r, n in table)
    slices = [r for r, n in table if r.op == "local slice"]
    assert slices and all(r.collective.startswith("no collective: local, on tp") for r in slices)


def test_parts_add_up_to_their_pass(llama_plan: rs.Plan) -> None:
    """Every step is in one part; a pass's parts have its steps and collectives."""
    totals = {t.name: t for t in pass_totals(llama_plan)}
    by_pass = parts(llama_plan)
    assert sum(len(p.nodes) for ps in by_pass.values() for p in ps) == len(llama_plan.lowered.nodes)
    assert set(by_pass) == set(node_passes(llama_plan)) == set(totals)
    for name, ps in by_pass.items():
        assert sum(len(p.nodes) for p in ps) == totals[name].steps
        assert sum(n.head.communicates for p in ps for n in p.nodes) == totals[name].collectives
    names = [p.name for p in by_pass["forward"]]
    assert names.index("model.embed_tokens") < names.index("model.layers.0") < names.index("model.layers.1") \
        < names.index("lm_head")


def test_why_not_the_vocab_parallel_lm_head(llama_plan: rs.Plan) -> None:
    """The plan all-gathers the lm_head weight placed Shard(0); explain says so, and what keeping
    Shard(0) would cost the whole plan (more than the plan: the extractor chose the cheaper)."""
    lines = llama_plan.explain().splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("lm_head.weight: fed at [S(0)], made [R] by "
                                                                         "the allgather of step"))
    why = lines[i + 1].strip()
    assert why.startswith("why: kept at [S(0)], ") and "lm_head.weight" in why.split("kept at [S(0)], ")[1]
    assert "whole plan" in why and "(+" in why
    assert any(ln.lstrip().startswith("lm_head.weight: fed at") for ln in llama_plan.explain(full=True).splitlines())


def test_tiny_llama_draws_within_4000_px(llama_plan: rs.Plan, tmp_path: Path) -> None:
    """A box per layer or module of each pass (the plan has hundreds of steps); a PNG at most
    4000 px a side (it was 5101 x 20811 px, a box per step)."""
    png = llama_plan.draw(tmp_path / "llama.png").read_bytes()
    w, h = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert 1000 <= w <= 4000 and h <= 4000, (w, h)
    svg = llama_plan.draw(tmp_path / "llama.svg").read_text()
    assert "a box per layer or module" in svg and ">model.layers.1<" in svg and ">lm_head<" in svg


def test_repeated_layers_fold_in_the_summary() -> None:
    """A stack of identical layers: its middle layers are one line, read in program order."""
    from reshard.examples import transformer_stack
    plan = rs.optimize(transformer_stack(5, seq=8, hidden=16, heads=2))
    lines = plan.explain(full=False).splitlines()
    row = next(ln for ln in lines if ln.lstrip().startswith("layers.2 .. layers.3 (2 layers)"))
    assert row.endswith("each repeats the steps of layers.1 above")
    first = [ln.split()[0] for ln in lines if ln.strip()]
    assert first.count("layers.2") == 1 and "layers.3" not in first and "layers.2.attn.wo:" not in first
    assert "  and 2 more in the layers that repeat others' steps" in lines
