"""Trace a small transformer block (nn.Module) with ``reshard.from_torch``, optimize it for
2 devices with sequence-parallel activations and Megatron-style weight shardings, print
the plan, and check the simulated plan against the module's own output.

    python examples/from_torch_module.py      (or: reshard explain examples/from_torch_module.py)
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor.placement_types import Replicate, Shard  # DTensor placements work too

import reshard as rs


class Block(nn.Module):
    def __init__(self, hidden: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm = nn.RMSNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, h = x.shape
        q, k, v = self.qkv(self.ln(x)).split(h, dim=-1)
        q, k, v = (t.view(s, self.heads, h // self.heads).transpose(0, 1) for t in (q, k, v))
        ctx = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(ctx.transpose(0, 1).reshape(s, h))
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


MESH = rs.DeviceMesh([0, 1], ("tp",))
#: Megatron-style: qkv and fc1 column parallel, proj and fc2 row parallel; everything else Replicate
WEIGHTS = {"qkv.weight": [Shard(0)], "qkv.bias": [Shard(0)], "proj.weight": [Shard(1)],
           "fc1.weight": [Shard(0)], "fc1.bias": [Shard(0)], "fc2.weight": [Shard(1)], "ln.weight": [Replicate()]}


def traced() -> tuple[Block, torch.Tensor, rs.TorchProgram]:
    """The block (seeded weights), an input, and its trace for 2 devices with sequence-parallel
    activations."""
    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(8, 16)
    tp = rs.from_torch(block, (x,), in_placements=[Shard(0)], out_placements=[Shard(0)], mesh=MESH,
                       param_placements=WEIGHTS)
    return block, x, tp


def build() -> rs.TorchProgram:
    """What ``reshard explain examples/from_torch_module.py`` optimizes and checks."""
    return traced()[2]


def main() -> None:
    block, x, tp = traced()
    print(f"traced: {len(tp.fusion.ops)} Fusion ops, inputs {list(tp.input_names)}")
    plan = rs.optimize(tp.fusion)
    print(plan.explain())
    (y,) = plan.simulate(tp.inputs(x))
    with torch.no_grad():
        expected = block(x)
    err = (y - expected).abs().max().item()
    torch.testing.assert_close(y, expected)
    print(f"check: simulated plan on {MESH.size} ranks matches block(x): max abs err {err:.2e}")


if __name__ == "__main__":
    main()
