"""The forward lookups and the seed of a training step as generated kernels: ``embedding`` and
``pick`` (``kernels.lookup_kernel``: one gather of the rank's block; for a table split along its
indexed dim, the masked local lookup through the rank's row positions, an index of a row another
rank holds giving 0) and ``grad_seed`` (``kernels.fill_kernel`` writing 1).

Without a GPU: every variant (each dtype, masked or not, 16-byte units or not) compiles with
NVRTC for sm_90; the lookup steps of vocab-split (even, uneven, cyclic), H-split, batch-split,
Partial and whole plans (and random extractions of their e-graphs) list these kernels; every
local step of the tiny GPT-2 training plan (tp 2, ``scripts/gpu_train_check.py``'s) but its
matmuls and views runs on kernels.  On a GPU (skipped without one): each step equals its torch
step exactly (outputs pre-filled with NaN), indices outside ``[0, V)`` (negative, past V, beyond
2^31) give 0 without reading outside the table, empty blocks give empty results, the plans
simulate like the reference and the training plan like its CPU simulation.
"""

from __future__ import annotations

import random

import pytest
import torch

import reshard as rs
from reshard.codegen import kernels as K
from reshard.codegen.program import Step
from reshard.ir import Inner, Root, TensorSharding
from reshard.ir.errors import ReshardError
from reshard.ir.ops import op_kind
from reshard.plan import Saturated
from reshard.runtime.local_ops import run_local
from reshard.runtime.simulator import simulate

from reshard.testing import programs as P
from reshard.testing.kernel_check import assert_cubin, kernel_cache, operands, torch_step  # noqa: F401

M2 = rs.DeviceMesh([0, 1], ("tp",))
M4 = rs.DeviceMesh([0, 1, 2, 3], ("tp",))
M2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
GATHERS = ("embedding", "pick")
NEW = (*GATHERS, "grad_seed")
MOVED = ("float32", "bfloat16", "float16", "float64")


def _embedding(mesh: rs.DeviceMesh, vocab: int, width: int, dtype: str, table: object, ids: object = None,
               tokens: tuple[int, ...] = (3, 5)) -> rs.Fusion:
    f = rs.Fusion()
    w = f.input("w", (vocab, width), dtype, mesh, table)
    i = f.input("ids", tokens, "int64", mesh, ids)
    f.output(f.embedding(w, i), [rs.Replicate()] * mesh.ndim)
    return f


def _pick(mesh: rs.DeviceMesh, vocab: int, dtype: str, x: object, index: object = None) -> rs.Fusion:
    f = rs.Fusion()
    xs = f.input("x", (6, vocab), dtype, mesh, x)
    i = f.input("i", (6,), "int64", mesh, index)
    f.output(f.pick(xs, i), [rs.Replicate()] * mesh.ndim)
    return f


def _cyclic() -> rs.Fusion:
    """A loop-domain (cyclic) split of V: the rank's rows are not a block."""
    f = rs.Fusion()
    v = 16
    w = f.input("w", (v, 4), "float32", M2, TensorSharding(M2, (v, 4), (Inner(Root(0, v), v // 2),)))
    ids = f.input("ids", (4, 8), "int64", M2, [rs.Replicate()])
    f.output(f.embedding(w, ids), [rs.Replicate()])
    return f


BUILDERS = {
    "embedding_lookups": P.embedding_lookups, "pick_lookups": P.pick_lookups, "training_lookups": P.training_lookups,
    "cyclic": _cyclic,
    "emb_vocab_uneven": lambda: _embedding(M4, 15, 6, "float32", [rs.Shard(0)]),
    "emb_vocab_bf16": lambda: _embedding(M2, 16, 8, "bfloat16", [rs.Shard(0)]),
    "emb_h_f64": lambda: _embedding(M2, 7, 6, "float64", [rs.Shard(1)]),
    "emb_tokens_uneven": lambda: _embedding(M4, 8, 8, "float16", [rs.Replicate()], [rs.Shard(0)], (3,)),
    "emb_open_2x2": lambda: _embedding(M2x2, 15, 8, "float32", None, None),
    "pick_vocab_uneven": lambda: _pick(M4, 15, "float32", [rs.Shard(1)]),
    "pick_vocab_bf16": lambda: _pick(M2, 16, "bfloat16", [rs.Shard(1)]),
    "pick_batch": lambda: _pick(M2, 7, "float16", [rs.Shard(0)], [rs.Shard(0)]),
    "pick_open_2x2": lambda: _pick(M2x2, 9, "float32", None, None),
}


def _plans(build) -> list[rs.Plan]:
    """The chosen plan and two random extractions of its e-graph (other lookup strategies)."""
    f = build()
    sat = Saturated.build(f, rs.CostProfile(), rs.Limits())
    rng = random.Random(5)
    return [rs.optimize(f), *(sat.plan(perturb=rng) for _ in range(2))]


def _program_inputs(plan: rs.Plan, inputs: dict[str, torch.Tensor], device: str = "cpu"
                    ) -> dict[int, dict[str, torch.Tensor]]:
    """Each rank's program inputs on ``device``, as ``Plan.simulate`` makes them (uneven inputs
    padded to their blocks)."""
    per_rank = plan.shard_inputs(inputs, torch.Generator().manual_seed(0))
    return {r: dict(plan.plan_locals(r, {k: v.to(device) for k, v in bufs.items()})) for r, bufs in per_rank.items()}


def test_lookup_and_fill_kernel_specs():
    ks = K.lookup_kernel(15, 8, 0, 16, "float32", True, vectorize=True)
    assert ks.kind == "lookup" and ks.params == ("out:ptr", "table:ptr", "idx:ptr", "pos:ptr")
    assert "uint4" in ks.source and "pos[id]" in ks.source  # 32-byte rows: 16-byte units
    assert "unsigned long long" in K.lookup_kernel(15, 6, 0, 16, "float32", True, vectorize=True).source  # 8-byte
    plain = K.lookup_kernel(15, 8, 0, 16, "float32", False)
    assert plain.params == ("out:ptr", "table:ptr", "idx:ptr") and "pos" not in plain.source
    assert plain.name != K.lookup_kernel(15, 8, 0, 17, "float32", False).name  # the extent is baked in
    assert K.lookup_kernel(6, 1, 16, 16, "bfloat16", False).name == K.lookup_kernel(6, 1, 16, 16, "float16", False).name
    with pytest.raises(ReshardError, match="negative"):
        K.lookup_kernel(-1, 8, 0, 16, "float32", False)
    one = K.fill_kernel(1, "bfloat16", 1.0)
    assert one.kind == "fill" and one.params == ("out:ptr",) and "16256ull" in one.source  # 0x3f80
    assert K.fill_kernel(4, "float32").name != K.fill_kernel(4, "float32", 1.0).name
    with pytest.raises(ReshardError, match="negative"):
        K.fill_kernel(-1, "float32")


@pytest.mark.parametrize("dtype", MOVED)
def test_lookup_and_fill_kernels_compile(dtype, kernel_cache):
    cases = [K.lookup_kernel(15, width, 0, 16, dtype, masked, vectorize=vec)
             for width in (8, 6, 1) for masked in (False, True) for vec in (False, True)]
    cases += [K.lookup_kernel(6, 1, 15, 15, dtype, masked) for masked in (False, True)]  # pick
    cases += [K.lookup_kernel(0, 8, 0, 16, dtype, True), K.lookup_kernel(2**20, 4096, 0, 2**17, dtype, True)]
    cases += [K.fill_kernel(1, dtype, 1.0), K.fill_kernel(1000, dtype)]
    for ks in {k.name: k for k in cases}.values():
        assert_cubin(ks)


@pytest.mark.parametrize("name", BUILDERS)
def test_lookup_steps_have_kernels_that_compile(name, kernel_cache):
    from reshard.runtime.gpu_local import step_kernels

    seen: dict[str, K.KernelSource] = {}
    fops = set()

    def record(step, env, rank):
        ks = step_kernels(step, env, rank)
        if step.attr("fop") in NEW:
            assert {"lookup" if step.attr("fop") in GATHERS else "fill"} <= {k.kind for k in ks}, step
            fops.add(step.attr("fop"))
        seen.update((k.name, k) for k in ks)
        return run_local(step, env, rank)

    build = BUILDERS[name]
    f = build()
    for plan in _plans(build):
        simulate(plan.program, _program_inputs(plan, P.random_inputs(f)), record)
    assert fops & set(GATHERS), fops
    for ks in seen.values():
        if ks.kind in ("lookup", "fill"):
            assert_cubin(ks)


def _training_plan() -> rs.TrainingPlan:
    pytest.importorskip("transformers")
    from tests.train.test_train import MESHES, plan_for

    return plan_for("gpt2", MESHES["tp2"])


def _training_inputs(tp: rs.TrainingPlan) -> dict[str, torch.Tensor]:
    from reshard.testing.train_models import batch, build, plan_inputs

    return plan_inputs(tp, build("gpt2"), batch(0))


def _is_view(step: Step, env: dict) -> bool:
    """A step that runs as no kernel: not an op, an op whose cost class is a view, or one whose
    result is a view of its operand on these inputs (``gpu_local.a_view``: a slice of whole outer
    rows, ...)."""
    from reshard.runtime.gpu_local import a_view

    if step.attr("op") != "apply":
        return True
    fop = step.attr("fop")
    return fop != "pointwise" and (op_kind(fop).cost == "view" or a_view(step, [env[b] for b in step.ins]))


@pytest.mark.hf
def test_training_plan_local_steps_are_kernels(kernel_cache):
    """GPT-2 (tiny, tp 2; ``scripts/gpu_train_check.py``'s plan): every local step but the
    matmuls (cuBLAS), the fused attention and its gradient (torch's SDPA kernels), views (a slice of
    whole outer rows too: ``gpu_local.a_view``) and the
    scatters that add into their summand (``codegen.scatter_add``: torch's ``scatter_add_`` on the
    GPU, no generated kernel yet) lists kernels, the lookups, the seed and the labels' int64
    ignore_index arithmetic included; their kernels compile."""
    from reshard.runtime.gpu_local import has_kernel, step_kernels

    tp = _training_plan()
    seen: dict[str, K.KernelSource] = {}
    ran: set[str] = set()

    def record(step, env, rank):
        out = run_local(step, env, rank)
        fop = step.attr("fop")
        accumulates = fop in ("unpick", "embedding_grad") and op_kind(fop).accumulator(step) is not None
        if not _is_view(step, env) and has_kernel(fop) and not accumulates:
            ks = step_kernels(step, env, rank)
            assert ks, step
            ran.add(step.attr("fop"))
            if step.attr("fop") in NEW or any(env[b].dtype == torch.int64 for b in step.ins):
                seen.update((k.name, k) for k in ks)
        return out

    plan = tp.plan
    simulate(plan.program, _program_inputs(plan, _training_inputs(tp)), record)
    assert set(NEW) <= ran, ran
    assert any("long long x" in k.source for k in seen.values())  # the labels' int64 arithmetic
    for ks in seen.values():
        assert_cubin(ks)


# ---- on a GPU ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", BUILDERS)
def test_gpu_lookups_equal_torch(name, kernel_cache):
    from reshard.runtime.gpu_local import gpu_local_step, kernel_path

    build = BUILDERS[name]
    f = build()
    inputs = P.random_inputs(f, 3)
    checked = []

    def both(step, env, rank):
        want = torch_step(step, env, rank)
        if step.attr("fop") in NEW:
            assert kernel_path(step, [env[b] for b in step.ins]), step
            for poison in (True, False):  # the second run may replay the first's launch
                got = gpu_local_step(step, operands(step, env), rank, poison=poison)
                assert got.dtype == want.dtype and torch.equal(got, want), step
            checked.append(step.attr("fop"))
        return want

    for plan in _plans(build):
        simulate(plan.program, _program_inputs(plan, inputs, "cuda"), both)
        P.assert_plan_matches_reference(plan, f, inputs, device="cuda")
    assert checked


def _lookup_step(kind: str, table: TensorSharding) -> Step:
    return Step.make("local", "o", ["t", "i"], op="apply", fop=kind, src=table)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GATHERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_indices_outside_the_table_give_zero(kind, dtype, kernel_cache):
    """Indices the op does not allow (negative, V and past it, beyond 2^31; torch raises) give 0
    and read nothing outside the table, on a whole table and on each rank's block of a
    vocab-split one; valid indices read their row."""
    from reshard.runtime.gpu_local import gpu_local_step

    v, rows = 10, 6
    bad = torch.tensor([-1, v, 2**31, 2**40 + 3, -(2**63), 2**63 - 1])
    good = torch.tensor([0, 3, v - 1, 5, 7, 1])
    odd = torch.arange(rows) % 2 == 1
    index = torch.where(odd, good, bad).cuda()
    valid = torch.where(odd, good, 0).cuda()
    shape = (v, 8) if kind == "embedding" else (rows, v)
    full = torch.randn(shape).to(dtype).cuda()
    dim = 0 if kind == "embedding" else 1
    for placements in ([rs.Replicate()], [rs.Shard(dim)]):
        ts = TensorSharding.from_placements(shape, placements, M2)
        for rank in (0, 1):
            lo, n = ts.block_ranges(ts.mesh.coords(rank))[dim]
            block = full.narrow(dim, lo, n)
            got = gpu_local_step(_lookup_step(kind, ts), {"t": block, "i": index}, rank, poison=True)
            want = run_local(_lookup_step(kind, ts), {"t": block, "i": valid}, rank)  # the valid ones
            keep = odd.reshape(rows, *[1] * (got.dim() - 1)).cuda()
            assert torch.equal(got, torch.where(keep, want, torch.zeros((), dtype=dtype, device=got.device)))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", GATHERS)
def test_gpu_empty_blocks(kind, kernel_cache):
    from reshard.runtime.gpu_local import gpu_local_step

    shape = (8, 4) if kind == "embedding" else (0, 8)
    ts = TensorSharding.from_placements((8, 4) if kind == "embedding" else (1, 8), [rs.Replicate()], M2)
    env = {"t": torch.randn(shape).cuda(), "i": torch.zeros(0, dtype=torch.int64).cuda()}
    got = gpu_local_step(_lookup_step(kind, ts), env, 0, poison=True)
    assert got.shape == run_local(_lookup_step(kind, ts), env, 0).shape


@pytest.mark.hf
@pytest.mark.gpu
def test_gpu_training_plan_equals_its_cpu_simulation(kernel_cache):
    """The whole GPT-2 training step (loss and gradients) on kernels against the same plan on
    the CPU (float32: rtol 1e-4, atol 1e-5); no step but the matmuls, the fused attention (torch's
    SDPA kernels) and views leaves the kernel path."""
    from reshard.runtime import gpu_local

    tp = _training_plan()
    inputs = _training_inputs(tp)
    torch_steps = []
    inner = gpu_local.gpu_local_step

    def counting(step, env, rank, **kw):
        if not _is_view(step, env) and gpu_local.has_kernel(step.attr("fop")) and not gpu_local.kernel_path(
                step, [env[b] for b in step.ins]):
            torch_steps.append(step.attr("fop"))
        return inner(step, env, rank, **kw)

    gpu_local.gpu_local_step = counting
    try:
        got = tp.plan.simulate(inputs, device="cuda", generator=torch.Generator().manual_seed(0))
    finally:
        gpu_local.gpu_local_step = inner
    want = tp.plan.simulate(inputs, generator=torch.Generator().manual_seed(0))
    assert not torch_steps, torch_steps
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)

