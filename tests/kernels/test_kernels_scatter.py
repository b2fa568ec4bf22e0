"""The lookups' backward as generated kernels: ``unpick`` (pick's backward,
``kernels.unpick_kernel``: each element of the rank's block written once, ``g[r]`` at the
row's column, 0 elsewhere) and ``embedding_grad`` (embedding's backward: a zeroed float32
block, g's rows added by atomics, ``kernels.embedding_grad_kernel``, rounded to g's dtype),
both the masked local scatter through the rank's row positions (-1: a row another rank
holds; a ``padding_idx`` token adds nothing).  Without a GPU: the kernels ``gpu_local`` would launch compile with
NVRTC for sm_90, for vocab-sharded (uneven too), batch-sharded, Partial and whole results; on
a GPU (skipped without one): each step equals its torch step (outputs pre-filled with NaN;
``unpick`` exactly, ``embedding_grad`` up to the order of its additions), and the plans
simulate like the reference.  A scatter added to a summand that dies there reads it as its
accumulator (``codegen.scatter_add``) and runs on kernels too: the summand copied (to float32
for ``embedding_grad``) and the scatter added, or ``unpick``'s block added to it."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.codegen import kernels as K
from reshard.ir.errors import ReshardError
from reshard.runtime.local_ops import run_local
from reshard.testing.kernel_check import operands, torch_step
from reshard.runtime.simulator import simulate

from reshard.testing import programs as P
from reshard.testing.op_oracle import MESH1, assert_same, inputs_of


def _unpicks(vocab: int = 16, dtype: str = "float32") -> rs.Fusion:
    """Cross entropy's target-logit gradient: vocab-sharded from whole g (the masked local
    scatter), batch-sharded from batch-sharded g, and of a [2, 4] batch."""
    f = rs.Fusion()
    g = f.input("g", (8,), dtype, MESH1, [rs.Replicate()])
    idx = f.input("idx", (8,), "int64", MESH1, [rs.Replicate()])
    f.output(f.unpick(g, idx, vocab), [rs.Shard(1)])
    gb = f.input("gb", (8,), dtype, MESH1, [rs.Shard(0)])
    f.output(f.unpick(gb, f.input("ib", (8,), "int64", MESH1, [rs.Shard(0)]), vocab), [rs.Shard(0)])
    g2 = f.input("g2", (2, 4), dtype, MESH1, [rs.Replicate()])
    f.output(f.unpick(g2, f.input("i2", (2, 4), "int64", MESH1, [rs.Replicate()]), vocab), [rs.Shard(2)])
    return f


def _embedding_grads(vocab: int = 16, dtype: str = "float32") -> rs.Fusion:
    """Embedding gradients: vocab-sharded from whole g and ids (masked local scatter, with a
    ``padding_idx``), Partial from token-sharded g and ids, and H-sharded."""
    f = rs.Fusion()
    g = f.input("g", (2, 4, 6), dtype, MESH1, [rs.Replicate()])
    ids = f.input("ids", (2, 4), "int64", MESH1, [rs.Replicate()])
    f.output(f.embedding_grad(g, ids, vocab, padding_idx=1), [rs.Shard(0)])
    gt = f.input("gt", (8, 6), dtype, MESH1, [rs.Shard(0)])
    it = f.input("it", (8,), "int64", MESH1, [rs.Shard(0)])
    f.output(f.embedding_grad(gt, it, vocab), [rs.Replicate()])
    gh = f.input("gh", (8, 6), dtype, MESH1, [rs.Shard(1)])
    f.output(f.embedding_grad(gh, f.input("ih", (8,), "int64", MESH1, [rs.Replicate()]), vocab), [rs.Shard(1)])
    return f


def _accumulated(dtype: str = "float32") -> rs.Fusion:
    """Scatters added to a summand that dies there (``codegen.scatter_add``: the step reads it as
    its accumulator): ``exp(a) + unpick(g, idx)`` vocab-sharded, ``exp(t) + embedding_grad(g, ids)``."""
    f = rs.Fusion()
    a = f.input("a", (8, 16), dtype, MESH1, [rs.Shard(1)])
    g = f.input("g", (8,), dtype, MESH1, [rs.Replicate()])
    idx = f.input("idx", (8,), "int64", MESH1, [rs.Replicate()])
    f.output(f.add(f.exp(a), f.unpick(g, idx, 16)), [rs.Shard(1)])
    t = f.input("t", (16, 6), dtype, MESH1, [rs.Shard(0)])
    gt = f.input("gt", (2, 4, 6), dtype, MESH1, [rs.Replicate()])
    ids = f.input("ids", (2, 4), "int64", MESH1, [rs.Replicate()])
    f.output(f.add(f.exp(t), f.embedding_grad(gt, ids, 16)), [rs.Shard(0)])
    return f


BUILDERS = [_accumulated, lambda: _accumulated("bfloat16"), _unpicks, lambda: _unpicks(15), lambda: _unpicks(16, "bfloat16"), P.scatter_lookups, P.training_lookups,
            _embedding_grads, lambda: _embedding_grads(15), lambda: _embedding_grads(16, "bfloat16")]
SCATTERS = ("unpick", "embedding_grad")


def _inputs(f: rs.Fusion, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values (NaN and inf among them), indices in range."""
    inputs = inputs_of(f, seed, special=True)
    gen = torch.Generator().manual_seed(seed)
    for op in f.ops:
        if op.kind in ("unpick", "embedding_grad", "embedding"):
            v = f.tensors[op.output if op.kind == "unpick" else op.inputs[0]].shape[-1 if op.kind == "unpick" else 0]
            t = f.tensors[op.inputs[1]]
            if t.name in inputs:
                inputs[t.name] = torch.randint(0, v, t.shape, generator=gen)
    return inputs


def test_unpick_kernel_spec():
    ks = K.unpick_kernel(8, 16, 16, "bfloat16", True)
    assert ks.kind == "unpick" and ks.params == ("out:ptr", "g:ptr", "idx:ptr", "pos:ptr")
    assert "unsigned short" in ks.source and "pos[id]" in ks.source
    assert K.unpick_kernel(8, 16, 16, "float16", True).name == ks.name  # bits: one kernel per item size
    assert K.unpick_kernel(8, 15, 15, "bfloat16", True).name != ks.name
    assert K.unpick_kernel(8, 16, 16, "bfloat16", False).params == ("out:ptr", "g:ptr", "idx:ptr")
    with pytest.raises(ReshardError, match="negative"):
        K.unpick_kernel(-1, 4, 4, "float32", False)
    a = K.unpick_add_kernel(8, 16, 16, "bfloat16", True)
    assert a.kind == "unpick_add" and a.params == ("out:ptr", "g:ptr", "idx:ptr", "pos:ptr") and a.grid[0] >= 1
    assert "__fadd_rn" in a.source and "if (r >= 0)" in a.source  # one thread per row, only its element
    assert a.name != K.unpick_add_kernel(8, 16, 16, "float16", True).name  # arithmetic: one kernel per dtype
    with pytest.raises(ReshardError, match="arithmetic kernels"):
        K.unpick_add_kernel(8, 16, 16, "int64", False)
    e = K.embedding_grad_kernel(8, 6, 16, "bfloat16", True, padding_idx=1)
    assert e.kind == "embedding_grad" and "atomicAdd" in e.source and "cuda_bf16.h" in e.source
    assert "id != 1LL" in e.source and e.params == ("acc:ptr", "g:ptr", "idx:ptr", "pos:ptr")
    assert e.name != K.embedding_grad_kernel(8, 6, 16, "bfloat16", True).name
    with pytest.raises(ReshardError, match="bad tokens"):
        K.embedding_grad_kernel(8, 0, 16, "float32", False)
    with pytest.raises(ReshardError, match="arithmetic kernels"):
        K.embedding_grad_kernel(8, 6, 16, "int64", False)


@pytest.mark.parametrize("build", BUILDERS)
def test_scatter_steps_have_kernels_that_compile(build, tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from reshard.codegen import nvrtc as N
    from reshard.runtime.gpu_local import step_kernels

    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kc"))
    N.clear_memory_cache()
    f = build()
    plan = rs.optimize(f)
    seen, accumulated = {}, []

    def record(step, env, rank):
        ks = step_kernels(step, env, rank)
        if step.attr("fop") in SCATTERS:  # (adding into a summand too: a pointwise kernel with it)
            kinds = [k.kind for k in ks]  # (an unpick adding into its summand: only its rows, unpick_add)
            assert step.attr("fop") in kinds or step.attr("fop") == "unpick" and "unpick_add" in kinds, step
            accumulated.append(len(step.ins) == 3)
        seen.update((k.name, k) for k in ks)
        return run_local(step, env, rank)

    simulate(plan.program, plan.shard_inputs(_inputs(f)), record)
    assert any(k.kind in SCATTERS for k in seen.values())
    if build in BUILDERS[:2]:
        assert accumulated and all(accumulated), "the scatters add into their summands"
    for ks in seen.values():
        assert ks.name.encode() in N.compile_kernel(ks, "sm_90")
    N.clear_memory_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("build", BUILDERS)
def test_gpu_scatters_equal_torch(build):
    from reshard.runtime.gpu_local import gpu_local_step, kernel_path

    f = build()
    plan = rs.optimize(f)
    inputs = _inputs(f)
    checked = []

    def both(step, env, rank):
        want = torch_step(step, env, rank)
        if step.attr("fop") in SCATTERS:
            assert kernel_path(step, [env[b] for b in step.ins])
            exact = step.attr("fop") == "unpick"
            tol = 0 if exact else 2e-2 if want.dtype == torch.bfloat16 else 1e-5
            for poison in (True, False):  # the second run may replay the first's launch
                got = gpu_local_step(step, operands(step, env), rank, poison=poison)
                torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)
            checked.append(rank)
        return want

    per_rank = {r: {k: v.cuda() for k, v in d.items()}
                for r, d in plan.shard_inputs(inputs, torch.Generator().manual_seed(0)).items()}
    simulate(plan.program, per_rank, both)
    assert checked
    outs = plan.simulate(inputs, device="cuda", generator=torch.Generator().manual_seed(0))
    for o, r in zip(outs, rs.run_reference(f, inputs), strict=True):
        assert_same(o, r) if r.dtype != torch.bfloat16 else torch.testing.assert_close(o, r, equal_nan=True,
                                                                                         rtol=2e-2, atol=2e-2)
