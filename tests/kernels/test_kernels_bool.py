"""Comparisons, logical ops and ``masked`` in generated pointwise kernels: a bool loads and
stores as one byte and is the float 0 or 1 in registers (``kernels.POINTWISE_DTYPES``).

Without a GPU: every such kernel compiles with NVRTC for sm_90; ``codegen.fuse`` makes relu's
backward ``masked(g, y > -y, True)`` and ``where``'s two ``masked`` and their ``add`` one
pointwise step each (an int64 comparison joins its bool chain), bit-identical on the
CPU to the unfused steps and equal to the reference (NaN and inf included); every
elementwise step of a joint (training) plan on float and bool buffers runs on kernels.
On a GPU (skipped without one): bool results equal torch's exactly (NaN compares false except
``ne``; a cast to bool makes NaN True), ``masked`` passes NaN and inf of the kept operand and
gives exact zeros elsewhere, the fused steps of these plans equal their torch steps, and the
joint plan simulated with ``device="cuda"`` matches the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reshard as rs
from reshard.codegen import kernels as K
from reshard.codegen import lower as L
from reshard.codegen.elementwise_cuda import BINARY_CUDA, UNARY_CUDA
from reshard.passes.autodiff import joint
from reshard.ir.errors import ReshardError
from reshard.ir.ops.elementwise import BINARY_FNS, UNARY_FNS
from reshard.runtime.local_ops import run_local, step_results
from reshard.runtime.simulator import simulate

from reshard.testing.autodiff_oracle import loss_weights, weighted_loss
from reshard.testing.kernel_check import assert_cubin, kernel_cache, torch_step  # noqa: F401
from reshard.testing.op_oracle import MESH1, assert_same, inputs_of
from tests.lower.test_fuse import _assert_as_unfused

COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
LOGICAL = ("logical_and", "logical_or")
FLOATS = ("float32", "bfloat16", "float16")


def _bool_chain() -> list[tuple]:
    """Every comparison of in0 and in1, combined by the logical ops, selecting with masked."""
    ops: list[tuple] = [(fn, "in0", "in1") for fn in COMPARISONS]  # t0..t5
    ops += [("logical_and", "t0", "t1"), ("logical_or", "t2", "t3"), ("logical_not", "t6"),  # t6..t8
            ("logical_or", "t7", "in2"), ("maximum", "t8", "t9"),  # t9, t10
            ("masked", "in0", "t10", True), ("masked", "in1", "t10", False), ("add", "t11", "t12"),  # t11..t13
            ("gt", "t13", "t4"), ("cast", "t14", "bool"), ("cast", "t15", "float32")]  # t14..t16
    return ops


@pytest.mark.parametrize("dtype", FLOATS)
def test_bool_instructions_compile(dtype, kernel_cache):
    """Bool loads and stores, comparisons, logical ops, masked and casts to and from bool, on
    the scalar and the 16-byte vector path."""
    ops = _bool_chain()
    cases = [K.pointwise_kernel([dtype, dtype, "bool"], out, ops, vectorize=vec)
             for out in ("bool", dtype) for vec in (False, True)]
    cases.append(K.pointwise_kernel(["bool", "bool"], "bool", [("logical_and", "in0", "in1"), ("logical_not", "t0")]))
    cases.append(K.pointwise_kernel(["bool"], dtype, [("cast", "in0", dtype)], vectorize=True))
    cases.append(K.pointwise_kernel([dtype, "bool"], dtype, [("masked", "in0", "in1", False)], (4, 16),
                                    ((), ((16,), (1,))), vectorize=True))  # a broadcast bool mask
    assert len({ks.name for ks in cases}) == len(cases)
    for ks in cases:
        assert_cubin(ks)
    assert "unsigned char* __restrict__ out" in cases[0].source
    assert "const unsigned char* __restrict__ in2" in cases[0].source


def test_every_elementwise_function_has_a_kernel_expression():
    """The comparisons and logical ops joined the kernels (their ``elementwise_cuda`` entries),
    and every function has a CUDA expression, none for a function that does not exist."""
    assert {*COMPARISONS, *LOGICAL, "logical_not", "masked"} <= K.POINTWISE_OPS
    assert set(UNARY_CUDA) == set(UNARY_FNS) and set(BINARY_CUDA) == set(BINARY_FNS)


@pytest.mark.parametrize("ins", [("masked", "in0", "in1"), ("masked", "in0", "in1", 1), ("masked", "in0", "t3", True)])
def test_bad_masked_instruction_raises(ins):
    with pytest.raises(ReshardError, match="masked|bad operand"):
        K.pointwise_kernel(["float32", "bool"], "float32", [ins])


def test_float64_is_not_a_pointwise_value():
    with pytest.raises(ReshardError, match="not supported by pointwise kernels"):
        K.pointwise_kernel(["float64", "float64"], "bool", [("eq", "in0", "in1")])


# ---- plans: chains with bools fuse ---------------------------------------------------------

def relu_backward(dtype: str = "float32") -> rs.Fusion:
    """relu's backward as autodiff writes it: ``masked(g, y > -y, True)``, ``y = relu(x)`` the
    saved activation; then the next layer's gradient term ``* w``."""
    f = rs.Fusion()
    y = f.input("y", (8, 16), dtype, MESH1, [rs.Shard(0)])
    g = f.input("g", (8, 16), dtype, MESH1, [rs.Shard(0)])
    w = f.input("w", (8, 16), dtype, MESH1, [rs.Shard(0)])
    f.output(f.mul(f.masked(g, f.gt(y, f.neg(y)), True), w), [rs.Shard(0)])
    return f


def masked_softmax(dtype: str = "float32") -> rs.Fusion:
    """``softmax(where(mask, s, fill))`` over rows (fill: -inf where masked out)."""
    f = rs.Fusion()
    s = f.input("s", (8, 16), dtype, MESH1, [rs.Shard(0)])
    mask = f.input("mask", (8, 16), "bool", MESH1, [rs.Shard(0)])
    fill = f.input("fill", (8, 16), dtype, MESH1, [rs.Shard(0)])
    z = f.where(mask, s, fill)
    e = f.exp(f.sub(z, f.broadcast(f.max(z, 1), (8, 16), (0,))))
    f.output(f.div(e, f.broadcast(f.sum(e, 1), (8, 16), (0,))), [rs.Shard(0)])
    return f


def mixed_masks() -> rs.Fusion:
    """An int comparison feeding bool logic on a broadcast bool row mask, a float comparison,
    and a bool result."""
    f = rs.Fusion()
    ids = f.input("ids", (8, 16), "int64", MESH1, [rs.Shard(0)])
    ign = f.input("ign", (8, 16), "int64", MESH1, [rs.Shard(0)])
    row = f.input("row", (16,), "bool", MESH1, [rs.Replicate()])
    x = f.input("x", (8, 16), "bfloat16", MESH1, [rs.Shard(0)])
    keep = f.logical_and(f.ne(ids, ign), f.logical_not(f.broadcast(row, (8, 16), (1,))))
    y = f.where(keep, f.scale(x, 2.0), f.neg(x))
    f.output(f.cast(y, "float32"), [rs.Shard(0)])
    f.output(f.logical_or(keep, f.ge(x, f.abs(y))), [rs.Shard(0)])
    return f


def training_mlp() -> tuple[rs.Fusion, rs.Fusion]:
    """A joint (forward + backward) Fusion: ``relu(x @ w1) * dropout mask @ w2``, then
    ``maximum`` with x, weighted loss; its backward has relu's, masked's and maximum's bool
    chains.  Returns (forward, joint)."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), "float32", MESH1, [rs.Shard(0)])
    w1 = f.input("w1", (16, 32), "float32", MESH1, [rs.Shard(1)])
    w2 = f.input("w2", (32, 16), "float32", MESH1, [rs.Shard(0)])
    keep = f.input("keep", (8, 32), "bool", MESH1, [rs.Replicate()])
    h = f.masked(f.relu(f.matmul(x, w1)), keep, True)
    y = f.maximum(f.matmul(h, w2), x, name="y")
    f.output(y, [rs.Replicate()])
    loss = weighted_loss(f, [y])
    return f, joint(f, loss, ["x", "w1", "w2"]).fusion


def _training_joint() -> rs.Fusion:
    return training_mlp()[1]


PLANS = [relu_backward, lambda: relu_backward("bfloat16"), masked_softmax, lambda: masked_softmax("float16"),
         mixed_masks, _training_joint]


def _inputs(f: rs.Fusion, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random inputs with NaN and inf (``special``), ``-inf`` fills; a training step's: finite,
    with ``_lw`` loss weights."""
    if any(f.tensors[i].name == "_lw0" for i in f.inputs):
        return {**inputs_of(f, seed), **loss_weights(f, seed)}
    inputs = inputs_of(f, seed, special=True)
    if "fill" in inputs:
        inputs["fill"] = torch.full_like(inputs["fill"], float("-inf"))
    return inputs


def _kernel_ops(plan: rs.Plan) -> list[list[str]]:
    """The instruction names of each kernel-bound elementwise step (a fused chain or one op)."""
    out = []
    for s in plan.steps:
        if s.attr("op") == "apply" and s.attr("fop") == "pointwise":
            out.append([o[0] for o in s.attr("ops")])
    return out


def test_relu_backward_is_one_kernel():
    for dtype in ("float32", "bfloat16"):
        plan = rs.optimize(relu_backward(dtype))
        applies = [s for s in plan.steps if s.attr("op") == "apply"]
        assert [s.attr("fop") for s in applies] == ["pointwise"]
        assert [o[0] for o in applies[0].attr("ops") if o[0] != "cast"] == ["neg", "gt", "masked", "mul"]


def test_where_is_one_kernel_and_int_comparisons_join_bool_chains():
    assert ["masked", "masked", "add"] in _kernel_ops(rs.optimize(masked_softmax()))
    plan = rs.optimize(mixed_masks())
    assert not [s for s in plan.steps if s.attr("fn") == "ne"]  # int64 operands fuse (kernels.POINTWISE_DTYPES)
    chains = _kernel_ops(plan)
    # keep (logical_and) has three readers: two members and a later step, so it is an extra output
    (big,) = [s for s in plan.steps if s.attr("fop") == "pointwise" and s.attr("extra_outs")]
    k = [o[0] for o in big.attr("ops")].index("logical_and")
    assert (f"t{k}", "bool") in big.attr("extra_values")
    assert any(c.count("masked") == 2 for c in chains) and ["abs", "ge", "logical_or"] in chains, chains
    bcast = [s for s in plan.steps if s.attr("fop") == "pointwise" and s.attr("bcast")]
    assert bcast, "the bool row mask's broadcast is read inside the kernel"


def _unfused(monkeypatch: pytest.MonkeyPatch, f: rs.Fusion) -> rs.Plan:
    with monkeypatch.context() as m:
        m.setattr(L, "fuse_pointwise", lambda steps, *_: steps)
        return rs.optimize(f)


@pytest.mark.parametrize("build", PLANS)
def test_fused_bool_chains_equal_unfused_and_reference(build, monkeypatch):
    f = build()
    fused, plain = rs.optimize(f), _unfused(monkeypatch, f)
    assert len(fused.steps) < len(plain.steps)
    inputs = _inputs(f)
    refs = rs.run_reference(f, inputs)
    for o, r in zip(fused.simulate(inputs, generator=torch.Generator().manual_seed(0)), refs, strict=True):
        if r.is_floating_point() and r.dtype != torch.float32:
            torch.testing.assert_close(o, r, equal_nan=True, rtol=1e-2, atol=1e-2)
        else:
            assert_same(o, r)
    _assert_as_unfused(fused, plain, inputs, seed=0)


@pytest.mark.parametrize("build", PLANS)
def test_plan_kernels_compile_and_cover_the_bool_steps(build, kernel_cache):
    """Every elementwise step on float / bool buffers (fused or not) has kernels
    (``step_kernels``), and they compile for sm_90."""
    from reshard.runtime.gpu_local import step_kernels

    f = build()
    plan = rs.optimize(f)
    seen: dict[str, K.KernelSource] = {}
    values = {torch.float32, torch.bfloat16, torch.float16, torch.bool}

    def record(step, env, rank):
        out = run_local(step, env, rank)
        ks = step_kernels(step, env, rank)
        elementwise = step.attr("fop") in ("pointwise", "unary", "binary", "masked", "cast", "scale")
        if elementwise and all(x.dtype in values for x in (*(env[b] for b in step.ins), *step_results(out))):
            assert ks, step
        seen.update((k.name, k) for k in ks)
        return out

    simulate(plan.program, plan.shard_inputs(_inputs(f)), record)
    assert any(k.kind == "pointwise" for k in seen.values())
    for ks in seen.values():
        assert_cubin(ks)


# ---- on a GPU ------------------------------------------------------------------------------

TDTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _special(n: int, dtype: torch.dtype, gen: torch.Generator, like: torch.Tensor | None = None) -> torch.Tensor:
    """Normal values with NaN, inf, -inf, zeros of both signs; where ``like`` is given, a third
    of the elements equal to it."""
    x = torch.randn(n, generator=gen)
    pick = torch.randint(0, 14, (n,), generator=gen)
    for k, v in enumerate((float("nan"), float("inf"), float("-inf"), 0.0, -0.0)):
        x = torch.where(pick == k, torch.tensor(v), x)
    x = x.to(dtype)
    if like is not None:
        x = torch.where(torch.rand(n, generator=gen) < 0.3, like.cpu(), x)
    return x.cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TDTYPES)
@pytest.mark.parametrize("n", [1000, 4096])  # the scalar and the 16-byte vector path
def test_gpu_bool_instructions_equal_torch(dtype, n, kernel_cache):
    from reshard.codegen import nvrtc as N

    gen = torch.Generator().manual_seed(n)
    a = _special(n, dtype, gen)
    b = _special(n, dtype, gen, like=a)
    c = (torch.rand(n, generator=gen) < 0.5).cuda()
    d = (torch.rand(n, generator=gen) < 0.5).cuda()
    for fn in COMPARISONS:
        got = N.run_pointwise([(fn, "in0", "in1")], [a, b], torch.bool)
        assert torch.equal(got, BINARY_FNS[fn].torch(a, b)), fn
    for fn in LOGICAL:
        assert torch.equal(N.run_pointwise([(fn, "in0", "in1")], [c, d], torch.bool), BINARY_FNS[fn].torch(c, d))
    assert torch.equal(N.run_pointwise([("logical_not", "in0")], [c], torch.bool), ~c)
    assert torch.equal(N.run_pointwise([("cast", "in0", "bool")], [a], torch.bool), a.to(torch.bool))  # NaN: True
    assert torch.equal(N.run_pointwise([], [a], torch.bool), a.to(torch.bool))
    assert torch.equal(N.run_pointwise([], [c], dtype), c.to(dtype))
    zero = torch.zeros((), dtype=dtype, device="cuda")
    for keep in (True, False):
        got = N.run_pointwise([("masked", "in0", "in1", keep)], [a, c], dtype)
        want = torch.where(c if keep else ~c, a, zero)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # NaN / inf kept, exact 0
        assert not torch.signbit(got[(c if keep else ~c).logical_not()]).any()  # +0, like torch.where
    # relu's backward in one kernel: masked(g, y > -y, True), y = relu(a)
    ops = [("relu", "in0"), ("neg", "t0"), ("gt", "t0", "t1"), ("masked", "in1", "t2", True)]
    y = torch.relu(a)
    torch.testing.assert_close(N.run_pointwise(ops, [a, b], dtype), torch.where(y > -y, b, zero),
                               rtol=0, atol=0, equal_nan=True)


@pytest.mark.multiproc
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 16), (3, 7)])
def test_gpu_broadcast_bool_mask(shape, kernel_cache):
    from reshard.codegen.nvrtc import launch

    gen = torch.Generator().manual_seed(1)
    x = _special(shape[0] * shape[1], torch.bfloat16, gen).reshape(shape)
    row = (torch.rand(shape[1], generator=gen) < 0.5).cuda()
    want = torch.where(row.expand(shape), torch.zeros((), dtype=x.dtype, device="cuda"), x)
    for vec in (False, True) if shape[-1] % 8 == 0 else (False,):
        ks = K.pointwise_kernel(["bfloat16", "bool"], "bfloat16", [("masked", "in0", "in1", False)], shape,
                                ((), ((shape[1],), (1,))), vectorize=vec)
        out = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        launch(ks, [out, x, row, np.int64(out.numel())], ks.grid_for(out.numel()), ks.block)
        torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("build", PLANS)
def test_gpu_local_steps_equal_their_torch_steps(build, kernel_cache):
    """Each step of the plan through ``gpu_local_step`` (outputs pre-filled with NaN / all
    bits set) against the same step with torch on the GPU: bools exactly, floats closely."""
    from reshard.runtime.gpu_local import gpu_local_step, kernel_path

    f = build()
    plan = rs.optimize(f)
    checked = []

    def both(step, env, rank):
        want = torch_step(step, env, rank)
        if step.attr("op") == "apply" and kernel_path(step, [env[b] for b in step.ins]):
            got = gpu_local_step(step, env, rank, poison=True)
            for g, w in zip(step_results(got), step_results(want), strict=True):
                if w.dtype == torch.bool:
                    assert torch.equal(g, w), step
                else:
                    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}[w.dtype]
                    torch.testing.assert_close(g, w, rtol=tol, atol=tol, equal_nan=True)
            checked.append(step.attr("fop"))
        return want

    per_rank = {r: {k: v.cuda() for k, v in d.items()}
                for r, d in plan.shard_inputs(_inputs(f), torch.Generator().manual_seed(0)).items()}
    simulate(plan.program, per_rank, both)
    assert "pointwise" in checked


@pytest.mark.gpu
def test_gpu_training_step_matches_reference(kernel_cache):
    """The joint plan's local steps on generated kernels (``simulate(device="cuda")``) give
    the reference's loss and gradients."""
    f = _training_joint()
    inputs = _inputs(f, 3)
    plan = rs.optimize(f)
    outs = plan.simulate(inputs, device="cuda", generator=torch.Generator().manual_seed(0))
    for o, r in zip(outs, rs.run_reference(f, inputs), strict=True):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)
