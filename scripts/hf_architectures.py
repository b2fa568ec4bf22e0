"""Which Hugging Face architectures train through reshard: decoders, mixtures of experts (their
experts split over the ranks, the load-balancing loss where the config has one), encoders
(masked LM) and encoder-decoders (BART, T5), each at a tiny config (``reshard.testing.hf_models.ARCHITECTURES``:
hidden 64, 4 heads, 2 key/value heads where it has them, vocab 128, random weights; here 2
layers, inputs ids and labels of 2 x 16 tokens),
planned for training on 2 ranks (tp) with Megatron placements where the parameter names match
(``reshard.testing.hf_models.megatron``), one step simulated, its loss and every parameter's
gradient compared with eager PyTorch (``testing.train_loop.simulated_step_matches_eager``).

    python scripts/hf_architectures.py [name ...]     (about two minutes for all)

Prints a table: architecture, parameters sharded, planning seconds, and the outcome ("matches
eager", or the ``ReshardError`` / mismatch).  Architectures the installed transformers lacks are
listed as such.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("RESHARD_PLAN_CACHE", "off")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import reshard as rs  # noqa: E402
from reshard.testing.hf_models import ARCHITECTURES, NO_CACHE_ARG, VOCAB, LossOf, megatron  # noqa: E402
from reshard.testing.train_loop import simulated_step_matches_eager  # noqa: E402

#: the layers of each model
LAYERS = 2


def check(name: str) -> tuple[str, str, str]:
    """(parameters sharded, planning seconds, outcome) of one architecture."""
    torch.manual_seed(0)
    try:
        module = LossOf(ARCHITECTURES[name](LAYERS), name not in NO_CACHE_ARG).train()
    except (AttributeError, TypeError, ValueError) as e:
        return "-", "-", f"not in this transformers ({type(e).__name__})"
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    g = torch.Generator().manual_seed(0)
    ids, labels = (torch.randint(3, VOCAB, (2, 16), generator=g) for _ in range(2))  # (no pad / special ids)
    params = megatron(module, mesh)
    t = time.perf_counter()
    try:
        plan = rs.plan_training(module, (ids, labels), mesh=mesh, param_placements=params, cache=False)
    except rs.ReshardError as e:
        return str(len(params)), "-", f"ReshardError: {str(e).splitlines()[0][:160]}"
    seconds = f"{time.perf_counter() - t:.1f}"
    try:
        simulated_step_matches_eager(module, plan, ids, labels)
    except AssertionError as e:
        return str(len(params)), seconds, f"MISMATCH: {str(e).splitlines()[0][:160]}"
    return str(len(params)), seconds, "matches eager"


def main() -> int:
    names = sys.argv[1:] or list(ARCHITECTURES)
    unknown = [n for n in names if n not in ARCHITECTURES]
    if unknown:
        print(f"unknown architectures {unknown}; known: {sorted(ARCHITECTURES)}")
        return 2
    import transformers
    print(f"Hugging Face architectures, one training step on tp 2 (transformers {transformers.__version__}, "
          f"torch {torch.__version__})\n")
    print("| architecture | params sharded | plan s | outcome |\n|---|---:|---:|---|")
    bad = 0
    for n in names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sharded, seconds, outcome = check(n)
        bad += outcome.startswith("MISMATCH")
        print(f"| {n} | {sharded} | {seconds} | {outcome} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
