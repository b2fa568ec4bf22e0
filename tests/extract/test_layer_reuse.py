"""Identical layers planned once (issue 27): ``ir.layers`` finds a regular stack and cuts it
down, ``extract.layer_reuse`` repeats a middle layer's plan.  Checked: the laws of a
regular stack (a layer that differs, a read across two layers, an outside reader of a middle
layer: no stack), the reduced program, plans of stacks against the reference (forward) and
against autograd (a training step, gradients), a stack's cost against its one layer's plan
repeated, and that reuse leaves programs without a stack as they were."""

from __future__ import annotations

import functools
import os

import pytest
import torch

import reshard as rs
from reshard.examples import transformer_stack
from reshard.extract import second_core
from reshard.ir.layers import find_stack, reduce_stack

MESH = rs.DeviceMesh([0, 1], ("tp",))


def _stack(depth: int, odd: int | None = None, skip: bool = False, outside_reader: bool = False,
           terms: bool = False) -> rs.Fusion:
    """``depth`` MLP layers ``layers.i`` on tp 2 (x sequence-sharded, w1 column-, w2
    row-parallel); layer ``odd`` uses tanh instead of gelu; ``skip``: each layer also adds the
    input of the layer before it; ``outside_reader``: an op outside the layers reads layer 2;
    ``terms``: a term of each layer's activation (``term_i``, named outside the layers) summed
    after the layers, in a running sum added to the output (a mixture's load-balancing loss)."""
    f = rs.Fusion()
    x = f.input("x", (16, 32), "float32", MESH, [rs.Shard(0)])
    ys = [x]
    for i in range(depth):
        w1 = f.input(f"layers.{i}.w1", (32, 64), "float32", MESH, [rs.Shard(1)])
        w2 = f.input(f"layers.{i}.w2", (64, 32), "float32", MESH, [rs.Shard(0)])
        h = f.matmul(ys[-1], w1, name=f"layers.{i}.fc1")
        h = (f.tanh if i == odd else f.gelu)(h, name=f"layers.{i}.act")
        y = f.add(ys[-1], f.matmul(h, w2, name=f"layers.{i}.fc2"), name=f"layers.{i}")
        if skip and i >= 2:
            y = f.add(y, ys[-2], name=f"layers.{i}.skip")
        ys.append(y)
    out = ys[-1]
    if outside_reader:
        out = f.add(out, f.scale(ys[3], 0.5, name="probe"), name="probed")
    if terms:
        total = None
        for i, y in enumerate(ys[1:]):
            term = f.scale(f.tanh(y, name=f"term_{i}_tanh"), 0.1, name=f"term_{i}")
            total = term if total is None else f.add(total, term, name=f"total_{i}")
        out = f.add(out, total, name="with_terms")
    f.output(out, [rs.Shard(0)])
    return f


def _inputs(f: rs.Fusion) -> dict[str, torch.Tensor]:
    """Random inputs, small enough that deep stacks without norms stay in float32's range."""
    g = torch.Generator().manual_seed(0)
    return {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=g) * 0.05 for i in f.inputs}


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to float32 rounding, relative to the largest value (stacks without norms grow)."""
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_regular_stack_is_found() -> None:
    """Six identical layers: six layers of equal size; the input x goes with the first (its
    only reader) after its ops, so positions agree."""
    stack = find_stack(_stack(6))
    assert stack is not None and stack.depth == 6 and stack.container == "layers"
    assert len({len(ops) for ops in stack.layers[1:]}) == 1 and len(stack.layers[0]) == len(stack.layers[1]) + 1


@pytest.mark.parametrize("kw", [dict(odd=3), dict(skip=True), dict(outside_reader=True)],
                         ids=["a-middle-layer-differs", "reads-two-layers-back", "outside-reads-a-middle-layer"])
def test_irregular_stack_is_not_reused(kw: dict) -> None:
    """Each law of ``ir.layers`` broken: no stack, and optimize() plans every op (still correct)."""
    f = _stack(6, **kw)
    assert find_stack(f) is None
    plan = rs.optimize(f)
    assert plan.report.layers is None
    inputs = _inputs(f)
    _close(plan.simulate(inputs)[0], rs.run_reference(f, inputs)[0])


def test_terms_of_every_layer_summed_after_them_are_part_of_the_stack() -> None:
    """A term of each layer summed after the layers (outside ops reading every layer, law 3
    broken as ``ir.layers`` first groups the ops): with the terms joined to their layers the
    stack is regular, the running sum passed from layer to layer; planned with reuse, the plan
    simulates to the reference."""
    f = _stack(7, terms=True)
    stack = find_stack(f)
    assert stack is not None and stack.depth == 7
    names = {f.tensors[f.ops[i].output].name for i in stack.layers[3]}
    assert {"term_3_tanh", "term_3", "total_3"} <= names
    plan = rs.optimize(f, cache=False)
    assert plan.report.layers is not None and plan.report.layers[:2] == (7, (0, 1, 2, 6))
    inputs = _inputs(f)
    _close(plan.simulate(inputs)[0], rs.run_reference(f, inputs)[0])


def test_reduced_program_keeps_the_first_layers_and_the_last() -> None:
    """Nine layers cut to four: layers 0, 1, 2 and 8, the last reading layer 2 where it read
    layer 7; the reduced Fusion computes (every op has its operands), its layers those four."""
    f = _stack(9)
    red = reduce_stack(f, find_stack(f), 4)
    assert red is not None and red.kept == (0, 1, 2, 8)
    names = {red.fusion.tensors[i].name for i in red.fusion.inputs}
    assert names == {"x"} | {f"layers.{i}.w{j}" for i in (0, 1, 2, 8) for j in (1, 2)}
    fc1 = next(op for op in red.fusion.ops if red.fusion.tensors[op.output].name == "layers.8.fc1")
    assert red.fusion.tensors[fc1.inputs[0]].name == "layers.2"
    assert rs.run_reference(red.fusion, _inputs(red.fusion))[0].shape == (16, 32)
    assert red.stack.depth == 4 and [len(ops) for ops in red.stack.layers] == [len(ops) for ops in
                                                                                 find_stack(f).layers[:3]] + [6]


@pytest.mark.parametrize("depth", [5, 9])
def test_stack_plan_matches_reference(depth: int) -> None:
    """A stack deep enough to reuse: four layers planned, the rest repeated; the plan simulates
    to the reference; its cost is the sum of its distinct nodes (``explain``'s total)."""
    f = transformer_stack(depth, MESH)
    plan = rs.optimize(f)
    assert plan.report.layers == (depth, (0, 1, 2, depth - 1), 2)
    assert f"{depth} layers: planned layers 0, 1, 2, {depth - 1}" in str(plan.report)
    inputs = _inputs(f)
    _close(plan.simulate(inputs)[0], rs.run_reference(f, inputs)[0])
    from reshard.plan_view import total_cost_s
    assert total_cost_s(plan) == pytest.approx(plan.cost, rel=1e-9)
    assert "repeats the steps of" in plan.explain(full=True)


@pytest.mark.parametrize("dearer", [None, 2])
def test_stack_repeats_its_cheapest_middle_layer(monkeypatch, dearer: int | None) -> None:
    """Every middle layer whose plan can be repeated is expanded and the cheapest expansion is
    the plan (of equal ones the later layer).  ``dearer``: that layer's expansion priced one ps
    more, so the other one is repeated, and its plan simulates to the reference as well."""
    import reshard.plan as P

    seen: dict[int, int] = {}
    expand = P.expand

    def priced(*args):
        roots, cost, shift = expand(*args)
        t = args[-1]
        seen[t] = cost + (t == dearer)
        return roots, seen[t], shift

    monkeypatch.setattr(P, "expand", priced)
    f = transformer_stack(6, MESH)
    plan = rs.optimize(f, cache=False)
    assert set(seen) == {1, 2}, "both middle layers' plans can be repeated in this stack"
    best = min(seen.values())
    assert plan.report.layers[2] == max(t for t, c in seen.items() if c == best)
    assert plan.report.layers[2] == (1 if dearer == 2 else 2)
    assert plan.cost == pytest.approx(best * 1e-12, rel=1e-12)
    inputs = _inputs(f)
    _close(plan.simulate(inputs)[0], rs.run_reference(f, inputs)[0])


def test_stack_planning_reports_each_extraction_step(tmp_path, monkeypatch) -> None:
    """``progress`` through a stack's planning: saturation's rounds, then extraction's start
    and its steps in order (the greedy, the sharing search's and the windows' counts, which
    only grow, alternatives adopted, the repeated layer's lowering), each reported by the
    planning process only (a candidate finished in a forked child reports nothing: the second
    core on, which the suite turns off, ``tests/conftest.py``)."""
    monkeypatch.setattr(second_core, "SECOND_CORE", True)
    log = tmp_path / "progress"

    def progress(r) -> None:
        with log.open("a") as out:
            out.write(f"{os.getpid()}\t{r.phase}\t{r.step}\n")

    plan = rs.optimize(transformer_stack(5, MESH), progress=progress, cache=False)
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    assert {pid for pid, _, _ in rows} == {str(os.getpid())}
    phases = [phase for _, phase, _ in rows]
    start = phases.index("extraction")
    assert set(phases[:start]) == {"saturation"} and set(phases[start:]) == {"extraction"}
    steps = [step for _, _, step in rows[start:]]
    assert steps[:2] == ["", "greedy"] and steps[-2] == "adopting alternatives"
    assert steps[-1] == "lowering (layer 2's plan repeated for 2 layers)" and plan.report.layers == (5, (0, 1, 2, 4), 2)
    for what in ("sharing search ", "exact windows ", "sharing search releasing "):
        counts = [tuple(map(int, s.removeprefix(what).split(" ")[0].split("/"))) for s in steps
                  if s.startswith(what) and s[len(what)].isdigit()]
        assert counts and counts == sorted(counts), what
        assert all(k <= n if "releasing" in what else k < n for k, n in counts), what


@functools.cache
def _block_cost(layers: int) -> float:
    return rs.optimize(transformer_stack(layers, MESH, 4096, 4096, 32, "bfloat16")).cost


@pytest.mark.slow
@pytest.mark.parametrize("depth", [4, 8])
def test_stack_never_costs_more_than_its_layer_repeated(depth: int) -> None:
    """The demo's block at a Llama-2-7B layer's sizes: ``depth`` blocks cost at most ``depth``
    copies of the one-block plan (whose input and output are the stack's seams, S(0))."""
    assert _block_cost(depth) <= depth * _block_cost(1) * (1 + 1e-9)


def test_reuse_off_plans_every_op() -> None:
    """``Limits(reuse_layers=False)``: the whole program is planned, and the plan is as valid."""
    f = transformer_stack(5, MESH)
    plan = rs.optimize(f, limits=rs.Limits(reuse_layers=False))
    assert plan.report.layers is None
    with pytest.raises(rs.ReshardError, match="reuse_layers must be a bool"):
        rs.Limits(reuse_layers=1)


@pytest.mark.hf
@pytest.mark.slow
def test_training_stack_matches_autograd() -> None:
    """A 5-layer Llama (tiny, fp32) trained on tp 2 with Megatron placements: the layers are
    planned once (layer 2's plan repeated for layers 2 and 3), and the plan's loss and every
    parameter's gradient match torch.autograd's."""
    T = pytest.importorskip("transformers")
    from reshard.testing.hf_models import megatron
    from reshard.testing.train_models import LossOf
    from reshard.testing.train_loop import simulated_step_matches_eager

    torch.manual_seed(0)
    module = LossOf(T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=5, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32)))
    ids, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    plan = rs.plan_training(module, (ids, labels), MESH, param_placements=megatron(module, MESH))
    assert plan.plan.report.layers == (5, (0, 1, 2, 4), 2)
    simulated_step_matches_eager(module, plan, ids, labels)


def test_each_ranked_plan_is_expanded_once(monkeypatch) -> None:
    """Extraction ranks a stack's finished candidates by their expansion (``rank``:
    ``StackProgram.expanded_cost``), and the plan lowers the chosen one's: every candidate's
    middle layers are expanded once, the chosen one's not again (``StackProgram._expanded``,
    and its ``PlanNode``s built once, ``extract``'s ``made``)."""
    import reshard.plan as P

    calls: dict[int, int] = {}
    ranked: list[int] = []
    expand, expanded_cost = P.expand, P.StackProgram.expanded_cost

    def counted(*args):
        calls[args[-1]] = calls.get(args[-1], 0) + 1
        return expand(*args)

    def ranking(self, roots):
        ranked.append(1)
        return expanded_cost(self, roots)

    monkeypatch.setattr(P, "expand", counted)
    monkeypatch.setattr(P.StackProgram, "expanded_cost", ranking)
    plan = rs.optimize(transformer_stack(6, MESH), cache=False)
    assert ranked, "this stack's extraction has several candidates: it ranks those it finishes"
    assert calls and all(n == len(ranked) for n in calls.values()), (calls, len(ranked))
    assert plan.report.layers[2] in calls
