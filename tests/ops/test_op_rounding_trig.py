"""The elementwise ops ``sign floor ceil trunc sin cos expm1 log2`` and ``atan2 remainder``
(registry entries, issue 30): plans on sharded and Partial inputs simulate like the reference
(none is linear: a Partial operand is reduced first); remainder is torch's floor-mod (the
divisor's sign); the step functions take ints too; their CUDA expressions compile with NVRTC."""

from __future__ import annotations

import pytest
import torch

import reshard as rs

MESH = rs.DeviceMesh([0, 1], ("tp",))
UNARY = ["sign", "floor", "ceil", "trunc", "sin", "cos", "expm1", "log2"]
BINARY = ["atan2", "remainder"]


def _build(fn: str, placements: list, dtype: str = "float32") -> rs.Fusion:
    f = rs.Fusion()
    a = f.input("a", (8, 12), dtype, MESH, placements)
    b = f.input("b", (8, 12), dtype, MESH, [rs.Shard(0)])
    y = f.binary(fn, a, b) if fn in BINARY else f.unary(fn, f.abs(a) if fn == "log2" else a)
    f.output(y, [rs.Shard(0)])
    return f


@pytest.mark.parametrize("fn", UNARY + BINARY)
@pytest.mark.parametrize("placements", [[rs.Shard(0)], [rs.Shard(1)], [rs.Partial("sum")]],
                         ids=["rows", "cols", "partial"])
def test_plans_match_the_reference(fn: str, placements: list) -> None:
    f = _build(fn, placements)
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(8, 12, generator=g) * 3, "b": torch.randn(8, 12, generator=g) * 3}
    inputs["a"][0, :2] = torch.tensor([float("nan"), 0.0])
    plan = rs.optimize(f)
    (got,) = plan.simulate(inputs, generator=torch.Generator().manual_seed(1))
    want = rs.run_reference(f, inputs)[0]
    torch.testing.assert_close(got, want, equal_nan=True)
    if placements == [rs.Partial("sum")]:
        assert [c.kind for c in plan.communications] in (["allreduce"], ["reduce_scatter"])


def test_remainder_takes_the_divisors_sign() -> None:
    f = _build("remainder", [rs.Shard(0)])
    a = torch.tensor([5.5, -5.5, 5.5, -5.5, 3.0, 1.0]).repeat(16).reshape(8, 12)
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, float("-inf")]).repeat(16).reshape(8, 12)
    (got,) = rs.optimize(f).simulate({"a": a, "b": b})
    assert got[0, :6].tolist() == [1.5, 0.5, -0.5, -1.5, 0.0, float("-inf")]
    torch.testing.assert_close(got, torch.remainder(a, b))


@pytest.mark.parametrize("fn", ["sign", "floor", "ceil", "trunc"])
def test_step_functions_take_ints(fn: str) -> None:
    f = _build(fn, [rs.Shard(0)], "int64")
    a = torch.randint(-5, 6, (8, 12), generator=torch.Generator().manual_seed(0))
    (got,) = rs.optimize(f).simulate({"a": a, "b": a})
    assert got.dtype == torch.int64 and torch.equal(got, getattr(torch, fn)(a))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_kernels_compile_with_nvrtc(dtype: str, tmp_path, monkeypatch) -> None:
    pytest.importorskip("cuda.core")
    from reshard.codegen import kernels as K
    from reshard.codegen import nvrtc as N

    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kcache"))
    N.clear_memory_cache()
    steps = ["sign", "floor", "ceil", "trunc"] if dtype == "int64" else UNARY
    chain = [("add", "in0", "in1")] + [(fn, f"t{i}") for i, fn in enumerate(steps)]
    if dtype != "int64":
        chain += [(fn, f"t{len(chain) - 1}", "in1") for fn in BINARY]
    for ks in (K.pointwise_kernel([dtype, dtype], dtype, chain),
               K.pointwise_kernel([dtype, dtype], dtype, chain, vectorize=True)):
        b = N.compile_kernel(ks, "sm_90")
        assert b[:4] == b"\x7fELF" and ks.name.encode() in b
    N.clear_memory_cache()
