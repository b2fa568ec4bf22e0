"""Fused QKV: reshard vs Megatron on GPT-2 blocks (issue 20, item 3).

    python benchmarks/fused_qkv.py [--widths 256 1024] [--tp 2 4] [--dp 1 2] [--shapes 1x128 4x512] [--check]

One ``transformers`` ``GPT2Block`` (random weights from a config, fp32, heads of 64; needs
``transformers``: ``pip install -e '.[bench]'``) goes through ``from_torch`` with Megatron's
placements: ``c_attn`` weight and bias ``FusedShard(-1, groups=3)`` (each rank holds its heads'
``[q | k | v]``), ``c_proj`` row-parallel, ``mlp.c_fc`` column-parallel, ``mlp.c_proj``
row-parallel; the block's input and output replicated.  With ``--dp 2`` the mesh is ``dp x tp``
(``2x2`` for tp 2): the parameters are replicated over ``dp`` and the block's input and output
batch-sharded over it (``[Shard(0), Replicate()]``), as Megatron's data x tensor parallelism.  For
each width, mesh and ``BxS`` shape it prints reshard's plan (collectives, bytes each rank receives,
``plan.comm_bytes``) next to Megatron's forward (one allreduce over ``tp`` of the local
``[B/dp, S, H]`` after attention and one after the MLP, counted in the same convention:
``2 (n-1)/n`` of the buffer), and the
plan for the placement users could write before ``FusedShard``, ``Shard(-1)`` on ``c_attn`` (a
different layout: rank r holds the r-th block of the whole ``[q | k | v]``).  ``--check``
simulates each fused plan on CPU ranks and compares with the module's eager output.  A shape
whose batch a ``--dp`` degree does not divide is skipped on that mesh, with a line saying so
(Megatron's ``B/dp`` needs it).  Exits 1 when a plan moves more bytes than Megatron's.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import reshard as rs
from reshard.ir.collective_kinds import kind

HEAD_DIM = 64


class Block(torch.nn.Module):
    """A ``GPT2Block`` returning its hidden states (the block returns a tuple in some versions)."""

    def __init__(self, width: int, heads: int, seq: int) -> None:
        super().__init__()
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        cfg = GPT2Config(n_embd=width, n_head=heads, n_layer=1, n_positions=seq, attn_implementation="sdpa")
        self.block = GPT2Block(cfg, layer_idx=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out[0] if isinstance(out, tuple) else out


def megatron_placements(c_attn: rs.ir.Placement, dp: int = 1) -> dict[str, list]:
    """The parameters' placements on a ``tp`` mesh, or (``dp`` > 1) a ``dp x tp`` mesh, replicated over dp."""
    S = rs.Shard
    on_dp = [rs.Replicate()] if dp > 1 else []
    tp = {"block.attn.c_attn.weight": c_attn, "block.attn.c_attn.bias": c_attn, "block.attn.c_proj.weight": S(0),
          "block.mlp.c_fc.weight": S(1), "block.mlp.c_fc.bias": S(0), "block.mlp.c_proj.weight": S(0)}
    return {name: on_dp + [p] for name, p in tp.items()}


def block_mesh(tp: int, dp: int = 1) -> rs.DeviceMesh:
    """The ``tp`` mesh, or (``dp`` > 1) the ``dp x tp`` mesh."""
    if dp == 1:
        return rs.DeviceMesh(list(range(tp)), ("tp",))
    return rs.DeviceMesh([list(range(i * tp, (i + 1) * tp)) for i in range(dp)], ("dp", "tp"))


def activation_placements(dp: int = 1) -> list:
    """The block's input and output: replicated over tp, batch-sharded over dp."""
    return [rs.Shard(0), rs.Replicate()] if dp > 1 else [rs.Replicate()]


def megatron_bytes(batch: int, seq: int, width: int, tp: int, dp: int = 1) -> int:
    """Bytes each rank receives in Megatron's forward: two allreduces over tp of [B/dp, S, H] fp32."""
    return 2 * kind("allreduce").moved_bytes(batch // dp * seq * width * 4, tp)


def plan_block(width: int, tp: int, batch: int, seq: int, c_attn: rs.ir.Placement, check: bool = False,
               dp: int = 1) -> rs.Plan:
    """reshard's plan of one GPT-2 block with Megatron's placements (``c_attn``: its weight's and
    bias's placement) on the ``dp x tp`` mesh (``block_mesh``); ``check``: simulate it and compare
    with the module's eager output."""
    torch.manual_seed(0)
    module = Block(width, width // HEAD_DIM, seq).eval()
    x = torch.randn(batch, seq, width)
    act = activation_placements(dp)
    prog = rs.from_torch(module, (x,), act, act, block_mesh(tp, dp), param_placements=megatron_placements(c_attn, dp))
    plan = rs.optimize(prog.fusion)
    if check:
        (y,) = plan.simulate(prog.inputs(x))
        with torch.no_grad():
            torch.testing.assert_close(y, module(x), rtol=1e-4, atol=1e-4)
    return plan


def collectives(plan: rs.Plan) -> str:
    """``plan``'s collectives by kind, e.g. ``2 allreduce``."""
    return ", ".join(f"{n} {k}" for k, n in Counter(c.kind for c in plan.communications).items()) or "none"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--dp", type=int, nargs="+", default=[1], help="data-parallel degrees (mesh dp x tp)")
    ap.add_argument("--shapes", nargs="+", default=["1x128", "4x512"], help="BxS")
    ap.add_argument("--check", action="store_true", help="simulate each fused plan against eager")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes]
    for dp in args.dp:
        for b, s in shapes:
            if b % dp:
                print(f"skipped on dp {dp}: B x S {b} x {s} (the batch {b} does not split over dp {dp})")
    print("| width | mesh (dp x tp) | B x S | reshard (FusedShard): collectives | bytes/rank | Megatron "
          "(2 allreduce): bytes/rank | ratio | Shard(-1) c_attn (before): collectives | bytes/rank |")
    print("|---|---|---|---|---|---|---|---|---|")
    worse = 0
    for width in args.widths:
        for dp in args.dp:
            for tp in args.tp:
                for b, s in shapes:
                    if b % dp:
                        continue
                    fused = plan_block(width, tp, b, s, rs.FusedShard(-1, groups=3), args.check, dp)
                    plain = plan_block(width, tp, b, s, rs.Shard(-1), dp=dp)
                    meg = megatron_bytes(b, s, width, tp, dp)
                    worse += fused.comm_bytes > meg
                    print(f"| {width} | {dp}x{tp} | {b} x {s} | {collectives(fused)} | {fused.comm_bytes:,} | {meg:,} "
                          f"| {fused.comm_bytes / meg:.2f} | {collectives(plain)} | {plain.comm_bytes:,} |",
                          flush=True)
    print(f"goal (reshard bytes <= Megatron's on every case): {'met' if not worse else f'missed on {worse}'}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
