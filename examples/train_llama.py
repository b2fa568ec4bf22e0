"""Train a tiny Hugging Face Llama with tensor parallelism through reshard, and check it against eager.

    torchrun --standalone --nproc-per-node 2 examples/train_llama.py

Each process is one rank of a 2-device "tp" mesh, on the CPU (gloo; on GPUs: NCCL, with the
model and batches moved to the device ``init_from_env`` returns, as ``scripts/gpu_train_multi.py``
does).  The model is written as for eager PyTorch: inputs by keyword, the loss from ``labels=``;
reshard plans the forward and backward of one step once (rank 0 plans, the others receive the
plan) and ``loss.backward()`` leaves each parameter's gradient shard in ``.grad`` for ``torch.optim``.
At the end rank 0 trains a copy of the same model in eager PyTorch and checks every loss.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import reshard as rs

STEPS, BATCH, SEQ, VOCAB = 6, 2, 16, 128


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2))


def megatron(model: torch.nn.Module) -> dict[str, list]:
    """Megatron's tensor parallelism: q/k/v/gate/up column-parallel, o/down row-parallel (Linear
    weights are [out, in]), the embedding and the LM head vocab-parallel."""
    column, row = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"), ("o_proj", "down_proj")
    placements = {"model.embed_tokens.weight": [rs.Shard(0)], "lm_head.weight": [rs.Shard(0)]}
    for name, _ in model.named_parameters():
        if any(f".{k}." in name for k in column):
            placements[name] = [rs.Shard(0)]
        elif any(f".{k}." in name for k in row):
            placements[name] = [rs.Shard(1)]
    return placements


def batch(step: int) -> dict[str, torch.Tensor]:
    """The same on every rank: two batches, alternating (the loss falls step by step)."""
    g = torch.Generator().manual_seed(step % 2)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids}  # next-token prediction: the model shifts the labels


def eager_losses() -> list[float]:
    """The same loop in plain PyTorch, one process."""
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        loss = model(**batch(step), use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def main() -> None:
    rank, world, _ = rs.init_from_env(backend="gloo")  # torchrun's environment, CPU processes
    mesh = rs.DeviceMesh(list(range(world)), ("tp",))
    model = tiny_llama()
    model = rs.parallelize(model, mesh, example_kwargs=batch(0), param_placements=megatron(model))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # on this rank's parameter shards
    losses = []
    for step in range(STEPS):
        loss = model(**batch(step))  # forward and backward: one plan
        loss.backward()               # each parameter's .grad: this rank's shard of its gradient
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if rank == 0:
        print("losses:", " ".join(f"{x:.4f}" for x in losses))
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses()), rtol=1e-4, atol=0)
        print(f"check: {world} ranks trained {STEPS} steps; every loss matches eager PyTorch")
    model.close()


if __name__ == "__main__":
    main()
