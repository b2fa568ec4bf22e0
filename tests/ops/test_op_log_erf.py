"""The ``log`` and ``erf`` elementwise ops (added through the op registry, issue 19): plans on
sharded and Partial inputs simulate like the reference; they are not linear, so a Partial
operand is reduced first; their CUDA expressions compile with NVRTC (and, on a GPU, run)."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.ops import op_kind

MESH = rs.DeviceMesh([0, 1], ("tp",))
MESH2 = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))


def _positive(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) + 0.5


@pytest.mark.parametrize("fn", ["log", "erf"])
@pytest.mark.parametrize("mesh,placements,out", [
    (MESH, [rs.Shard(0)], [rs.Shard(0)]),
    (MESH, [rs.Shard(1)], [rs.Replicate()]),
    (MESH2, [rs.Shard(0), rs.Shard(1)], [rs.Replicate(), rs.Shard(1)]),
    (MESH2, [rs.Replicate(), rs.Shard(0)], [rs.Shard(1), rs.Replicate()]),
])
def test_sharded_plans_match_the_reference(fn, mesh, placements, out):
    f = rs.Fusion()
    x = f.input("x", (8, 12), "float32", mesh, placements)
    f.output(getattr(f, fn)(f.scale(x, 2.0)), out)
    plan = rs.optimize(f)
    inputs = {"x": _positive((8, 12), 0)}
    (got,) = plan.simulate(inputs)
    torch.testing.assert_close(got, rs.run_reference(f, inputs)[0])


@pytest.mark.parametrize("fn", ["log", "erf"])
def test_partial_operand_is_reduced_before_the_op(fn):
    """log(a + b) != log(a) + log(b): the sum must be taken first (an allreduce), and random
    Partial summands still give the reference value."""
    f = rs.Fusion()
    x = f.input("x", (8, 12), "float32", MESH, [rs.Partial("sum")])
    y = getattr(f, fn)(x)
    f.output(y, [rs.Shard(0)])
    assert op_kind("unary").keeps(f.ops[f.producer[y.id]]) == ()
    plan = rs.optimize(f)
    assert [c.kind for c in plan.communications] in (["allreduce"], ["reduce_scatter"])
    inputs = {"x": _positive((8, 12), 1)}
    (got,) = plan.simulate(inputs, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(got, rs.run_reference(f, inputs)[0])


@pytest.mark.parametrize("fn", ["log", "erf"])
def test_fused_chain_runs_on_the_cpu_like_the_reference(fn):
    """exp then fn then neg fuse into one pointwise step; its CPU evaluation is the reference's."""
    f = rs.Fusion()
    x = f.input("x", (8, 12), "float32", MESH, [rs.Shard(0)])
    f.output(f.neg(getattr(f, fn)(f.exp(x))), [rs.Shard(0)])
    plan = rs.optimize(f)
    fused = [s for s in plan.program.steps if s.attr("fop") == "pointwise"]
    assert len(fused) == 1 and [o[0] for o in fused[0].attr("ops")] == ["exp", fn, "neg"]
    inputs = {"x": _positive((8, 12), 2)}
    torch.testing.assert_close(plan.simulate(inputs)[0], rs.run_reference(f, inputs)[0])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_kernels_compile_with_nvrtc(dtype, tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from reshard.codegen import kernels as K
    from reshard.codegen import nvrtc as N

    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kcache"))
    N.clear_memory_cache()
    for ks in (K.pointwise_kernel([dtype], dtype, [("log", "in0"), ("erf", "t0")]),
               K.pointwise_kernel([dtype], dtype, [("erf", "in0"), ("log", "t0")], vectorize=True)):
        b = N.compile_kernel(ks, "sm_90")
        assert b[:4] == b"\x7fELF" and ks.name.encode() in b
    N.clear_memory_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("fn", ["log", "erf"])
def test_gpu_kernels_match_the_reference(fn):
    f = rs.Fusion()
    x = f.input("x", (64, 96), "float32", MESH, [rs.Shard(0)])
    f.output(getattr(f, fn)(x), [rs.Shard(0)])
    f2 = rs.Fusion()
    x2 = f2.input("x", (64, 96), "float32", MESH, [rs.Shard(0)])
    f2.output(f2.scale(getattr(f2, fn)(f2.exp(x2)), 0.5), [rs.Shard(0)])
    inputs = {"x": _positive((64, 96), 4)}
    for fusion in (f, f2):
        got = rs.optimize(fusion).simulate(inputs, device="cuda")[0]
        torch.testing.assert_close(got, rs.run_reference(fusion, inputs)[0], rtol=1e-5, atol=1e-5)
