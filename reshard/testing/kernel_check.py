"""Shared by the kernel tests: a fresh NVRTC cache per test (``kernel_cache``: every compile
really runs NVRTC), ``assert_cubin``, a kernel compiled for sm_90 with its symbol in the
cubin (no GPU needed), and ``torch_step``, a step's torch result that leaves its operands as they
were."""

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


def torch_step(step: Step, env: dict[str, torch.Tensor], rank: int) -> torch.Tensor:
    """``run_local``'s result of ``step``, leaving ``env`` as it was: a step writing into a dying
    operand (``into``, ``codegen.alloc``) writes into a copy of it, so the same step can then run
    again on the same inputs (through ``gpu_local_step``, to compare)."""
    i = step.attr("into")
    if i is None:
        return run_local(step, env, rank)
    return run_local(step, {**env, step.ins[i]: env[step.ins[i]].clone()}, rank)

