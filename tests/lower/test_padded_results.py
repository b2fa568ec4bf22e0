"""A pad of a pointwise step's result is that step writing the padded buffer (``codegen.padded_results``).

* A misaligned bf16 matmul's operand made by a fused chain (with a broadcast input, directly or
  through a reshape keeping the last dim) is written padded by the chain's kernel: no ``pad``
  step reads a pointwise result, the plan equals the plan without the pass bit for bit (CPU
  local steps, and on a GPU the generated kernels) and the reference closely; its kernels
  compile for sm_90 on both paths.
* Where the pad must stay (the result is also read elsewhere) it does.
* The kernel's vector path reads an input n wide along the innermost dim, unshifted, in a
  wider result whose vectors can straddle n: lane by lane from the straddling vector on
  (``kernels._cut_at``); the path is refused for a shift that is no multiple of the width.
"""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.codegen import kernels as K
from reshard.codegen import lower as L
from reshard.runtime.gpu_local import gpu_local_step
from reshard.runtime.local_ops import run_local
from reshard.runtime.simulator import simulate
from reshard.testing import programs as P
from reshard.testing.kernel_check import kernel_cache  # noqa: F401 (a fixture)

from .test_fuse import _compiled_kernels


def _grad_like(reshaped: bool, read_elsewhere: bool = False, vocab: int = 1001) -> rs.Fusion:
    """``exp(x - max) * 0.5`` over ``[4, vocab]`` bf16 (the max broadcast along the vocab), read by
    a matmul whose K (the vocab) is misaligned: cross entropy's gradient into the lm head."""
    f = rs.Fusion()
    mesh = P.MESH1
    x = f.input("x", (4, vocab), "bfloat16", mesh)
    m = f.input("m", (4, 1), "bfloat16", mesh)
    w = f.input("w", (vocab, 64), "bfloat16", mesh)
    g = f.scale(f.exp(f.sub(x, f.broadcast_to(m, (4, vocab)))), 0.5)
    if reshaped:
        g = f.reshape(g, (2, 2, vocab))
    f.output(f.matmul(g, w, name="y"), [rs.Replicate()])
    if read_elsewhere:
        f.output(f.neg(g, name="n"), [rs.Replicate()])
    return f


def _without_pass(monkeypatch: pytest.MonkeyPatch, f: rs.Fusion) -> rs.Plan:
    with monkeypatch.context() as mp:
        mp.setattr(L, "pads_into_producers", lambda steps, *_: steps)
        return rs.optimize(f)


def _pads_of_pointwise(plan: rs.Plan) -> list:
    """The steps padding a pointwise step's result: a ``pad`` step, or a pointwise step reading
    it clamped (``fuse.moved_reads``' form of a pad of an elementwise chain)."""
    made_by = {s.out: s for s in plan.steps}

    def pointwise(b: str) -> bool:
        return made_by.get(b) is not None and made_by[b].attr("fop") == "pointwise"

    return [s for s in plan.steps if s.kind == "local" and (
        s.attr("fop") == "pad" and pointwise(s.ins[0])
        or s.attr("fop") == "pointwise" and any(len(spec) > 2 and pointwise(b)
                                                for b, spec in zip(s.ins, s.attr("bcast") or ())))]


def _same_outputs(a: rs.Plan, b: rs.Plan, inputs: dict[str, torch.Tensor], local) -> None:
    ra = simulate(a.program, a.shard_inputs(inputs), local)
    rb = simulate(b.program, b.shard_inputs(inputs), local)
    for (ba, _), (bb, _) in zip(a.lowered.outputs, b.lowered.outputs):
        for r in a.program.mesh_ranks:
            assert torch.equal(ra[r][ba], rb[r][bb])


@pytest.mark.parametrize("reshaped", [False, True])
def test_the_chain_writes_the_padded_operand(reshaped, monkeypatch, tmp_path):
    f = _grad_like(reshaped)
    plan, plain = rs.optimize(f), _without_pass(monkeypatch, f)
    assert _pads_of_pointwise(plain) and not _pads_of_pointwise(plan)
    (pw,) = [s for s in plan.steps if s.kind == "local" and s.attr("fop") == "pointwise"]
    assert tuple(pw.attr("shape"))[-1] == 1008 and pw.attr("ops")[-1] == ("in_range", 1, 0, 1001, f"t{len(pw.attr('ops')) - 2}", 0)
    inputs = P.random_inputs(f)
    _same_outputs(plan, plain, inputs, run_local)
    for o, r in zip(plan.simulate(inputs), rs.run_reference(f, inputs)):
        torch.testing.assert_close(o, r, atol=3e-2, rtol=3e-2)
    kernels = _compiled_kernels(plan, inputs, monkeypatch, tmp_path, only=[pw])
    assert any("nv = n /" in ks.source for ks in kernels)  # the vector path


def test_a_result_read_elsewhere_keeps_its_pad(monkeypatch):
    f = _grad_like(False, read_elsewhere=True)
    assert _pads_of_pointwise(rs.optimize(f))


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [1001, 1003, 1016])
def test_the_padded_kernel_equals_the_cpu_steps_on_a_gpu(vocab, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    f = _grad_like(True, vocab=vocab)
    plan = rs.optimize(f)
    inputs = P.random_inputs(f)
    got = simulate(plan.program, {r: {k: v.cuda() for k, v in env.items()} for r, env in
                                  plan.shard_inputs(inputs).items()}, gpu_local_step)
    want = simulate(plan.program, plan.shard_inputs(inputs), run_local)
    for b, _ in plan.lowered.outputs:
        torch.testing.assert_close(got[0][b].cpu(), want[0][b], atol=0, rtol=0)


@pytest.mark.parametrize("n,width", [(1001, 1008), (5, 16), (24, 28)])
def test_the_vector_path_reads_a_narrower_input_lane_by_lane_past_its_extent(n, width, kernel_cache):
    from reshard.codegen import nvrtc as N
    shape = (3, width)
    bcast = (((3, n), (0, 1), ((1, 0),)),)
    ops = (("neg", "in0"), ("in_range", 1, 0, n, "t0", 0))
    assert K.pointwise_vector_ok(["bfloat16"], "bfloat16", 3 * width, shape, bcast) == (3 * width % 8 == 0)
    if 3 * width % 8:
        return
    ks = K.pointwise_kernel(["bfloat16"], "bfloat16", ops, shape, bcast, vectorize=True)
    assert f"if (c1 + 7u < {min(n, width)}u)" in ks.source
    assert ks.name.encode() in N.compile_kernel(ks, "sm_90")


def test_the_vector_path_still_needs_a_shift_a_multiple_of_the_width():
    shape = (3, 16)
    assert not K.pointwise_vector_ok(["bfloat16"], "bfloat16", 48, shape, (((3, 16), (0, 1), ((1, 3),)),))
    assert K.pointwise_vector_ok(["bfloat16"], "bfloat16", 48, shape, (((3, 16), (0, 1), ((1, 8),)),))


def test_gpt2s_vocab_gradient_is_written_padded():
    """A tiny bf16 GPT-2 with a misaligned vocabulary (1001), planned for training: cross
    entropy's backward kernel writes ``dlogits`` padded for the lm head's GEMMs (through the
    reshape to ``[b, s, vocab]``): no pad step of a pointwise result is left."""
    import transformers as T

    cfg = T.GPT2Config(n_layer=1, n_embd=64, n_head=4, n_positions=32, vocab_size=1001, resid_pdrop=0.0,
                       embd_pdrop=0.0, attn_pdrop=0.0)
    model = T.GPT2LMHeadModel(cfg).to(torch.bfloat16)
    ids = torch.randint(0, 1001, (2, 16), generator=torch.Generator().manual_seed(0))
    plan = rs.plan_training(model, mesh=rs.DeviceMesh([0], ("tp",)), example_kwargs={"input_ids": ids, "labels": ids})
    p = plan.plan
    assert not _pads_of_pointwise(p)
    padded = [s for s in p.steps if s.attr("fop") == "pointwise" and tuple(s.attr("shape") or ())[-1:] == (1008,)]
    assert padded and all(s.attr("ops")[-1][:4] == ("in_range", 1, 0, 1001) for s in padded)
