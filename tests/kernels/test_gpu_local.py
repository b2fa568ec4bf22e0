"""gpu_local_step: the kernels it launches for every example plan compile with NVRTC for
sm_90 (no GPU needed); on a GPU, plans simulated with it match the reference."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("cuda.core")

import reshard as rs  # noqa: E402
from reshard.codegen import nvrtc as N  # noqa: E402
from reshard.codegen.kernels import KernelSource  # noqa: E402
from reshard.codegen.program import Step  # noqa: E402
from reshard.examples import transformer_block  # noqa: E402
from reshard.ir.sharding import unshard  # noqa: E402
from reshard.ir.ops import op_kind  # noqa: E402
from reshard.runtime.gpu_local import a_view, gpu_local_step, has_kernel, kernel_path, step_kernels  # noqa: E402
from reshard.runtime.local_ops import run_local  # noqa: E402
from reshard.runtime.simulator import simulate  # noqa: E402

from reshard.testing import programs as P  # noqa: E402
from reshard.testing.kernel_check import kernel_cache  # noqa: E402,F401


def _bf16_block() -> rs.Fusion:
    return transformer_block(P.MESH1, seq=8, hidden=16, heads=4, dtype="bfloat16")


BUILDERS = [*P.ALL, _bf16_block]
IDS = [b.__name__ for b in BUILDERS]


def _plans() -> list[tuple[str, rs.Fusion, rs.Plan]]:
    out = []
    for b in BUILDERS:
        f = b()
        out.append((b.__name__, f, rs.optimize(f)))
    return out


def simulate_on(plan: rs.Plan, inputs: dict[str, torch.Tensor], local_step, device: str, seed: int = 0
                ) -> tuple[torch.Tensor, ...]:
    """Shard ``inputs`` (on the CPU), run ``plan``'s program on ``device`` with ``local_step``,
    unshard the outputs on the CPU."""
    per_rank = plan.shard_inputs(inputs, torch.Generator().manual_seed(seed))
    per_rank = {r: {k: v.to(device) for k, v in d.items()} for r, d in per_rank.items()}
    outs = simulate(plan.program, per_rank, local_step)
    return tuple(unshard({r: outs[r][buf].cpu() for r in plan.program.mesh_ranks}, ts)
                 for buf, ts in plan.lowered.outputs)


@pytest.fixture(scope="module")
def plans():
    return _plans()


@pytest.mark.slow
def test_plan_kernels_compile_for_sm90(plans, tmp_path, monkeypatch):
    monkeypatch.setenv("RESHARD_KERNEL_CACHE", str(tmp_path / "kcache"))  # really run NVRTC
    N.clear_memory_cache()
    kernels: dict[str, KernelSource] = {}
    used, fallback = Counter(), Counter()

    def record(step, env, rank):
        ks = step_kernels(step, env, rank)
        if step.attr("op") == "apply" and step.attr("fop") not in ("matmul", "reshape"):
            # (a scatter adding into its summand, ``codegen.scatter_add``, runs torch's scatter_add_)
            fop = step.attr("fop")
            acc = "+acc" if fop != "pointwise" and op_kind(fop).accumulator(step) is not None else ""
            if fop != "pointwise" and has_kernel(fop) and a_view(step, [env[b] for b in step.ins]):
                assert not ks  # a view of its contiguous operand: no kernel
                acc = "=view"
            if ks and fop == "pointwise" and any(o[0] == "in_range" for o in step.attr("ops")):
                used[f"moved:{env[step.ins[0]].dtype}"] += 1
            (used if ks or acc == "=view" else fallback)[f"{step.attr('fop')}{acc}:{env[step.ins[0]].dtype}"] += 1
        for k in ks:
            assert kernels.setdefault(k.name, k) == k, f"two kernels named {k.name}"
        return run_local(step, env, rank)

    for name, f, plan in plans:
        simulate_on(plan, P.random_inputs(f), record, "cpu")
    # every kernelizable fop of the example plans went through kernels
    kinds = {k.split(":")[0] for k in used}  # (moved: pads and cats read shifted, fuse.moved_reads)
    assert kinds >= {"unary", "binary", "pointwise", "set", "permute", "slice", "reduce"}, used
    assert kinds & {"pad", "moved"} and kinds & {"cat", "moved"}, used
    # the only fallbacks there: layout_ops' cast to float64 (no fp64 arithmetic kernels) and the op
    # kinds that declare no generated kernel (their steps run with torch on the GPU)
    assert {k for k in fallback if has_kernel(k.split(":")[0])} <= {"cast:torch.float32",
                                                                    "embedding_grad+acc:torch.float32"}, fallback
    for ks in kernels.values():
        cubin = N.compile_kernel(ks, "sm_90")
        assert cubin[:4] == b"\x7fELF" and ks.name.encode() in cubin
    assert N.cache_stats()["compiles"] == len(kernels) > 20
    N.clear_memory_cache()


def _step(fop: str, n_in: int = 1, **attrs) -> Step:
    return Step.make("local", "o", [f"i{k}" for k in range(n_in)], op="apply", fop=fop, **attrs)


def test_fallback_predicates():
    f32, f64 = torch.ones(4, 6), torch.ones(4, 6, dtype=torch.float64)
    assert kernel_path(_step("unary", fn="gelu"), [f32])
    assert kernel_path(_step("unary", fn="sqrt"), [f32])
    assert not kernel_path(_step("unary", fn="erfinv"), [f32])  # no kernel op
    chain = (("add", "in0", "in1"), ("cast", "t0", "bfloat16"), ("gelu", "t1"))
    assert kernel_path(_step("pointwise", 2, ops=chain, dtype="bfloat16"), [f32, f32])
    assert not kernel_path(_step("pointwise", 2, ops=chain, dtype="float64"), [f32, f32])  # fp64 result
    assert not kernel_path(_step("pointwise", 2, ops=chain[:1], dtype="float32"), [f32, f32[:, :3]])  # shapes
    assert not kernel_path(_step("pointwise", 1, ops=(("cast", "in0", "float64"),), dtype="float32"), [f32])
    assert not kernel_path(_step("unary", fn="exp"), [f64])  # no fp64 arithmetic
    assert not kernel_path(_step("binary", 2, fn="add"), [f32, torch.ones(6)])  # broadcasting
    assert kernel_path(_step("binary", 2, fn="mul"), [f32, f32.bfloat16()])
    assert kernel_path(_step("permute", perm=(1, 0)), [f64])  # data movement: any dtype
    assert not kernel_path(_step("cat", 2, dim=0), [f32, f64])
    assert not kernel_path(_step("reduce", fn="max", dims=(0,)), [torch.ones(0, 3)])
    assert not kernel_path(_step("matmul", 2), [f32, f32.T])  # cuBLAS, not a kernel
    assert step_kernels(_step("reduce", fn="sum", dims=(0, 2)), {"i0": torch.ones(2, 3, 4)}, 0)  # permute + reduce
    # a result that is a view of its contiguous operand (``shares_operand``) is that view: no kernel
    x3 = torch.ones(3, 4, 5)
    rows = _step("slice", dim=0, start=1, stop=2)
    assert not kernel_path(rows, [x3]) and not step_kernels(rows, {"i0": x3}, 0)
    assert gpu_local_step(rows, {"i0": x3}, 0).data_ptr() == x3[1:].data_ptr()
    assert kernel_path(_step("slice", dim=2, start=1, stop=3), [x3])  # a strided copy
    assert not kernel_path(_step("permute", perm=(1, 0, 2)), [torch.ones(1, 4, 5)])  # moves an extent-1 dim
    assert kernel_path(_step("permute", perm=(1, 0, 2)), [x3])
    assert kernel_path(rows, [torch.ones(3, 5, 4).transpose(1, 2)])  # not contiguous: copied
    # gpu_local_step on CPU tensors is run_local
    s = _step("unary", fn="exp")
    assert torch.equal(gpu_local_step(s, {"i0": f32}, 0), torch.exp(f32))



def _poisoned(step, env, rank):
    return gpu_local_step(step, env, rank, poison=True)


@pytest.mark.gpu
@pytest.mark.parametrize("idx", range(len(BUILDERS)), ids=IDS)
def test_gpu_plans_match_reference(plans, idx):
    name, f, plan = plans[idx]
    inputs = P.random_inputs(f, seed=idx)
    outs = simulate_on(plan, inputs, _poisoned, "cuda", seed=idx)
    refs = rs.run_reference(f, inputs)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and o.dtype == r.dtype
        assert not torch.isnan(o).any(), f"{name}: unwritten (NaN) output elements"
        if r.dtype == torch.bfloat16:  # two bf16 computations, rounded differently: compare norms
            err = ((o.double() - r.double()).norm() / r.double().norm()).item()
            assert err <= 2e-2, f"{name}: relative error {err:.2e}"
        else:
            torch.testing.assert_close(o, r, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("idx", range(len(BUILDERS)), ids=IDS)
def test_replayed_launches_equal_the_first_run(plans, idx, monkeypatch):
    """A step run as one kernel is replayed from its recorded launch the next time
    (``gpu_local._ONE_KERNEL``): the second run of a plan must give exactly the first's
    outputs, and every one-kernel step must then be a replay."""
    from reshard.runtime import gpu_local as G

    class Counting(dict):
        hits = 0

        def get(self, k, default=None):
            v = super().get(k, default)
            Counting.hits += v is not None
            return v

    monkeypatch.setattr(G, "_ONE_KERNEL", Counting())
    name, f, plan = plans[idx]
    inputs = P.random_inputs(f, seed=idx)
    first = simulate_on(plan, inputs, gpu_local_step, "cuda", seed=idx)
    hits_first, recorded = Counting.hits, len(G._ONE_KERNEL)
    second = simulate_on(plan, inputs, gpu_local_step, "cuda", seed=idx)
    for a, b in zip(first, second):
        assert torch.equal(a, b), name
    assert Counting.hits - hits_first == hits_first + recorded  # the first run's records now replay too


def test_in_place_operand_follows_the_allocation_plan():
    """A fused chain marked ``into`` (``codegen.alloc``) writes into that operand where the
    kernel can (contiguous, the result's shape and dtype, not broadcast, no other view of its
    storage among the operands); elsewhere a new buffer."""
    from reshard.runtime.gpu_local import in_place_operand
    chain = (("add", "in0", "in1"), ("gelu", "t0"))
    x, y = torch.ones(4, 6), torch.ones(4, 6)
    assert in_place_operand(_step("pointwise", 2, ops=chain, dtype="float32", into=1), [x, y]) is y
    assert in_place_operand(_step("pointwise", 2, ops=chain, dtype="float32"), [x, y]) is None
    assert in_place_operand(_step("pointwise", 2, ops=chain, dtype="bfloat16", into=0), [x, y]) is None
    assert in_place_operand(_step("pointwise", 2, ops=chain, dtype="float32", into=0), [x.T, y.T]) is None
    assert in_place_operand(_step("pointwise", 2, ops=chain, dtype="float32", into=0), [x, x[:, :6]]) is None
    assert in_place_operand(_step("pointwise", 2, ops=chain, dtype="float32", into=0), [x, x]) is x


@pytest.mark.gpu
def test_a_chain_marked_into_runs_in_place_on_the_gpu():
    """On the GPU the kernel writes into the marked operand (its storage, no new buffer), with
    the values of the step run on new memory; the replayed launch does the same."""
    chain = (("add", "in0", "in1"), ("gelu", "t0"))
    step = _step("pointwise", 2, ops=chain, dtype="float32", into=0)
    for _ in range(2):  # the first run, then its replay
        x, y = torch.randn(64, 96, device="cuda"), torch.randn(64, 96, device="cuda")
        want = torch.nn.functional.gelu(x + y)
        out = gpu_local_step(step, {"i0": x, "i1": y}, 0)
        assert out.data_ptr() == x.data_ptr()
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


#: cross entropy's vocabulary gradient over rows of an odd extent (GPT-2's 50257 columns, here
#: 37): ``softmax(x) * g`` with ``g`` added at the label's column: bf16 rows, per-row float32
#: max and scale, int64 labels (``codegen.unpick_chains``' ``at_index``)
_VOCAB_GRAD = (("cast", "in1", "float32"), ("sub", "t0", "in2"), ("exp", "t1"), ("mul", "in0", "t2"),
               ("add", "t3", "in3"), ("at_index", 1, "in4", "t4", "t3"), ("cast", "t5", "bfloat16"))


def _vocab_grad_step(rows: int, cols: int) -> Step:
    return _step("pointwise", 5, ops=_VOCAB_GRAD, dtype="bfloat16", shape=(rows, cols),
                 bcast=(((), ()), (), ((rows,), (0,)), ((rows,), (0,)), ((rows,), (0,))))


def test_rows_of_an_odd_extent_take_the_vector_path(kernel_cache):
    """A pointwise kernel whose broadcast inputs index rows of an extent no multiple of the
    vector width still moves 16 bytes at a time (``pointwise_vector_ok``): a vector within one
    row reads the row's operands once, one crossing into the next reads each lane's own; it
    compiles for sm_90.  A shift along such rows keeps the scalar path."""
    from reshard.codegen import kernels as K
    from reshard.testing.kernel_check import assert_cubin
    ins = ["float32", "bfloat16", "float32", "float32", "int64"]
    bcast = _vocab_grad_step(4096, 50257).attr("bcast")
    assert K.pointwise_vector_ok(ins, "bfloat16", 4096 * 50257, (4096, 50257), bcast)
    ks = K.pointwise_kernel(ins, "bfloat16", _VOCAB_GRAD, (4096, 50257), bcast, vectorize=True)
    assert "if (c1 + 7u < 50257u)" in ks.source and ks.elems_per_thread == 8
    assert_cubin(ks)
    assert not K.pointwise_vector_ok(["bfloat16"] * 2, "bfloat16", 8 * 17, (8, 17), (((8, 17), (0, 1), ((1, 8),)), ()))


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols", [(16, 37), (5, 8 * 7 + 1), (64, 50257 // 64)])
def test_rows_of_an_odd_extent_match_the_torch_step(rows, cols):
    """The vector path over rows that vectors cross computes what the step's torch ops compute
    (``run_local``), the labels' columns included, at every row seam."""
    g = torch.Generator().manual_seed(rows * cols)
    x = torch.randn(rows, cols, generator=g).to(torch.bfloat16)
    xs = [torch.tensor(0.25), x, x.float().amax(dim=1), torch.randn(rows, generator=g),
          torch.randint(0, cols, (rows,), generator=g)]
    step = _vocab_grad_step(rows, cols)
    want = run_local(step, {f"i{k}": v for k, v in enumerate(xs)}, 0)
    got = gpu_local_step(step, {f"i{k}": v.cuda() for k, v in enumerate(xs)}, 0)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-2, atol=1e-3)  # (expf and exp: an ulp apart at most)
