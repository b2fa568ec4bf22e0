"""Plan.explain (priced rejected alternatives, table), Plan.draw (PNG/SVG) and the CLI flags."""

from __future__ import annotations

import random
import struct

import pytest

import reshard as rs
from reshard.cli import _Progress, main
from reshard.egraph_rules.saturate import SaturationReport
from reshard.examples import transformer_block
from reshard.egraph_rules.alternatives import COLLECTIVES
from reshard.explain import fmt_time, print_explanation, total_cost_s
from reshard.plan import PS, Saturated
from tests import programs as P


def readme_mlp() -> rs.Fusion:
    """The README's example, verbatim."""
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    f = rs.Fusion()
    x = f.input("x", (16, 32), "float32", mesh, [rs.Shard(0)])
    w1 = f.input("w1", (32, 128), "float32", mesh, [rs.Shard(1)])
    w2 = f.input("w2", (128, 32), "float32", mesh, [rs.Shard(0)])
    f.output(f.matmul(f.gelu(f.matmul(x, w1)), w2), [rs.Shard(0)])
    return f


@pytest.fixture(scope="module")
def mlp_plan() -> rs.Plan:
    return rs.optimize(readme_mlp())


@pytest.fixture(scope="module")
def small_out_plan() -> rs.Plan:
    return rs.optimize(P.matmul_small_out(m=8))


def _subdag_cost_ps(n) -> int:
    """Cost of a PlanNode's sub-DAG from the PlanNodes alone (shared e-nodes paid once)."""
    seen: dict[int, int] = {}
    stack = [n]
    while stack:
        m = stack.pop()
        if m.enode not in seen:
            seen[m.enode] = m.cost_ps
            stack.extend(m.args)
    return sum(seen.values())


def _collective_nodes(plan: rs.Plan) -> list:
    return [n for n in plan.lowered.nodes if n.kind in COLLECTIVES]


def test_mlp_explanation_prices_a_rejected_alternative_for_each_collective(mlp_plan):
    plan = mlp_plan
    text = plan.explain()
    lines = text.splitlines()
    # the table: one row per plan node, a totals line whose time is plan.cost
    assert len([ln for ln in lines if ln.lstrip()[:1].isdigit()]) == len(plan.lowered.nodes)
    total = next(ln for ln in lines if ln.split()[:1] == ["total"])
    assert total.rstrip().endswith(fmt_time(plan.cost)) and f"{len(plan.communications)} collectives" in total
    assert total_cost_s(plan) == pytest.approx(plan.cost, rel=1e-12)
    # both collectives, each followed by its cheapest rejected alternative
    for kind in ("allgather", "reduce_scatter"):
        i = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f"comm {kind} on axis 'tp' (team 2)"))
        assert lines[i + 1].strip().startswith("rejected: ")
    nodes = _collective_nodes(plan)
    assert [COLLECTIVES[n.kind] for n in nodes] == ["allgather", "reduce_scatter"]
    assert any(a.scope == "value" for n in nodes for a in n.alternatives)
    for n, c in zip(nodes, plan.communications):
        assert n.subplan_cost_ps == _subdag_cost_ps(n)
        assert n.cost_ps * PS == pytest.approx(c.cost_s)
        values = [a for a in n.alternatives if a.scope == "value"]
        assert values  # x [R]'s other way (via x [S(1)]) is priced acyclically (test_explain_alternatives)
        assert [a.cost_ps for a in values] == sorted(a.cost_ps for a in values)
        for a in values:
            assert a.cost_ps >= n.subplan_cost_ps  # extraction kept the cheaper sub-plan
            assert a.plan_cost_ps * PS >= plan.cost * (1 - 1e-12)  # and the cheaper whole plan
            assert a.plan_bytes >= a.bytes >= 0
    # the last collective's sub-plan is the whole plan
    assert nodes[-1].subplan_cost_ps * PS == pytest.approx(plan.cost) and nodes[-1].subplan_bytes == plan.comm_bytes


def test_gather_after_matmul_rejects_gather_before_with_more_bytes(small_out_plan):
    plan = small_out_plan
    (gather,) = _collective_nodes(plan)
    x_bytes = 64 * 1024 * 4 // 2  # what gathering x before the matmul receives per rank
    before = [a for a in gather.alternatives if a.scope == "value" and a.description.startswith("matmul(x [R], w [R])")]
    assert len(before) == 1
    (b,) = before
    assert any(s.startswith("allgather of x [S(0)] -> [R]") for s in b.new_comms)
    assert b.bytes == x_bytes > gather.subplan_bytes == plan.comm_bytes == 1024
    assert b.cost_ps > gather.subplan_cost_ps and b.plan_cost_ps * PS > plan.cost
    # the strategy section names the replicated matmul as the rejected strategy of t2
    (mm,) = [n for n in plan.lowered.nodes if n.kind == "Loc2"]
    strat = [a for a in mm.alternatives if a.scope == "strategy"]
    assert strat[0].description.startswith("matmul(x [R], w [R]) -> [R]") and strat[0].bytes == x_bytes
    text = plan.explain()
    assert "rejected: matmul(x [R], w [R]) -> [R] after allgather of x [S(0)] -> [R]" in text


def test_flipped_costs_reject_the_gather_after_instead():
    """bf16 with a wide output: gathering x first is chosen; gathering the product is the
    rejected alternative, with more bytes and a higher whole-plan cost."""
    plan = rs.optimize(P.matmul_small_out(m=2048, dtype="bfloat16"))
    (gather,) = _collective_nodes(plan)
    assert plan.fusion.tensors[gather.value].name == "x"
    (out,) = [n for n in plan.lowered.nodes if n.kind == "Loc2"]
    after = [a for a in out.alternatives if a.scope == "value" and a.description.startswith("allgather of t2")]
    assert after and after[0].bytes == 64 * 2048 * 2 // 2 > plan.comm_bytes
    assert after[0].plan_cost_ps * PS > plan.cost


def test_explain_of_perturbed_plans_is_consistent():
    f = P.mlp()
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    rng = random.Random(3)
    for _ in range(3):
        plan = sat.plan(perturb=rng)
        text = plan.explain()
        assert "reshard plan:" in text and "total" in text
        assert total_cost_s(plan) == pytest.approx(plan.cost, rel=1e-12)
        for n in plan.lowered.nodes:
            assert n.subplan_cost_ps == _subdag_cost_ps(n)
            for a in n.alternatives:
                assert a.scope in ("value", "strategy") and a.cost_ps > 0 and a.plan_cost_ps > 0


def test_rich_rendering_when_available(mlp_plan):
    pytest.importorskip("rich")
    import io
    buf = io.StringIO()
    print_explanation(mlp_plan, buf, use_rich=True)
    assert "reduce_scatter" in buf.getvalue() and "[S(0)]" in buf.getvalue()


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_draw_png_and_svg(tmp_path, small_out_plan):
    png = small_out_plan.draw(tmp_path / "plan.png")
    w, h = _png_size(png.read_bytes())
    assert w >= 900 and h >= 300 and png.stat().st_size > 10_000
    svg = small_out_plan.draw(str(tmp_path / "plan.SVG"))
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for label in ("allgather t2", "t2 = matmul", "input x", "S(0) \u2192 R", "modeled 10.0 us"):
        assert label in text, label


def test_draw_demo_block_is_large_enough_to_read(tmp_path):
    plan = rs.optimize(transformer_block())
    w, h = _png_size(plan.draw(tmp_path / "demo.png").read_bytes())
    # ~1 inch per layer at 150 dpi: boxes keep their size instead of being squeezed
    assert w >= 2000 and h >= 900


@pytest.mark.parametrize("name,message", [("plan.gif", "must end in .png or .svg"), ("plan", "must end in"),
                                           ("missing/plan.png", "no such directory")])
def test_draw_bad_paths_raise(tmp_path, small_out_plan, name, message):
    with pytest.raises(rs.ReshardError, match=message):
        small_out_plan.draw(tmp_path / name)


def test_cli_demo_and_explain_draw(tmp_path, capsys):
    out = tmp_path / "demo.png"
    assert main(["demo", "-q", "--draw", str(out)]) == 0
    assert _png_size(out.read_bytes())[0] > 1000
    assert f"plan drawn to {out}" in capsys.readouterr().out
    prog = tmp_path / "prog.py"
    prog.write_text("import reshard as rs\n"
                    "f = rs.Fusion()\n"
                    "x = f.input('x', (8, 4), 'float32', rs.DeviceMesh([0, 1]), [rs.Shard(0)])\n"
                    "f.output(f.exp(x), [rs.Replicate()])\n"
                    "fusion = f\n")
    svg = tmp_path / "prog.svg"
    assert main(["explain", str(prog), "-q", "--draw", str(svg)]) == 0
    assert "<svg" in svg.read_text()
    assert main(["explain", str(prog), "-q", "--draw", str(tmp_path / "x.jpg")]) == 2
    assert "must end in .png or .svg" in capsys.readouterr().err


def test_progress_prints_every_few_iterations(capsys):
    progress = _Progress(every=3, seconds=2.0)
    for i, secs in enumerate([0.1, 0.2, 0.3, 0.4, 2.6, 2.7], start=1):
        progress(SaturationReport(iterations=i, enodes=100 * i, seconds=secs))
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(",")[0].strip() for ln in err] == ["saturation: iteration 3", "saturation: iteration 5",
                                                        "saturation: iteration 6"]
    assert "500 e-nodes, 2.60 s elapsed" in err[1]


def test_cross_mesh_transfer_is_explained_and_drawn(tmp_path):
    a, b = rs.DeviceMesh([0, 1], ("tp",)), rs.DeviceMesh([2, 3], ("tp",))
    f = rs.Fusion()
    x = f.input("x", (16, 32), "float32", a, [rs.Shard(0)])
    f.output(f.tanh(f.redistribute(f.exp(x), [rs.Replicate()], mesh=b)), [rs.Replicate()])
    plan = rs.optimize(f)
    text = plan.explain()
    kinds = {c.kind for c in plan.communications}
    assert kinds & {"send_recv", "broadcast", "scatter"}
    assert len([ln for ln in text.splitlines() if ln.strip().startswith("comm ")]) == len(plan.communications)
    assert total_cost_s(plan) == pytest.approx(plan.cost, rel=1e-12)
    svg = plan.draw(tmp_path / "xmesh.svg").read_text()
    assert "ranks [2, 3]" in svg
