"""Shared helpers of the op oracle tests (``tests/ops/test_op_*.py``): random global inputs of any
Fusion dtype and the plan-vs-reference check."""

from __future__ import annotations

import torch

import reshard as rs
from reshard.ir.dtypes import DTYPES, dtype_kind

MESH1 = rs.DeviceMesh([0, 1], ("tp",))
MESH2 = rs.DeviceMesh([[0, 1], [2, 3]], ("x", "y"))


def rand(shape: tuple[int, ...], dtype: str, gen: torch.Generator, *, special: bool = False) -> torch.Tensor:
    """A random tensor of ``dtype``: ints in [-4, 4] (repeats, so comparisons are often equal),
    bools about half True, floats normal (with ``special``, about one element in six NaN, inf
    or -inf)."""
    kind = dtype_kind(dtype)
    if kind == "int":
        return torch.randint(-4, 5, shape, generator=gen).to(DTYPES[dtype])
    if kind == "bool":
        return torch.rand(shape, generator=gen) < 0.5
    x = torch.randn(shape, generator=gen)
    if special:
        pick = torch.randint(0, 12, shape, generator=gen)
        x = torch.where(pick == 0, float("nan"), torch.where(pick == 1, float("inf"), x))
        x = torch.where(pick == 2, float("-inf"), x)
    return x.to(DTYPES[dtype])


def inputs_of(f: rs.Fusion, seed: int, *, special: bool = False) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {f.tensors[i].name: rand(f.tensors[i].shape, f.tensors[i].dtype, gen, special=special)
            for i in f.inputs}


#: a 16-bit float's tolerance: two roundings (a fused chain computes in float32 and rounds once,
#: the reference's ops round after each op, ``codegen.fuse``)
_SIXTEEN_BIT_TOL = {torch.bfloat16: 2 ** -6, torch.float16: 2 ** -9}


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal dtype and shape; ints and bools exactly, floats closely (NaN equal to NaN; a 16-bit
    float within two roundings of its dtype)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if want.is_floating_point():
        tol = _SIXTEEN_BIT_TOL.get(want.dtype, 1e-5)
        torch.testing.assert_close(got, want, equal_nan=True, rtol=tol, atol=tol)
    else:
        assert torch.equal(got, want), (got, want)


def check_plan(f: rs.Fusion, seeds: tuple[int, ...] = (0, 1), *, special: bool = False) -> rs.Plan:
    """Optimize ``f`` and check the simulated plan against ``rs.run_reference`` on random
    inputs (Partial inputs get random summands), on the CPU and, where there is one, on a
    GPU (``gpu_local``'s kernels, or torch for the steps they decline); returns the plan."""
    plan = rs.optimize(f)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for seed in seeds:
        inputs = inputs_of(f, seed, special=special)
        refs = rs.run_reference(f, inputs)
        for device in devices:
            outs = plan.simulate(inputs, generator=torch.Generator().manual_seed(seed + 100), device=device)
            for o, r in zip(outs, refs, strict=True):
                assert_same(o, r)
    return plan
