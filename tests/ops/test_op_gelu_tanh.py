"""``f.unary("gelu_tanh", x)`` / ``f.gelu_tanh(x)`` (issue 20): torch's ``gelu(x,
approximate="tanh")`` (GPT-2's activation).  Plans on sharded inputs (inf and NaN included)
simulate like torch; it is not linear, so a Partial operand is reduced first; its CUDA
expression compiles with NVRTC and, on a GPU, matches torch."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.ops import op_kind

from reshard.testing.op_oracle import MESH1, MESH2, check_plan


def _torch(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("mesh,placements,out", [
    (MESH1, [rs.Shard(1)], [rs.Shard(1)]),
    (MESH2, [rs.Shard(0), rs.Shard(1)], [rs.Replicate(), rs.Shard(0)]),
])
def test_gelu_tanh_matches_torch(dtype, mesh, placements, out):
    f = rs.Fusion()
    x = f.input("x", (4, 8), dtype, mesh, placements)
    y = f.unary("gelu_tanh", f.scale(x, 3.0))
    f.output(y, out)
    f.output(f.gelu_tanh(x), [rs.Replicate()] * mesh.ndim)
    check_plan(f, special=True)
    inputs = {"x": torch.tensor([-float("inf"), float("inf"), -30.0, 0.5] * 8).view(4, 8).to(getattr(torch, dtype))}
    torch.testing.assert_close(rs.run_reference(f, inputs)[1], _torch(inputs["x"]), equal_nan=True)


def test_partial_operand_is_reduced_first():
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", MESH1, [rs.Partial("sum")])
    y = f.gelu_tanh(x)
    f.output(y, [rs.Shard(0)])
    assert op_kind("unary").keeps(f.ops[f.producer[y.id]]) == ()
    plan = check_plan(f)
    assert [c.kind for c in plan.communications] in (["allreduce"], ["reduce_scatter"])


def test_int_operand_is_an_error():
    f = rs.Fusion()
    x = f.input("x", (4, 8), "int64", MESH1)
    with pytest.raises(rs.ReshardError, match="gelu_tanh: operand %x"):
        f.gelu_tanh(x)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_kernels_compile_with_nvrtc(dtype, tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from reshard.codegen import kernels as K
    from reshard.codegen import nvrtc as N

    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kcache"))
    N.clear_memory_cache()
    for ks in (K.pointwise_kernel([dtype], dtype, [("gelu_tanh", "in0")]),
               K.pointwise_kernel([dtype], dtype, [("exp", "in0"), ("gelu_tanh", "t0")], vectorize=True)):
        b = N.compile_kernel(ks, "sm_90")
        assert b[:4] == b"\x7fELF" and ks.name.encode() in b
    N.clear_memory_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_kernel_matches_torch(dtype):
    f = rs.Fusion()
    x = f.input("x", (64, 96), dtype, MESH1, [rs.Shard(0)])
    f.output(f.gelu_tanh(f.scale(x, 4.0)), [rs.Shard(0)])
    x0 = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype))
    x0[0, :3] = torch.tensor([float("inf"), -float("inf"), float("nan")])
    got = rs.optimize(f).simulate({"x": x0}, device="cuda")[0]
    tol = 1e-5 if dtype == "float32" else 1.6e-2
    torch.testing.assert_close(got, rs.run_reference(f, {"x": x0})[0], rtol=tol, atol=tol, equal_nan=True)
