"""The ``log1p`` and ``minimum`` elementwise ops (registry entries, issue 30): plans on sharded
and Partial inputs simulate like the reference (neither is linear: a Partial operand is reduced
first); minimum propagates NaN from either operand, like torch; their CUDA expressions compile
with NVRTC."""

from __future__ import annotations

import pytest
import torch

import reshard as rs

MESH = rs.DeviceMesh([0, 1], ("tp",))


def _build(fn: str, placements: list) -> rs.Fusion:
    f = rs.Fusion()
    a = f.input("a", (8, 12), "float32", MESH, placements)
    b = f.input("b", (8, 12), "float32", MESH, [rs.Shard(0)])
    f.output(f.log1p(f.abs(a)) if fn == "log1p" else f.minimum(a, b), [rs.Shard(0)])
    return f


@pytest.mark.parametrize("fn", ["log1p", "minimum"])
@pytest.mark.parametrize("placements", [[rs.Shard(0)], [rs.Shard(1)], [rs.Partial("sum")]],
                         ids=["rows", "cols", "partial"])
def test_plans_match_the_reference(fn: str, placements: list) -> None:
    f = _build(fn, placements)
    g = torch.Generator().manual_seed(0)
    inputs = {"a": torch.randn(8, 12, generator=g), "b": torch.randn(8, 12, generator=g)}
    inputs["a"][0, :3] = float("nan")
    inputs["b"][1, :3] = float("nan")
    plan = rs.optimize(f)
    (got,) = plan.simulate(inputs, generator=torch.Generator().manual_seed(1))
    want = rs.run_reference(f, inputs)[0]
    torch.testing.assert_close(got, want, equal_nan=True)
    if fn == "minimum":
        assert want[:2, :3].isnan().all()  # NaN from either side
    if placements == [rs.Partial("sum")]:
        assert [c.kind for c in plan.communications] in (["allreduce"], ["reduce_scatter"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_kernels_compile_with_nvrtc(dtype: str, tmp_path, monkeypatch) -> None:
    pytest.importorskip("cuda.core")
    from reshard.codegen import kernels as K
    from reshard.codegen import nvrtc as N

    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kcache"))
    N.clear_memory_cache()
    chain = [("minimum", "in0", "in1")] + ([("log1p", "t0")] if dtype != "int64" else [])
    for ks in (K.pointwise_kernel([dtype, dtype], dtype, chain),
               K.pointwise_kernel([dtype, dtype], dtype, chain, vectorize=True)):
        b = N.compile_kernel(ks, "sm_90")
        assert b[:4] == b"\x7fELF" and ks.name.encode() in b
    N.clear_memory_cache()
