"""Plan.explain (priced rejected alternatives, table), Plan.draw (PNG/SVG) and the CLI flags."""

from __future__ import annotations

import random
import re
import struct

import pytest

import reshard as rs
from reshard.cli import _Progress, main
from reshard.search.saturate import SaturationReport
from reshard.draw import draw_plan
from reshard.examples import transformer_block, transformer_stack
from reshard.extract.plan_node import Tag
from reshard.explain import explain_text, print_explanation, rows
from reshard.plan_view import fmt_bytes, fmt_time, layer_of, repeated_layers, total_cost_s
from reshard.plan import PS, Saturated
from reshard.testing import programs as P


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
    return [n for n in plan.lowered.nodes if n.head.tag is Tag.COLLECTIVE]


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
    assert [n.head.form for n in nodes] == ["allgather", "reduce_scatter"]
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
    (mm,) = [n for n in plan.lowered.nodes if n.head.tag is Tag.APPLY and len(n.args) == 2]
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
    (out,) = [n for n in plan.lowered.nodes if n.head.tag is Tag.APPLY and len(n.args) == 2]
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
    progress(SaturationReport(iterations=7, enodes=900, seconds=2.8, phase="extraction"))  # (never throttled)
    assert capsys.readouterr().err.startswith("  saturation done: 7 iterations, 900 e-nodes, 2.80 s; extracting")
    # each extraction step as it starts; a counted step again only after 2 s without a line
    for step in ["greedy", "sharing search 0/9 re-extractions", "sharing search 1/9 re-extractions",
                 "sharing search releasing 1/2", "adopting alternatives", "lowering"]:
        progress(SaturationReport(iterations=7, enodes=900, seconds=2.8, phase="extraction", step=step))
    err = capsys.readouterr().err.splitlines()
    assert [ln.rsplit(" (", 1)[0] for ln in err] == [
        "  extraction: greedy", "  extraction: sharing search 0/9 re-extractions",
        "  extraction: sharing search releasing 1/2", "  extraction: adopting alternatives", "  extraction: lowering"]
    assert all(ln.endswith(" s elapsed)") for ln in err)


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


# ---- names, footnotes, repeated layers (issue 18, "the first hour") --------------------------
@pytest.fixture(scope="module")
def demo_plan() -> rs.Plan:
    return rs.optimize(transformer_block())


def _table_values(text: str) -> set[str]:
    """The value column of the plain-text table."""
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["#", "value"])
    start = lines[head].index("value")
    end = lines[head].index("op", start)
    out = set()
    for ln in lines[head + 2:]:
        if ln.startswith("--"):
            break
        out.add(ln[start:end].strip())
    return out


def _footnotes(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("total")) + 1:]


def test_fusion_ops_take_a_name():
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", mesh, [rs.Shard(0)])
    w = f.input("w", (8, 8), "float32", mesh, [rs.Replicate()])
    y = f.matmul(x, w, name="mlp.fc1")
    z = f.cat([y, y, y], 1, name="three")
    assert (y.name, z.name, f.gelu(y).name) == ("mlp.fc1", "three", f"t{len(f.tensors) - 1}")
    assert [t.name for t in f.tensors if t.name == "three"] == ["three"]  # the chain's last cat only
    for bad in ("", 3):
        with pytest.raises(rs.ReshardError, match="name must be a non-empty str"):
            f.exp(y, name=bad)


def test_demo_values_are_named_after_what_they_are(demo_plan):
    values = _table_values(demo_plan.explain())
    assert {"x", "attn.qkv", "attn.q", "attn.scores", "attn.probs", "attn.out", "h", "mlp.fc1", "mlp.gelu",
            "mlp.fc2", "y"} <= values
    assert not [v for v in values if re.fullmatch(r"t\d+", v)]


def test_every_value_a_footnote_names_is_in_the_table(demo_plan):
    """A rejected alternative that reads a value the plan does not compute (the attention's
    k.T, which the chosen plan reads through a transposed view) spells it out in table values."""
    text = demo_plan.explain()
    values = _table_values(text)
    names = {t.name for t in demo_plan.fusion.tensors}
    assert "permute(attn.k)" in text and "attn.kT" in names - values
    for line in _footnotes(text):
        for name in names:
            if re.search(rf"(?<![\w.]){re.escape(name)}(?=\.T \(view\)|[^\w.]|$)", line):
                assert name in values, (name, line)


def test_no_alternative_costs_0_bytes_without_a_reason(demo_plan):
    text = demo_plan.explain()
    zero = re.findall(r"\b0 B\b.{0,40}", text)
    assert zero and all(z.startswith("0 B (") for z in zero), zero


@pytest.fixture(scope="module")
def stack_plan() -> rs.Plan:
    return rs.optimize(transformer_stack(4, seq=8, hidden=16, heads=2))


def test_repeated_layers_are_one_line_each_in_the_explanation(stack_plan):
    plan = stack_plan
    layers = repeated_layers(plan)
    assert layers.same == {"layers.1": "layers.0", "layers.2": "layers.0"}  # the last layer ends differently
    short, full = plan.explain(full=True), explain_text(plan, full=True, summarize=False)
    assert len(short.splitlines()) < len(full.splitlines()) * 0.7
    values = _table_values(short)
    assert "layers.0.attn.qkv" in values and "layers.3.attn.qkv" in values
    assert not any(v.startswith(("layers.1.", "layers.2.")) for v in values)
    row = next(ln for ln in short.splitlines() if ln.lstrip().startswith("layers.1 .. layers.2"))
    assert "2 layers" in row and "each repeats the steps of layers.0 above" in row
    # the summary row's bytes and time are the hidden layers' own: the totals line is unchanged
    total = [ln.split() for ln in short.splitlines() if ln.split()[:1] == ["total"]]
    assert total == [ln.split() for ln in full.splitlines() if ln.split()[:1] == ["total"]]
    hidden = [r for r, n in zip(rows(plan), plan.lowered.nodes) if layers.of.get(n.uid) in layers.same]
    assert fmt_time(sum(r.cost_s for r in hidden)) in row and fmt_bytes(sum(r.bytes for r in hidden)) in row


def test_layers_agree_only_when_their_steps_do(stack_plan):
    """Each hidden layer's rows are its reference layer's with the layer renamed; a layer
    whose weights are sharded differently is shown in full."""
    plan = stack_plan
    layers = repeated_layers(plan)
    by_layer: dict[str, list] = {}
    for r, n in zip(rows(plan), plan.lowered.nodes):
        by_layer.setdefault(layers.of.get(n.uid), []).append(r)
    for hidden, ref in layers.same.items():
        strip = [[(r.value.removeprefix(layer), r.op, r.sharding, r.collective, r.bytes, r.cost_s)
                  for r in by_layer[layer]] for layer in (hidden, ref)]
        assert strip[0] == strip[1]
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    f = rs.Fusion()
    y = f.input("x", (8, 16), "float32", mesh, [rs.Shard(0)])
    for i in range(4):
        w = f.input(f"layers.{i}.w", (16, 16), "float32", mesh, [rs.Replicate() if i == 2 else rs.Shard(1)])
        y = f.gelu(f.matmul(y, w, name=f"layers.{i}.mm"), name=f"layers.{i}.act")
    f.output(y, [rs.Replicate()])
    odd = repeated_layers(rs.optimize(f))
    assert "layers.2" not in odd.same and odd.same.get("layers.1") == "layers.0"


def test_repeated_layers_are_one_box_in_the_drawing(tmp_path, stack_plan):
    short = stack_plan.draw(tmp_path / "short.svg").read_text()
    assert "layers.1 .. layers.2" in short and "2 layers, each repeats layers.0" in short
    assert "layers.1.attn.qkv = matmul" not in short and "layers.3.attn.qkv = matmul" in short
    full = draw_plan(stack_plan, tmp_path / "full.svg", full=True).read_text()
    (w1, h1), (w2, h2) = (map(float, re.search(r'width="([\d.]+)pt" height="([\d.]+)pt"', svg).groups())
                          for svg in (short, full))
    assert "layers.1.attn.qkv = matmul" in full and h1 * w1 < 0.7 * h2 * w2


def test_from_torch_names_values_by_module_path():
    """from_torch names a module's result by its path and what a module's ops compute inside
    it by path and op; the blocks of an nn.ModuleList get the same names up to the index."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.nn.functional.gelu(self.fc1(x))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(), Block()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.layers:
                x = b(x)
            return x

    tp = rs.from_torch(Net(), (torch.randn(4, 8),), [rs.Shard(0)], [rs.Shard(0)], rs.DeviceMesh([0, 1], ("tp",)))
    names = [t.name for t in tp.fusion.tensors]
    assert {"layers.0.fc1", "layers.0.fc1.matmul", "layers.0.gelu", "layers.0", "layers.1.fc1", "layers.1"} <= set(
        names), names
    per_layer = [sorted(n.removeprefix(f"layers.{i}") for n in names if layer_of(n) == f"layers.{i}")
                 for i in range(2)]
    assert per_layer[0] == per_layer[1]
