"""Plan.explain and Plan.draw of a training plan show the forward and the backward pass apart
(``explain.node_passes`` / ``pass_totals``, ``draw.band_layout``); a plan without a backward
pass shows no pass at all."""

from __future__ import annotations

import pytest

import reshard as rs
from reshard.draw import box_passes, band_layout, boxes
from reshard.plan_view import fmt_bytes, fmt_time, node_passes, pass_totals
from reshard.passes.phases import backward_values
from reshard.testing import programs as P


@pytest.fixture(scope="module")
def train_plan() -> rs.Plan:
    return rs.optimize(P.training_block())


@pytest.fixture(scope="module")
def forward_plan() -> rs.Plan:
    return rs.optimize(P.mlp())


def test_pass_totals_add_up_to_the_plan(train_plan):
    plan = train_plan
    fwd, bwd = pass_totals(plan)
    assert (fwd.name, bwd.name) == ("forward", "backward")
    assert fwd.steps > 0 and bwd.steps > 0 and fwd.steps + bwd.steps == len(plan.lowered.nodes)
    assert fwd.collectives + bwd.collectives == len(plan.communications)
    assert bwd.collectives > 0 and bwd.bytes > 0  # the gradient's reduction
    assert fwd.bytes + bwd.bytes == plan.comm_bytes
    assert fwd.cost_s + bwd.cost_s == pytest.approx(plan.cost, rel=1e-9)


def _section(lines: list[str], name: str) -> list[str]:
    """The table rows between a pass's heading row and its totals row."""
    start = next(i for i, ln in enumerate(lines) if ln.split()[:2] == [name, "pass:"])
    end = next(i for i, ln in enumerate(lines) if ln.split()[:3] == [name, "pass", "total"])
    return lines[start + 1:end]


def test_explain_table_has_a_section_and_totals_per_pass(train_plan):
    plan = train_plan
    lines = plan.explain().splitlines()
    back = backward_values(plan.fusion)
    for t in pass_totals(plan):
        rows = _section(lines, t.name)
        values = [ln.split()[1] for ln in rows if ln.lstrip()[:1].isdigit()]
        assert len(values) == t.steps  # the plan has no repeated layers: one row per step
        by_name = {plan.fusion.tensors[n.value].name: n.value in back for n in plan.lowered.nodes}
        assert all(by_name[v] == (t.name == "backward") for v in values), (t.name, values)
        total = next(ln for ln in lines if ln.split()[:3] == [t.name, "pass", "total"])
        assert f"{t.steps} steps" in total and f"{t.collectives} collectives" in total
        assert total.rstrip().endswith(f"{fmt_bytes(t.bytes)}  {fmt_time(t.cost_s)}")
    assert "grad.w" in {ln.split()[1] for ln in _section(lines, "backward")}
    assert {"x", "xw", "loss"} <= {ln.split()[1] for ln in _section(lines, "forward")}
    # the forward section comes first, and the plan's totals row is unchanged
    assert lines.index(next(ln for ln in lines if "forward pass:" in ln)) < lines.index(
        next(ln for ln in lines if "backward pass:" in ln))
    total = next(ln for ln in lines if ln.split()[:1] == ["total"])
    assert f"{len(plan.communications)} collectives" in total and total.rstrip().endswith(fmt_time(plan.cost))


def test_draw_clusters_the_passes(train_plan, tmp_path):
    plan = train_plan
    nodes = boxes(plan)
    phase = box_passes(plan, nodes)
    layer, bands = band_layout(nodes, phase)
    assert [b.phase for b in bands] == sorted((b.phase for b in bands), key=("forward", "backward").index)
    assert {b.phase for b in bands} == {"forward", "backward"}
    band_of_layer = {L: b.phase for b in bands for L in b.layers}
    by_name = {b.name: band_of_layer[layer[b.uid]] for b in nodes}
    assert by_name["grad.x"] == by_name["g"] == by_name["x.saved"] == "backward"
    assert by_name["xw"] == by_name["loss"] == "forward"
    assert all(band_of_layer[layer[b.uid]] == phase[b.uid] for b in nodes)
    svg = plan.draw(tmp_path / "train.svg").read_text()
    fwd, bwd = pass_totals(plan)
    assert f"forward pass: {fwd.steps} steps, {fwd.collectives} collectives" in svg
    assert f"backward pass: {bwd.steps} steps, {bwd.collectives} collectives" in svg
    assert "to x.saved" in svg and "from x" in svg  # the saved activation's edge crosses into the backward pass


def test_a_forward_plan_shows_no_pass(forward_plan, tmp_path):
    plan = forward_plan
    assert node_passes(plan) is None and pass_totals(plan) == []
    text = plan.explain()
    assert "pass:" not in text and "pass total" not in text
    nodes = boxes(plan)
    assert box_passes(plan, nodes) is None
    assert {b.phase for b in band_layout(nodes, None)[1]} == {None}
    svg = plan.draw(tmp_path / "fwd.svg").read_text()
    assert "forward pass" not in svg and "backward pass" not in svg
