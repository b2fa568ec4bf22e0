"""Shared by the kernel tests: a fresh NVRTC cache per test (``kernel_cache``: every compile
really runs NVRTC) and ``assert_cubin``, a kernel compiled for sm_90 with its symbol in the
cubin (no GPU needed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reshard.codegen.kernels import KernelSource


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
