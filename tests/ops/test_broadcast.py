"""The ``broadcast`` op end to end: builder validation, reference semantics, optimize +
simulate vs the reference (optimized and randomly extracted plans), local shapes, and the
GPU local step's kernel (compiled with NVRTC, no GPU needed)."""

from __future__ import annotations

import random

import pytest
import torch

import reshard as rs
from reshard.plan import Saturated
from reshard.testing import programs as P

M2, M2D = P.MESH1, P.MESH2D


# ---- builder ------------------------------------------------------------------------------

def test_builder_shapes_and_helpers():
    f = rs.Fusion()
    b = f.input("b", (16,), "float32", M2, [rs.Replicate()])
    y = f.broadcast(b, (8, 16), (1,))
    assert y.shape == (8, 16) and y.dtype == "float32"
    assert f.ops[-1].kind == "broadcast" and f.ops[-1].attrs == {"shape": (8, 16), "dims": (1,)}
    z = f.broadcast(b, (4, 16, 3), (-2,))  # negative dims are normalized
    assert f.ops[-1].attrs["dims"] == (1,) and z.shape == (4, 16, 3)
    one = f.input("one", (1, 16), "float32", M2, [rs.Replicate()])
    w = f.broadcast_to(one, (2, 8, 16))  # numpy rules: leading new dim, extent-1 dim expanded
    assert w.shape == (2, 8, 16) and f.ops[-1].attrs["dims"] == (1, 2)
    assert f.broadcast_to(y, (8, 16)) is y
    assert f.expand_as(b, y).shape == (8, 16)
    with pytest.raises(rs.ReshardError, match="cannot become result dim 2"):
        f.expand_as(b, z)  # trailing dims aligned: 16 vs 3


@pytest.mark.parametrize("args,match", [
    (((8, 16), (0,)), "cannot become result dim 0"),
    (((8, 16), (0, 1)), "one result dim per operand dim"),
    (((8, 16), (2,)), "not a dim of the result"),
    (((), ()), "one result dim per operand dim"),
    (((8, 0), (1,)), "positive ints"),
    (((8, 16), ("1",)), "not a dim of the result"),
])
def test_builder_errors(args, match):
    f = rs.Fusion()
    b = f.input("b", (16,), "float32", M2, [rs.Replicate()])
    with pytest.raises(rs.ReshardError, match=match):
        f.broadcast(b, *args)


def test_builder_errors_rank_and_order():
    f = rs.Fusion()
    x = f.input("x", (4, 6), "float32", M2, [rs.Replicate()])
    with pytest.raises(rs.ReshardError, match="strictly increasing"):
        f.broadcast(x, (6, 3, 4), (2, 0))
    with pytest.raises(rs.ReshardError, match="fewer dims"):
        f.broadcast(x, (24,), (0, 0))
    with pytest.raises(rs.ReshardError, match="fewer dims"):
        f.broadcast_to(x, (24,))
    with pytest.raises(rs.ReshardError, match="not a tensor of this Fusion"):
        rs.Fusion().broadcast(x, (2, 4, 6), (1, 2))


def test_reference_semantics():
    f = rs.Fusion()
    x = f.input("x", (3, 4), "float32", M2, [rs.Replicate()])
    one = f.input("one", (3, 1), "float32", M2, [rs.Replicate()])
    f.output(f.broadcast(x, (3, 5, 4), (0, 2)), [rs.Replicate()])
    f.output(f.broadcast(x, (2, 3, 4), (1, 2)), [rs.Replicate()])
    f.output(f.broadcast_to(one, (3, 4)), [rs.Replicate()])
    xv, ov = torch.randn(3, 4), torch.randn(3, 1)
    a, b, c = rs.run_reference(f, {"x": xv, "one": ov})
    assert torch.equal(a, xv[:, None, :].expand(3, 5, 4))
    assert torch.equal(b, xv.expand(2, 3, 4))
    assert torch.equal(c, ov.expand(3, 4))
    assert a.is_contiguous()


# ---- programs -----------------------------------------------------------------------------

def bias_add_seq_parallel() -> rs.Fusion:
    """x [8, 16] sharded on the sequence + a replicated bias [16]: no communication."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", M2, [rs.Shard(0)])
    b = f.input("b", (16,), "float32", M2, [rs.Replicate()])
    f.output(f.add(x, f.broadcast(b, (8, 16), (1,))), [rs.Shard(0)])
    return f


def bias_add_sharded_bias() -> rs.Fusion:
    """x [S(0), S(1)] on a 2x2 mesh + bias [R, S(0)]: the bias's shard maps to x's dim 1."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", M2D, [rs.Shard(0), rs.Shard(1)])
    b = f.input("b", (16,), "float32", M2D, [rs.Replicate(), rs.Shard(0)])
    f.output(f.add(x, f.broadcast(b, (8, 16), (1,))), [rs.Shard(0), rs.Shard(1)])
    return f


def _softmax(f: rs.Fusion, x, dim: int):
    keep = tuple(d for d in range(len(x.shape)) if d != dim)
    m = f.broadcast(f.max(x, dim), x.shape, keep)
    e = f.exp(f.sub(x, m))
    return f.div(e, f.broadcast(f.sum(e, dim), x.shape, keep))


def softmax_unsharded_dim() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", M2, [rs.Shard(0)])
    f.output(_softmax(f, x, 1), [rs.Shard(0)])
    return f


def softmax_sharded_dim() -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", M2, [rs.Shard(1)])
    f.output(_softmax(f, x, 1), [rs.Shard(1)])
    return f


def rmsnorm() -> rs.Fusion:
    """x * rsqrt(mean(x^2) + eps) * w; eps a (1,) input expanded by broadcast."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", M2, [rs.Shard(0)])
    w = f.input("w", (16,), "float32", M2, [rs.Replicate()])
    eps = f.input("eps", (1,), "float32", M2, [rs.Replicate()])
    ms = f.add(f.mean(f.mul(x, x), 1), f.broadcast(eps, (8,), (0,)))
    y = f.mul(f.mul(x, f.broadcast(f.rsqrt(ms), (8, 16), (0,))), f.broadcast(w, (8, 16), (1,)))
    f.output(y, [rs.Shard(0)])
    return f


def partial_broadcast() -> rs.Fusion:
    """A Partial(sum) input broadcast and added to another Partial: stays Partial until the end."""
    f = rs.Fusion()
    a = f.input("a", (6,), "float32", M2D, [rs.Partial(), rs.Shard(0)])
    b = f.input("b", (4, 6), "float32", M2D, [rs.Partial(), rs.Shard(1)])
    f.output(f.add(f.broadcast(a, (4, 6), (1,)), b), [rs.Replicate(), rs.Shard(1)])
    return f


def matmul_bias_rowwise() -> rs.Fusion:
    """Column-parallel linear with a sharded bias, then a row-wise max broadcast (3-D)."""
    f = rs.Fusion()
    x = f.input("x", (2, 4, 8), "float32", M2, [rs.Shard(0)])
    w = f.input("w", (8, 12), "float32", M2, [rs.Shard(1)])
    b = f.input("b", (12,), "float32", M2, [rs.Shard(0)])
    h = f.add(f.matmul(x, w), f.broadcast(b, (2, 4, 12), (2,)))
    mx = f.broadcast(f.max(h, 2), (2, 4, 12), (0, 1))
    f.output(f.sub(h, mx), [rs.Shard(0)])
    return f


PROGRAMS = [bias_add_seq_parallel, bias_add_sharded_bias, softmax_unsharded_dim, softmax_sharded_dim, rmsnorm,
            partial_broadcast, matmul_bias_rowwise]


def _check(plan: rs.Plan, f: rs.Fusion, seed: int = 0) -> None:
    inputs = P.random_inputs(f, seed)
    if "eps" in inputs:
        inputs["eps"] = torch.tensor([1e-5])
    P.assert_plan_matches_reference(plan, f, inputs, seed)


@pytest.mark.parametrize("build", PROGRAMS, ids=lambda b: b.__name__)
def test_optimized_and_random_plans_match_reference(build):
    f = build()
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    assert sat.report.saturated
    plan = sat.plan()
    # a broadcast step, or a fused elementwise step reading through one (codegen.fuse)
    assert any(s.attr("fop") == "broadcast" or s.attr("bcast") for s in plan.steps)
    _check(plan, f)
    rng = random.Random(0)
    for i in range(5):
        _check(sat.plan(perturb=rng), f, seed=i + 1)


@pytest.mark.parametrize("build", [bias_add_seq_parallel, bias_add_sharded_bias, softmax_unsharded_dim, rmsnorm],
                         ids=lambda b: b.__name__)
def test_broadcasts_of_local_data_need_no_communication(build):
    assert rs.optimize(build()).communications == ()


def test_sharded_bias_stays_sharded_through_the_broadcast():
    """The bias is fed at [R, S(0)] and broadcast locally straight to x's [S(0), S(1)] (4 x 8
    per device: its dim 1 transported, the new dim 0 split on the axis where the bias is
    replicated, ``rules.expand``); no gather of the bias, no slice after the broadcast."""
    plan = rs.optimize(bias_add_sharded_bias())
    (step,) = [s for s in plan.steps if s.attr("fop") == "broadcast" or s.attr("bcast")]
    assert tuple(step.attr("shape")) == (4, 8)  # fused into the add: the add's local shape
    assert plan.communications == ()


def test_softmax_over_a_sharded_dim_communicates():
    f = softmax_sharded_dim()
    plan = rs.optimize(f)
    assert plan.communications and plan.comm_bytes > 0
    # the cheapest: one gather of x (512 B) beats two all-reduces of the row stats
    assert [c.kind for c in plan.communications] == ["allgather"]
    _check(plan, f)


def test_partial_sums_flow_through_broadcast():
    """broadcast is linear: the Partial sum is kept through it and the add, and reduced once."""
    plan = rs.optimize(partial_broadcast())
    assert [c.kind for c in plan.communications] == ["allreduce"]
    assert plan.communications[0].tensor == plan.fusion.tensors[plan.fusion.outputs[0][0]].name


def test_explain_names_broadcast():
    assert "broadcast" in rs.optimize(rmsnorm()).explain()


# ---- GPU local step -------------------------------------------------------------------------

def test_gpu_local_step_broadcast_kernels_compile(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from reshard.codegen import nvrtc as N
    from reshard.codegen.program import Step
    from reshard.runtime.gpu_local import gpu_local_step, kernel_path, step_kernels
    from reshard.runtime.local_ops import run_local

    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kcache"))
    N.clear_memory_cache()
    cases = [((16,), (8, 16), (1,)), ((8,), (8, 16), (0,)), ((4, 1), (4, 3, 5), (0, 2)), ((2, 3), (2, 7, 3), (0, 2))]
    for dt in (torch.float32, torch.bfloat16, torch.float64):
        for src, shape, dims in cases:
            x = torch.randn(src).to(dt)
            step = Step.make("local", "o", ["i0"], op="apply", fop="broadcast", shape=shape, dims=dims)
            assert kernel_path(step, [x])
            ks = step_kernels(step, {"i0": x}, 0)
            assert ks and all(k.kind == "gather" for k in ks)
            for k in ks:
                assert N.compile_kernel(k, "sm_90")[:4] == b"\x7fELF"
            ref = run_local(step, {"i0": x}, 0)
            assert torch.equal(ref, x.reshape([x.shape[dims.index(d)] if d in dims else 1
                                               for d in range(len(shape))]).expand(shape))
            if torch.cuda.is_available():
                got = gpu_local_step(step, {"i0": x.cuda()}, 0, poison=True)
                assert torch.equal(got.cpu(), ref)
    N.clear_memory_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("build", PROGRAMS, ids=lambda b: b.__name__)
def test_gpu_plans_with_broadcast_match_reference(build):
    """The optimized plans run with gpu_local_step (NVRTC kernels, outputs poisoned with NaN
    first) on CUDA tensors and match the reference."""
    pytest.importorskip("cuda.core")
    from reshard.ir.sharding import unshard
    from reshard.runtime.gpu_local import gpu_local_step
    from reshard.runtime.simulator import simulate

    f = build()
    plan = rs.optimize(f)
    inputs = P.random_inputs(f)
    if "eps" in inputs:
        inputs["eps"] = torch.tensor([1e-5])
    per_rank = {r: {k: v.cuda() for k, v in d.items()}
                for r, d in plan.shard_inputs(inputs, torch.Generator().manual_seed(0)).items()}
    outs = simulate(plan.program, per_rank, lambda s, env, r: gpu_local_step(s, env, r, poison=True))
    got = [unshard({r: outs[r][buf].cpu() for r in plan.program.mesh_ranks}, ts) for buf, ts in plan.lowered.outputs]
    for o, r in zip(got, rs.run_reference(f, inputs)):
        assert not torch.isnan(o).any()
        torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)
