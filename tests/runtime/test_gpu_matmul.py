"""``runtime.gpu_matmul.aligned_matmul``: a half-precision matmul step whose operands or result
read an extent or a leading dimension that is no multiple of 16 bytes contiguously runs on
zero-padded buffers (cuBLAS's tensor-core kernels need aligned ones): every matrix handed to
``torch.matmul`` reads aligned runs at aligned strides, the result is the step's (shape,
values), and aligned or 4-byte matmuls are left to the step."""

from __future__ import annotations

import pytest
import torch

from reshard.codegen.program import Step
from reshard.runtime.gpu_matmul import aligned_matmul


def _step(transposed: tuple[bool, bool] = (False, False)) -> Step:
    return Step("local", "y", ("a", "b"), (("fop", "matmul"), ("op", "apply"), ("transposed", transposed)))


def _runs(x: torch.Tensor) -> tuple[int, int]:
    """(the extent read contiguously, the stride between those runs) of ``x``'s matrices."""
    if x.stride(-1) == 1:
        return x.shape[-1], x.stride(-2)
    return x.shape[-2], x.stride(-1)


def _run(monkeypatch, step: Step, xs: list[torch.Tensor]) -> tuple[torch.Tensor | None, list[int]]:
    """The step's result and the contiguous extents and leading dimensions of every matrix
    torch.matmul was given."""
    seen: list[int] = []
    inner = torch.matmul

    def recording(a, b):
        seen.extend(v for t in (a, b) for v in _runs(t))
        out = inner(a, b)
        seen.extend(_runs(out))
        return out

    monkeypatch.setattr(torch, "matmul", recording)
    return aligned_matmul(step, xs), seen


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("case", ["wide result", "misaligned contraction", "lhs read transposed", "batched",
                                  "batched lhs read transposed", "rhs read transposed"])
def test_misaligned_bf16_matmuls_run_on_aligned_buffers(case, device, monkeypatch):
    """On the GPU, the padded last dims and the result's cut columns through reshard's row pad kernel."""
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(torch.bfloat16).to(device)

    step = _step()
    if case == "wide result":  # the lm head: h @ W^T, W [vocab, hidden] read transposed
        step, xs = _step((False, True)), [r(24, 32), r(37, 32)]
        want = xs[0].float() @ xs[1].float().T
    elif case == "misaligned contraction":  # its input gradient: dlogits @ W
        xs = [r(24, 37), r(37, 32)]
        want = xs[0].float() @ xs[1].float()
    elif case == "lhs read transposed":  # its weight gradient: dlogits^T @ h
        step, xs = _step((True, False)), [r(24, 37), r(24, 16)]
        want = xs[0].float().T @ xs[1].float()
    elif case == "batched":
        xs = [r(3, 24, 37), r(3, 37, 40)]
        want = xs[0].float() @ xs[1].float()
    elif case == "batched lhs read transposed":  # M and K both misaligned, M read contiguously
        step, xs = _step((True, False)), [r(3, 37, 21), r(3, 37, 40)]
        want = xs[0].float().transpose(-1, -2) @ xs[1].float()
    else:  # K read contiguously in both operands
        step, xs = _step((False, True)), [r(24, 37), r(16, 37)]
        want = xs[0].float() @ xs[1].float().T
    got, seen = _run(monkeypatch, step, xs)
    assert got is not None and got.shape == want.shape and got.is_contiguous()
    assert seen and all(ld % 8 == 0 for ld in seen), seen
    torch.testing.assert_close(got.float().cpu(), want.cpu(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype, shapes", [(torch.bfloat16, [(24, 32), (32, 40)]), (torch.float32, [(24, 37), (37, 5)])],
                         ids=["aligned bf16", "float32"])
def test_aligned_or_wide_element_matmuls_are_left_to_the_step(dtype, shapes, monkeypatch):
    xs = [torch.ones(s, dtype=dtype) for s in shapes]
    assert _run(monkeypatch, _step(), xs) == (None, [])
