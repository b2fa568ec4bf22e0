"""The GPU path of issue 20's dtypes and ops: every kernel ``gpu_local`` would launch for a
plan with int / bool tensors, comparisons, ``where``, ``cumsum`` and ``gelu_tanh`` compiles
with NVRTC for sm_90 (no GPU needed); int and bool data movement (slice, pad, cat, permute,
broadcast) runs on the byte-copy kernels, float ``gelu_tanh``, ``where``'s ``masked`` and
``add`` and the int64 comparison on pointwise kernels (bool conditions load as 0 / 1, ints as
64-bit ints), and the steps no kernel computes (``cumsum``, an int sum) fall back to torch; on
a GPU the plan simulates like the reference."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import reshard as rs

from reshard.testing.op_oracle import MESH2, assert_same, inputs_of

pytest.importorskip("cuda.core")

from reshard.codegen import nvrtc as N  # noqa: E402
from reshard.runtime.gpu_local import step_kernels  # noqa: E402
from reshard.runtime.local_ops import run_local  # noqa: E402
from reshard.runtime.simulator import simulate  # noqa: E402


def _program() -> rs.Fusion:
    f = rs.Fusion()
    ids = f.input("ids", (4, 8), "int64", MESH2, [rs.Shard(0), rs.Shard(1)])
    ign = f.input("ign", (4, 8), "int64", MESH2, [rs.Replicate(), rs.Replicate()])
    x = f.input("x", (4, 8), "float32", MESH2, [rs.Shard(0), rs.Replicate()])
    b = f.input("b", (8,), "bool", MESH2, [rs.Replicate(), rs.Shard(0)])
    valid = f.ne(ids, ign)
    y = f.where(valid, f.gelu_tanh(f.scale(x, 2.0)), x)
    f.output(f.cumsum(y, 1), [rs.Shard(0), rs.Replicate()])
    f.output(f.pad(f.permute(ids, (1, 0)), 1, 1, 3), [rs.Shard(0), rs.Replicate()])
    f.output(f.cat([f.slice(valid, 1, 0, 4), f.broadcast(b, (4, 8), (1,))], 1), [rs.Replicate(), rs.Shard(1)])
    f.output(f.sum(f.cast(valid, "int32"), 1), [rs.Replicate(), rs.Replicate()])
    return f


def test_kernels_compile_and_fallbacks(tmp_path, monkeypatch):
    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kcache"))
    N.clear_memory_cache()
    f = _program()
    plan = rs.optimize(f)
    used, fallback, kernels = Counter(), Counter(), {}

    def record(step, env, rank):
        ks = step_kernels(step, env, rank)
        if step.attr("op") == "apply" and step.attr("fop") not in ("reshape",):
            (used if ks else fallback)[f"{step.attr('fop')}:{env[step.ins[0]].dtype}"] += 1
            if ks and step.attr("fop") == "pointwise" and any(o[0] == "in_range" for o in step.attr("ops")):
                used[f"moved:{env[step.ins[0]].dtype}"] += 1  # a pad / cat read shifted (``fuse.moved_reads``)
        for k in ks:
            kernels[k.name] = k
        return run_local(step, env, rank)

    inputs = inputs_of(f, 0)
    per_rank = plan.shard_inputs(inputs, torch.Generator().manual_seed(0))
    simulate(plan.program, per_rank, record)
    kinds = {k.split(":")[0] for k in used}
    assert "permute" in kinds and kinds & {"pad", "moved"} and kinds & {"cat", "moved"}, used
    assert any(k.startswith(("unary:", "pointwise:")) for k in used), used  # gelu_tanh's kernel
    assert set(fallback) == {"cumsum:torch.float32", "reduce:torch.int32"}, fallback  # no int reduce kernel
    assert "binary:torch.int64" in used, used  # the int64 ne
    for ks in kernels.values():
        cubin = N.compile_kernel(ks, "sm_90")
        assert cubin[:4] == b"\x7fELF" and ks.name.encode() in cubin
    N.clear_memory_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1])
def test_plan_on_the_gpu_matches_the_reference(seed):
    f = _program()
    inputs = inputs_of(f, seed, special=True)
    outs = rs.optimize(f).simulate(inputs, device="cuda", generator=torch.Generator().manual_seed(seed))
    for o, r in zip(outs, rs.run_reference(f, inputs), strict=True):
        assert_same(o, r)
