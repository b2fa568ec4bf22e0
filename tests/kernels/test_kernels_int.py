"""int64 / int32 values in generated pointwise kernels (``kernels.POINTWISE_DTYPES``): held in
64-bit signed registers, the arithmetic wrapping like torch's two's complement ints (each
function's int form, ``elementwise_cuda``), comparisons giving bools, ``masked`` keeping an int exact, casts
between ints, floats and bools as torch's ``.to`` does them.  Cross entropy's ignore_index
arithmetic on int64 labels, ``where(labels != -100, labels, 0)``, runs as kernels: ``ne`` and
one fused ``masked + masked + add`` step.

Without a GPU: every int kernel variant compiles with NVRTC for sm_90; int and float values
meet only through a cast or a comparison (anything else raises); a fused int32 chain wraps after
each member (``kernels.WRAPS_IN_REGISTERS``) and equals the unfused steps bit for bit on the
CPU and the reference.  On a GPU (skipped without one): each int instruction, the label chain
and the casts equal torch exactly on values beyond 2^31, negative values, -100, int32 overflow
and empty tensors (outputs pre-filled with all bits set), and the plans simulate like the
reference.
"""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.codegen import kernels as K
from reshard.codegen import lower as L
from reshard.codegen.elementwise_cuda import BINARY_CUDA, UNARY_CUDA
from reshard.ir.errors import ReshardError
from reshard.ir.ops.elementwise import BINARY_FNS, UNARY_FNS
from reshard.runtime.local_ops import pointwise_local, run_local, step_results
from reshard.runtime.simulator import simulate

from reshard.testing.kernel_check import assert_cubin, kernel_cache, operands, torch_step  # noqa: F401
from reshard.testing.op_oracle import MESH1, assert_same

INTS = ("int64", "int32")
IGNORE = -100
#: every int instruction, the label chain of cross entropy, casts through every pointwise dtype
CHAIN: list[tuple] = [
    ("ne", "in0", "in1"), ("masked", "in0", "t0", True), ("masked", "in1", "t0", False), ("add", "t1", "t2"),  # t3
    ("mul", "t3", "in1"), ("sub", "t4", "in0"), ("neg", "t5"), ("abs", "t6"), ("maximum", "t7", "in1"),  # t8
    ("lt", "t8", "in0"), ("masked", "t8", "t9", False), ("cast", "t10", "int32"), ("cast", "t11", "float32"),  # t12
    ("cast", "t12", "int64"), ("cast", "t13", "bool"), ("cast", "t14", "int32"), ("cast", "t15", "bfloat16"),  # t16
    ("cast", "t16", "int64"), ("eq", "t17", "in0"), ("cast", "t18", "int64"),
]
OUTS = ("int64", "int32", "bool", "float32", "bfloat16", "float16")


def test_every_function_that_takes_ints_has_an_int_form():
    exprs = {**UNARY_CUDA, **BINARY_CUDA}
    for name, fn in {**UNARY_FNS, **BINARY_FNS}.items():
        if name in exprs and "int" in fn.kinds:
            assert exprs[name].int64, name
    assert "int32" in K.WRAPS_IN_REGISTERS and "int64" not in K.WRAPS_IN_REGISTERS


@pytest.mark.parametrize("dtype", INTS)
def test_int_kernels_compile(dtype, kernel_cache):
    cases = [K.pointwise_kernel([dtype, dtype], out, CHAIN, vectorize=vec) for out in OUTS for vec in (False, True)]
    cases += [K.pointwise_kernel([src], dtype, [], vectorize=True) for src in K.POINTWISE_DTYPES]  # stores
    cases += [K.pointwise_kernel([dtype], out, [], vectorize=True) for out in K.POINTWISE_DTYPES if out != dtype]
    cases.append(K.pointwise_kernel([dtype, "bool"], dtype, [("masked", "in0", "in1", True)], (4, 16),
                                    ((), ((16,), (1,))), vectorize=True))  # a broadcast bool mask
    assert len({ks.name for ks in cases}) == len(cases)
    for ks in cases:
        assert_cubin(ks)


def test_int_registers():
    """Ints load into ``long long`` registers, int32 wraps where it is stored; the arithmetic is
    unsigned (C++'s signed overflow is undefined); ``masked`` of an int keeps it as an int."""
    src = K.pointwise_kernel(["int32", "int32"], "int32", CHAIN[:5]).source
    assert "const long long x0 = ((long long)in0[i]);" in src and "out[i] = ((int)t4);" in src
    assert "(unsigned long long)" in src and "0LL" in src and "const float t0" in src
    float_src = K.pointwise_kernel(["float32", "bool"], "float32", [("masked", "in0", "in1", True)]).source
    assert "long long x" not in float_src and "0.0f" in float_src


def test_int_and_float_values_meet_only_through_casts_and_comparisons():
    with pytest.raises(ReshardError, match="int and float operands"):
        K.pointwise_kernel(["int64", "float32"], "float32", [("add", "in0", "in1")])
    with pytest.raises(ReshardError, match="takes a float operand"):
        K.pointwise_kernel(["int64"], "int64", [("mul_scalar", "in0", 2.0)])
    with pytest.raises(ReshardError, match="condition must be a bool"):
        K.pointwise_kernel(["float32", "int64"], "float32", [("masked", "in0", "in1", True)])
    with pytest.raises(ReshardError, match="no int form"):
        K.pointwise_kernel(["int64"], "float32", [("sqrt", "in0")])
    K.pointwise_kernel(["int64", "float32"], "bool", [("cast", "in0", "float32"), ("lt", "t0", "in1")])
    at = [("at_index", 1, "in0", "in1", "in1")]
    with pytest.raises(ReshardError, match="at_index needs an int index"):
        K.pointwise_kernel(["float32", "float32"], "float32", at, (2, 3), ((), ()))
    with pytest.raises(ReshardError, match="at_index needs the output shape|in_range and at_index need"):
        K.pointwise_kernel(["int64", "float32"], "float32", at)
    rows = ((2,), (0,))
    src = K.pointwise_kernel(["int64", "float32"], "float32", at, (2, 3), (rows, ())).source
    assert "(((long long)c1 == x0) ? x1 : x1)" in src


def test_at_index_selects_where_the_coordinate_is_the_index():
    """``at_index(d, i, a, b)`` on the CPU (``pointwise_local``, the broadcast index expanded as
    ``apply_local`` does): a where the coordinate along d equals i, else b."""
    from reshard.runtime.local_ops import pointwise_local

    a, b = torch.randn(3, 5), torch.randn(3, 5)
    index = torch.tensor([4, 0, 2])
    got = pointwise_local((("at_index", 1, "in0", "in1", "in2"),), [index[:, None].expand(3, 5), a, b], torch.float32)
    want = b.clone()
    want[torch.arange(3), index] = a[torch.arange(3), index]
    assert torch.equal(got, want)


# ---- plans ---------------------------------------------------------------------------------

def label_chain() -> rs.Fusion:
    """Cross entropy's ignore_index on int64 labels: ``where(labels != ignore, labels, 0)``
    (``ignore`` and ``zero`` are inputs: the IR has no constants), and the count of kept labels."""
    f = rs.Fusion()
    labels = f.input("labels", (4, 8), "int64", MESH1, [rs.Shard(0)])
    ignore = f.input("ignore", (4, 8), "int64", MESH1, [rs.Shard(0)])
    zero = f.input("zero", (4, 8), "int64", MESH1, [rs.Shard(0)])
    keep = f.ne(labels, ignore)
    f.output(f.where(keep, labels, zero), [rs.Shard(0)])
    f.output(f.cast(keep, "float32"), [rs.Shard(0)])
    return f


def int32_chain() -> rs.Fusion:
    """int32 arithmetic that overflows 32 bits in its intermediates (``a * b + a``), compared
    with ``b``: each member's result wraps before the next reads it."""
    f = rs.Fusion()
    a = f.input("a", (4, 8), "int32", MESH1, [rs.Shard(0)])
    b = f.input("b", (4, 8), "int32", MESH1, [rs.Shard(0)])
    c = f.add(f.mul(a, b), a)
    f.output(f.lt(f.abs(c), f.neg(b)), [rs.Shard(0)])
    f.output(f.maximum(f.sub(c, b), a), [rs.Shard(0)])
    return f


PLANS = [label_chain, int32_chain]


def _inputs(f: rs.Fusion, seed: int = 0) -> dict[str, torch.Tensor]:
    """Ints over the whole range of their dtype (int64: beyond 2^31), with -100, 0, the extremes;
    ``ignore`` is -100 and ``zero`` 0; a third of the labels -100."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i in f.inputs:
        t = f.tensors[i]
        info = torch.iinfo(getattr(torch, t.dtype))
        x = torch.randint(info.min, info.max, t.shape, generator=gen, dtype=torch.int64)
        special = torch.tensor([IGNORE, 0, 1, -1, info.min, info.max, 2**31, -(2**31) - 1]).to(torch.int64)
        pick = torch.randint(0, 3 * len(special), t.shape, generator=gen)
        x = torch.where(pick < len(special), special[pick.clamp(max=len(special) - 1)], x)
        out[t.name] = x.to(getattr(torch, t.dtype))
    if "labels" in out:
        out["labels"] = torch.where(torch.rand(out["labels"].shape, generator=gen) < 0.3, IGNORE, out["labels"])
        out["ignore"] = torch.full_like(out["ignore"], IGNORE)
        out["zero"] = torch.zeros_like(out["zero"])
    return out


def _kernel_ops(plan: rs.Plan) -> list[list[str]]:
    return [[o[0] for o in s.attr("ops")] for s in plan.steps if s.attr("fop") == "pointwise"]


def test_label_chain_fuses():
    """``ne`` on int64 operands (read by the chain and as an output: the kernel's extra bool
    output), then ``masked``, ``masked`` and ``add`` on int64 in one kernel; int32 members are
    followed by a wrapping cast."""
    plan = rs.optimize(label_chain())
    assert _kernel_ops(plan) == [["ne", "masked", "masked", "add"]], _kernel_ops(plan)
    (step,) = [s for s in plan.steps if s.attr("fop") == "pointwise"]
    assert step.attr("extra_values") == (("t0", "bool"),) and not [s for s in plan.steps if s.attr("fop") == "binary"]
    chains = _kernel_ops(rs.optimize(int32_chain()))  # c = a * b + a: an extra output, read by the second chain
    assert chains == [["mul", "cast", "add", "cast", "abs", "cast", "neg", "cast", "lt"], ["sub", "cast", "maximum"]]


@pytest.mark.parametrize("build", PLANS)
def test_fused_int_chains_equal_unfused_and_reference(build, monkeypatch):
    f = build()
    fused = rs.optimize(f)
    with monkeypatch.context() as m:
        m.setattr(L, "fuse_pointwise", lambda steps, *_: steps)
        plain = rs.optimize(f)
    assert len(fused.steps) < len(plain.steps)
    inputs = _inputs(f)
    for o, r in zip(fused.simulate(inputs), rs.run_reference(f, inputs), strict=True):
        assert_same(o, r)
    a = simulate(fused.program, fused.shard_inputs(inputs), run_local)
    b = simulate(plain.program, plain.shard_inputs(inputs), run_local)
    for (ba, _), (bb, _) in zip(fused.lowered.outputs, plain.lowered.outputs):
        for r in fused.program.mesh_ranks:
            assert torch.equal(a[r][ba], b[r][bb])


@pytest.mark.parametrize("build", PLANS)
def test_int_steps_have_kernels_that_compile(build, kernel_cache):
    """Every elementwise step of these plans (int, bool and float buffers) lists kernels."""
    from reshard.runtime.gpu_local import step_kernels

    f = build()
    plan = rs.optimize(f)
    seen: dict[str, K.KernelSource] = {}

    def record(step, env, rank):
        ks = step_kernels(step, env, rank)
        if step.attr("op") == "apply":
            assert ks, step
        seen.update((k.name, k) for k in ks)
        return run_local(step, env, rank)

    simulate(plan.program, plan.shard_inputs(_inputs(f)), record)
    assert any("long long" in k.source for k in seen.values())
    for ks in seen.values():
        assert_cubin(ks)


# ---- on a GPU ------------------------------------------------------------------------------


def _values(n: int, dtype: torch.dtype, gen: torch.Generator, like: torch.Tensor | None = None) -> torch.Tensor:
    """Ints over the dtype's range with -100, 0, +-1, the extremes, 2^31 and -2^31 - 1 (wrapped
    for int32); where ``like`` is given, a third of the elements equal to it."""
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max, (n,), generator=gen, dtype=torch.int64)
    special = torch.tensor([IGNORE, 0, 1, -1, info.min, info.max, 2**31, -(2**31) - 1, 2**40 + 3])
    pick = torch.randint(0, 2 * len(special), (n,), generator=gen)
    x = torch.where(pick < len(special), special[pick.clamp(max=len(special) - 1)], x).to(dtype)
    if like is not None:
        x = torch.where(torch.rand(n, generator=gen) < 0.3, like.cpu(), x)
    return x.cuda()


def _run(ops: list[tuple], xs: list[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    """The chain through ``gpu_local``'s kernel kit (contiguous inputs, output pre-filled with
    all bits set)."""
    from reshard.runtime.gpu_local import KernelKit

    return KernelKit(poison=True).pointwise(ops, xs, out_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("n", [0, 1000, 4096])  # empty, the scalar and the 16-byte vector path
def test_gpu_int_instructions_equal_torch(dtype, n, kernel_cache):
    gen = torch.Generator().manual_seed(n)
    a = _values(n, dtype, gen)
    b = _values(n, dtype, gen, like=a)
    for fn in ("add", "sub", "mul", "maximum", "eq", "ne", "lt", "le", "gt", "ge"):
        want = BINARY_FNS[fn].torch(a, b)
        assert torch.equal(_run([(fn, "in0", "in1")], [a, b], want.dtype), want), fn
    for fn in ("neg", "abs"):
        assert torch.equal(_run([(fn, "in0")], [a], dtype), UNARY_FNS[fn].torch(a)), fn
    c = (torch.rand(n, generator=gen) < 0.5).cuda()
    for keep in (True, False):
        want = torch.where(c if keep else ~c, a, torch.zeros((), dtype=dtype, device=a.device))
        assert torch.equal(_run([("masked", "in0", "in1", keep)], [a, c], dtype), want)
    # a fused chain as codegen.fuse writes it (a cast after each member: int32 wraps there)
    d = str(dtype)[len("torch."):]
    ops = [("mul", "in0", "in1"), ("cast", "t0", d), ("add", "t1", "in0"), ("cast", "t2", d), ("sub", "t3", "in1"),
           ("cast", "t4", d), ("neg", "t5"), ("cast", "t6", d), ("abs", "t7"), ("cast", "t8", d),
           ("maximum", "t9", "in1"), ("lt", "t10", "in0"), ("masked", "t10", "t11", False)]
    assert torch.equal(_run(ops, [a, b], dtype), pointwise_local(tuple(ops), [a, b], dtype))
    # the label chain of cross entropy: where(labels != -100, labels, 0)
    labels = torch.where(torch.rand(n, generator=gen).cuda() < 0.3, IGNORE, a)
    ign, zero = torch.full_like(labels, IGNORE), torch.zeros_like(labels)
    chain = [("ne", "in0", "in1"), ("masked", "in0", "t0", True), ("masked", "in2", "t0", False), ("add", "t1", "t2")]
    assert torch.equal(_run(chain, [labels, ign, zero], dtype), torch.where(labels != IGNORE, labels, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_gpu_int_casts_equal_torch(dtype, kernel_cache):
    gen = torch.Generator().manual_seed(3)
    a = _values(4096, dtype, gen)
    for out in (torch.int64, torch.int32, torch.bool, torch.float32, torch.bfloat16, torch.float16):
        got = _run([], [a], out)
        if out.is_floating_point:  # rounded to nearest (through float32 for 16-bit, like torch)
            torch.testing.assert_close(got, a.to(out), rtol=0, atol=0)
        else:
            assert torch.equal(got, a.to(out)), out
    # floats to ints: toward zero (values in range; torch leaves out-of-range values undefined)
    for src in (torch.float32, torch.bfloat16, torch.float16):
        x = (torch.randn(4096, generator=gen) * 1000).to(src).cuda()
        x[:4] = torch.tensor([-0.5, 0.5, -1.99, 1.99])
        assert torch.equal(_run([], [x], dtype), x.to(dtype)), src
        b = (torch.rand(4096, generator=gen) < 0.5).cuda()
        assert torch.equal(_run([], [b], dtype), b.to(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("build", PLANS)
def test_gpu_int_plans_equal_reference(build, kernel_cache):
    from reshard.runtime.gpu_local import gpu_local_step, kernel_path

    f = build()
    plan = rs.optimize(f)
    inputs = _inputs(f, 1)
    checked = []

    def both(step, env, rank):
        want = torch_step(step, env, rank)
        if step.attr("op") == "apply":
            assert kernel_path(step, [env[b] for b in step.ins]), step
            for poison in (True, False):  # the second run may replay the first's launch
                got = gpu_local_step(step, operands(step, env), rank, poison=poison)
                assert all(torch.equal(g, w) for g, w in zip(step_results(got), step_results(want), strict=True)), step
            checked.append(step)
        return want

    per_rank = {r: {k: v.cuda() for k, v in d.items()} for r, d in plan.shard_inputs(inputs).items()}
    simulate(plan.program, per_rank, both)
    assert checked
    for o, r in zip(plan.simulate(inputs, device="cuda"), rs.run_reference(f, inputs), strict=True):
        assert_same(o, r)
