"""Symbolic mesh sizes (``ir.symbolic``, ``extract.repricing``, ``plan_symbolic``): one e-graph per
size class, each size's plan extracted from it without saturating again, equal to ``optimize`` of
the concrete program at that size and simulating to the reference."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
import torch

import reshard as rs
import reshard.plan as plan_module
from reshard.extract.dag import ENode, collect_enodes
from reshard.extract.repricing import Repricer
from reshard.ir.symbolic import mesh_for, on_mesh
from reshard.testing import programs as P


def chain(mesh: rs.DeviceMesh, s: int = 1024, h: int = 4096, o: int = 1024, k: int = 8) -> rs.Fusion:
    """A row-parallel matmul (its result Partial) and ``k`` elementwise ops, the result
    replicated: all-reduce then the ops on the whole result, or reduce-scatter, the ops on
    1/tp of it, and all-gather.  The second pays one more α and saves (1 - 1/tp) of the ops'
    memory traffic: the all-reduce is cheaper at tp = 2, the pair from tp = 4 on."""
    f = rs.Fusion()
    x = f.input("x", (s, h), "float32", mesh, [rs.Shard(1)])
    w = f.input("w", (h, o), "float32", mesh, [rs.Shard(0)])
    y = f.matmul(x, w, name="y")
    for i in range(k):
        y = (f.tanh if i % 2 == 0 else f.exp)(y, name=f"act{i}")
    f.output(y, [rs.Replicate()])
    return f


TP = rs.SymbolicMesh(("tp",), {"tp": [2, 4, 8]}, {"tp": [4096]})


@pytest.fixture(scope="module")
def crossover() -> rs.SymbolicPlan:
    return rs.optimize_symbolic(chain, TP)


def test_specialize_saturates_nothing_and_matches_optimize(crossover, monkeypatch):
    assert crossover.saturations == 1 and len(crossover.classes) == 1
    calls = []
    real = plan_module.saturate_program
    monkeypatch.setattr(plan_module, "saturate_program", lambda *a, **k: calls.append(1) or real(*a, **k))
    plans = {n: crossover.specialize(tp=n) for n in (2, 4, 8)}
    assert calls == []
    for n, plan in plans.items():
        concrete = rs.optimize(chain(TP.at(tp=n)), cache=False)
        assert plan.cost == concrete.cost and plan.digest() == concrete.digest()
    assert len(calls) == 3  # (the concrete runs)


def test_a_size_outside_the_domain_in_a_saturated_class(crossover, monkeypatch):
    """tp = 16 was not in the domain, but its program falls in the class of 4 and 8."""
    calls = []
    real = plan_module.saturate_program
    monkeypatch.setattr(plan_module, "saturate_program", lambda *a, **k: calls.append(1) or real(*a, **k))
    plan = crossover.specialize(tp=16)
    assert calls == []
    concrete = rs.optimize(chain(TP.at(tp=16)), cache=False)
    assert plan.cost == concrete.cost and plan.digest() == concrete.digest()


def test_the_cheapest_plan_changes_with_the_size(crossover):
    table = crossover.table()
    assert [[s["tp"] for s in r.sizes] for r in table] == [[2], [4, 8]]
    assert [c.kind for c in table[0].plans[0].communications] == ["allreduce"]
    assert sorted(c.kind for c in table[1].plans[0].communications) == ["allgather", "reduce_scatter"]
    text = crossover.explain()
    assert "range 1: tp=2\n" in text and "range 2: tp=4 | tp=8" in text and "reduce_scatter(tp)" in text
    assert "the cheapest plan changes between tp=2 and tp=4" in text
    x, w = 1024 * 4096 * 4, 4096 * 1024 * 4  # both split on tp
    assert f"inputs per rank: {x + w}/tp bytes" in text


def test_crossover_plans_simulate_to_the_reference():
    """The crossover 1024 times smaller (every dim / 32, α and launch / 1024, peak x 32: every
    cost / 1024, so the same choices): the plan of each range simulates to the reference."""
    prof = json.loads((Path(rs.__file__).parent / "profiles" / "h200x2.json").read_text())
    prof["alpha_us"] = {k: v / 1024 for k, v in prof["alpha_us"].items()}
    prof["launch_us"] /= 1024
    prof["peak_tflops"] = {k: v * 32 for k, v in prof["peak_tflops"].items()}
    small = rs.optimize_symbolic(lambda m: chain(m, s=32, h=128, o=32), rs.SymbolicMesh(("tp",), {"tp": [2, 4]},
                                                                                          {"tp": [128]}),
                                 cost_profile=prof)
    assert [[c.kind for c in r.plans[0].communications] for r in small.table()] == [
        ["allreduce"], ["reduce_scatter", "allgather"]]
    for n in (2, 4):
        f = chain(TP.at(tp=n), s=32, h=128, o=32)
        P.assert_plan_matches_reference(small.specialize(tp=n), f, P.random_inputs(f))


def test_smallest_size_that_fits(crossover):
    peaks = {n: crossover.specialize(tp=n).peak_bytes for n in (2, 4, 8)}
    assert peaks[2] > peaks[4] > peaks[8]
    assert crossover.smallest("tp", peaks[4]).peak_bytes == peaks[4]
    assert crossover.smallest("tp", peaks[4] - 1).peak_bytes == peaks[8]
    assert crossover.smallest("tp", peaks[8] - 1) is None


def mlp2d(mesh: rs.DeviceMesh = P.MESH2D, s: int = 64, h: int = 64) -> rs.Fusion:
    """A data x tensor parallel MLP: tokens split on x, Megatron's weights on y."""
    f = rs.Fusion()
    R, S = rs.Replicate, rs.Shard
    x = f.input("x", (s, h), "float32", mesh, [S(0), R()])
    w1 = f.input("w1", (h, 4 * h), "float32", mesh, [R(), S(1)])
    w2 = f.input("w2", (4 * h, h), "float32", mesh, [R(), S(0)])
    f.output(f.matmul(f.gelu(f.matmul(x, w1)), w2), [S(0), R()])
    return f


@pytest.mark.parametrize("build, sizes, one_egraph", [
    (mlp2d, {"x": [2], "y": [4, 8]}, True),  # dp x tp 2x4 and 2x8
    (lambda: P.mlp(s=12, h=24), {"x": [2, 3, 4, 6]}, True),
    (P.qkv_slice, {"x": [2, 4, 8]}, False),
    (P.pick_lookups, {"x": [2, 4, 8]}, False),
    (P.training_linear, {"x": [2, 4, 8]}, False),
    (P.mesh2d_block, {"x": [2], "y": [2, 4]}, False),  # dp x tp 2x2 and 2x4
], ids=["mlp2d", "mlp-tp2346", "qkv_slice", "pick_lookups", "training_linear", "mesh2d_block"])
def test_programs_specialize_as_optimize_does(build, sizes, one_egraph):
    """Every size's plan is the concrete program's (modeled cost and digest) and simulates to
    the reference; programs whose dims every size divides, and exceeds, saturate once."""
    f = build()
    mesh = mesh_for(f, sizes)
    sym = rs.optimize_symbolic(f, mesh)
    assert sym.saturations == len(sym.classes)
    assert (sym.saturations == 1) == one_egraph
    for point in mesh.points():
        concrete_f = on_mesh(f, mesh.at(**point))
        plan = sym.specialize(**point)
        concrete = rs.optimize(concrete_f, cache=False)
        assert plan.cost == concrete.cost, point
        assert plan.digest() == concrete.digest(), point
        P.assert_plan_matches_reference(plan, concrete_f, P.random_inputs(concrete_f))


def fused_qkv(mesh: rs.DeviceMesh, s: int = 16, h: int = 64) -> rs.Fusion:
    """GPT-2's fused [q | k | v] weight column-parallel by heads (``FusedShard``), q sliced out."""
    f = rs.Fusion()
    x = f.input("x", (s, h), "float32", mesh, [rs.Replicate()])
    w = f.input("w", (h, 3 * h), "float32", mesh, [rs.FusedShard(1, 3)])
    q = f.slice(f.gelu(f.matmul(x, w)), 1, 0, h)
    f.output(f.matmul(q, f.input("wo", (h, h), "float32", mesh, [rs.Shard(0)])), [rs.Replicate()])
    return f


def test_a_fused_shard_decoded_in_its_cyclic_form_is_read_at_other_sizes():
    """At tp = 2 the e-graph's smallest term of the matmul's fused shard is ``Inner(Outer(x, 6),
    3)``; at tp = 4 it is rebuilt as ``FusedShard(1, 3)`` (the outer-inner law)."""
    mesh = rs.SymbolicMesh(("tp",), {"tp": [2, 4]}, {"tp": [192, 64]})
    sym = rs.optimize_symbolic(fused_qkv, mesh)
    assert sym.saturations == 1
    assert any(n.sharding.placements is None for n in sym.specialize(tp=2).lowered.nodes)
    for n in (2, 4):
        f = fused_qkv(mesh.at(tp=n))
        plan, concrete = sym.specialize(tp=n), rs.optimize(f, cache=False)
        assert plan.cost == concrete.cost and plan.digest() == concrete.digest()
        P.assert_plan_matches_reference(plan, f, P.random_inputs(f))


def test_a_size_outside_the_domain_or_a_fact_is_refused(crossover):
    with pytest.raises(rs.ReshardError, match=r"tp=1 falls in none of the size classes"):
        crossover.specialize(tp=1)
    with pytest.raises(rs.ReshardError, match=r"tp=3 violates the divisibility fact tp \| 4096 .* which splits "
                                              r"input x dim 1, input w dim 0"):
        crossover.specialize(tp=3)
    with pytest.raises(rs.ReshardError, match=r"tp=3 violates the divisibility fact tp \| 4096"):
        rs.SymbolicMesh(("tp",), {"tp": [2, 3]}, {"tp": [4096]})
    with pytest.raises(rs.ReshardError, match=r"give a size for each axis"):
        crossover.specialize(dp=2)


def test_a_split_without_a_fact_names_the_tensor_dim():
    mesh = rs.SymbolicMesh(("tp",), {"tp": [2, 4]}, {"tp": [1024]})
    with pytest.raises(rs.ReshardError, match=r"input x dim 1 \(extent 4096\) is split over tp .* tp \| 4096"):
        rs.optimize_symbolic(chain, mesh)


def test_a_sharding_naming_concrete_sizes_is_refused():
    f = P.cyclic_reduce()  # x at Inner(Root(0, 8), 4): a cyclic split names the size 2
    with pytest.raises(rs.ReshardError, match=r"names concrete sizes .* function of the mesh"):
        rs.optimize_symbolic(f, rs.SymbolicMesh(("x",), {"x": [2, 4]}, {"x": [8]}))


def test_repricing_checks_each_law_against_the_egraph():
    """A node whose e-graph cost no re-pricing law gives is refused, not priced by a guess."""
    sat = plan_module.Saturated.build(P.mlp(), rs.CostProfile.load(None), rs.Limits())
    nodes = collect_enodes(sat.snapshot)
    Repricer(sat.snapshot, sat.fusion, nodes, sat.encoding.mesh, rs.CostProfile.load(None))  # every law checks out
    n = next(n for n in nodes if n.ctor == "AllGather")
    bad = [ENode(m.id, m.ctor, m.cls, m.args, m.children, m.cost + (m is n)) for m in nodes]
    with pytest.raises(rs.ReshardError, match="no cost law re-pricing knows"):
        Repricer(sat.snapshot, sat.fusion, bad, sat.encoding.mesh, rs.CostProfile.load(None))


def attention_heads(mesh: rs.DeviceMesh, b: int = 16, heads: int = 16, s: int = 64, d: int = 64) -> rs.Fusion:
    """Fused attention with q, k, v and the result sharded on the heads."""
    f = rs.Fusion()
    q, k, v = (f.input(n, (b, heads, s, d), "float32", mesh, [rs.Shard(1)]) for n in "qkv")
    f.output(f.attention(q, k, v, None, scale=d ** -0.5, name="o"), [rs.Shard(1)])
    return f


def test_a_fused_op_is_repriced_from_its_local_work_at_each_size():
    """A fused op's cost reads its strategy's local work (``OpKind.local_work``), which the
    repricer recomputes on the local shapes each size gives: one e-graph serves tp 2, 4 and 8,
    each plan the concrete program's."""
    mesh = rs.SymbolicMesh(("tp",), {"tp": [2, 4, 8]}, {"tp": [16]})
    sym = rs.optimize_symbolic(attention_heads, mesh)
    assert sym.saturations == 1
    for n in (2, 4, 8):
        f = attention_heads(mesh.at(tp=n))
        plan, concrete = sym.specialize(tp=n), rs.optimize(f, cache=False)
        assert "attention" in {s.attr("fop") for s in plan.program.steps if s.attr("op") == "apply"}
        assert plan.cost == concrete.cost and plan.digest() == concrete.digest(), n
        P.assert_plan_matches_reference(plan, f, P.random_inputs(f))


def test_plan_training_on_a_symbolic_mesh():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    S = rs.Shard
    params = {"0.weight": [S(0)], "0.bias": [S(0)], "2.weight": [S(1)]}
    mesh = rs.SymbolicMesh(("tp",), {"tp": [2, 4]}, {"tp": [32]})
    sym = rs.plan_training(module, (x,), mesh, loss_fn=torch.nn.functional.mse_loss, example_targets=(y,),
                           param_placements=params)
    got = sym.specialize(tp=4)
    concrete = rs.plan_training(module, (x,), rs.DeviceMesh([0, 1, 2, 3], ("tp",)),
                                loss_fn=torch.nn.functional.mse_loss, example_targets=(y,),
                                param_placements=params, cache=False)
    assert got.grads == concrete.grads and got.plan.cost == concrete.plan.cost
    assert got.plan.digest() == concrete.plan.digest()
    P.assert_plan_matches_reference(got.plan, got.plan.source, P.random_inputs(got.plan.source))
    assert "range 1: tp=2 | tp=4" in sym.explain()


def mlp_stack(mesh: rs.DeviceMesh, depth: int = 6) -> rs.Fusion:
    """``depth`` MLP layers ``layers.i`` (x sequence-sharded, w1 column-, w2 row-parallel): a
    regular stack, planned layer by layer (``plan.StackProgram``)."""
    f = rs.Fusion()
    y = f.input("x", (16, 32), "float32", mesh, [rs.Shard(0)])
    for i in range(depth):
        w1 = f.input(f"layers.{i}.w1", (32, 64), "float32", mesh, [rs.Shard(1)])
        w2 = f.input(f"layers.{i}.w2", (64, 32), "float32", mesh, [rs.Shard(0)])
        h = f.gelu(f.matmul(y, w1, name=f"layers.{i}.fc1"), name=f"layers.{i}.act")
        y = f.add(y, f.matmul(h, w2, name=f"layers.{i}.fc2"), name=f"layers.{i}")
    f.output(y, [rs.Shard(0)])
    return f


def test_a_stack_of_layers_is_planned_once_per_size_class(monkeypatch):
    """A program with a stack of repeated layers: its reduced program saturated once for the
    whole domain, each size's plan its layer's plan repeated, equal to ``optimize`` at that size
    (which plans the stack the same way) and to the reference."""
    mesh = rs.SymbolicMesh(("tp",), {"tp": [2, 4, 8]}, {"tp": [16, 64]})
    deep = functools.partial(mlp_stack, depth=10)
    sym = rs.optimize_symbolic(deep, mesh)
    assert sym.saturations == 1
    monkeypatch.setattr(plan_module.Saturated, "build", None)  # specialize saturates nothing
    for point in mesh.points():
        plan = sym.specialize(**point)
        assert plan.report.layers is not None and plan.report.layers[0] == 10, point
        concrete_f = deep(mesh.at(**point))
        monkeypatch.undo()
        concrete = rs.optimize(concrete_f, cache=False)
        monkeypatch.setattr(plan_module.Saturated, "build", None)
        assert plan.cost == concrete.cost and plan.digest() == concrete.digest(), point
        small = {k: v * 0.05 for k, v in P.random_inputs(concrete_f).items()}  # a stack without norms grows
        P.assert_plan_matches_reference(plan, concrete_f, small)
    assert sym.saturations == 1
    text = sym.explain()  # the collectives counted per layer, the repeated layers as one run
    assert re.search(r"layers\.\d \.\. layers\.\d \(\d layers\) each: ", text), text


def test_a_stack_planned_whole_when_layer_reuse_is_off():
    mesh = rs.SymbolicMesh(("tp",), {"tp": [2, 4]}, {"tp": [16, 64]})
    limits = rs.Limits(reuse_layers=False)
    plan = rs.optimize_symbolic(mlp_stack, mesh, limits=limits).specialize(tp=4)
    assert plan.report.layers is None
    assert plan.digest() == rs.optimize(mlp_stack(mesh.at(tp=4)), limits=limits, cache=False).digest()
