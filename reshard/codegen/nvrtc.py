"""Compile generated kernels with NVRTC (through ``cuda.core``), cache them, launch them.

The ``gpu`` extra installs what it needs (``pip install 'reshard[gpu]'``: cuda-python,
cuda-core, nvidia-cuda-nvrtc); without it, importing this module works and compiling or
launching is a ``ReshardError`` that names the extra (every ``cuda`` import is inside the
function that needs it).  Compilation needs no GPU: the ``nvidia-cuda-nvrtc`` wheel is enough, and the
``cuda_fp16.h`` / ``cuda_bf16.h`` headers come from NVRTC's bundled headers
(``ProgramOptions(use_bundled_headers=True)``, NVRTC >= 13.x).  If bundling is not available
we fall back to a CUDA include directory (``$RESHARD_CUDA_INCLUDE`` or the one
``cuda.pathfinder`` finds).

Caches: an in-process dict and an on-disk directory (``$RESHARD_KERNEL_CACHE`` or
``~/.cache/reshard/kernels``), both keyed by sha256 of (source, arch, options, NVRTC
version).  Launches go on torch's current CUDA stream.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Sequence

from reshard.codegen import kernels as K
from reshard.codegen.kernels import KernelSource
from reshard.ir.errors import ReshardError
from reshard.ir.tensor_cache import BoundedCache

__all__ = [
    "compile_kernel",
    "cache_dir",
    "cache_stats",
    "clear_memory_cache",
    "launch",
    "run_pointwise",
    "run_cast",
    "run_permute",
    "run_strided_copy",
    "run_pad",
    "run_cat",
    "run_reduce",
]

_lock = threading.Lock()
#: cache key -> cubin, the compiled kernels of this process (bounded like every memo)
_mem_cache: BoundedCache[str, bytes] = BoundedCache(4096)
_stats = {"compiles": 0, "memory_hits": 0, "disk_hits": 0}
_header_mode: str | None = None  # "bundled" | "include:<dir>" once known to work

#: Extra NVRTC options every kernel is compiled with (part of the cache key).
_BASE_OPTIONS: dict[str, Any] = {"std": "c++17"}


def cache_dir() -> Path:
    """The on-disk kernel cache directory (``$RESHARD_KERNEL_CACHE`` or ~/.cache/reshard/kernels)."""
    env = os.environ.get("RESHARD_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "reshard" / "kernels"


def cache_stats() -> dict[str, int]:
    """Counters: NVRTC compiles run, in-memory hits and disk hits (since import / last clear)."""
    return dict(_stats)


def clear_memory_cache(reset_stats: bool = True) -> None:
    """Forget in-memory compiled kernels (the disk cache is untouched)."""
    with _lock:
        _mem_cache.clear()
        _loaded.clear()
        _by_source.clear()
        if reset_stats:
            for k in _stats:
                _stats[k] = 0


def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:  # pragma: no cover - version only feeds the cache key
        return "unknown"


_NVRTC_VERSION: str | None = None


def _cache_key(ks: KernelSource, arch: str) -> str:
    global _NVRTC_VERSION
    if _NVRTC_VERSION is None:
        _NVRTC_VERSION = _nvrtc_version()
    blob = "\0".join([ks.source, arch, repr(sorted(_BASE_OPTIONS.items())), _NVRTC_VERSION, ks.name])
    return hashlib.sha256(blob.encode()).hexdigest()


def _fallback_include_dir() -> str | None:
    env = os.environ.get("RESHARD_CUDA_INCLUDE")
    if env:
        return env
    try:
        from cuda import pathfinder

        d = pathfinder.find_nvidia_header_directory("cudart")
        if d and Path(d, "cuda_bf16.h").exists():
            return str(d)
    except Exception:
        pass
    return None


#: what a missing ``cuda.core`` means, and how to get it
GPU_EXTRA = ("NVRTC kernels need the gpu extra (cuda-python, cuda-core, nvidia-cuda-nvrtc): "
             "pip install 'reshard[gpu]' (from a checkout: pip install -e '.[gpu]')")


def _cuda_core() -> Any:
    """The cuda.core namespace (1.x exports at top level; 0.x under ``experimental``);
    ``ReshardError`` naming the ``gpu`` extra when it is not installed."""
    try:
        import cuda.core as cc
    except ImportError as e:
        raise ReshardError(f"{GPU_EXTRA} ({e})") from e
    if hasattr(cc, "Program"):
        return cc
    from cuda.core import experimental  # pragma: no cover - old cuda.core

    return experimental


def _nvrtc_compile(ks: KernelSource, arch: str) -> bytes:
    """Run NVRTC; raises ReshardError with the log on failure.

    Headers: NVRTC's bundled ones first, else a CUDA include directory; the first mode
    that works is remembered for later compiles.
    """
    global _header_mode
    cc = _cuda_core()
    modes = [_header_mode] if _header_mode else ["bundled", "include"]
    failures: list[tuple[str, Exception]] = []
    for mode in modes:
        opts: dict[str, Any] = dict(_BASE_OPTIONS, arch=arch, name=f"{ks.name}.cu")
        if mode == "bundled":
            opts["use_bundled_headers"] = True
        else:
            inc = mode.split(":", 1)[1] if mode.startswith("include:") else _fallback_include_dir()
            if inc is None:
                continue
            opts["include_path"] = inc
            mode = f"include:{inc}"
        try:
            obj = cc.Program(ks.source, "c++", cc.ProgramOptions(**opts)).compile("cubin")
        except Exception as e:  # NVRTCError (log in the message), or an option this version lacks
            failures.append((mode, e))
            continue
        _header_mode = mode
        return bytes(obj.code)
    logs = "\n".join(f"[{m}] {type(e).__name__}: {e}".strip() for m, e in failures) or "no header mode available"
    raise ReshardError(f"NVRTC failed to compile kernel {ks.name} ({ks.kind}) for {arch}:\n{logs}") from (
        failures[-1][1] if failures else None)


def compile_kernel(ks: KernelSource, arch: str = "sm_90") -> bytes:
    """Compile ``ks`` to a cubin for ``arch`` (e.g. "sm_90"), through the memory and disk caches.

    Raises:
        ReshardError: NVRTC rejected the source; the message holds the NVRTC log.
    """
    key = _cache_key(ks, arch)
    with _lock:
        hit = _mem_cache.get(key)
        if hit is not None:
            _stats["memory_hits"] += 1
            return hit
    path = cache_dir() / f"{key}.cubin"
    try:
        data = path.read_bytes()
        if data[:4] == b"\x7fELF":
            with _lock:
                _mem_cache[key] = data
                _stats["disk_hits"] += 1
            return data
    except OSError:
        pass
    data = _nvrtc_compile(ks, arch)
    with _lock:
        _stats["compiles"] += 1
        _mem_cache[key] = data
    try:  # atomic write; a cache we cannot write is not an error
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".cubin")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass
    return data


# --------------------------------------------------------------------------------------
# launching (needs CUDA)

_loaded: BoundedCache[tuple[str, int], Any] = BoundedCache(4096)  # (cache key, device index) -> cuda.core Kernel


def _device_arch(index: int) -> str:
    return f"sm_{_cuda_core().Device(index).arch}"


#: (kernel source, device index) -> loaded kernel, the per-launch lookup: a KernelSource
#: hashes its fields (strings cache their hashes) where ``_loaded``'s key is a sha256 of the source
_by_source: BoundedCache[tuple[KernelSource, int], Any] = BoundedCache(4096)


def _get_kernel(ks: KernelSource, index: int) -> Any:
    kern = _by_source.get((ks, index))
    if kern is not None:
        return kern
    cc = _cuda_core()
    Device, ObjectCode = cc.Device, cc.ObjectCode

    arch = _device_arch(index)
    key = (_cache_key(ks, arch), index)
    kern = _loaded.get(key)
    if kern is None:
        Device(index).set_current()
        cubin = compile_kernel(ks, arch)
        kern = ObjectCode.from_cubin(cubin, name=ks.name).get_kernel(ks.name)
        _loaded[key] = kern
    _by_source[(ks, index)] = kern
    return kern


#: per device index: its cuda.core Device; per (grid, block, shared memory): a LaunchConfig
_devices: dict[int, Any] = {}
_configs: BoundedCache[tuple, Any] = BoundedCache(4096)


def _raw_stream(torch: Any, index: int) -> int:
    """torch's current ``cudaStream_t`` on device ``index`` (its fast private accessor when
    present: constructing a ``torch.cuda.Stream`` costs microseconds per launch)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def _as_dim3(v: int | Sequence[int]) -> tuple[int, ...]:
    return (int(v),) if isinstance(v, int) else tuple(int(x) for x in v)


def launch(ks: KernelSource, args: list, grid: int | Sequence[int], block: int | Sequence[int],
           shared_mem: int = 0) -> None:
    """Launch ``ks`` on torch's current CUDA stream (of the current device).

    ``args`` are passed in order: torch tensors become their ``data_ptr()``; other values
    are passed as given, so scalars must be numpy scalar types matching the kernel's C
    parameters (``np.int64`` for ``long long``, ``np.float32`` for ``float``).
    """
    import torch

    cc = _cuda_core()

    if not _devices and not torch.cuda.is_available():
        raise ReshardError(f"cannot launch kernel {ks.name}: CUDA is not available")
    index = torch.cuda.current_device()
    kern = _get_kernel(ks, index)
    dev = _devices.get(index)
    if dev is None:
        dev = _devices[index] = cc.Device(index)
    dev.set_current()
    stream = _wrap_stream(cc, _raw_stream(torch, index))
    ckey = (grid, block, shared_mem) if isinstance(grid, tuple) and isinstance(block, tuple) else \
        (_as_dim3(grid), _as_dim3(block), shared_mem)
    cfg = _configs.get(ckey)
    if cfg is None:
        cfg = _configs[ckey] = cc.LaunchConfig(grid=_as_dim3(ckey[0]), block=_as_dim3(ckey[1]),
                                               shmem_size=int(shared_mem))
    kargs = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
    cc.launch(stream, cfg, kern, *kargs)


class _StreamHandle:
    """A foreign stream for cuda.core versions without ``Stream.from_handle``."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


_streams: dict[int, Any] = {}


def _wrap_stream(cc: Any, handle: int) -> Any:
    """A cuda.core Stream for torch's raw ``cudaStream_t`` (cached per handle)."""
    s = _streams.get(handle)
    if s is None:
        if hasattr(cc.Stream, "from_handle"):
            s = cc.Stream.from_handle(handle)
        else:  # pragma: no cover - old cuda.core
            s = cc.Device().create_stream(_StreamHandle(handle))
        _streams[handle] = s
    return s


def _launch_ks(ks: KernelSource, args: list, n: int | None = None) -> None:
    launch(ks, args, ks.grid_for(n), ks.block, ks.shared_mem)


def _aligned16(*ts: Any) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in ts)


def _check_out(out: Any, shape: Sequence[int], dtype: Any, device: Any, what: str) -> Any:
    import torch

    if out is None:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or not out.is_contiguous() or out.device != device:
        raise ReshardError(f"{what}: out must be contiguous {tuple(shape)} {dtype} on {device}, got "
                           f"{tuple(out.shape)} {out.dtype} on {out.device}")
    return out


def _dtype_name(t: Any) -> str:
    return K.normalize_dtype(t.dtype)


def _require_cuda_contig(ts: Sequence[Any], what: str) -> None:
    for t in ts:
        if not t.is_cuda or not t.is_contiguous():
            raise ReshardError(f"{what}: inputs must be contiguous CUDA tensors (got {t.device}, "
                               f"contiguous={t.is_contiguous()})")


def run_pointwise(ops: Sequence[K.Instr], inputs: Sequence[Any], out_dtype: Any = None, out: Any = None) -> Any:
    """Run a fused pointwise chain (see :func:`kernels.pointwise_kernel`) on same-shape tensors.

    ``out_dtype`` defaults to the dtype of input 0. Uses the 16-byte vector path when
    every pointer is 16-byte aligned and the element count allows it.
    """
    import numpy as np
    import torch

    if not inputs:
        raise ReshardError("run_pointwise: no inputs")
    _require_cuda_contig(inputs, "run_pointwise")
    shape = inputs[0].shape
    if any(t.shape != shape for t in inputs):
        raise ReshardError(f"run_pointwise: input shapes differ: {[tuple(t.shape) for t in inputs]}")
    odt = inputs[0].dtype if out_dtype is None else (getattr(torch, K.normalize_dtype(out_dtype))
                                                     if not isinstance(out_dtype, torch.dtype) else out_dtype)
    out = _check_out(out, shape, odt, inputs[0].device, "run_pointwise")
    n = out.numel()
    in_dts = [_dtype_name(t) for t in inputs]
    od = K.normalize_dtype(odt)
    vec = n % K.pointwise_vector_width(in_dts, od) == 0 and _aligned16(out, *inputs)
    ks = K.memoized(K.pointwise_kernel, in_dts, od, ops, vectorize=vec)
    if n:
        _launch_ks(ks, [out, *inputs, np.int64(n)], n)
    return out


def run_cast(x: Any, dtype: Any, out: Any = None) -> Any:
    """``x.to(dtype)`` through a generated pointwise kernel."""
    return run_pointwise([("cast", "in0", K.normalize_dtype(dtype))], [x], dtype, out)


def run_strided_copy(x: Any, out_shape: Sequence[int], in_strides: Sequence[int], in_offset: int = 0,
                     out: Any = None) -> Any:
    """Contiguous copy of the view of ``x``'s storage given by element strides/offset,
    relative to ``x.data_ptr()`` (like ``x.as_strided(out_shape, in_strides, in_offset)``
    for a contiguous ``x`` with zero storage offset)."""
    _require_cuda_contig([x], "run_strided_copy")
    out = _check_out(out, out_shape, x.dtype, x.device, "run_strided_copy")
    ks = K.memoized(K.strided_copy_kernel, out_shape, in_strides, in_offset, _dtype_name(x),
                    vectorize=_aligned16(out, x))
    if out.numel():
        _launch_ks(ks, [out, x])
    return out


def run_permute(x: Any, perm: Sequence[int], out: Any = None) -> Any:
    """``x.permute(perm).contiguous()`` for a contiguous CUDA tensor ``x``."""
    _require_cuda_contig([x], "run_permute")
    shape = [x.shape[p] for p in perm]
    out = _check_out(out, shape, x.dtype, x.device, "run_permute")
    ks = K.memoized(K.permute_kernel, tuple(x.shape), tuple(perm), _dtype_name(x), vectorize=_aligned16(out, x))
    if out.numel():
        _launch_ks(ks, [out, x])
    return out


def run_pad(x: Any, pads: Sequence[tuple[int, int]], value: float = 0.0, out: Any = None) -> Any:
    """Constant pad of a contiguous CUDA tensor; ``pads[d] = (before, after)`` per dim."""
    _require_cuda_contig([x], "run_pad")
    shape = [s + a + b for s, (a, b) in zip(x.shape, pads)]
    out = _check_out(out, shape, x.dtype, x.device, "run_pad")
    ks = K.memoized(K.pad_kernel, tuple(x.shape), pads, _dtype_name(x), value)
    if out.numel():
        _launch_ks(ks, [out, x])
    return out


def run_cat(xs: Sequence[Any], dim: int, out: Any = None) -> Any:
    """``torch.cat(xs, dim)`` of contiguous same-dtype CUDA tensors."""
    _require_cuda_contig(xs, "run_cat")
    if any(t.dtype != xs[0].dtype for t in xs):
        raise ReshardError(f"run_cat: dtypes differ: {[t.dtype for t in xs]}")
    r = xs[0].dim()
    dm = dim + r if dim < 0 else dim
    shape = list(xs[0].shape)
    shape[dm] = sum(t.shape[dm] for t in xs)
    out = _check_out(out, shape, xs[0].dtype, xs[0].device, "run_cat")
    ks = K.memoized(K.cat_kernel, [tuple(t.shape) for t in xs], dm, _dtype_name(xs[0]))
    if out.numel():
        _launch_ks(ks, [out, *xs])
    return out


def run_reduce(x: Any, dim: int, op: str = "sum", out: Any = None) -> Any:
    """``x.sum(dim)`` / ``x.amax(dim)`` (fp32 accumulation, output in x's dtype)."""
    _require_cuda_contig([x], "run_reduce")
    r = x.dim()
    dm = dim + r if dim < 0 else dim
    out = _check_out(out, [s for i, s in enumerate(x.shape) if i != dm], x.dtype, x.device, "run_reduce")
    if not out.numel():
        return out
    import torch

    shape, dtype = tuple(x.shape), _dtype_name(x)
    splits = K.reduce_splits(shape, dm)
    if splits > 1:  # (``reduce_splits``)
        part = x.new_empty((math.prod(shape[:dm]), splits, math.prod(shape[dm + 1:])), dtype=torch.float32)
        _launch_ks(K.memoized(K.reduce_kernel, shape, dm, op, dtype, split=splits), [part, x])
        _launch_ks(K.memoized(K.reduce_kernel, tuple(part.shape), 1, op, dtype, from_partials=True), [out, part])
    else:
        _launch_ks(K.memoized(K.reduce_kernel, shape, dm, op, dtype), [out, x])
    return out
