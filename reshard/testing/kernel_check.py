"""Shared by the kernel tests: a fresh NVRTC cache per test (``kernel_cache``: every compile
really runs NVRTC), ``assert_cubin``, a kernel compiled for sm_90 with its symbol in the
cubin (no GPU needed), ``torch_step``, a step's torch result that leaves its operands as they were, and ``operands``,
the environment a step may write into without changing the caller's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from reshard.codegen.kernels import KernelSource
from reshard.codegen.program import Step
from reshard.runtime.local_ops import run_local


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch) -> Iterator[None]:
    pytest.importorskip("cuda.core")
    from reshard.codegen import nvrtc as N

    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kcache"))
    N.clear_memory_cache()
    yield
    N.clear_memory_cache()


def assert_cubin(ks: KernelSource) -> bytes:
    """``ks`` compiled with NVRTC for sm_90: an ELF cubin holding its ``extern "C"`` symbol."""
    from reshard.codegen import nvrtc as N

    b = N.compile_kernel(ks, "sm_90")
    assert b[:4] == b"\x7fELF" and ks.name.encode() in b, ks.name
    return b


def operands(step: Step, env: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``env`` with a fresh copy of the dying operand ``step`` writes into (``into``,
    ``codegen.alloc``), if any: running ``step`` on it leaves ``env`` as it was, so the same
    step can run again on the same inputs (through ``gpu_local_step``, to compare)."""
    i = step.attr("into")
    return env if i is None else {**env, step.ins[i]: env[step.ins[i]].clone()}


def torch_step(step: Step, env: dict[str, torch.Tensor], rank: int) -> torch.Tensor:
    """``run_local``'s result of ``step``, leaving ``env`` as it was (``operands``)."""
    return run_local(step, operands(step, env), rank)

