#!/usr/bin/env python3
"""Time one training step of GPT-2 and Llama on N ranks: DTensor's TP + SP plan against reshard's
plan at the same parameter placements (issue 21: "when a two-GPU machine is available, time a
training step against DTensor with the same placements").

The step is ``benchmarks/train_dtensor.py``'s ``TrainStep`` (forward, mean cross entropy of
the logits against already-shifted labels, backward), built by its ``build`` at its sizes
(``medium``: GPT-2 medium's width, Llama GQA, 2 layers, 1024 tokens; ``--size large``: 4
layers, width 2048, 2048 tokens, registered here; ``--cpu`` uses ``tiny``).

* **DTensor**: ``train_dtensor.dtensor_plan`` (torchtitan's tensor + sequence parallel plan)
  on a 1-D mesh of N ranks, the loss under ``loss_parallel``; after backward, gradients whose
  placement is not their parameter's are redistributed to it (part of the step, as there).
* **reshard**: ``reshard.plan_training`` on rank 0, sent to the others (as ``parallelize``
  sends it), with every parameter at the placement DTensor gave it (read back from the
  DTensor run), ids and labels replicated; each rank ``reshard.parallelize(module,
  plan=plan)`` and calls the ``ParallelModule`` (its ``DistRuntime`` runs the plan's local steps with ``run_local``:
  torch ops on the rank's CUDA tensors, matmuls through cuBLAS).  ``--local-steps nvrtc`` (on
  CUDA) also times the plan with reshard's generated NVRTC kernels
  (``runtime.gpu_local.gpu_local_step``), given to the module's runtime before its first call.

Each variant: ``--warmup`` steps, then the median of ``--steps`` timed steps, each started
after a barrier and ``torch.cuda.synchronize()`` and ended by one (wall clock on the CPU);
gradients are cleared before each step.  The two are checked against each other: loss and a
few gradients (``CHECKED``; reshard's gathered from the ranks' shards), relative error
``max |a - b| / max |b|``.  Prints a table: model, ranks, DTensor ms / step, reshard
ms / step, ratio (reshard / DTensor), max rel error.  Exit status 1 if an error exceeds
``--tol`` (default 1e-3 on CUDA, where cuBLAS and NCCL sum in other orders, 1e-4 on the CPU).

On the device (NCCL, one GPU per rank, ``NCCL_NVLS_ENABLE=0`` set here; needs >= N GPUs).
egglog comes as wheels from ``bash ../shared/scripts/device-wheels.sh``; **transformers is
needed too**: add its wheels and those of its dependencies that the device lacks to ``.whl/``
(the versions tested here; ``pip show`` lists the requirements; untested on the device)::

    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -d .whl transformers==5.24.0 huggingface-hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0 \\
        regex pyyaml tqdm typer click rich shellingham pydantic pydantic-core annotated-doc \\
        annotated-types typing-inspection httpx2 httpcore2 h11 anyio idna truststore fsspec hf-xet \\
        markdown-it-py mdurl pygments typing-extensions

then carry ``.whl`` and run::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit;
    python3 scripts/gpu_train_multi.py --nprocs 2 --local-steps torch nvrtc

Smoke test here (gloo, CPU, tiny sizes, well under a minute)::

    python scripts/gpu_train_multi.py --cpu
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's reshard and benchmarks, also in the spawned ranks
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # inherited by the spawned ranks

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import reshard as rs  # noqa: E402
from benchmarks.real_models import Shapes  # noqa: E402
from benchmarks.train_dtensor import FUSED_QKV_DTENSOR, SHAPES, build, dtensor_plan  # noqa: E402
from reshard.ir.sharding import unshard  # noqa: E402

#: ``--size large``: 4 layers at width 2048 and 2048 tokens (registered beside train_dtensor's sizes)
SHAPES.setdefault(("gpt2", "large"), Shapes(hidden=2048, layers=4, heads=16, kv_heads=16, intermediate=8192,
                                            vocab=50304, seq=2048, batch=1))
SHAPES.setdefault(("llama", "large"), Shapes(hidden=2048, layers=4, heads=16, kv_heads=8, intermediate=5632,
                                             vocab=32000, seq=2048, batch=1))

#: gradients compared between the two (suffixes of parameter names; the first match of each)
CHECKED = {"gpt2": ("wte.weight", "h.0.attn.c_attn.weight", "h.0.mlp.c_proj.weight", "ln_f.weight"),
           "llama": ("embed_tokens.weight", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight",
                     "model.norm.weight")}


def checked_names(step: torch.nn.Module, model: str) -> list[str]:
    """The parameter FQNs whose gradients are compared."""
    names = [n for n, _ in step.named_parameters()]
    return [next(n for n in names if n.endswith(s)) for s in CHECKED[model]]


def device_of(cuda: bool) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def timed(step: Callable[[], None], warmup: int, steps: int, cuda: bool) -> float:
    """Median seconds of ``step()`` over ``steps`` runs after ``warmup``; each run between a
    barrier + device synchronization and a device synchronization."""
    times = []
    for i in range(warmup + steps):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def dtensor_worker(rank: int, model: str, size: str, cuda: bool, warmup: int, steps: int) -> dict[str, Any]:
    """DTensor's step on this rank: median seconds; rank 0 also the parameter placements, the
    loss and the checked gradients (global)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    dev = device_of(cuda)
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),), mesh_dim_names=("tp",))
    step, (ids, labels) = build(model, size)
    step.to(dev)
    ids, labels = ids.to(dev), labels.to(dev)
    dtensor_plan(step, model, mesh)
    losses: list[torch.Tensor] = []

    def one() -> None:
        for p in step.parameters():
            p.grad = None
        with loss_parallel():
            loss = step(ids, labels)
            loss.backward()
        for p in step.parameters():
            if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        losses.append(loss)

    seconds = timed(one, warmup, steps, cuda)
    loss = losses[-1]
    out: dict[str, Any] = {"s": seconds, "loss": float((loss.full_tensor() if isinstance(loss, DTensor) else loss))}
    params = dict(step.named_parameters())
    grads = {n: params[n].grad.full_tensor().cpu() for n in checked_names(step, model)}  # collective: every rank
    if rank == 0:
        out |= {"grads": grads,
                "placements": {n: list(p.placements) for n, p in params.items() if isinstance(p, DTensor)}}
    return out


def reshard_worker(rank: int, model: str, size: str, plan: rs.TrainingPlan, local_steps: str, cuda: bool,
                   warmup: int, steps: int) -> dict[str, Any]:
    """reshard's step on this rank through ``parallelize(module, plan=plan)``: median seconds,
    the loss, this rank's shards of the checked gradients."""
    dev = device_of(cuda)
    step, (ids, labels) = build(model, size)
    model_ = rs.parallelize(step.to(dev), plan=plan)
    ids, labels = ids.to(dev), labels.to(dev)
    if local_steps == "nvrtc":
        from reshard.runtime.distributed import DistRuntime
        from reshard.runtime.gpu_local import gpu_local_step
        model_._runtimes[id(plan)] = DistRuntime.from_plan(plan.plan, local_step=gpu_local_step)  # the runtime it would build
    losses: list[torch.Tensor] = []

    def one() -> None:
        for p in model_.parameters():
            p.grad = None
        loss = model_(ids, labels)
        loss.backward()
        losses.append(loss)

    seconds = timed(one, warmup, steps, cuda)
    params = dict(model_.module.named_parameters())
    out = {"s": seconds, "loss": float(losses[-1]),
           "grads": {n: params[n].grad.detach().cpu() for n in checked_names(model_.module, model)}}
    model_.close()
    return out


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| in float64."""
    got, want = got.double(), want.double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def rank_main(rank: int, models: list[str], size: str, local_steps: list[str], cuda: bool, warmup: int,
              steps: int) -> dict[str, Any]:
    """Per model: DTensor's step, then rank 0's plan at its placements (sent to every rank, as
    ``parallelize`` sends it), then reshard's step per local-step executor."""
    import transformers

    transformers.logging.set_verbosity_error()  # the tiny configs' token ids outside the vocabulary
    warnings.filterwarnings("ignore", category=UserWarning)  # backward hooks on HF outputs
    if not cuda:
        torch.set_num_threads(1)  # several ranks on few cores: intra-op threads only contend
    out: dict[str, Any] = {}
    for model in models:
        d = dtensor_worker(rank, model, size, cuda, warmup, steps)
        made: list[Any] = [None, 0.0]
        if rank == 0:
            step, args = build(model, size)
            t0 = time.perf_counter()
            made[0] = rs.plan_training(step, args, rs.DeviceMesh(list(range(dist.get_world_size())), ("tp",)),
                                       param_placements=d["placements"])
            made[1] = time.perf_counter() - t0
        dist.broadcast_object_list(made, src=0)
        shardings = {n: made[0].sharding(n) for n in d["grads"]} if rank == 0 else None
        out[model] = {"dtensor": d, "shardings": shardings, "plan_s": made[1],
                      "reshard": {ls: reshard_worker(rank, model, size, made[0], ls, cuda, warmup, steps)
                                  for ls in local_steps}}
    return out


def rows_of(per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model and local-step executor: DTensor's and reshard's median step (the
    slowest rank's) and their agreement (loss on every rank, the checked gradients)."""
    rows = []
    for model, r0 in per_rank[0].items():
        want = r0["dtensor"]
        dt = max(r[model]["dtensor"]["s"] for r in per_rank)
        for ls in r0["reshard"]:
            got = [r[model]["reshard"][ls] for r in per_rank]
            errs = [rel_err(torch.tensor(g["loss"]), torch.tensor(want["loss"])) for g in got]
            errs += [rel_err(unshard({k: g["grads"][n] for k, g in enumerate(got)}, r0["shardings"][n]), w)
                     for n, w in want["grads"].items()]
            rt = max(g["s"] for g in got)
            rows.append({"model": model, "ranks": len(per_rank), "local_steps": ls, "dtensor_ms": dt * 1e3,
                         "reshard_ms": rt * 1e3, "ratio": rt / dt, "max_rel_err": max(errs), "plan_s": r0["plan_s"]})
    return rows


def table(rows: list[dict[str, Any]], size: str) -> str:
    lines = ["| model | ranks | DTensor ms/step | reshard ms/step | ratio | max rel error |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} {size} | {r['ranks']} | {r['dtensor_ms']:.2f} | {r['reshard_ms']:.2f} "
              f"({r['local_steps']}) | {r['ratio']:.2f} | {r['max_rel_err']:.1e} |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama"], choices=sorted(CHECKED))
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--size", default="medium", choices=["medium", "large"], help="ignored with --cpu (tiny)")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU, tiny sizes: a smoke test")
    ap.add_argument("--local-steps", nargs="+", default=["torch"], choices=["torch", "nvrtc"],
                    help="reshard's local-step executors to time (nvrtc: CUDA only)")
    ap.add_argument("--warmup", type=int, default=None, help="default 3 (1 with --cpu)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps, default 10 (3 with --cpu)")
    ap.add_argument("--tol", type=float, default=None, help="max rel error allowed (default 1e-3 CUDA, 1e-4 CPU)")
    ap.add_argument("--timeout", type=float, default=600.0, help="process-group timeout, seconds")
    args = ap.parse_args()
    cuda = not args.cpu
    if cuda and torch.cuda.device_count() < args.nprocs:
        ap.error(f"{args.nprocs} ranks need {args.nprocs} GPUs, {torch.cuda.device_count()} found (--cpu: gloo)")
    if not cuda and "nvrtc" in args.local_steps:
        ap.error("--local-steps nvrtc needs CUDA")
    if "gpt2" in args.models and not FUSED_QKV_DTENSOR:
        ap.error(f"GPT-2's DTensor baseline (its fused qkv as _StridedShard(0, 3)) needs torch 2.13 or newer, "
                 f"this is {torch.__version__}: --models llama")
    size = "tiny" if args.cpu else args.size
    warmup = args.warmup if args.warmup is not None else (1 if args.cpu else 3)
    steps = args.steps if args.steps is not None else (3 if args.cpu else 10)
    tol = args.tol if args.tol is not None else (1e-3 if cuda else 1e-4)
    per_rank = rs.launch(rank_main, args.nprocs, args.models, size, args.local_steps, cuda, warmup, steps,
                         backend="nccl" if cuda else "gloo", timeout_s=args.timeout)
    rows = rows_of(per_rank)
    where = torch.cuda.get_device_name() if cuda else "CPU (gloo)"
    print(f"One training step (fp32, forward + backward), {where}, torch {torch.__version__}; median of {steps} "
          f"after {warmup} warm-up; reshard planned in "
          + ", ".join(f"{m} {s:.1f} s" for m, s in {r["model"]: r["plan_s"] for r in rows}.items())
          + f"\n\n{table(rows, size)}")
    bad = [r for r in rows if not r["max_rel_err"] <= tol]
    if bad:
        print(f"max rel error above {tol:g}: " + ", ".join(f"{r['model']} ({r['local_steps']})" for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
