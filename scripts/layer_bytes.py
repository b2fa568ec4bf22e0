"""The bytes each decoder layer's collectives move in a real-size training plan (issue 27's
"bytes per rank linear in depth": what one layer moves, and what the ends do).

    python scripts/layer_bytes.py gpt2-xl tp4 1 2 4 [--extractor greedy|windows|ilp] [--ilp-time-limit S]

For each depth, the training step ``benchmarks/train_scale.py`` plans for (model, mesh, depth)
(its model, placements and mesh: ``train_scale.step_parts``) is planned, and each collective
of the plan is put in the decoder layer its tensor's name holds (Hugging Face's module paths,
``.h.<i>.`` / ``.layers.<i>.``, which the forward, backward and saved values all carry), or in
*the ends* (embedding, final norm, lm head, loss and their gradients) when it names none.
Prints, per depth, what each rank receives per layer and for the ends (MiB, ``moved_bytes``),
their sum (``plan.comm_bytes``) and the modeled step.  ``--extractor ilp`` (``--ilp-time-limit``
seconds of HiGHS, 600 by default) shows how far the default extractors are from the exact one on
the small depths (where the ILP is not proved within the limit: its incumbent, or the greedy plan
where cheaper, ``extract``'s fallback; its warning is left out, the line printed says it).
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import reshard as rs  # noqa: E402
from real_models import MODELS  # noqa: E402
from train_scale import _mesh_arg, step_parts  # noqa: E402

#: the decoder layer a tensor's name places it in (GPT-2's ``transformer.h.<i>``, Llama's ``model.layers.<i>``)
LAYER = re.compile(r"\.(?:h|layers)\.(\d+)\.")
MIB = 2 ** 20


def layer_bytes(model: str, mesh_spec: str, layers: int, extractor: str,
                ilp_time_limit_s: float = 600.0) -> tuple[Counter, rs.Plan]:
    """The plan of ``train_scale``'s step and what its collectives move, by layer ("ends": none)."""
    import torch

    from reshard.frontend.torch_export import from_torch

    module, args, in_pl, params, mesh = step_parts(model, mesh_spec, layers, torch.bfloat16)
    prog = from_torch(module, args, in_pl, None, mesh, param_placements=params, train=True)
    plan = rs.optimize(prog.fusion, cache=False, extractor=extractor, ilp_time_limit_s=ilp_time_limit_s)
    moved: Counter = Counter()
    for c in plan.communications:
        m = LAYER.search(c.tensor)
        moved[int(m.group(1)) if m else "ends"] += c.moved_bytes
    return moved, plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=list(MODELS))
    ap.add_argument("mesh", type=_mesh_arg, help="tpN or dpMxtpN")
    ap.add_argument("layers", type=int, nargs="+", help="decoder layers, one plan each")
    ap.add_argument("--extractor", default="greedy", choices=["greedy", "windows", "ilp"])
    ap.add_argument("--ilp-time-limit", type=float, default=600.0, help="seconds of HiGHS (--extractor ilp)")
    args = ap.parse_args()
    for n in args.layers:
        with warnings.catch_warnings():
            # (an ILP cut by its time limit warns; the report printed says it: other warnings still show)
            warnings.filterwarnings("ignore", message="reshard: ILP extraction NOT proved optimal")
            moved, plan = layer_bytes(args.model, args.mesh, n, args.extractor, args.ilp_time_limit)
        per_layer = " ".join(f"{moved[i] / MIB:.2f}" for i in range(n))
        print(f"{args.model} {args.mesh} {n} layers: per layer MiB [{per_layer}], ends {moved['ends'] / MIB:.2f}, "
              f"total {plan.comm_bytes / MIB:.2f} MiB / rank, modeled {plan.cost * 1e3:.3f} ms ({plan.extraction})",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
