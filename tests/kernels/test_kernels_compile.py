"""Generated CUDA kernels: every kind compiles with NVRTC (no GPU needed), caching works,
bad sources raise ReshardError; on a GPU the run_* wrappers match torch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("cuda.core")

from reshard.codegen import kernels as K  # noqa: E402
from reshard.codegen import nvrtc as N  # noqa: E402
from reshard.ir.errors import ReshardError  # noqa: E402

DTYPES = ["float32", "bfloat16", "float16"]
ARCH = "sm_90"
CHAIN = [("add", "in0", "in1"), ("gelu", "t0"), ("mul_scalar", "t1", 0.5), ("cast", "t2", "bfloat16"),
         ("silu", "t3"), ("relu", "t4"), ("tanh", "t5"), ("exp", "t6"), ("neg", "t7"), ("sub", "t8", "in1"),
         ("div", "t9", "in0"), ("add_scalar", "t10", -1.25), ("mul", "t11", "t0")]


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kcache"))
    N.clear_memory_cache()
    yield
    N.clear_memory_cache()


def _assert_cubin(ks: K.KernelSource) -> bytes:
    b = N.compile_kernel(ks, ARCH)
    assert isinstance(b, bytes) and len(b) > 64 and b[:4] == b"\x7fELF", ks.name
    assert ks.name.encode() in b  # the extern "C" symbol is in the cubin
    return b


def _cases(dtype: str) -> list[K.KernelSource]:
    other = "float32" if dtype != "float32" else "bfloat16"
    return [
        K.pointwise_kernel([dtype, dtype], dtype, CHAIN),
        K.pointwise_kernel([dtype, dtype], dtype, CHAIN, vectorize=True),
        K.pointwise_kernel([dtype, other], other, [("mul", "in0", "in1"), ("exp", "t0")], vectorize=True),
        K.pointwise_kernel([dtype], dtype, []),
        K.cast_kernel(1024, dtype, other, vectorize=True),
        K.cast_kernel(1023, other, dtype, vectorize=True),
        K.permute_kernel((64, 48), (1, 0), dtype),
        K.permute_kernel((4, 33, 70), (0, 2, 1), dtype),
        K.permute_kernel((2, 3, 4, 5), (3, 1, 0, 2), dtype),
        K.permute_kernel((2, 3, 4, 8), (2, 0, 1, 3), dtype, vectorize=True),
        K.permute_kernel((2, 1, 4), (1, 0, 2), dtype),
        K.permute_kernel((5,), (0,), dtype),
        K.strided_copy_kernel((3, 5), (20, 2), 7, dtype),
        K.strided_copy_kernel((4, 8), (16, 1), 8, dtype, vectorize=True),
        K.strided_copy_kernel((4, 3), (0, 1), 0, dtype),  # expand
        K.strided_copy_kernel((), (), 3, dtype),
        K.pad_kernel((3, 5), [(1, 2), (0, 3)], dtype, 0.0),
        K.pad_kernel((2, 3, 5), [(0, 0), (2, -1), (1, 1)], dtype, float("-inf")),
        K.pad_kernel((3, 5), [(0, 0), (2, 3)], dtype, 0.0),  # the last dim only: rows
        K.pad_kernel((2, 3, 12), [(0, 0), (0, 0), (0, -5)], dtype, 0.0),  # a crop
        K.cat_kernel([(2, 3, 4), (2, 5, 4), (2, 1, 4)], 1, dtype),
        K.cat_kernel([(7,), (9,)], 0, dtype),
        K.cat_kernel([(2, 3), (2, 0), (2, 4)], -1, dtype),
        K.reduce_kernel((8, 4096), 1, "sum", dtype),
        K.reduce_kernel((8, 100), -1, "max", dtype),
        K.reduce_kernel((3, 100, 33), 1, "sum", dtype),
        K.reduce_kernel((100, 64), 0, "max", dtype),
        K.reduce_kernel((2, 1000, 40), 1, "sum", dtype, split=K.reduce_splits((2, 1000, 40), 1)),
        K.reduce_kernel((2, 15, 40), 1, "sum", dtype, from_partials=True, scale=0.5),
        K.reduce_kernel((4096, 2048), 0, "max", dtype, split=K.reduce_splits((4096, 2048), 0)),
    ] + ([  # the 16-byte tiled transpose (2- and 4-byte items)
        K.permute_kernel((64, 48), (1, 0), dtype, vectorize=True),
        K.permute_kernel((4, 40, 72), (0, 2, 1), dtype, vectorize=True),  # edge tiles, batch dim
        K.permute_kernel((2, 16, 3, 24), (2, 0, 3, 1), dtype, vectorize=True),  # two batch dims
    ] if K.ITEMSIZE[dtype] in K.TRANSPOSE_VEC_ITEMSIZES else [])


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_kernel_kind_compiles(dtype):
    cases = _cases(dtype)
    names = [ks.name for ks in cases]
    assert len(set(names)) == len(names), "kernel names must be unique per specialization"
    kinds = {ks.kind for ks in cases}
    assert {"pointwise", "permute_tiled", "gather", "pad", "pad_rows", "cat"} <= kinds
    assert ("permute_tiled_vec" in kinds) == (K.ITEMSIZE[dtype] in (2, 4))
    assert {"reduce_rows_block", "reduce_rows_warp", "reduce_cols", "reduce_cols_split"} <= kinds
    for ks in cases:
        assert 'extern "C" __global__' in ks.source
        assert "#include <" not in ks.source.replace("#include <cuda_bf16.h>", "").replace(
            "#include <cuda_fp16.h>", "")
        _assert_cubin(ks)
    assert N.cache_stats()["compiles"] == len(cases)


def test_cache_memory_and_disk():
    ks = K.pointwise_kernel(["bfloat16"], "bfloat16", [("gelu", "in0")])
    b1 = _assert_cubin(ks)
    assert N.cache_stats() == {"compiles": 1, "memory_hits": 0, "disk_hits": 0}
    assert N.compile_kernel(ks, ARCH) == b1
    assert N.cache_stats()["compiles"] == 1 and N.cache_stats()["memory_hits"] == 1
    N.clear_memory_cache()
    assert N.compile_kernel(ks, ARCH) == b1  # from disk
    assert N.cache_stats() == {"compiles": 0, "memory_hits": 0, "disk_hits": 1}
    assert len(list(N.cache_dir().glob("*.cubin"))) == 1
    # another arch is another entry
    b2 = N.compile_kernel(ks, "sm_80")
    assert b2[:4] == b"\x7fELF" and N.cache_stats()["compiles"] == 1


def test_names_depend_on_spec():
    a = K.pointwise_kernel(["float32"], "float32", [("mul_scalar", "in0", 0.5)])
    b = K.pointwise_kernel(["float32"], "float32", [("mul_scalar", "in0", 0.25)])
    c = K.pointwise_kernel(["float32"], "float32", [("mul_scalar", "in0", 0.5)])
    assert a.name != b.name and a == c
    assert K.permute_kernel((4, 5), (1, 0), "bfloat16").name != K.permute_kernel((5, 4), (1, 0), "bfloat16").name


def test_malformed_kernel_raises_with_log():
    bad = K.KernelSource(name="rs_bad_kernel", source='extern "C" __global__ void rs_bad_kernel(float* o) '
                         "{ o[0] = undeclared_thing + 1; }\n", kind="test", params=("out:ptr",))
    with pytest.raises(ReshardError) as ei:
        N.compile_kernel(bad, ARCH)
    msg = str(ei.value)
    assert "rs_bad_kernel" in msg and "undeclared_thing" in msg and "identifier" in msg
    assert N.cache_stats()["compiles"] == 0


def test_bad_specs_raise():
    with pytest.raises(ReshardError):
        K.pointwise_kernel(["float32"], "float32", [("add", "in0", "in1")])
    with pytest.raises(ReshardError):
        K.pointwise_kernel(["float32"], "float32", [("frobnicate", "in0")])
    with pytest.raises(ReshardError):
        K.pointwise_kernel(["float32"], "float32", [("neg", "t0")])
    with pytest.raises(ReshardError, match="not supported by pointwise kernels"):
        K.pointwise_kernel(["float64"], "float32", [("neg", "in0")])
    with pytest.raises(ReshardError, match="no int form"):
        K.pointwise_kernel(["int32"], "float32", [("exp", "in0")])
    with pytest.raises(ReshardError):
        K.permute_kernel((2, 3), (0, 0), "float32")
    with pytest.raises(ReshardError):
        K.cat_kernel([(2, 3), (3, 3)], 1, "float32")
    with pytest.raises(ReshardError):
        K.reduce_kernel((2, 3), 2, "sum", "float32")
    with pytest.raises(ReshardError):
        K.reduce_kernel((2, 3), 1, "prod", "float32")


def test_permute_collapse():
    # (0, 2, 3, 1) on (2, 3, 4, 5) merges dims 2,3 -> a (2, 3, 20) -> (0, 2, 1) transpose
    assert K._collapse_perm((2, 3, 4, 5), (0, 2, 3, 1)) == ((2, 3, 20), (0, 2, 1))
    assert K._collapse_perm((2, 1, 4), (1, 0, 2)) == ((8,), (0,))
    assert K.permute_kernel((2, 3, 4, 5), (0, 2, 3, 1), "float32").kind == "permute_tiled"
    assert K.permute_kernel((2, 3, 4, 5), (1, 0, 2, 3), "float32").kind == "gather"


@pytest.mark.parametrize("dtype", DTYPES)
def test_vectorized_transpose_only_where_it_applies(dtype):
    """The 16-byte tiled transpose is used for 2- and 4-byte items whose two tiled extents
    are whole 16-byte vectors, given the caller's alignment promise (``vectorize``);
    otherwise (8-byte items included) the 32x32 tile runs."""
    v = 16 // K.ITEMSIZE[dtype]
    vec = K.permute_kernel((3 * v, 5 * v), (1, 0), dtype, vectorize=True)
    assert (vec.kind == "permute_tiled_vec") == (K.ITEMSIZE[dtype] in (2, 4))
    assert K.permute_kernel((3 * v, 5 * v), (1, 0), dtype).kind == "permute_tiled"  # no alignment promise
    assert K.permute_kernel((3 * v + 2, 5 * v), (1, 0), dtype, vectorize=True).kind == "permute_tiled"
    assert K.permute_kernel((3 * v, 5 * v + 2), (1, 0), dtype, vectorize=True).kind == "permute_tiled"
    assert K.permute_kernel((16, 16), (1, 0), "float64", vectorize=True).kind == "permute_tiled"


@pytest.mark.parametrize("itemsize,unroll", [(2, 1), (2, 2), (2, 4), (4, 1), (4, 2)])
def test_vectorized_transpose_variants_compile(itemsize, unroll):
    """Every tile layout of the generator (64 x 64 packed pairs for 2-byte items, 32 x 32
    for 4-byte ones; 1-4 tiles per iteration) compiles, with its grid counting tiles."""
    for shape, perm in [((1024, 2048), (1, 0)), ((4, 40, 72), (0, 2, 1)), ((2, 40, 3, 24), (3, 1, 0, 2))]:
        cs, cp = K._collapse_perm(shape, perm)
        if not (cs[cp[-1]] * itemsize % 16 == 0 and cs[-1] * itemsize % 16 == 0):
            continue
        ks = K._transpose_vec_kernel(cs, cp, itemsize, unroll)
        assert ks.kind == "permute_tiled_vec" and "uint4" in ks.source
        assert ("__byte_perm" in ks.source) == (itemsize == 2)
        if shape == (1024, 2048):
            t = 64 if itemsize == 2 else 32
            assert ks.grid == (1024 // t * (2048 // (t * unroll)), 1, 1)
        _assert_cubin(ks)


#: shapes whose tiles come in several bands, the last one partial, at groups 1-3
BANDED = [((1000, 264), (1, 0)), ((520, 1032), (1, 0)), ((3, 136, 200), (0, 2, 1)), ((2, 16, 3, 232), (2, 0, 3, 1))]


@pytest.mark.parametrize("itemsize", [2, 4])
def test_banded_tile_order_compiles(itemsize):
    """``group``: tiles in bands of tile rows (``_tile_loop``); the kernel names tell the
    orders apart, and the band path is emitted only where there is more than one band."""
    for shape, perm in BANDED:
        cs, cp = K._collapse_perm(shape, perm)
        names = set()
        for g in (0, 1, 2, 3):
            ks = K._transpose_vec_kernel(cs, cp, itemsize, group=g)
            assert ("a_first" in ks.source) == (0 < g < -(-cs[cp[-1]] // (32 * 4 // itemsize)))
            names.add(ks.name)
            _assert_cubin(ks)
        assert len(names) == 4


# ---------------------------------------------------------------------------------------
# GPU: each wrapper against torch

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}
TDTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype
    g, r = got.double(), ref.double()
    assert not torch.isnan(g).any() or torch.isnan(r).any()
    err = (g - r).abs().max().item()
    mag = max(r.abs().max().item(), 1e-30)
    assert err <= TOL[dtype] * scale * mag, f"max abs err {err} vs max |ref| {mag}"


def _torch_chain(ops, xs, out_dtype):
    vals = [x.float() for x in xs]
    ts = []
    get = lambda tok: vals[int(tok[2:])] if tok.startswith("in") else ts[int(tok[1:])]  # noqa: E731
    for op, *a in ops:
        x = get(a[0])
        if op in ("add", "sub", "mul", "div"):
            y = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op](x, get(a[1]))
        elif op == "cast":
            y = x.to(getattr(torch, a[1])).float()
        elif op == "mul_scalar":
            y = x * a[1]
        elif op == "add_scalar":
            y = x + a[1]
        else:
            y = {"neg": torch.neg, "exp": torch.exp, "tanh": torch.tanh, "relu": torch.relu, "silu":
                 torch.nn.functional.silu, "gelu": torch.nn.functional.gelu}[op](x)
        ts.append(y)
    return (ts[-1] if ts else vals[0]).to(out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TDTYPES)
@pytest.mark.parametrize("n", [1, 1000, 4096, 1 << 20])
def test_gpu_pointwise(dtype, n):
    ops = [("add", "in0", "in1"), ("gelu", "t0"), ("mul_scalar", "t1", 0.5), ("silu", "t2"),
           ("sub", "t3", "in1"), ("tanh", "t4")]
    xs = [torch.randn(n, device="cuda", dtype=dtype) for _ in range(2)]
    out = torch.full((n,), float("nan"), device="cuda", dtype=dtype)
    N.run_pointwise(ops, xs, out=out)
    _close(out, _torch_chain(ops, xs, dtype), dtype, scale=2.0)
    # mixed dtypes + cast
    y = N.run_pointwise([("relu", "in0"), ("mul", "t0", "in1")], [xs[0], xs[1].float()], torch.float32)
    _close(y, torch.relu(xs[0].float()) * xs[1].float(), torch.float32)
    c = N.run_cast(xs[0], torch.float32)
    assert torch.equal(c, xs[0].float())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TDTYPES)
@pytest.mark.parametrize("shape,perm", [((64, 48), (1, 0)), ((4, 33, 70), (0, 2, 1)), ((2, 3, 4, 5), (3, 1, 0, 2)),
                                        ((2, 3, 4, 8), (2, 0, 1, 3)), ((5, 7, 9), (1, 2, 0)), ((300, 2, 40), (2, 1, 0)),
                                        ((1000, 264), (1, 0)), ((3, 72, 136), (0, 2, 1)), ((2, 16, 3, 24), (2, 0, 3, 1))])
def test_gpu_permute(dtype, shape, perm):
    x = torch.randn(shape, device="cuda").to(dtype)
    assert torch.equal(N.run_permute(x, perm), x.permute(perm).contiguous())


@pytest.mark.multiproc
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group", [1, 2, 3, 32])
def test_gpu_banded_transpose(dtype, group):
    from reshard.codegen.nvrtc import launch

    for shape, perm in BANDED:
        x = torch.randn(shape, device="cuda").to(dtype)
        cs, cp = K._collapse_perm(shape, perm)
        ks = K._transpose_vec_kernel(cs, cp, x.element_size(), group=group)
        out = torch.full([shape[p] for p in perm], float("nan"), device="cuda", dtype=dtype)
        launch(ks, [out, x], ks.grid, ks.block)
        assert torch.equal(out, x.permute(perm).contiguous()), (shape, perm)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TDTYPES)
def test_gpu_strided_pad_cat(dtype):
    base = torch.randn(1000, device="cuda").to(dtype)
    for shape, strides, off in [((3, 5), (20, 2), 7), ((4, 8), (16, 1), 8), ((4, 3), (0, 1), 0), ((), (), 3)]:
        got = N.run_strided_copy(base, shape, strides, off)
        assert torch.equal(got, base.as_strided(shape, strides, off).contiguous())
    x = torch.randn(2, 3, 5, device="cuda").to(dtype)
    pads = [(0, 0), (2, -1), (1, 1)]
    flat = [v for a, b in reversed(pads) for v in (a, b)]
    assert torch.equal(N.run_pad(x, pads, 1.5), torch.nn.functional.pad(x, flat, value=1.5))
    for shape, last in [((3, 5), (2, 3)), ((4, 2, 3000), (0, 7)), ((5, 12), (0, -5)), ((2, 9), (-3, 1))]:
        x = torch.randn(*shape, device="cuda").to(dtype)
        pads = [(0, 0)] * (len(shape) - 1) + [last]
        assert torch.equal(N.run_pad(x, pads, 1.5), torch.nn.functional.pad(x, list(last), value=1.5)), (shape, last)
    xs = [torch.randn(2, k, 4, device="cuda").to(dtype) for k in (3, 5, 1)]
    assert torch.equal(N.run_cat(xs, 1), torch.cat(xs, 1))
    ys = [torch.randn(3, k, device="cuda").to(dtype) for k in (7, 0, 9)]
    assert torch.equal(N.run_cat(ys, -1), torch.cat(ys, -1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TDTYPES)
@pytest.mark.parametrize("shape,dim", [((8, 4096), 1), ((8, 100), -1), ((3, 100, 33), 1), ((100, 64), 0),
                                       ((4, 5, 6), 2), ((2, 1000, 40), 1), ((4096, 2048), 0)])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_gpu_reduce(dtype, shape, dim, op):
    x = torch.randn(shape, device="cuda").to(dtype)
    got = N.run_reduce(x, dim, op)
    ref = x.float().sum(dim).to(dtype) if op == "sum" else x.amax(dim)
    if op == "max":
        assert torch.equal(got, ref)
    else:
        _close(got, ref, dtype, scale=4.0)


def test_memoized_generation():
    """``memoized`` returns the very same source for equal arguments and keeps apart what
    compares equal but generates differently (0.0 vs -0.0 factors, vectorize flags)."""
    a = K.memoized(K.pointwise_kernel, ["bfloat16"], "bfloat16", [("mul_scalar", "in0", 0.0)])
    assert K.memoized(K.pointwise_kernel, ["bfloat16"], "bfloat16", [("mul_scalar", "in0", 0.0)]) is a
    b = K.memoized(K.pointwise_kernel, ["bfloat16"], "bfloat16", [("mul_scalar", "in0", -0.0)])
    assert b is not a and b.name != a.name and "-0.0f" in b.source
    v = K.memoized(K.permute_kernel, (64, 48), (1, 0), "float32", vectorize=True)
    assert v.kind == "permute_tiled_vec"
    assert K.memoized(K.permute_kernel, (64, 48), (1, 0), "float32", vectorize=False).kind == "permute_tiled"


#: (output shape, broadcast input's shape, its dims): rows, columns, a middle dim, extent-1 dims
BCASTS = [((6, 16), (16,), (1,)), ((6, 16), (6,), (0,)), ((3, 5, 8), (3, 8), (0, 2)), ((3, 5, 8), (1, 5, 1), (0, 1, 2)),
          ((4, 24), (), ()), ((6, 20), (6,), (0,)), ((2, 3, 12), (3, 12), (1, 2))]


def test_broadcast_reads_compile_and_check_their_spec():
    for shape, bshape, dims in BCASTS:
        for vec in (False, True):
            ks = K.pointwise_kernel(["float32", "bfloat16"], "bfloat16", [("add", "in0", "in1")], shape,
                                    ((), (bshape, dims)), vectorize=vec and math.prod(shape) % 8 == 0)
            _assert_cubin(ks)
    assert K.broadcast_strides((3, 8), (0, 2), (3, 5, 8)) == (8, 0, 1)
    assert K.broadcast_strides((1, 5, 1), (0, 1, 2), (3, 5, 8)) == (0, 1, 0)
    with pytest.raises(ReshardError, match="neither 1 nor"):
        K.broadcast_strides((4,), (0,), (3, 5))
    with pytest.raises(ReshardError, match="innermost dim"):  # (a vector crossing a row would wrap)
        K.pointwise_kernel(["bfloat16"] * 2, "bfloat16", [("add", "in0", "in1")], (4, 12), ((), ((4, 12), (0, 1), ((1, 8),))),
                           vectorize=True)


@pytest.mark.multiproc
@pytest.mark.gpu
@pytest.mark.parametrize("shape,bshape,dims", BCASTS)
def test_gpu_broadcast_reads(shape, bshape, dims):
    from reshard.codegen.nvrtc import launch

    x = torch.randn(shape, device="cuda")
    b = torch.randn(bshape, device="cuda").bfloat16()
    view = [1] * len(shape)
    for i, d in enumerate(dims):
        view[d] = bshape[i]
    want = (x + b.float().reshape(view)).bfloat16()
    for vec in (False, True) if shape[-1] % 8 == 0 else (False,):
        ks = K.pointwise_kernel(["float32", "bfloat16"], "bfloat16", [("add", "in0", "in1")], shape,
                                ((), (bshape, dims)), vectorize=vec)
        out = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        n = out.numel()
        launch(ks, [out, x, b, np.int64(n)], ks.grid_for(n), ks.block)
        assert torch.equal(out, want), (shape, bshape, dims, vec)
