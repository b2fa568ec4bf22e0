"""``benchmarks/train_dtensor.py``'s DTensor side on GPT-2 tiny (2 gloo processes, a few seconds):
the step's loss and gradients match eager, every rank records the same collectives, the
recorder's counts are CommDebugMode's, and the fused ``c_attn`` output stays on its rank (the
only all-gathers are of ``[batch, seq, hidden]`` activations)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch.distributed as dist

pytestmark = [pytest.mark.multiproc, pytest.mark.hf]

pytest.importorskip("transformers")

from benchmarks.train_dtensor import FUSED_QKV_DTENSOR  # noqa: E402

#: CommDebugMode's op names -> reshard's kind names
_KINDS = {"all_gather_into_tensor": "allgather", "reduce_scatter_tensor": "reduce_scatter", "all_reduce": "allreduce"}


@pytest.mark.slow
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
@pytest.mark.skipif(not FUSED_QKV_DTENSOR, reason="this torch's DTensor cannot run GPT-2's fused qkv (train_dtensor)")
def test_gpt2_tiny_dtensor_step() -> None:
    from benchmarks.train_dtensor import SHAPES, run_dtensor

    d = run_dtensor("gpt2", "tiny", 2, timeout_s=120)
    assert d["ranks_agree"]
    assert d["loss_rel_err"] < 1e-5 and d["grad_rel_err"] < 1e-4
    counted = {_KINDS[op.split(".")[-1]]: n for op, n in d["commdebug"].items()}
    assert Counter(c.kind for c in d["colls"]) == counted
    s = SHAPES[("gpt2", "tiny")]
    assert {c.buffer for c in d["colls"] if c.kind == "allgather"} == {s.batch * s.seq * s.hidden * 4}
    assert set(d["phases"]) == {"forward", "backward", "gradient placement"}
