"""0-dim values (shape ``()``) end to end: the builder (ops that take or give them, errors for
ops that need a dim), sharding (Replicate or Partial only; a Shard is a ``ReshardError``), plans
on 2 ranks against the unsharded reference (simulated, and one process per rank over gloo),
``from_torch`` of modules with scalar inputs, parameters and results against eager torch, and
training through a 0-dim loss against torch.autograd."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard as DTensorShard

import reshard as rs
from reshard import Partial, Replicate, Shard
from reshard.passes.autodiff import joint
from reshard.ir.fused_shard import FusedShard
from reshard.ir.ops import op_kind
from reshard.ir.sharding import unshard
from reshard.runtime.local_ops import run_local, step_results
from reshard.runtime.simulator import simulate
from reshard.testing.kernel_check import assert_cubin, kernel_cache  # noqa: F401  (a fixture)

M2 = rs.DeviceMesh([0, 1], ("tp",))
M2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
#: where plans run their local steps: torch on the CPU; on a GPU, reshard's generated kernels too
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                          reason="torch.distributed with gloo is not available")


# ---- builder -----------------------------------------------------------------------------------
def test_builder_takes_and_gives_0_dim_values():
    f = rs.Fusion()
    s = f.input("s", (), "float32", M2, [Partial()])
    x = f.input("x", (4, 6), "float32", M2, [Shard(0)])
    assert s.shape == () and s.numel == 1 and repr(s) == "%s[]:float32"
    assert f.exp(s).shape == f.add(s, s).shape == f.scale(s, 2.0).shape == f.cast(s, "bfloat16").shape == ()
    assert f.reshape(s, (1, 1)).shape == (1, 1) and f.reshape(s, (-1,)).shape == (1,)
    assert f.reshape(f.reshape(s, (1,)), ()).shape == ()
    assert f.broadcast(s, (4, 6), ()).shape == f.broadcast_to(s, (4, 6)).shape == (4, 6)
    assert f.sum(x, (0, 1)).shape == f.mean(x, [1, 0]).shape == f.max(x, (0, -1)).shape == ()
    assert f.permute(s, ()).shape == ()


@pytest.mark.parametrize("build,match", [
    (lambda f, s, x: f.slice(s, 0, 0, 1), "dim 0 out of range"),
    (lambda f, s, x: f.cumsum(s, 0), "dim 0 out of range"),
    (lambda f, s, x: f.sum(s, 0), "dim 0 out of range"),
    (lambda f, s, x: f.sum(s, ()), "no dims to reduce"),
    (lambda f, s, x: f.matmul(s, x), "at least 2-D"),
    (lambda f, s, x: f.add(s, x), "operand shapes differ"),
    (lambda f, s, x: f.reshape(s, (2,)), "element count 1 != 2"),
    (lambda f, s, x: f.broadcast(x, (), ()), "one result dim per operand dim"),
], ids=["slice", "cumsum", "reduce-dim", "reduce-nothing", "matmul", "binary", "reshape", "broadcast"])
def test_ops_that_need_a_dim_raise_naming_the_operand(build, match):
    f = rs.Fusion()
    s = f.input("s", (), "float32", M2, [Replicate()])
    x = f.input("x", (4, 6), "float32", M2, [Shard(0)])
    with pytest.raises(rs.ReshardError, match=match):
        build(f, s, x)


@pytest.mark.parametrize("placement", [Shard(0), DTensorShard(0), FusedShard(0, 2)], ids=["reshard", "dtensor", "fused"])
def test_a_sharded_0_dim_value_is_an_error(placement):
    """An input, an output and a redistribute target: each names the placement and says what a
    0-dim value takes."""
    f = rs.Fusion()
    with pytest.raises(rs.ReshardError, match=r"input 's': placement .* on mesh axis 1 shards a 0-dim tensor.*"
                                              r"Replicate\(\) or Partial\(\)"):
        f.input("s", (), "float32", M2x2, [Replicate(), placement])
    s = f.input("s", (), "float32", M2x2, [Partial(), Replicate()])
    with pytest.raises(rs.ReshardError, match="redistribute of %s.*shards a 0-dim tensor"):
        f.redistribute(s, [placement, Replicate()])
    with pytest.raises(rs.ReshardError, match="output %s.*shards a 0-dim tensor"):
        f.output(s, [placement, Replicate()])


# ---- plans against the unsharded reference ------------------------------------------------------
def scalar_program(mesh: rs.DeviceMesh, s_at: list, m_at: list) -> rs.Fusion:
    """0-dim inputs ``s`` and ``m`` (at ``s_at`` / ``m_at``) with a matrix sharded by rows: full
    reductions (sum, mean, max), 0-dim values broadcast over the matrix (directly and through a
    ``(1,)`` view), a 0-dim embedding index, views ``()`` <-> ``(1, 1)``; outputs 0-dim at
    Replicate and Partial, and the matrix at its rows."""
    f = rs.Fusion()
    s = f.input("s", (), "float32", mesh, s_at)
    m = f.input("m", (), "float32", mesh, m_at)
    x = f.input("x", (8, 6), "float32", mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1))
    i = f.input("i", (), "int64", mesh, [Replicate()] * mesh.ndim)
    total, mean, top = f.sum(x, (0, 1)), f.mean(x, (0, 1)), f.max(x, (1, 0))
    centred = f.sub(x, f.broadcast_to(mean, x.shape))
    scaled = f.mul(centred, f.broadcast_to(f.tanh(s), x.shape))
    row = f.embedding(x, i)  # row i of x: [6]
    shifted = f.add(scaled, f.broadcast(f.add(f.broadcast(f.reshape(f.add(s, m), (1,)), (6,), (0,)), row), (8, 6), (1,)))
    f.output(shifted, [Shard(0)] + [Replicate()] * (mesh.ndim - 1))
    f.output(f.add(f.scale(total, 0.5), f.reshape(f.reshape(top, (1, 1)), ())), [Replicate()] * mesh.ndim)
    f.output(f.add(total, m), [Partial()] + [Replicate()] * (mesh.ndim - 1))
    return f


def scalar_inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"s": torch.randn((), generator=g), "m": torch.randn((), generator=g),
            "x": torch.randn(8, 6, generator=g), "i": torch.tensor(5)}


CASES = {
    "replicated": (M2, [Replicate()], [Replicate()]),
    "partial": (M2, [Partial()], [Partial()]),
    "open": (M2, None, [Partial("max")]),
    "2x2": (M2x2, [Partial(), Replicate()], [Replicate(), Partial()]),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_plan_matches_reference(case):
    """Simulated ranks against the reference interpreter (on a GPU, the local steps as
    generated kernels too); each rank's 0-dim input is 0-dim."""
    mesh, s_at, m_at = CASES[case]
    f = scalar_program(mesh, s_at, m_at)
    plan = rs.optimize(f)
    for seed, device in ((seed, device) for seed in range(3) for device in DEVICES):
        ins = scalar_inputs(seed)
        if m_at == [Partial("max")]:
            ins["m"] = ins["m"].abs()
        want = rs.run_reference(f, ins)
        got = plan.simulate(ins, generator=torch.Generator().manual_seed(seed), device=device)
        assert [tuple(t.shape) for t in got] == [(8, 6), (), ()]
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for local in plan.shard_inputs(scalar_inputs(0)).values():
        assert [v.shape for k, v in local.items() if k.split("@")[0] in ("s", "m", "i")] == [()] * 3


@pytest.mark.slow
def test_0_dim_steps_are_generated_kernels_that_compile(kernel_cache):  # noqa: F811
    """Every local step reading or writing a 0-dim value (full reductions, fused elementwise
    chains, broadcasts of a 0-dim operand, steps or a fused kernel's reads, a lookup at a 0-dim
    index, the gradient seed), a view
    (reshape; saved, whose cost law is a keep's) aside, takes the generated-kernel path, and its kernels compile with NVRTC
    for sm_90 (no GPU needed)."""
    from reshard.runtime.gpu_local import kernel_path, step_kernels

    kinds, kernels = set(), []

    def record(step: Any, env: dict[str, torch.Tensor], rank: int) -> torch.Tensor:
        out = run_local(step, env, rank)
        xs = [env[b] for b in step.ins if b in env]
        if step.attr("op") == "apply" and any(x.dim() == 0 for x in (*step_results(out), *xs)):
            assert kernel_path(step, xs) or op_kind(step.attr("fop")).cost in ("view", "kept"), step
            kinds.add(step.attr("fop"))
            if any(b and tuple(b[0]) == () for b in step.attr("bcast") or ()):  # read through a fused broadcast
                kinds.add("broadcast")
            kernels.extend(step_kernels(step, env, rank))
        return out

    for mesh, s_at, m_at in CASES.values():
        plan = rs.optimize(scalar_program(mesh, s_at, m_at))
        simulate(plan.program, plan.shard_inputs(scalar_inputs(0)), record)
    tp, ins = scaled_training_program()
    plan = rs.optimize(tp.fusion)
    simulate(plan.program, plan.shard_inputs(ins), record)
    assert {"reduce", "pointwise", "embedding", "grad_seed", "broadcast"} <= kinds, kinds
    for ks in {k.name: k for k in kernels}.values():
        assert_cubin(ks)


def run_worker(rank: int, plan: rs.Plan, locals_by_rank: dict[int, dict[str, torch.Tensor]]) -> tuple:
    torch.set_num_threads(1)
    return plan.run(locals_by_rank[rank])


@pytest.mark.multiproc
@pytest.mark.slow
@gloo
def test_plan_runs_on_two_processes():
    """``Plan.run`` on 2 gloo processes, 0-dim inputs Partial: the outputs gathered from the
    ranks are the reference's."""
    f = scalar_program(M2, [Partial()], [Partial()])
    plan, ins = rs.optimize(f), scalar_inputs(7)
    locals_by_rank = plan.shard_inputs(ins, generator=torch.Generator().manual_seed(1))
    per_rank = rs.launch(run_worker, 2, plan, locals_by_rank, timeout_s=120)
    for k, ((_, ts), want) in enumerate(zip(f.outputs, rs.run_reference(f, ins), strict=True)):
        got = unshard({r: outs[k] for r, outs in enumerate(per_rank)}, ts)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_joint_of_a_0_dim_loss_matches_autograd():
    """``joint`` through full reductions to a 0-dim loss and a 0-dim weight (Partial input):
    the loss and the gradients (the 0-dim one 0-dim) are torch.autograd's."""
    f = rs.Fusion()
    w = f.input("w", (), "float64", M2, [Partial()])
    x = f.input("x", (8, 6), "float64", M2, [Shard(0)])
    y = f.mul(f.tanh(x), f.broadcast_to(w, x.shape))
    loss = f.add(f.mean(f.mul(y, y), (0, 1)), f.max(f.reshape(w, (1,)), 0), name="loss")
    f.output(loss, [Replicate()])
    j = joint(f, loss, ["w", "x"])
    g = torch.Generator().manual_seed(0)
    ins = {"w": torch.randn((), generator=g, dtype=torch.float64), "x": torch.randn(8, 6, generator=g, dtype=torch.float64)}
    wt, xt = ins["w"].clone().requires_grad_(), ins["x"].clone().requires_grad_()
    want = ((torch.tanh(xt) * wt) ** 2).mean() + wt
    want.backward()
    got_loss, got_w, got_x = rs.optimize(j.fusion).simulate(ins)
    torch.testing.assert_close(got_loss, want.detach())
    torch.testing.assert_close(got_w, wt.grad)
    torch.testing.assert_close(got_x, xt.grad)


# ---- from_torch -----------------------------------------------------------------------------------
FUNCTIONS = {
    "atleast_1d": torch.atleast_1d,
    "atleast_2d": torch.atleast_2d,
    "atleast_3d": torch.atleast_3d,
    "flatten": torch.flatten,
    "arith": lambda s: (s * 2 + 1).exp() / 3,
    "sum-of-scalar": lambda s: s.sum() + s.sum(0) + s.mean(-1),
    "view-round-trip": lambda s: s.reshape(1, 1).squeeze(),
    "broadcast": lambda s: s.expand(3, 2) + torch.ones(3, 2),
}


@pytest.mark.parametrize("name", FUNCTIONS, ids=list(FUNCTIONS))
@pytest.mark.parametrize("placement", [Replicate(), Partial()], ids=["replicated", "partial"])
def test_from_torch_of_a_scalar_matches_eager(name, placement):
    """``torch.tensor(3.0)``-style inputs through views, arithmetic and reductions of a 0-dim
    value: the plan's result has torch's shape and values."""
    fn, s = FUNCTIONS[name], torch.tensor(1.5)
    tp = rs.from_torch(fn, (s,), [[placement]], mesh=M2)
    assert tp.fusion.tensors[tp.fusion.inputs[0]].shape == ()
    (got,) = rs.optimize(tp.fusion).simulate(tp.inputs(s))
    want = fn(s)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)


class Scaled(torch.nn.Module):
    """A 0-dim parameter and a 0-dim argument scale a linear layer; full reductions and a dot
    product give 0-dim results."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)
        self.s = torch.nn.Parameter(torch.tensor(0.7))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x)) * self.s / t
        dot = h[0] @ h[1]  # 1-D @ 1-D: 0-dim
        return (h ** 2).mean() + h.amax() + dot + self.s.sum()


@pytest.mark.parametrize("t_at", [Replicate(), Partial()], ids=["replicated", "partial"])
def test_from_torch_module_with_scalars_matches_eager(t_at):
    torch.manual_seed(0)
    m, x, t = Scaled(), torch.randn(8, 6), torch.tensor(3.0)
    tp = rs.from_torch(m, (x, t), [[Shard(0)], [t_at]], mesh=M2, param_placements={"fc.weight": [Shard(0)]})
    (got,) = rs.optimize(tp.fusion).simulate(tp.inputs(x, t))
    with torch.no_grad():
        want = m(x, t)
    assert got.shape == ()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def scaled_training_program() -> tuple[Any, dict[str, torch.Tensor]]:
    """``from_torch(Scaled(), train=True)``, the layer sharded on 2 ranks, and its inputs."""
    torch.manual_seed(1)
    m, x, t = Scaled(), torch.randn(8, 6), torch.tensor(2.0)
    tp = rs.from_torch(m, (x, t), [[Shard(0)], [Replicate()]], mesh=M2, train=True,
                       param_placements={"fc.weight": [Shard(0)], "fc.bias": [Shard(0)]})
    return tp, tp.inputs(x, t, state=m)


def test_from_torch_training_with_a_0_dim_loss_matches_autograd():
    """``train=True``: the loss is 0-dim and the 0-dim parameter's gradient is 0-dim, both
    torch.autograd's, with the layer sharded on 2 ranks."""
    tp, ins = scaled_training_program()
    torch.manual_seed(1)
    m, x, t = Scaled(), ins["x"], ins["t"]
    plan = rs.optimize(tp.fusion)
    loss = m(x, t)
    loss.backward()
    for device in DEVICES:
        got = dict(zip(["loss", *tp.grads], plan.simulate(ins, device=device)))
        assert got["loss"].shape == () and got["s"].shape == ()
        torch.testing.assert_close(got["loss"], loss.detach(), rtol=1e-5, atol=1e-6)
        for n, p in m.named_parameters():
            torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-6)


def test_parallelized_scalar_loss_trains_as_eager():
    """``parallelize(simulate=True)``: 3 SGD steps through a 0-dim loss and a 0-dim parameter
    match eager, the parameter staying 0-dim."""
    def steps(model: Any) -> list[float]:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for k in range(3):
            g = torch.Generator().manual_seed(k)
            opt.zero_grad()
            loss = model(torch.randn(8, 6, generator=g), torch.tensor(2.0))
            loss.backward()
            opt.step()
            out.append(float(loss.detach()))
        return out
    torch.manual_seed(2)
    eager = Scaled()
    torch.manual_seed(2)
    model = rs.parallelize(Scaled(), M2, example_inputs=(torch.randn(8, 6), torch.tensor(2.0)), simulate=True,
                           param_placements={"fc.weight": [Shard(0)]})
    assert steps(model) == pytest.approx(steps(eager), rel=1e-5)
    assert model.module.s.shape == () and abs(float((model.module.s - eager.s).detach())) < 1e-5
