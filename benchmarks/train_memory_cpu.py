"""A planned training step's memory on 1 rank against autograd's (issue 28, item 1), on the CPU.

    python benchmarks/train_memory_cpu.py [--layers 2] [--hidden 256] [--seq 256] [--batch 2]
                                          [--vocab 50257] [--budget]

A Hugging Face ``GPT2LMHeadModel`` (random weights, tied ``lm_head``, dropout 0) is planned
for training on one rank (``reshard.plan_training`` of the model's own loss) and simulated on
one batch.  Printed, in MiB:

- **autograd saved**: what ``torch.autograd`` saves for the same batch
  (``saved_tensors_hooks``: distinct storages, the parameters' and the inputs' left out;
  attention through the math kernel, the plan's local work);
- **plan saved**: ``plan.saved_bytes`` (the saved activations, each storage once), and the
  simulator's measurement of it;
- **peak**: ``plan.peak_bytes`` (the allocation plan's peak, parameters included) and the
  simulator's measured peak of the distinct storages held;
- ``--budget``: the same with ``memory_budget`` = autograd's saved bytes (recomputing what
  does not fit).
"""

from __future__ import annotations

import argparse

import torch
import transformers as T
from torch.nn.attention import SDPBackend, sdpa_kernel

import reshard as rs

MIB = 2 ** 20


def autograd_saved(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """The bytes autograd saves for ``model(**batch).loss``'s backward: distinct storages, the
    parameters' and the inputs' left out (alive anyway), attention through the math kernel."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), sdpa_kernel(SDPBackend.MATH):
        model(**batch).loss
    alive = {p.untyped_storage().data_ptr() for p in model.parameters()}
    alive |= {x.untyped_storage().data_ptr() for x in batch.values()}
    return sum(n for p, n in seen.items() if p not in alive)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--budget", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=a.vocab, n_embd=a.hidden, n_layer=a.layers, n_head=4,
                                           n_positions=a.seq, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0))
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids}
    saved = autograd_saved(model, batch)
    tp = rs.plan_training(model, mesh=rs.DeviceMesh([0], ("tp",)), example_kwargs=batch,
                          memory_budget=saved if a.budget else None, cache=False)
    params = dict(model.named_parameters(remove_duplicate=False))
    values = {**dict(zip(tp.user_inputs, batch.values())), **{n: params[n].detach() for n in tp.state_inputs},
              **tp.constants}
    stats: dict = {}
    tp.plan.simulate(values, stats=stats)
    plan = tp.plan
    print(f"GPT-2 {a.layers} layers, h{a.hidden}, seq {a.seq}, batch {a.batch}, vocab {a.vocab}, 1 rank"
          + (f", memory_budget {saved / MIB:.1f} MiB" if a.budget else ""))
    print(f"autograd saved {saved / MIB:.1f} MiB | plan saved {plan.saved_bytes / MIB:.1f} MiB "
          f"(measured {stats['saved_peak_bytes'][0] / MIB:.1f}) | peak {plan.peak_bytes / MIB:.1f} MiB "
          f"(measured {stats['peak_bytes'][0] / MIB:.1f})")


if __name__ == "__main__":
    main()
