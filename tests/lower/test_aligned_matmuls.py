"""``codegen.aligned_matmuls``: a 16-bit matmul whose operands or result read an extent that is no
multiple of 16 bytes contiguously reads zero-padded operands (``pad`` steps) and its result is
cut back (``slice`` steps): every matrix handed to ``torch.matmul`` reads aligned runs at
aligned strides and the steps compute the matmul's result; a buffer read by several such
matmuls of one phase, directly or through reshapes keeping its last dim, is padded once;
aligned and 4-byte matmuls are left as they are.  On the GPU the same steps run through the
kernel path (the pad and slice steps' row kernel and block copy)."""

from __future__ import annotations

import pytest
import torch

from reshard.codegen.aligned_matmuls import align_matmuls
from reshard.codegen.program import Step
from reshard.runtime.gpu_local import gpu_local_step
from reshard.runtime.local_ops import run_local


def _mm(out: str, a: str, b: str, transposed: tuple[bool, bool] = (False, False)) -> Step:
    return Step.make("local", out, [a, b], op="apply", fop="matmul", transposed=transposed)


def _runs(x: torch.Tensor) -> tuple[int, int]:
    """(the extent read contiguously, the stride between those runs) of ``x``'s matrices."""
    if x.stride(-1) == 1:
        return x.shape[-1], x.stride(-2)
    return x.shape[-2], x.stride(-1)


def _walk(steps: list[Step], env: dict[str, torch.Tensor], monkeypatch, device: str) -> list[int]:
    """Run ``steps`` on ``env`` (in place); the contiguous extents and leading dimensions of
    every matrix torch.matmul was given."""
    seen: list[int] = []
    inner = torch.matmul

    def recording(a, b):
        seen.extend(v for t in (a, b) for v in _runs(t))
        out = inner(a, b)
        seen.extend(_runs(out))
        return out

    monkeypatch.setattr(torch, "matmul", recording)
    step_fn = gpu_local_step if device == "cuda" else run_local
    for s in steps:
        env[s.out] = step_fn(s, env, 0)
    return seen


def _meta(**shapes: tuple[int, ...]) -> dict[str, tuple[tuple[int, ...], str]]:
    return {k: (v, "bfloat16") for k, v in shapes.items()}


CASES = {  # name: (lhs shape, rhs shape, transposed): the lm head and its two gradients, batched
    "wide result": ((24, 32), (37, 32), (False, True)),  # h @ W^T, W [vocab, hidden]
    "misaligned contraction": ((24, 37), (37, 32), (False, False)),  # dlogits @ W
    "lhs read transposed": ((24, 37), (24, 16), (True, False)),  # dlogits^T @ h
    "batched": ((3, 24, 37), (3, 37, 40), (False, False)),
    "batched lhs read transposed": ((3, 37, 21), (3, 37, 40), (True, False)),  # M and K misaligned, M contiguous
    "rhs read transposed": ((24, 37), (16, 37), (False, True)),  # K read contiguously in both
}


def _result_shape(a: tuple[int, ...], b: tuple[int, ...], t: tuple[bool, bool]) -> tuple[int, ...]:
    m = a[-1] if t[0] else a[-2]
    n = b[-2] if t[1] else b[-1]
    return tuple(torch.broadcast_shapes(a[:-2], b[:-2])) + (m, n)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_misaligned_bf16_matmuls_read_padded_operands(case, device, monkeypatch):
    a_shape, b_shape, t = CASES[case]
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(*s, generator=g).to(torch.bfloat16).to(device) for s in (a_shape, b_shape))
    meta = _meta(a=a_shape, b=b_shape, y=_result_shape(a_shape, b_shape, t))
    steps = align_matmuls([_mm("y", "a", "b", t)], {"a", "b", "y"}, meta, set())
    assert [s.attr("fop") for s in steps].count("matmul") == 1 and len(steps) > 1
    env = {"a": a, "b": b}
    seen = _walk(steps, env, monkeypatch, device)
    want = (a.float().transpose(-1, -2) if t[0] else a.float()) @ (b.float().transpose(-1, -2) if t[1] else b.float())
    got = env["y"]
    assert got.shape == want.shape and tuple(got.shape) == meta["y"][0]
    assert seen and all(ld % 8 == 0 for ld in seen), seen
    assert all(tuple(env[s.out].shape) == meta[s.out][0] for s in steps)
    torch.testing.assert_close(got.float().cpu(), want.cpu(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype, shapes", [("bfloat16", [(24, 32), (32, 40)]), ("float32", [(24, 37), (37, 5)]),
                                           ("bfloat16", [(24, 37), (37, 1)])],
                         ids=["aligned bf16", "float32", "matrix-vector"])
def test_aligned_or_wide_element_matmuls_are_left_as_they_are(dtype, shapes):
    meta = {"a": (shapes[0], dtype), "b": (shapes[1], dtype), "y": ((shapes[0][0], shapes[1][1]), dtype)}
    steps = [_mm("y", "a", "b")]
    assert align_matmuls(steps, {"a", "b", "y"}, meta, set()) == steps


def _dlogits_program() -> tuple[list[Step], dict]:
    """GPT-2's lm head backward in small: ``d`` [2, 12, 37] (the vocabulary gradient, made by a
    cast), read by the input gradient ``d @ W`` and, reshaped to [24, 37], by the weight gradient
    ``r^T @ h``."""
    steps = [
        Step.make("local", "d", ["d32"], op="apply", fop="cast", dtype="bfloat16"),
        _mm("dh", "d", "w"),
        Step.make("local", "r", ["d"], op="apply", fop="reshape", shape=(24, 37)),
        _mm("dw", "r", "h", (True, False)),
    ]
    meta = _meta(d32=(2, 12, 37), d=(2, 12, 37), w=(37, 16), dh=(2, 12, 16), r=(24, 37), h=(24, 16), dw=(37, 16))
    meta["d32"] = ((2, 12, 37), "float32")
    return steps, meta


@pytest.mark.parametrize("phases", ["one phase", "two phases"])
def test_a_buffer_read_by_two_matmuls_of_one_phase_is_padded_once(phases, monkeypatch):
    """``d`` is padded once for both gradients (the reshape of it that only the weight gradient
    read is dropped: it reshapes the padded buffer); with the two matmuls in different phases
    each pads it (no padded buffer kept across phases)."""
    steps, meta = _dlogits_program()
    backward = {"dw", "r"} if phases == "two phases" else set()
    got = align_matmuls(steps, {"d32", "w", "h", "dh", "dw"}, meta, backward)
    pads_of_d = [s for s in got if s.attr("fop") == "pad" and s.ins == ("d",)]
    assert len(pads_of_d) == (1 if phases == "one phase" else 2)
    assert "r" not in {s.out for s in got}
    if backward:  # (the steps made for the weight gradient are in its phase)
        assert {s.out for s in got[got.index(next(s for s in got if s.out == "dh")) + 1:]} <= backward
    g = torch.Generator().manual_seed(1)
    env = {k: torch.randn(*meta[k][0], generator=g) for k in ("d32", "w", "h")}
    env["w"], env["h"] = env["w"].to(torch.bfloat16), env["h"].to(torch.bfloat16)
    ref = dict(env)
    _walk(steps, ref, monkeypatch, "cpu")
    seen = _walk(got, env, monkeypatch, "cpu")
    assert all(ld % 8 == 0 for ld in seen), seen
    for k in ("dh", "dw"):
        assert env[k].shape == ref[k].shape
        torch.testing.assert_close(env[k].float(), ref[k].float(), rtol=2e-2, atol=2e-2)


def test_the_steps_of_a_multi_mesh_program_run_on_the_matmuls_mesh():
    """In a multi-mesh program (steps placed with ``on``) the pads, reshapes and cuts run on the
    mesh of the matmul that reads them."""
    steps, meta = _dlogits_program()
    steps = [Step.make(s.kind, s.out, s.ins, **dict(s.attrs), on=1) for s in steps]
    got = align_matmuls(steps, {"d32", "w", "h", "dh", "dw"}, meta, set())
    assert {s.attr("fop") for s in got} >= {"pad", "slice", "reshape", "matmul"}
    assert all(s.attr("on") == 1 for s in got)
