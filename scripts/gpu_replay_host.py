"""Host time of a 1-rank training step replayed as a CUDA graph (issue 28's host-time goal).

    python scripts/gpu_replay_host.py

The tiny GPT-2 of ``benchmarks/train_step_gpu.py`` (``gpt2-L2-h64-s32-b4-v1000-f32``), planned on
one rank and captured (``Plan.graphed``, ``TrainingPlan.graphed``); printed, each the median
over 200 calls of the wall time of issuing it (the GPU synchronized before each, not after):
torch's ``CUDAGraph.replay()`` alone (the floor), ``Plan.graphed``'s call with no inputs (the
parameters and batch read in place), with every input passed again (a check per input), and
``TrainingPlan.graphed``'s call with the batch (copied into the graph's buffers).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import reshard as rs  # noqa: E402
from train_step_gpu import CONFIGS, build  # noqa: E402


def host_us(call: Callable[[], object], n: int = 200) -> float:
    """Median microseconds of issuing ``call`` (the GPU idle before each)."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_replay_host: no CUDA device")
        return 1
    c = CONFIGS["gpt2-L2-h64-s32-b4-v1000-f32"]
    model = build(c).cuda()
    ids = torch.randint(0, c.vocab, (c.batch, c.seq), generator=torch.Generator().manual_seed(1)).cuda()
    tp = rs.plan_training(build(c), mesh=rs.DeviceMesh([0], ("tp",)),
                          example_kwargs={"input_ids": ids.cpu(), "labels": ids.cpu()})
    params = dict(model.named_parameters(remove_duplicate=False))
    values = {**dict(zip(tp.user_inputs, (ids, ids))), **{n: params[n].detach() for n in tp.state_inputs},
              **{k: v.cuda() for k, v in tp.constants.items()}}
    step = tp.plan.graphed(values)
    training = tp.graphed(model, input_ids=ids, labels=ids)
    for name, call in [("CUDAGraph.replay() alone", step.step.graph.replay),
                       ("Plan.graphed(): no inputs", step),
                       ("Plan.graphed(values): every input passed", lambda: step(values)),
                       ("TrainingPlan.graphed(ids, labels): batch copied in",
                        lambda: training(input_ids=ids, labels=ids))]:
        print(f"{name:52s} {host_us(call):8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
