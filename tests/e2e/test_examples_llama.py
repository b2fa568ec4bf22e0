"""``reshard.examples.llama_layers``: a Llama-style decoder layer in the Fusion IR (RMSNorm,
causal softmax attention with rotary q and k, SwiGLU, residuals; Megatron's placements).  Its
reference value is eager PyTorch's Llama layer (``F.scaled_dot_product_attention(is_causal=
True)``, ``F.rms_norm``, ``F.silu``, Hugging Face's ``rotate_half``), and its plan on 2 ranks
simulates to that value; ``reshard demo --block llama`` plans it at real size and checks the
replay.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

import reshard as rs
from reshard.cli import main
from reshard.examples import llama_constants, llama_layers, swiglu_width

SEQ, HIDDEN, HEADS = 16, 32, 4


def eager_layer(inputs: dict[str, torch.Tensor], prefix: str = "") -> torch.Tensor:
    """One Llama decoder layer in eager PyTorch on ``inputs`` (``llama_layers``' names)."""
    x, hd = inputs["x"], HIDDEN // HEADS
    cos, sin, eps = inputs["rope.cos"], inputs["rope.sin"], float(inputs["eps"])

    def rotate_half(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([-t[..., hd // 2:], t[..., :hd // 2]], -1)

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(SEQ, HEADS, hd).transpose(0, 1)

    a = F.rms_norm(x, (HIDDEN,), inputs[f"{prefix}attn_norm.weight"], eps)
    q, k, v = (heads(a @ inputs[f"{prefix}attn.w{c}"]) for c in "qkv")
    q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
    ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(SEQ, HIDDEN)
    h = x + ctx @ inputs[f"{prefix}attn.wo"]
    m = F.rms_norm(h, (HIDDEN,), inputs[f"{prefix}mlp_norm.weight"], eps)
    act = F.silu(m @ inputs[f"{prefix}mlp.w_gate"]) * (m @ inputs[f"{prefix}mlp.w_up"])
    return h + act @ inputs[f"{prefix}mlp.w_down"]


def random_inputs(f: rs.Fusion) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    consts = llama_constants(SEQ, HIDDEN, HEADS)
    out = {}
    for i in f.inputs:
        t = f.tensors[i]
        out[t.name] = consts[t.name] if t.name in consts else torch.randn(t.shape, generator=g) * t.shape[0] ** -0.5
    return out


def test_the_layer_is_llamas_and_its_plan_computes_it() -> None:
    f = llama_layers(seq=SEQ, hidden=HIDDEN, heads=HEADS)
    inputs = random_inputs(f)
    (want,) = rs.run_reference(f, inputs)
    torch.testing.assert_close(want, eager_layer(inputs), rtol=1e-5, atol=1e-5)
    placements = {f.tensors[i].name: f.tensors[i].sharding.placements for i in f.inputs}
    assert placements["attn.wq"] == placements["mlp.w_up"] == (rs.Shard(1),)  # column-parallel
    assert placements["attn.wo"] == placements["mlp.w_down"] == (rs.Shard(0),)  # row-parallel
    assert inputs["mlp.w_gate"].shape == (HIDDEN, swiglu_width(HIDDEN)) and swiglu_width(4096) == 11008
    plan = rs.optimize(f)
    (got,) = plan.simulate(inputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_demo_plans_a_llama_layer(capsys) -> None:
    """``reshard demo`` (its default block) at Llama-2-7B's sizes gives Megatron-SP's plan: the
    normed input gathered before each column-parallel pair, the row-parallel output
    reduce-scattered back to sequence-parallel; the seq 16 replay makes the same 4."""
    assert main(["demo", "-q"]) == 0
    out = capsys.readouterr().out
    assert "Llama-style layer (RMSNorm, causal softmax attention with rope, SwiGLU" in out
    comms = re.findall(r"^ +\d+  (\w+) on tp \(2 ranks\) +(\S+) ", out, re.M)  # the summary's collectives
    assert comms == [("allgather", "attn_norm.out"), ("reduce_scatter", "attn.out"),
                     ("allgather", "mlp_norm.out"), ("reduce_scatter", "mlp.down")]
    assert "the same 4 collectives on the same values and shardings as the plan above" in out
    assert "outputs match the unsharded reference" in out
