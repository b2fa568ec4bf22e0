"""``codegen.fuse``: elementwise chains become one ``apply pointwise`` step exactly where the
law allows, and fused plans compute what the unfused steps compute (CPU): bit for bit, but a
chain of 16-bit floats, computed in float32 and rounded once, within a few roundings of the
unfused steps' (rounded after every op); within kernel tolerance on a GPU; and match the
unsharded reference."""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path
from typing import Any

import pytest
import torch

import reshard as rs
from reshard.codegen import fuse as FU
from reshard.codegen import lower as L
from reshard.codegen.program import Step
from reshard.ir.dtypes import DTYPES
from reshard.runtime.local_ops import run_local
from reshard.runtime.simulator import simulate
from reshard.testing.kernel_check import assert_cubin, kernel_cache  # noqa: F401 (a fixture)

from reshard.testing import programs as P
from tests.ops.test_broadcast import PROGRAMS as BROADCASTS

META = {b: ((4, 8), "bfloat16") for b in ("x", "y", "a", "b", "c", "d", "e", "z")}


def _ew(out: str, ins: list[str], fop: str, **attrs) -> Step:
    return Step.make("local", out, ins, op="apply", fop=fop, **attrs)


def test_chain_fuses_into_one_step_at_its_end():
    steps = [_ew("a", ["x"], "scale", factor=0.5), _ew("b", ["a", "y"], "binary", fn="add"),
             Step.make("allgather", "g", ["y"], axis=0, dim=0), _ew("c", ["b"], "unary", fn="gelu")]
    out = FU.fuse_pointwise(steps, {"x", "y", "c"}, META)
    assert [s.out for s in out] == ["g", "c"]
    (f,) = [s for s in out if s.out == "c"]
    assert f.ins == ("x", "y") and f.attr("fop") == "pointwise" and f.attr("dtype") == "bfloat16"
    assert f.attr("fused") == ("a", "b", "c")
    # computed in float32: no rounding to bf16 between the members (the result rounds once)
    assert f.attr("ops") == (("mul_scalar", "in0", 0.5), ("add", "t0", "in1"), ("gelu", "t1"))


def test_diamond_and_shared_input():
    """x -> exp, x -> neg, add(exp, neg): one step reading x once."""
    steps = [_ew("a", ["x"], "unary", fn="exp"), _ew("b", ["x"], "unary", fn="neg"),
             _ew("c", ["a", "b"], "binary", fn="add")]
    (f,) = FU.fuse_pointwise(steps, {"x", "c"}, {k: ((3,), "float32") for k in "xabc"})
    assert f.ins == ("x",) and f.attr("ops") == (("exp", "in0"), ("neg", "in0"), ("add", "t0", "t1"))


def test_broadcast_leaf_is_read_through_its_index_map():
    meta = {"x": ((4, 8), "float32"), "b": ((8,), "float32"), "bb": ((4, 8), "float32"), "a": ((4, 8), "float32"),
            "c": ((4, 8), "float32")}
    steps = [_ew("bb", ["b"], "broadcast", shape=(4, 8), dims=(1,)), _ew("a", ["x", "bb"], "binary", fn="add"),
             _ew("c", ["a", "x"], "binary", fn="mul")]
    (f,) = FU.fuse_pointwise(steps, {"x", "b", "c"}, meta)
    assert f.ins == ("b", "x") and f.attr("shape") == (4, 8) and f.attr("bcast") == (((8,), (1,)), ())
    assert f.attr("ops") == (("add", "in1", "in0"), ("mul", "t0", "in1")) and f.attr("fused") == ("bb", "a", "c")
    # read by two steps, or of float64: the broadcast stays a step of its own
    two = steps + [Step.make("allgather", "g", ["bb"], axis=0, dim=0)]
    assert [s.attr("fop") for s in FU.fuse_pointwise(two, {"x", "b", "c", "g"}, meta)] == ["broadcast", "pointwise",
                                                                                          None]
    f64 = dict(meta, b=((8,), "float64"))
    assert FU.fuse_pointwise(steps, {"x", "b", "c"}, f64)[0] == steps[0]


@pytest.mark.parametrize("case", ["read before the sink", "other phase", "shape", "mesh", "not elementwise",
                                  "float64"])
def test_chain_breaks_where_the_law_does_not_hold(case):
    meta = dict(META)
    steps = [_ew("a", ["x"], "unary", fn="exp"), _ew("b", ["a"], "unary", fn="neg")]
    keep = {"x", "b"}
    backward: set[str] = set()
    if case == "read before the sink":
        steps.insert(1, Step.make("allgather", "g", ["a"], axis=0, dim=0))
    elif case == "other phase":  # a forward result the backward sink would write as an extra output
        steps.append(Step.make("allgather", "g", ["a"], axis=0, dim=0))
        backward = {"b", "g"}
    elif case == "shape":
        meta["a"] = ((32,), "bfloat16")
    elif case == "mesh":
        steps = [_ew("a", ["x"], "unary", fn="exp", on=0), _ew("b", ["a"], "unary", fn="neg", on=1)]
    elif case == "float64":  # no kernel computes it: it stays a step of its own
        meta["b"] = ((4, 8), "float64")
        steps[1] = _ew("b", ["a"], "cast", dtype="float64")
    else:
        steps[0] = _ew("a", ["x"], "permute", perm=(1, 0))
    assert FU.fuse_pointwise(steps, keep, meta, backward) == steps


@pytest.mark.parametrize("case", ["read after the sink", "output"])
def test_intermediate_read_elsewhere_is_an_extra_output(case):
    """exp's result, read by an allgather after the sink (or a program output), is written by
    the fused step as an extra output; its other reader reads it there."""
    steps = [_ew("a", ["x"], "unary", fn="exp"), _ew("b", ["a", "y"], "binary", fn="mul"),
             _ew("c", ["b"], "unary", fn="neg")]
    keep = {"x", "y", "c"}
    if case == "output":
        keep.add("a")
    else:
        steps.append(Step.make("allgather", "g", ["a"], axis=0, dim=0))
    fused = FU.fuse_pointwise(steps, keep, META)
    f = fused[0]
    assert [s.out for s in fused] == ["c"] + (["g"] if case != "output" else [])
    assert f.outs == ("c", "a") and f.attr("fused") == ("a", "b", "c")
    assert f.attr("extra_values") == (("t0", "bfloat16"),)  # exp, rounded to bf16 where it is stored
    x, y = torch.randn(4, 8).bfloat16(), torch.randn(4, 8).bfloat16()
    c, a = run_local(f, {"x": x, "y": y}, 0)
    xf, yf = x.float(), y.float()  # the chain in float32, each stored value rounded once
    assert torch.equal(a, torch.exp(xf).bfloat16()) and torch.equal(c, (-(torch.exp(xf) * yf)).bfloat16())


def test_multi_reader_intermediates_inside_one_group():
    """SwiGLU's backward shape: sigmoid(s) read by two members, a product read by two: one step,
    every intermediate internal; the forward's silu(g) * u with silu saved: one step."""
    meta = {b: ((4, 8), "bfloat16") for b in ("s", "g", "u", "sg", "p", "q", "r", "y", "h")}
    steps = [_ew("sg", ["s"], "unary", fn="sigmoid"), _ew("p", ["g", "sg"], "binary", fn="mul"),
             _ew("q", ["p", "s"], "binary", fn="mul"), _ew("r", ["q", "sg", "p"], "binary", fn="add")]
    (f,) = FU.fuse_pointwise(steps, {"s", "g", "r"}, meta)
    assert f.outs == ("r",) and f.attr("fused") == ("sg", "p", "q", "r")
    forward = [_ew("h", ["g"], "unary", fn="silu"), _ew("y", ["h", "u"], "binary", fn="mul"),
               Step.make("local", "h.saved", ["h"], op="apply", fop="saved")]
    f, saved = FU.fuse_pointwise(forward, {"g", "u", "y", "h.saved"}, meta, {"h.saved"})
    assert f.outs == ("y", "h") and saved == forward[2]


def test_a_product_a_reduction_reads_is_its_prologue():
    """x * y summed over its last dim: one reduce step reading x and y (the product never
    written), bit-identical on the CPU.  The square of a cast read again after the sum: the
    reduce step writes the cast as an extra output; read between the two, the cast stays,
    writing that output only, and the reduction computes the square again."""
    meta = {"x": ((4, 8), "bfloat16"), "y": ((4, 8), "bfloat16"), "p": ((4, 8), "bfloat16"),
            "xf": ((4, 8), "float32"), "sq": ((4, 8), "float32"), "s": ((4,), "float32"), "r": ((4,), "bfloat16")}
    red = dict(op="apply", fop="reduce", fn="sum", dims=(1,), count=8)
    steps = [_ew("p", ["x", "y"], "binary", fn="mul"), Step.make("local", "r", ["p"], **red)]
    (f,) = FU.fuse_pointwise(steps, {"x", "y", "r"}, meta)
    assert f.ins == ("x", "y") and f.attr("prologue") == ((("mul", "in0", "in1"),), "bfloat16")
    x, y = torch.randn(4, 8).bfloat16(), torch.randn(4, 8).bfloat16()
    assert torch.equal(run_local(f, {"x": x, "y": y}, 0), run_local(steps[1], {"p": x * y}, 0))
    steps = [_ew("xf", ["x"], "cast", dtype="float32"), _ew("sq", ["xf", "xf"], "binary", fn="mul"),
             Step.make("local", "s", ["sq"], **red), Step.make("allgather", "g", ["xf"], axis=0, dim=0)]
    f, g = FU.fuse_pointwise(steps, {"x", "s", "g"}, meta)
    assert f.ins == ("x",) and f.attr("prologue")[0] == (("cast", "in0", "float32"), ("mul", "t0", "t0")) and g == steps[3]
    assert f.outs == ("s", "xf") and f.attr("extra_values") == (("t0", "float32"),)
    xf = x.float()
    s, xf2 = run_local(f, {"x": x}, 0)
    assert torch.equal(xf2, xf) and torch.equal(s, (xf * xf).sum(1))
    steps.insert(2, steps.pop())  # the allgather reads the cast before the sum
    cast, g, f = FU.fuse_pointwise(steps, {"x", "s", "g"}, meta)
    assert cast.outs == ("xf",) and cast.ins == ("x",) and cast.attr("ops") == (("cast", "in0", "float32"),)
    assert f.outs == ("s",) and f.attr("prologue")[0] == (("cast", "in0", "float32"), ("mul", "t0", "t0"))
    assert torch.equal(run_local(cast, {"x": x}, 0), xf) and torch.equal(run_local(f, {"x": x}, 0), (xf * xf).sum(1))
    # the square read after the sum too: an extra output of the sum; the product x * y (of x's
    # shape and dtype: its step may write it into x's memory) read after it: no prologue
    later = steps[:2] + [steps[3], Step.make("allgather", "g2", ["sq"], axis=0, dim=0)]
    f = FU.fuse_pointwise(later, {"x", "s", "g2"}, meta)[0]
    assert f.outs == ("s", "sq") and f.attr("extra_values") == (("t1", "float32"),)
    s, sq = run_local(f, {"x": x}, 0)
    assert torch.equal(sq, xf * xf) and torch.equal(s, (xf * xf).sum(1))
    both = later[:3] + [Step.make("local", "s0", ["sq"], **{**red, "dims": (0,)})]  # two reductions of the square
    f, g = FU.fuse_pointwise(both, {"x", "s", "s0"}, meta)
    assert f.outs == ("s", "sq") and g.ins == ("sq",) and not g.attr("prologue")  # written once, by the first
    product = [_ew("p", ["x", "y"], "binary", fn="mul"), Step.make("local", "r", ["p"], **red),
               Step.make("allgather", "g", ["p"], axis=0, dim=0)]
    assert FU.fuse_pointwise(product, {"x", "y", "r", "g"}, meta) == product
    # the square read before the sum, or reduced over dims that are not adjacent: no prologue
    two = [steps[0], steps[1], Step.make("allgather", "g", ["sq"], axis=0, dim=0), steps[3]]
    assert [s.attr("prologue") for s in FU.fuse_pointwise(two, {"x", "s", "g"}, meta)] == [None, None, None]
    apart = {**meta, "x3": ((2, 4, 8), "bfloat16"), "p3": ((2, 4, 8), "bfloat16"), "r3": ((4,), "bfloat16")}
    steps = [_ew("p3", ["x3", "x3"], "binary", fn="mul"), Step.make("local", "r3", ["p3"], **{**red, "dims": (0, 2)})]
    assert FU.fuse_pointwise(steps, {"x3", "r3"}, apart) == steps


def _chain_program(dtype: str = "bfloat16") -> rs.Fusion:
    """Sharded elementwise chains around a row-parallel matmul (partial sums), in ``dtype``."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), dtype, P.MESH1, [rs.Shard(1)])
    w = f.input("w", (16, 12), dtype, P.MESH1, [rs.Shard(0)])
    b = f.input("b", (8, 12), dtype, P.MESH1, [rs.Replicate()])
    h = f.silu(f.scale(f.add(x, x), 0.25))
    y = f.matmul(h, w)
    z = f.gelu(f.add(f.rsqrt(f.sigmoid(y)), f.mul(b, b)))
    zz = f.cast(f.sub(f.exp(f.neg(f.abs(z))), f.tanh(z)), "float32")
    f.output(f.maximum(zz, f.sqrt(f.relu(f.cast(z, "float32")))), [rs.Shard(0)])
    return f


def _centered_program(dtype: str = "bfloat16") -> rs.Fusion:
    """``gelu(x - mean(x, 1) + b)`` on row-sharded x: the mean's broadcast is local and fuses."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), dtype, P.MESH1, [rs.Shard(0)])
    b = f.input("b", (16,), dtype, P.MESH1, [rs.Replicate()])
    mu = f.broadcast(f.scale(f.sum(x, 1), 1 / 16), (8, 16), (0,))
    f.output(f.gelu(f.add(f.sub(x, mu), f.broadcast(b, (8, 16), (1,)))), [rs.Shard(0)])
    return f


def _shared_program(dtype: str = "bfloat16") -> rs.Fusion:
    """silu(x / 2), read by the chain and by a matmul after it, and a comparison, read by the
    chain's ``masked`` and by a cast after it: the fused step writes both as extra outputs."""
    f = rs.Fusion()
    x = f.input("x", (8, 16), dtype, P.MESH1, [rs.Shard(0)])
    w = f.input("w", (16, 12), dtype, P.MESH1, [rs.Replicate()])
    h = f.silu(f.scale(x, 0.5))
    keep = f.gt(h, f.neg(x))
    f.output(f.cast(f.masked(f.gelu(f.mul(h, x)), keep, True), "float32"), [rs.Shard(0)])
    f.output(f.matmul(h, w), [rs.Shard(0)])
    f.output(f.cast(keep, "float32"), [rs.Shard(0)])
    return f


SHARED = [_shared_program, lambda: _shared_program("float16"), lambda: _shared_program("float32")]


def _norm_program(dtype: str = "bfloat16") -> rs.Fusion:
    """RMSNorm's forward and its weight's gradient shape: sum(x * x, 1) and sum(x * g, 0), the
    mean of a gelu, a max of differences, LayerNorm's variance (centred squares, the mean read
    through a broadcast), each operand read by its reduction alone: reduce steps with prologues."""
    f = rs.Fusion()
    x = f.input("x", (8, 64), dtype, P.MESH1, [rs.Shard(0)])
    g = f.input("g", (8, 64), dtype, P.MESH1, [rs.Shard(0)])
    xf = f.cast(x, "float32")
    f.output(f.sum(f.mul(xf, xf), 1), [rs.Shard(0)])
    f.output(f.sum(f.mul(x, g), 0), [rs.Partial()])
    f.output(f.mean(f.gelu(g), 1), [rs.Shard(0)])
    f.output(f.max(f.sub(x, g), 1), [rs.Shard(0)])
    centred = f.sub(g, f.broadcast(f.mean(g, 1), (8, 64), (0,)))
    f.output(f.mean(f.mul(centred, centred), 1), [rs.Shard(0)])
    return f


NORMS = [_norm_program, lambda: _norm_program("float16"), lambda: _norm_program("float32")]


def _unfused(monkeypatch: pytest.MonkeyPatch, f: rs.Fusion) -> rs.Plan:
    with monkeypatch.context() as m:
        m.setattr(L, "fuse_pointwise", lambda steps, *_: steps)
        return rs.optimize(f)


#: how far a fused 16-bit chain (computed in float32, rounded once) may lie from the unfused
#: steps (rounded after each op): a few roundings of the dtype
_CHAIN_TOL = {torch.bfloat16: 2 ** -5, torch.float16: 2 ** -8}


def _assert_as_unfused(fused: rs.Plan, plain: rs.Plan, inputs: dict[str, torch.Tensor],
                          seed: int | None = None) -> None:
    """Both plans' programs on the CPU's local steps give every rank the same outputs (``seed``:
    the generator of the inputs' Partial summands): bit for bit, but where the program holds
    16-bit floats, whose fused chains skip the unfused steps' roundings between members
    (``codegen.fuse``): there within a few roundings (``_CHAIN_TOL``)."""
    gen = (lambda: None) if seed is None else (lambda: torch.Generator().manual_seed(seed))
    a = simulate(fused.program, fused.shard_inputs(inputs, gen()), run_local)
    b = simulate(plain.program, plain.shard_inputs(inputs, gen()), run_local)
    tol = max((_CHAIN_TOL.get(DTYPES[t.dtype], 0.0) for t in fused.fusion.tensors), default=0.0)
    for (ba, _), (bb, _) in zip(fused.lowered.outputs, plain.lowered.outputs):
        for r in fused.program.mesh_ranks:
            torch.testing.assert_close(a[r][ba], b[r][bb], rtol=tol, atol=tol, equal_nan=True)


def _compiled_kernels(plan: rs.Plan, inputs: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch,
                      tmp_path: Path, only: Container[Step] | None = None) -> list[Any]:
    """The kernels ``plan``'s local steps (those in ``only``, when given) list on ``inputs``,
    each checked to compile for sm_90 (its name in the cubin); skipped without the gpu extra."""
    pytest.importorskip("cuda.core")
    from reshard.codegen import nvrtc as N
    from reshard.runtime.gpu_local import step_kernels

    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kc"))
    seen: list[Any] = []

    def record(step, env, rank):
        if only is None or step in only:
            seen.extend(step_kernels(step, env, rank))
        return run_local(step, env, rank)

    simulate(plan.program, plan.shard_inputs(inputs), record)
    for ks in seen:
        assert ks.name.encode() in N.compile_kernel(ks, "sm_90")
    return seen


BUILDERS = [_chain_program, lambda: _chain_program("float16"), lambda: _chain_program("float32"),
            _centered_program, lambda: _centered_program("float32"), P.transformer_like, P.mlp, P.attention,
            *SHARED, *NORMS, *BROADCASTS]


def _inputs(f: rs.Fusion) -> dict[str, torch.Tensor]:
    inputs = P.random_inputs(f)
    if "eps" in inputs:  # rmsnorm's epsilon
        inputs["eps"] = torch.tensor([1e-5])
    return inputs


@pytest.mark.parametrize("build", BUILDERS)
def test_fused_plan_equals_unfused_and_reference(build, monkeypatch):
    f = build()
    fused, plain = rs.optimize(f), _unfused(monkeypatch, f)
    assert [c.kind for c in fused.communications] == [c.kind for c in plain.communications]
    kinds = [s.attr("fop") for s in fused.steps]
    inputs = _inputs(f)
    refs = rs.run_reference(f, inputs)
    tol = max({"float32": 1e-4, "bfloat16": 3e-2, "float16": 3e-3}.get(t.dtype, 0) for t in f.tensors)
    for o, r in zip(fused.simulate(inputs, generator=torch.Generator().manual_seed(0)), refs):
        assert o.dtype == r.dtype
        torch.testing.assert_close(o, r, atol=tol, rtol=tol)
    _assert_as_unfused(fused, plain, inputs, seed=0)
    if build is _chain_program:
        assert kinds.count("pointwise") >= 2 and len(fused.steps) < len(plain.steps)
    if build is _centered_program:
        assert any(s.attr("bcast") for s in fused.steps)
    if build in SHARED:
        (g,) = [s for s in fused.steps if s.attr("fop") == "pointwise"]  # silu's result and the comparison
        assert [d for _, d in g.attr("extra_values")] == [f.tensors[0].dtype, "bool"] and len(g.outs) == 3
    if build in NORMS:
        prologues = [s for s in fused.steps if s.attr("prologue")]
        assert [(s.attr("fn"), bool(s.attr("bcast"))) for s in prologues] == [
            ("sum", False), ("sum", False), ("mean", False), ("max", False), ("mean", True)]


def test_chain_program_kernels_compile_for_sm90(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from reshard.codegen import nvrtc as N
    from reshard.runtime.gpu_local import step_kernels

    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kc"))
    programs = [_chain_program(d) for d in ("bfloat16", "float16", "float32")] + [b() for b in BROADCASTS]
    for f in programs + [_centered_program(d) for d in ("bfloat16", "float16", "float32")] + [
            b() for b in SHARED + NORMS]:
        plan = rs.optimize(f)
        seen = []

        def record(step, env, rank):
            if step.attr("fop") == "pointwise" or step.attr("prologue"):
                ks = step_kernels(step, env, rank)
                assert ks and (not step.attr("prologue") or "rs_value" in ks[0].source), step
                seen.extend(ks)
            return run_local(step, env, rank)

        simulate(plan.program, plan.shard_inputs(_inputs(f)), record)
        assert seen or f in programs[3:]  # some broadcast programs keep no chain
        assert all(("out1" in ks.source) == any(k == "out1:ptr" for k in ks.params) for ks in seen)
        for ks in seen:
            assert ks.name.encode() in N.compile_kernel(ks, "sm_90")


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int64", "int32", "bool"])
def test_extra_output_kernels_compile_for_sm90(dtype, vectorize, kernel_cache):
    """A pointwise kernel storing extra outputs (of ``dtype``, and a bool; a broadcast input
    too) compiles, with one output parameter per output, each stored once per element."""
    from reshard.codegen import kernels as K

    ops = [("cast", "in0", dtype), ("cast", "in1", dtype), ("add", "t0", "t1"), ("cast", "t2", dtype),
           ("gt", "t3", "t1"), ("cast", "t3", "float32"), ("masked", "t5", "t4", True)]
    extra = (("t3", dtype), ("t4", "bool"), ("in0", "float32"))
    plain = K.pointwise_kernel(["float32", "bfloat16"], "float32", ops, vectorize=vectorize, extra=extra)
    wide = K.pointwise_kernel(["float32", "bfloat16"], "float32", ops, (4, 32), ((), ((32,), (1,))),
                              vectorize=vectorize, extra=extra)
    for ks in (plain, wide):
        assert ks.params[:4] == ("out:ptr", "out1:ptr", "out2:ptr", "out3:ptr") and ks.params[-1] == "n:i64"
        assert ks.name != K.pointwise_kernel(["float32", "bfloat16"], "float32", ops, vectorize=vectorize).name
        if vectorize:  # 16 bools per vector iteration: one 16-byte store of out2, four of out (float32)
            assert "nv = n / 16" in ks.source and "reinterpret_cast<uint4*>(out2)[v * 1 + c]" in ks.source
        assert_cubin(ks)


#: reduce steps with a prologue masking x * y by a bool (writing the product and the mask as
#: extra outputs), each kernel variant: rows of 2048
#: (a block per row), rows of 100 (a warp per row), a middle dim (columns), columns of few
#: tiles over many rows (cut into parts: ``kernels.reduce_splits``, a sum and a mean)
PROLOGUE_CASES = [((4, 2048), (1,), "sum"), ((64, 100), (1,), "max"), ((3, 40, 70), (1,), "sum"),
                  ((6, 5, 33), (0, 1), "mean"), ((1000, 64), (0,), "sum"), ((600, 3, 40), (0,), "mean")]


def _prologue_step(shape: tuple[int, ...], dims: tuple[int, ...], fn: str, dtype: str, row: bool) -> Step:
    """``row``: y is one row, read through a broadcast along every dim but the last."""
    ops = (("cast", "in0", "float32"), ("mul", "t0", "in1"), ("masked", "t1", "in2", True), ("cast", "t2", dtype))
    count = 1
    for d in dims:
        count *= shape[d]
    reads = {"shape": shape, "bcast": ((), ((shape[-1],), (len(shape) - 1,)), ())} if row else {}
    return Step.make("local", "r", ["x", "y", "m"], op="apply", fop="reduce", fn=fn, dims=dims, count=count,
                     prologue=(ops, dtype), extra_outs=("p", "m2"), extra_values=(("t1", "float32"), ("in2", "bool")),
                     **reads)


def _prologue_inputs(shape: tuple[int, ...], dtype: str, row: bool, device: str = "cpu") -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(len(shape))
    return {"x": torch.randn(shape, generator=gen).bfloat16().to(device),
            "y": torch.randn(shape[-1:] if row else shape, generator=gen).to(getattr(torch, dtype)).to(device),
            "m": (torch.rand(shape, generator=gen) < 0.7).to(device)}


@pytest.mark.parametrize("shape,dims,fn", PROLOGUE_CASES)
@pytest.mark.parametrize("dtype,row", [("float32", False), ("bfloat16", False), ("bfloat16", True)])
def test_reduce_prologue_kernels_compile_for_sm90(shape, dims, fn, dtype, row, kernel_cache):
    """A reduce step with a prologue lists one reduce kernel (a mean scaling its sums)
    computing the operand from its three inputs, or, cut into parts, that kernel writing the
    parts' partials and one reducing them (a mean scaling there); they compile."""
    from reshard.codegen import kernels as K
    from reshard.runtime.gpu_local import step_kernels

    ks = step_kernels(_prologue_step(shape, dims, fn, dtype, row), _prologue_inputs(shape, dtype, row), 0)
    assert ks[0].params == ("out:ptr", "out1:ptr", "out2:ptr", "in0:ptr", "in1:ptr", "in2:ptr")
    assert "rs_value(in0, in1, in2, out1, out2," in ks[0].source and ("in1[o1]" in ks[0].source) == row
    split = K.reduce_splits(shape, dims[0]) > 1  # (one reduced dim, or adjacent dims too short to cut)
    assert [k.kind for k in ks] == (["reduce_cols_split", "reduce_cols"] if split else [ks[0].kind])
    assert ("__fmul_rn" in ks[-1].source) == (fn == "mean")  # a mean scales in the (last) kernel
    assert not split or "__fmul_rn" not in ks[0].source  # the partials are not scaled
    for k in ks:
        assert_cubin(k)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dims,fn", PROLOGUE_CASES)
@pytest.mark.parametrize("dtype,row", [("float32", False), ("bfloat16", False), ("bfloat16", True)])
def test_reduce_prologue_on_the_gpu_matches_torch(shape, dims, fn, dtype, row):
    """The prologue reduce kernel against ``run_local`` (the prologue with torch ops, then the
    reduction) and against the unfused kernels (a pointwise kernel, then the reduce kernel)."""
    from reshard.runtime.gpu_local import gpu_local_step

    step = _prologue_step(shape, dims, fn, dtype, row)
    env = _prologue_inputs(shape, dtype, row, "cuda")
    got, product, mask = gpu_local_step(step, env, 0, poison=True)
    want, *extras = run_local(step, {k: v.cpu() for k, v in env.items()}, 0)
    tol = 1e-5 if dtype == "float32" else 1e-2
    torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol)
    assert torch.equal(product.cpu(), extras[0]) and torch.equal(mask.cpu(), extras[1])
    reads = {k: step.attr(k) for k in ("shape", "bcast") if row}
    operand = gpu_local_step(Step.make("local", "p", ["x", "y", "m"], op="apply", fop="pointwise",
                                       ops=step.attr("prologue")[0], dtype=dtype, **reads), env, 0)
    unfused = {k: v for k, v in step.attrs if k not in ("prologue", "extra_outs", "extra_values", "shape", "bcast")}
    plain = gpu_local_step(Step.make("local", "r", ["p"], **unfused), {"p": operand}, 0)
    assert torch.equal(got, plain)  # the same operand values, added in the same order


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int64", "int32", "bool"])
@pytest.mark.parametrize("n", [16, 1000, 4096 + 16])
def test_extra_output_kernels_on_the_gpu_match_torch(dtype, n):
    """The kernel's result and extra outputs equal ``pointwise_local``'s (exact for these ops:
    adds of values that round to ``dtype``, a comparison, a copy), vector path and scalar."""
    from reshard.runtime.gpu_local import KernelKit
    from reshard.runtime.local_ops import pointwise_local

    ops = [("cast", "in0", dtype), ("cast", "in1", dtype), ("add", "t0", "t1"), ("cast", "t2", dtype),
           ("gt", "t3", "t1"), ("cast", "t3", "float32"), ("masked", "t5", "t4", True)]
    extra = (("t3", dtype), ("t4", "bool"), ("in0", "float32"))
    gen = torch.Generator().manual_seed(n)
    xs = [torch.randint(-50, 50, (n,), generator=gen).float().cuda(),
          torch.randint(-50, 50, (n,), generator=gen).bfloat16().cuda()]
    for offset in (0, 1):  # 16-byte aligned pointers take the vector path, the others the scalar one
        views = [torch.empty(n + offset, dtype=x.dtype, device="cuda")[offset:].copy_(x) for x in xs]
        got = KernelKit(poison=True).pointwise(ops, views, torch.float32, extra=extra)
        ref = pointwise_local(tuple(ops), [x.cpu() for x in xs], torch.float32, extra)
        for g, r in zip(got, ref, strict=True):
            assert g.dtype == r.dtype and torch.equal(g.cpu(), r)


@pytest.mark.gpu
@pytest.mark.parametrize("build", [_chain_program, lambda: _chain_program("float16"), lambda: _chain_program("float32"),
                                   _centered_program, lambda: _centered_program("float16"),
                                   lambda: _centered_program("float32"), *SHARED, *NORMS, *BROADCASTS])
def test_fused_steps_on_the_gpu_match_torch(build):
    from reshard.runtime.gpu_local import gpu_local_step, kernel_path

    f = build()
    plan = rs.optimize(f)
    tol = max({"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}.get(t.dtype, 0) for t in f.tensors)
    checked = []

    def both(step, env, rank):
        ref = run_local(step, env, rank)
        if step.attr("fop") == "pointwise" or step.attr("prologue"):
            assert kernel_path(step, [env[b] for b in step.ins])
            got = gpu_local_step(step, env, rank, poison=True)
            for g, r in zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (got, ref)), strict=True):
                err = float((g.double() - r.double()).norm() / r.double().norm().clamp_min(1e-30))
                assert g.dtype == r.dtype and err < tol, (step.attr("ops"), err)
            checked.append(step)
        return ref

    per_rank = {r: {k: v.cuda() for k, v in d.items()} for r, d in plan.shard_inputs(_inputs(f)).items()}
    simulate(plan.program, per_rank, both)
    assert checked


def test_explain_names_the_fused_chains():
    f = rs.Fusion()
    x = f.input("x", (8, 4), "float32", P.MESH1, [rs.Shard(0)])
    f.output(f.tanh(f.scale(x, 0.5)), [rs.Shard(0)])
    text = rs.optimize(f).explain()
    head = "fused elementwise chains (one kernel each; the table prices every op on its own):"
    assert head in text
    want = f"{f.tensors[1].name} = scale, {f.tensors[2].name} = unary(tanh)"
    assert text.split(head)[1].splitlines()[1].strip() == want


def _cast_logits_loss(vocab_split: bool = False) -> rs.Fusion:
    """Cross entropy over bf16 logits cast to float32 (the frontend's form): the cast read by the
    target pick, the max and ``exp(x - max)`` (whose sum is taken, and which is kept)."""
    f = rs.Fusion()
    x = f.input("x", (2, 4, 16), "bfloat16", P.MESH1, [rs.Shard(2)] if vocab_split else None)
    idx = f.input("idx", (8,), "int64", P.MESH1)
    xf = f.reshape(f.cast(x, "float32", name="xf"), (8, 16), name="xr")
    m = f.max(xf, 1, name="m")
    e = f.exp(f.sub(xf, f.broadcast_to(f.reshape(m, (8, 1)), (8, 16))), name="e")
    loss = f.sub(f.add(f.log(f.sum(e, 1)), m), f.pick(xf, idx), name="loss")
    f.output(loss, [rs.Replicate()])
    f.output(e, [rs.Replicate()])
    return f


def test_a_cast_read_by_several_kernels_is_computed_by_each(monkeypatch, tmp_path):
    """``cast`` then ``reshape`` read by a pick, a max and an elementwise chain: the reshape views
    the bf16 operand, the pick picks bf16 values and casts those, the max and the chain compute
    the cast themselves (a prologue, a member): no float32 copy of the logits is written, and
    ``exp(x - max)`` is the sum's prologue, written as its extra output.  The plan computes what
    the plan lowered without fusion computes (CPU, ``_assert_as_unfused``), and the reference; its kernels
    compile for sm_90."""
    f = _cast_logits_loss()
    fused = rs.optimize(f)
    with monkeypatch.context() as m:
        m.setattr(L, "fuse_pointwise", lambda steps, *_: steps)
        m.setattr(L, "spread_casts", lambda steps, *_: steps)
        plain = rs.optimize(f)
    shapes = {s.out: s for s in fused.steps}
    casts = [s for s in fused.steps if s.attr("fop") == "cast"]
    assert [s.ins[0] for s in casts] == [] or all(shapes[s.ins[0]].attr("fop") == "pick" for s in casts), casts
    assert not any(s.attr("fop") == "pointwise" and "exp" in str(s.attr("ops")) for s in fused.steps)
    (sums,) = [s for s in fused.steps if s.attr("fn") == "sum" and s.attr("prologue")
               and any(o[0] == "exp" for o in s.attr("prologue")[0])]
    assert sums.attr("extra_outs")  # exp(x - max), kept as an output
    assert len(fused.steps) < len(plain.steps)
    inputs = {"x": torch.randn(2, 4, 16).bfloat16(), "idx": torch.randint(0, 16, (8,))}
    _assert_as_unfused(fused, plain, inputs)
    for o, r in zip(fused.simulate(inputs), rs.run_reference(f, inputs)):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)
    seen = _compiled_kernels(fused, inputs, monkeypatch, tmp_path)
    assert any("rs_value" in ks.source and "out1" in ks.source for ks in seen)


def test_spread_casts_needs_every_reader_to_compute_it():
    """A cast also read by a step that cannot compute it (a matmul) stays one step, its readers
    reading it; a cast of one pick is the pick of the operand, cast."""
    meta = {"x": ((4, 8), "bfloat16"), "c": ((4, 8), "float32"), "y": ((4, 8), "float32"),
            "w": ((8, 8), "float32"), "z": ((4, 8), "float32"), "i": ((4,), "int64"), "p": ((4,), "float32")}
    steps = [_ew("c", ["x"], "cast", dtype="float32"), _ew("y", ["c"], "unary", fn="exp"),
             _ew("z", ["c", "w"], "matmul")]
    assert FU.spread_casts(steps, {"x", "w", "y", "z"}, dict(meta), set()) == steps
    steps = [_ew("c", ["x"], "cast", dtype="float32"), _ew("p", ["c", "i"], "pick")]
    m2 = dict(meta)
    out = FU.spread_casts(steps, {"x", "i", "p"}, m2, set())
    assert [(s.out, s.attr("fop"), s.ins) for s in out] == [("p.raw", "pick", ("x", "i")), ("p", "cast", ("p.raw",))]
    assert m2["p.raw"] == ((4,), "bfloat16")


def _rope_program(dtype: str = "bfloat16", tp: bool = False) -> rs.Fusion:
    """Rotary embedding's forward ``x cos + cat(-x2, x1) sin`` and its backward form
    ``pad(-(g sin)[:h], lo=h) + pad((g sin)[h:], hi=h) + g cos`` (``rotate_half`` and its
    transpose), x and g of [batch, heads, seq, 16], cos and sin of [seq, 16]."""
    f = rs.Fusion()
    heads = [rs.Shard(1)] if tp else [rs.Replicate()]
    mesh = P.MESH1
    x = f.input("x", (2, 4, 8, 16), dtype, mesh, heads if tp else None)
    g = f.input("g", (2, 4, 8, 16), dtype, mesh, heads if tp else None)
    cos, sin = f.input("cos", (8, 16), dtype, mesh), f.input("sin", (8, 16), dtype, mesh)
    cb, sb = (f.broadcast_to(t, (2, 4, 8, 16)) for t in (cos, sin))
    rot = f.cat([f.neg(f.slice(x, 3, 8, 16)), f.slice(x, 3, 0, 8)], 3)
    f.output(f.add(f.mul(x, cb), f.mul(rot, sb), name="q"), heads)
    s = f.mul(g, sb, name="s")
    back = f.add(f.pad(f.neg(f.slice(s, 3, 0, 8)), 3, 8, 0), f.pad(f.slice(s, 3, 8, 16), 3, 0, 8))
    f.output(f.add(back, f.mul(g, cb), name="gq"), heads)
    return f


def test_a_cat_of_slices_is_read_in_place_by_one_kernel():
    """``cat(-x[..., 8:], x[..., :8])``: one pointwise step reading x shifted by 8 (its
    ``bcast`` entry's shift, wrapped) and selecting the negated half by coordinate
    (``in_range``); a pad of a slice likewise with zeros; the same values as the unfused
    steps, bit for bit."""
    meta = {"x": ((2, 16), "bfloat16"), "a": ((2, 8), "bfloat16"), "n": ((2, 8), "bfloat16"),
            "b": ((2, 8), "bfloat16"), "c": ((2, 16), "bfloat16"), "p": ((2, 16), "bfloat16")}
    steps = [_ew("a", ["x"], "slice", dim=1, start=8, stop=16), _ew("n", ["a"], "unary", fn="neg"),
             _ew("b", ["x"], "slice", dim=1, start=0, stop=8), _ew("c", ["n", "b"], "cat", dim=1),
             _ew("p", ["b"], "pad", dim=1, lo=8, hi=0)]
    out = FU.moved_reads(steps[:4], {"x", "c"}, meta)
    (c,) = out
    assert c.out == "c" and c.ins == ("x",) and c.attr("bcast") == (((2, 16), (0, 1), ((1, 8),)),)
    assert c.attr("ops") == (("neg", "in0"), ("in_range", 1, 0, 8, "t0", "in0"))
    x = torch.randn(2, 16).bfloat16()
    env = {"x": x}
    for s in steps:
        env[s.out] = run_local(s, env, 0)
    assert torch.equal(run_local(c, {"x": x}, 0), env["c"])
    (p,) = FU.moved_reads([steps[2], steps[4]], {"x", "p"}, meta)
    assert p.ins == ("x",) and p.attr("ops") == (("in_range", 1, 8, 16, "in0", 0),)
    assert p.attr("bcast") == (((2, 16), (0, 1), ((1, 8),)),)  # element j reads x[j - 8]: rolled by 8
    assert torch.equal(run_local(p, {"x": x}, 0), env["p"])
    # a slice read elsewhere too stays: the cat reads its result, narrower than the cat, shifted
    # and clamped (``kernels._bcast_rolls``); likewise a slice of a buffer wider than the result
    kept = FU.moved_reads(steps[:4], {"x", "c", "a"}, meta)
    assert [s.out for s in kept] == ["a", "c"] and kept[1].ins == ("a", "x")
    assert kept[1].attr("bcast")[0] == ((2, 8), (0, 1), ((1, 0),))
    env2 = {"x": x, "a": env["a"]}
    assert torch.equal(run_local(kept[1], env2, 0), env["c"])
    wide = dict(meta, x=((2, 20), "bfloat16"))
    assert [s.attr("fop") for s in FU.moved_reads(steps[:4], {"x", "c"}, wide)] == ["slice", "slice", "pointwise"]
    # a pad of a buffer (no slice) an elementwise step reads: that buffer read shifted and
    # clamped, zeros around it (kept, or read otherwise, it stays a pad step: nothing to save)
    pad = [_ew("q", ["b"], "pad", dim=1, lo=4, hi=4), _ew("e", ["q"], "unary", fn="exp")]
    m3 = meta | {"q": ((2, 16), "bfloat16"), "e": ((2, 16), "bfloat16")}
    q, e = FU.moved_reads(pad, {"b", "e"}, m3)
    assert q.attr("bcast") == (((2, 8), (0, 1), ((1, 12),)),) and q.attr("ops") == (("in_range", 1, 4, 12, "in0", 0),)
    b = torch.randn(2, 8).bfloat16()
    assert torch.equal(run_local(q, {"b": b}, 0), torch.nn.functional.pad(b, [4, 4]))
    assert FU.moved_reads(pad[:1], {"b", "q"}, m3) == pad[:1]


@pytest.mark.parametrize("tp", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rotary_embedding_is_one_kernel_each_way(dtype, tp, monkeypatch, tmp_path):
    """Rotary embedding forward and backward (``_rope_program``): no slice, cat, pad or neg step
    is left, one pointwise step each way (the backward's ``g sin``, read rolled, its own); the
    kernel that reads x rolled never writes into x's memory; the plan computes what the
    unfused plan computes (CPU, ``_assert_as_unfused``), and the reference; its kernels (scalar and
    16-byte vector forms) compile for sm_90."""
    f = _rope_program(dtype, tp)
    fused = rs.optimize(f)
    plain = _unfused(monkeypatch, f)
    kinds = [s.attr("fop") for s in fused.steps if s.kind == "local"]
    assert not {"slice", "cat", "pad", "unary"} & set(kinds), kinds
    moved = [s for s in fused.steps if s.attr("fop") == "pointwise" and any(o[0] == "in_range" for o in s.attr("ops"))]
    assert len(moved) == 2 and all(s.attr("into") is None or not s.attr("bcast")[s.attr("into")] for s in moved)
    for s in moved:  # never into the memory it reads rolled
        rolled = {b for b, spec in zip(s.ins, s.attr("bcast")) if len(spec) > 2}
        assert s.attr("into") is None or s.ins[s.attr("into")] not in rolled
    inputs = P.random_inputs(f)
    _assert_as_unfused(fused, plain, inputs)
    tol = 3e-2 if dtype == "bfloat16" else 1e-5
    for o, r in zip(fused.simulate(inputs), rs.run_reference(f, inputs)):
        torch.testing.assert_close(o, r, atol=tol, rtol=tol)
    seen = _compiled_kernels(fused, inputs, monkeypatch, tmp_path, moved)
    assert len(seen) >= 4 and all("c3 + 8u" in ks.source for ks in seen)  # both variants of each, rolled


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_permute_read_by_a_kernel_is_read_through(dtype, monkeypatch, tmp_path):
    """Rotary embedding of the heads' permute ``[b, s, h, d] -> [b, h, s, d]``: the permute
    joins the kernel as a leaf, its input read through the inverse permutation composed with
    the rolled read (``bcast`` dims ``(0, 2, 1, 3)``); its backward form's result permuted back
    is the kernel writing the permuted shape (its inputs read through the permutation, its
    ``in_range`` dim mapped); no permute step; the unfused plan's values (``_assert_as_unfused``),
    equal to the reference; the kernels (scalar and vector) compile for sm_90."""
    f = rs.Fusion()
    mesh = P.MESH1
    x = f.input("x", (2, 8, 4, 16), dtype, mesh)
    cos, sin = f.input("cos", (8, 16), dtype, mesh), f.input("sin", (8, 16), dtype, mesh)
    h = f.permute(x, (0, 2, 1, 3))
    cb, sb = (f.broadcast_to(t, (2, 4, 8, 16)) for t in (cos, sin))
    rot = f.cat([f.neg(f.slice(h, 3, 8, 16)), f.slice(h, 3, 0, 8)], 3)
    f.output(f.add(f.mul(h, cb), f.mul(rot, sb), name="q"), [rs.Replicate()])
    g = f.input("g", (2, 4, 8, 16), dtype, mesh)
    sg = f.mul(g, sb, name="s")
    back = f.add(f.pad(f.neg(f.slice(sg, 3, 0, 8)), 3, 8, 0), f.pad(f.slice(sg, 3, 8, 16), 3, 0, 8))
    f.output(f.permute(f.add(back, f.mul(g, cb)), (0, 2, 1, 3), name="gx"), [rs.Replicate()])
    fused = rs.optimize(f)
    local = [s for s in fused.steps if s.kind == "local"]
    assert "permute" not in [s.attr("fop") for s in local], local
    pw = next(s for s in local if any(b.startswith("x") for b in s.ins))
    specs = [spec for b, spec in zip(pw.ins, pw.attr("bcast")) if b.startswith("x")]
    assert {tuple(spec[1]) for spec in specs} == {(0, 2, 1, 3)} and any(len(spec) > 2 for spec in specs)
    gx = next(s for s in local if tuple(s.attr("shape") or ()) == (2, 8, 4, 16))
    assert (0, 2, 1, 3) in {tuple(spec[1]) for spec in gx.attr("bcast")}  # g read through the permutation
    inputs = P.random_inputs(f)
    _assert_as_unfused(fused, _unfused(monkeypatch, f), inputs)
    tol = 3e-2 if dtype == "bfloat16" else 1e-5
    for o, r in zip(fused.simulate(inputs), rs.run_reference(f, inputs)):
        torch.testing.assert_close(o, r, atol=tol, rtol=tol)
    assert len(_compiled_kernels(fused, inputs, monkeypatch, tmp_path)) >= 2


@pytest.mark.parametrize("vectorize", [False, True])
def test_rolled_reads_and_in_range_kernel_source(vectorize, kernel_cache):
    """A pointwise kernel reading an input rolled along the innermost dim and selecting by
    coordinate compiles for sm_90; the vector path needs the shift a multiple of the width."""
    from reshard.codegen import kernels as K

    shape = (4, 3, 16)
    bcast = (((4, 3, 16), (0, 1, 2), ((2, 8),)), ())
    ops = (("neg", "in0"), ("in_range", 2, 0, 8, "t0", "in0"), ("add", "t1", "in1"))
    ks = K.pointwise_kernel(["bfloat16", "bfloat16"], "bfloat16", ops, shape, bcast, vectorize=vectorize)
    assert "c2 + 8u" in ks.source and ("(c2 + j)" in ks.source) == vectorize
    assert_cubin(ks)
    assert K.pointwise_vector_ok(["bfloat16"] * 2, "bfloat16", 192, shape, bcast)
    assert not K.pointwise_vector_ok(["bfloat16"] * 2, "bfloat16", 192, shape, (((4, 3, 16), (0, 1, 2), ((2, 4),)), ()))
    # an input narrower along the shifted dim: clamped in bounds (the vector path: n - V)
    narrow = (((4, 3, 8), (0, 1, 2), ((2, 8),)), ())
    ops = (("in_range", 2, 8, 16, "in0", 0), ("add", "t0", "in1"))
    ks = K.pointwise_kernel(["bfloat16", "bfloat16"], "bfloat16", ops, shape, narrow, vectorize=vectorize)
    assert ("min(" in ks.source) and ((", 0u)" if vectorize else ", 7u)") in ks.source)
    assert_cubin(ks)
    assert not K.pointwise_vector_ok(["bfloat16"] * 2, "bfloat16", 192, shape, (((4, 3, 4), (0, 1, 2), ((2, 8),)), ()))


def _qkv_grad_program() -> rs.Fusion:
    """GPT-2's fused qkv gradient: ``pad(dq, hi=2h) + pad(dk, h, h) + pad(dv, lo=2h)``."""
    f = rs.Fusion()
    d = [f.input(n, (2, 8, 16), "bfloat16", P.MESH1) for n in ("dq", "dk", "dv")]
    pads = [f.pad(t, 2, 16 * k, 16 * (2 - k)) for k, t in enumerate(d)]
    f.output(f.add(f.add(pads[0], pads[1]), pads[2], name="dqkv"), [rs.Replicate()])
    return f


def test_pads_added_are_one_kernel(monkeypatch):
    """Three pads added (GPT-2's qkv gradient): one pointwise step reading each operand shifted and
    clamped; the unfused plan's values, bit for bit, and the reference's."""
    f = _qkv_grad_program()
    fused, plain = rs.optimize(f), _unfused(monkeypatch, f)
    assert [s.attr("fop") for s in fused.steps if s.kind == "local"] == ["pointwise"]
    inputs = P.random_inputs(f)
    _assert_as_unfused(fused, plain, inputs)
    for o, r in zip(fused.simulate(inputs), rs.run_reference(f, inputs)):
        torch.testing.assert_close(o, r, atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("build", [lambda: _rope_program("bfloat16"), lambda: _rope_program("float32", True),
                                   _cast_logits_loss, _qkv_grad_program])
def test_moved_reads_and_spread_casts_on_the_gpu_match_torch(build):
    """The rolled reads and coordinate selects (``moved_reads``), and the casts computed by
    their readers (``spread_casts``), on the GPU: each fused step's kernels against its CPU step."""
    test_fused_steps_on_the_gpu_match_torch(build)


def test_a_value_read_shifted_stays_a_group_input():
    """``y = exp(x)`` read by ``cat(-y[:, 8:], y[:, :8])`` (shifted) and by the add of it: exp
    does not join the add's group (the group computes its values at its own element only), and
    the fused steps compute the unfused values."""
    meta = {b: ((2, 16), "float32") for b in ("x", "y", "c", "z")} | {b: ((2, 8), "float32") for b in "anb"}
    steps = [_ew("y", ["x"], "unary", fn="exp"), _ew("a", ["y"], "slice", dim=1, start=8, stop=16),
             _ew("n", ["a"], "unary", fn="neg"), _ew("b", ["y"], "slice", dim=1, start=0, stop=8),
             _ew("c", ["n", "b"], "cat", dim=1), _ew("z", ["c", "y"], "binary", fn="add")]
    out = FU.fuse_pointwise(steps, {"x", "z"}, meta)
    assert [s.out for s in out] == ["y", "z"] and "y" in out[1].ins  # exp its own step, read by the group
    x = torch.randn(2, 16)
    env, fused = {"x": x}, {"x": x}
    for s in steps:
        env[s.out] = run_local(s, env, 0)
    for s in out:
        fused[s.out] = run_local(s, fused, 0)
    assert torch.equal(fused["z"], env["z"])
