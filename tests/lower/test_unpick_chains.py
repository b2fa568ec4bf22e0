"""``codegen.unpick_chains``: cross entropy's vocab gradient ``softmax * dlse + unpick(dnll, target)``,
reshaped and cast to bf16 for the lm head's GEMMs, is one pointwise kernel (the unpick an
``at_index`` select, the cast before the view); on a vocab-split block the masked scatter stays.
Fused plans compute bit for bit what the unfused steps compute (CPU), match the reference, and
their kernels compile for sm_90 and match the CPU steps on a GPU."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.codegen import lower as L
from reshard.testing import programs as P
from tests.lower import test_fuse as TF


def _vocab_gradient(vocab_split: bool = False, dtype: str = "float32") -> rs.Fusion:
    """``e * s + unpick(g, idx, V)`` over ``[8, V]`` (``s`` a per-row scale), reshaped to
    ``[2, 4, V]``, cast to bf16 and multiplied by a ``[V, 5]`` weight."""
    f = rs.Fusion()
    split = [rs.Shard(1)] if vocab_split else None
    e = f.input("e", (8, 16), dtype, P.MESH1, split)
    s = f.input("s", (8,), dtype, P.MESH1)
    g = f.input("g", (8,), dtype, P.MESH1)
    idx = f.input("idx", (8,), "int64", P.MESH1)
    w = f.input("w", (16, 5), "bfloat16", P.MESH1, [rs.Shard(0)] if vocab_split else None)
    acc = f.mul(e, f.broadcast_to(f.reshape(s, (8, 1)), (8, 16)), name="acc")
    d = f.add(acc, f.unpick(g, idx, 16), name="d")
    y = f.matmul(f.cast(f.reshape(d, (2, 4, 16)), "bfloat16", name="d16"), w, name="y")
    f.output(y, [rs.Partial()] if vocab_split else [rs.Replicate()])
    return f


def _plain(monkeypatch: pytest.MonkeyPatch, f: rs.Fusion) -> rs.Plan:
    """``f`` lowered without the unpick chains and without fusion."""
    with monkeypatch.context() as m:
        for name in ("fuse_pointwise", "unpicks_as_pointwise", "casts_before_reshapes"):
            m.setattr(L, name, lambda steps, *_: steps)
        return rs.optimize(f)


def _inputs(f: rs.Fusion) -> dict[str, torch.Tensor]:
    inputs = P.random_inputs(f)
    inputs["e"][0, 3] = -0.0  # (a -0.0 off the target stays -0.0, as the scatter leaves it)
    return inputs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_vocab_gradient_is_one_kernel(dtype, monkeypatch, tmp_path):
    f = _vocab_gradient(dtype=dtype)
    fused, plain = rs.optimize(f), _plain(monkeypatch, f)
    (pw,) = [s for s in fused.steps if s.attr("fop") == "pointwise"]
    names = [o[0] for o in pw.attr("ops")]
    assert names[0] == "mul" and "at_index" in names and names[-1] == ("cast" if dtype == "float32" else "at_index")
    assert not any(s.attr("fop") in ("unpick", "cast", "binary") for s in fused.steps)
    assert any(s.attr("fop") == "unpick" for s in plain.steps)
    inputs = _inputs(f)
    TF._assert_as_unfused(fused, plain, inputs)
    for o, r in zip(fused.simulate(inputs), rs.run_reference(f, inputs)):
        torch.testing.assert_close(o, r, atol=3e-2, rtol=3e-2)
    seen = TF._compiled_kernels(fused, inputs, monkeypatch, tmp_path, only={pw})
    assert any("== " in ks.source and ks.kind == "pointwise" for ks in seen)
    # the explanation names the kernel's members, the cast lowering moved before the view too
    (line,) = [ln for ln in fused.explain(full=True).splitlines() if "acc = " in ln and "d = " in ln]
    assert ("d16 = cast" in line) == (dtype == "float32")


def test_a_masked_scatter_keeps_its_kernel(monkeypatch):
    """The vocab split over the ranks: each rank's rows found through a table, the scatter stays."""
    f = _vocab_gradient(vocab_split=True)
    fused, plain = rs.optimize(f), _plain(monkeypatch, f)
    assert any(s.attr("fop") == "unpick" for s in fused.steps)
    inputs = _inputs(f)
    TF._assert_as_unfused(fused, plain, inputs, seed=0)
    for o, r in zip(fused.simulate(inputs, generator=torch.Generator().manual_seed(0)), rs.run_reference(f, inputs)):
        torch.testing.assert_close(o, r, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_vocab_gradient_kernel_on_the_gpu_matches_torch(dtype):
    TF.test_fused_steps_on_the_gpu_match_torch(lambda: _vocab_gradient(dtype=dtype))
