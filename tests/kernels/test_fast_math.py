"""``codegen.fast_math``: the 16-bit gelu is as accurate as its rounding needs (exhaustively,
on the CPU through a float32 evaluation of the same formula and constants; on a GPU through
the generated kernel), and the generator uses it exactly where a value is rounded to 16 bits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reshard.codegen import fast_math as F
from reshard.codegen import kernels as K

from reshard.testing.rounding import every_finite, rounding_errors

F32 = np.float32


def gelu16_float32(x: np.ndarray) -> np.ndarray:
    """``rs_gelu16`` step by step in float32 (exact rcp and exp2 in place of the SFU's
    approximations, which are within 2 ulp of them)."""
    x = x.astype(F32)
    s = (F32(1) / (F32(F.GELU16_SCALE) * np.abs(x) + F32(1))).astype(F32)
    p = np.full_like(x, F32(F.GELU16_POLY[-1]))
    for c in reversed(F.GELU16_POLY[:-1]):
        p = (p * s + F32(c)).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = (s * p * np.exp2((x * x) * F32(F.GELU16_EXP2_SCALE))).astype(F32)
        return (x * np.where(x > 0, F32(1) - h, h)).astype(F32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_formula_rounds_like_the_exact_gelu(dtype):
    """Over every finite input: bf16 results all correctly rounded, fp16 within 1 ulp (and
    misrounded less often than torch's own gelu)."""
    x = every_finite(dtype)
    out = torch.from_numpy(gelu16_float32(x.float().numpy())).to(dtype)
    bad, worst, checked = rounding_errors(out, x)
    torch_bad, _, _ = rounding_errors(torch.nn.functional.gelu(x.float()).to(dtype), x)
    assert checked > 40000
    assert worst <= (0 if dtype == torch.bfloat16 else 1), (bad, worst)
    assert bad < torch_bad and bad <= checked // 1000, (bad, torch_bad)


def test_formula_special_values():
    x = np.array([np.inf, np.nan, 0.0, -0.0, 1e30, -1e30, 3e-38, -3e-38], dtype=F32)
    out = gelu16_float32(x)
    assert out[0] == np.inf and np.isnan(out[1])
    assert out[2] == 0 and out[3] == 0
    assert out[4] == F32(1e30) and out[5] == 0  # far tail: x * Phi(x) underflows to -0
    assert abs(out[6] - F32(1.5e-38)) < 1e-44 and abs(out[7] + F32(1.5e-38)) < 1e-44


def test_source_carries_the_tested_constants():
    src = F.gelu16_source(K._float_literal)
    for c in (F.GELU16_SCALE, F.GELU16_EXP2_SCALE, *F.GELU16_POLY):
        assert K._float_literal(c) in src


@pytest.mark.parametrize("ops, out, fast", [
    ([("gelu", "in0")], "bfloat16", True),
    ([("gelu", "in0")], "float16", True),
    ([("gelu", "in0")], "float32", False),
    ([("gelu", "in0"), ("cast", "t0", "bf16")], "float32", True),
    ([("gelu", "in0"), ("cast", "t0", "float32")], "bfloat16", False),
    ([("gelu", "in0"), ("cast", "t0", "bf16"), ("add", "t0", "t1")], "bfloat16", False),  # t0 also read in fp32
    ([("gelu", "in0"), ("mul_scalar", "t0", 2.0)], "bfloat16", False),
    ([("add", "in0", "in0"), ("gelu", "t0")], "float16", True),
])
def test_fast_form_only_where_rounded_to_16_bits(ops, out, fast):
    for vec in (False, True):
        src = K.pointwise_kernel(["bfloat16"], out, ops, vectorize=vec).source
        assert ("rs_gelu16(" in src) == fast
        assert ("erff(" in src) != fast


def test_fast_form_compiles_for_sm90(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from reshard.codegen import nvrtc as N

    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kc"))
    for dt in ("bfloat16", "float16"):
        for vec in (False, True):
            ks = K.pointwise_kernel([dt], dt, [("gelu", "in0")], vectorize=vec)
            assert ks.name.encode() in N.compile_kernel(ks, "sm_90")



@pytest.mark.multiproc
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_rounds_like_the_exact_gelu(dtype):
    """The generated kernels (vector and scalar paths, the SFU's approximate rcp/ex2) over
    every finite input: within 1 ulp, misrounded less often than torch's gelu on the GPU."""
    from reshard.codegen import nvrtc as N

    x = every_finite(dtype, "cuda")
    torch_bad, _, _ = rounding_errors(torch.nn.functional.gelu(x), x)
    for vec in (True, False):
        y = torch.full_like(x, float("nan"))
        N.run_pointwise([("gelu", "in0")], [x], out=y) if vec else _scalar_path(N, x, y)
        bad, worst, _ = rounding_errors(y, x)
        assert worst <= 1 and bad < torch_bad and bad <= x.numel() // 1000, (vec, bad, worst, torch_bad)


def _scalar_path(N, x: torch.Tensor, y: torch.Tensor) -> None:
    ks = K.pointwise_kernel([K.normalize_dtype(x.dtype)], K.normalize_dtype(y.dtype), [("gelu", "in0")])
    N.launch(ks, [y, x, np.int64(x.numel())], ks.grid_for(x.numel()), ks.block)
