"""A planned training step on one GPU against eager PyTorch and torch.compile (issue 28).

    python benchmarks/train_step_gpu.py [--configs NAME ...] [--steps 10] [--tp 2] [--graph] [--no-compile] [--json PATH]

Hugging Face ``GPT2LMHeadModel``, ``LlamaForCausalLM`` (GQA) and ``MixtralForCausalLM`` (GQA, 8
experts, 2 per token; reshard exports its experts dense, every token through every expert:
``frontend.moe``; eager and torch.compile run transformers' default experts implementation) with random weights, dropout 0,
TF32 off, one batch of random token ids (labels = ids, the model's own loss).  Per
configuration, the forward + backward step (the loss and every parameter's gradient) timed
after warm-up as the median of ``--steps`` steps (CUDA-synchronized), and its peak memory
(``torch.cuda.max_memory_allocated`` over the timed steps, less what was allocated before
them, plus the parameters' bytes: every column counts the parameters once, the batch not):

- **eager**: ``model(**batch).loss.backward()``;
- **compile**: the same through ``torch.compile(model)`` (Inductor; ``--no-compile`` leaves it
  out: its compile takes a minute per configuration);
- **reshard 1 rank, kernels**: ``reshard.plan_training`` on a 1-rank mesh, its program run by
  the simulator with every local step as reshard's generated kernels / cuBLAS
  (``runtime.gpu_local``), the inputs already on the GPU;
- **1 rank, torch steps**: the same program with torch's ops as the local steps
  (``runtime.local_ops.run_local``);
- **tp N on one GPU**: the Megatron-placed plan on an N-rank mesh, every rank's local steps on
  the one GPU (kernels), collectives simulated there: the total work of N ranks;
- ``--graph``: **reshard 1 rank, CUDA graph**, the 1-rank step captured once
  (``Plan.graphed``, ``runtime.cuda_graph``; parameters and batch read in place) and replayed,
  and **tp N on one GPU, CUDA graph** (``GraphedStep`` of the N ranks' simulation).  Their peak
  counts the warm-up and the capture too (the graph's memory pool is allocated then).

Each row also gives the reshard loss's relative difference from eager's (a check, not a
timing) and the host time of a 1-rank step (the wall time of issuing it, the GPU left to
finish afterwards; a GPU-bound step's host time is hidden), with ``--graph`` that of a replay
too (``Plan.graphed``'s call with no inputs: the parameters and the batch read where they are,
as a loop that updates them in place).  Figures are measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reshard as rs  # noqa: E402
from reshard.runtime.local_ops import run_local  # noqa: E402
from reshard.runtime.simulator import simulate as simulate_program  # noqa: E402
from real_models import megatron_params  # noqa: E402

MIB = 2 ** 20
GRAPH = "reshard 1 rank, CUDA graph"


@dataclass(frozen=True)
class Config:
    model: str
    layers: int
    hidden: int
    seq: int
    batch: int
    vocab: int
    dtype: str

    @property
    def name(self) -> str:
        short = "f32" if self.dtype == "float32" else "bf16"
        return f"{self.model}-L{self.layers}-h{self.hidden}-s{self.seq}-b{self.batch}-v{self.vocab}-{short}"


CONFIGS = {c.name: c for c in (
    Config("gpt2", 2, 64, 32, 4, 1000, "float32"),
    Config("gpt2", 2, 768, 512, 4, 50257, "float32"),
    Config("gpt2", 4, 1024, 1024, 4, 50257, "float32"),
    Config("gpt2", 4, 1024, 1024, 4, 50257, "bfloat16"),
    Config("gpt2", 4, 2048, 1024, 4, 50257, "bfloat16"),
    Config("llama", 4, 2048, 1024, 4, 32000, "bfloat16"),
    Config("llama", 2, 2048, 2048, 2, 32000, "bfloat16"),
    Config("llama", 4, 1024, 512, 8, 32000, "float32"),
    Config("mixtral", 2, 1024, 1024, 4, 32000, "bfloat16"),
)}


def build(c: Config) -> torch.nn.Module:
    import transformers as T
    torch.manual_seed(0)
    if c.model == "gpt2":
        m = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=c.vocab, n_embd=c.hidden, n_layer=c.layers, n_head=c.hidden // 64
                                           if c.hidden >= 256 else 4, n_positions=c.seq, attn_pdrop=0.0,
                                           resid_pdrop=0.0, embd_pdrop=0.0))
    elif c.model == "mixtral":
        heads = c.hidden // 128
        m = T.MixtralForCausalLM(T.MixtralConfig(vocab_size=c.vocab, hidden_size=c.hidden, num_hidden_layers=c.layers,
                                                 num_attention_heads=heads, num_key_value_heads=max(1, heads // 4),
                                                 intermediate_size=int(3.5 * c.hidden) // 64 * 64,
                                                 num_local_experts=8, num_experts_per_tok=2,
                                                 max_position_embeddings=c.seq))
    else:
        heads = c.hidden // 128
        m = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=c.vocab, hidden_size=c.hidden, num_hidden_layers=c.layers,
                                             num_attention_heads=heads, num_key_value_heads=max(1, heads // 4),
                                             intermediate_size=int(8 * c.hidden / 3) // 64 * 64,
                                             max_position_embeddings=c.seq))
    return m.to(getattr(torch, c.dtype)).train()


def timed(step: Callable[[], Any], clear: Callable[[], Any], steps: int, warmup: int = 3,
          setup: Callable[[], Any] | None = None) -> tuple[float, float, float]:
    """(median ms per step, peak MiB above what was allocated before (``clear`` frees the
    previous step's gradients first; ``setup``, run first, counts: a graph's capture), median
    host ms per step)."""
    if setup is None:
        for _ in range(warmup):
            step()
    clear()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    if setup is not None:
        setup()
        for _ in range(warmup):
            step()
    walls, hosts = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        hosts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() - before
    return statistics.median(walls) * 1e3, peak / MIB, statistics.median(hosts) * 1e3


def param_mib(m: torch.nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in m.parameters()) / MIB


def torch_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]
               ) -> tuple[Callable[[], Any], Callable[[], Any], list]:
    """(step, clear: the gradients freed, [the last loss])."""
    last: list = [None]

    def clear() -> None:
        model.zero_grad(set_to_none=True)

    def step() -> None:
        clear()
        loss = model(**batch).loss
        loss.backward()
        last[0] = loss.detach()
    return step, clear, last


def reshard_step(c: Config, model: torch.nn.Module, ids: torch.Tensor, tp: int, kernels: bool, graph: bool
                 ) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], float], float, Callable[[], Any] | None]:
    """The plan's step on the GPU: (step, clear, the last step's loss, planning seconds, the
    graph's capture (``graph``; else None))."""
    from reshard.runtime.cuda_graph import GraphedStep
    from reshard.runtime.gpu_local import gpu_local_step
    cpu_model = build(c)
    mesh = rs.DeviceMesh(list(range(tp)), ("tp",))
    cpu_ids = ids.cpu()
    t0 = time.perf_counter()
    plan = rs.plan_training(cpu_model, mesh=mesh, example_kwargs={"input_ids": cpu_ids, "labels": cpu_ids},
                            param_placements=megatron_params(cpu_model) if tp > 1 else None)
    plan_s = time.perf_counter() - t0
    params = dict(model.named_parameters(remove_duplicate=False))
    values = {**dict(zip(plan.user_inputs, (ids, ids))), **{n: params[n].detach() for n in plan.state_inputs},
              **{k: v.cuda() for k, v in plan.constants.items()}}
    p = plan.plan
    per_rank = {} if graph and tp == 1 else \
        {r: {k: v.cuda() for k, v in p.plan_locals(r, bufs, "train_step_gpu").items()}
         for r, bufs in p._shard_inputs(values, None, "train_step_gpu").items()}
    local = gpu_local_step if kernels else run_local
    last: list = [None]
    buf, ts = p.lowered.outputs[0]
    graphed: list = [None]

    def clear() -> None:
        last[0] = None  # (the previous step's gradients, as eager's zero_grad)

    def step() -> None:
        clear()
        last[0] = simulate_program(p.program, per_rank, local)

    def capture() -> None:  # 1 rank: the public entry, fed the parameters and batch each step
        graphed[0] = p.graphed(values) if tp == 1 else GraphedStep(p.program, per_rank)

    def replay() -> None:  # (1 rank: parameters and batch read in place, as a loop that updates them in place)
        last[0] = graphed[0]()

    def loss() -> float:
        out = last[0][0] if graph and tp == 1 else last[0][ts.mesh.ranks[0]][buf]
        return float(out.float().reshape(-1)[0])
    if graph:
        return replay, clear, loss, plan_s, capture
    return step, clear, loss, plan_s, None


def measure(c: Config, steps: int, tps: list[int], graph: bool, compile: bool = True) -> dict:
    """One configuration's row: per method (ms per step, peak MiB), loss differences, host ms."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = build(c).cuda()
    ids = torch.randint(0, c.vocab, (c.batch, c.seq), generator=torch.Generator().manual_seed(1)).cuda()
    batch = {"input_ids": ids, "labels": ids}
    pm = param_mib(model)
    row: dict = {"config": c.name, "params MiB": round(pm, 1)}
    step, clear, last = torch_step(model, batch)
    ms, peak, host = timed(step, clear, steps)
    eager_loss = float(last[0].float())
    row["eager"] = [round(ms, 2), round(peak + pm, 1), round(host, 2)]
    model.zero_grad(set_to_none=True)
    if compile:
        try:
            cstep, cclear, _ = torch_step(torch.compile(model), batch)
            ms, peak, host = timed(cstep, cclear, steps)
            row["compile"] = [round(ms, 2), round(peak + pm, 1), round(host, 2)]
        except Exception as e:  # noqa: BLE001 (a benchmark row says why)
            row["compile"] = f"failed: {type(e).__name__}: {str(e)[:120]}"
        model.zero_grad(set_to_none=True)
        torch._dynamo.reset()
    variants = [("reshard 1 rank", 1, True, False), ("1 rank, torch steps", 1, False, False)]
    variants += [(f"tp {n} on one GPU", n, True, False) for n in tps]
    if graph:
        variants += [(GRAPH, 1, True, True)] + [(f"tp {n} on one GPU, CUDA graph", n, True, True) for n in tps]
    for label, n, kernels, graphed in variants:
        try:
            rstep, rclear, rloss, plan_s, capture = reshard_step(c, model, ids, n, kernels, graphed)
            ms, peak, host = timed(rstep, rclear, steps, setup=capture)
            row[label] = [round(ms, 2), round(peak + pm, 1), round(host, 2), round(plan_s, 1),
                          f"{abs(rloss() - eager_loss) / abs(eager_loss):.1e}"]
            rclear()
            del rstep, rclear, rloss, capture
        except Exception as e:  # noqa: BLE001
            row[label] = f"failed: {type(e).__name__}: {str(e)[:160]}"
        torch.cuda.empty_cache()
    return row


def _cell(v: Any, eager: Any) -> str:
    if not isinstance(v, list):
        return str(v)
    ratio = f" ({v[0] / eager[0]:.2f}x eager)" if isinstance(eager, list) else ""
    return f"{v[0]:.1f} ms{ratio}, {v[1] / 1024:.2f} GiB"


def table(rows: list[dict], tps: list[int], graph: bool) -> str:
    cols = ["eager", "compile", "reshard 1 rank", "1 rank, torch steps"] + [f"tp {n} on one GPU" for n in tps]
    if graph:
        cols += [GRAPH] + [f"tp {n} on one GPU, CUDA graph" for n in tps]
    host = "host ms (CUDA graph: per replay)" if graph else "host ms"
    out = ["| config | " + " | ".join(cols) + f" | reshard 1 rank: {host}, plan s, loss vs eager |",
           "|---" * (len(cols) + 2) + "|"]
    for r in rows:
        one, replayed = r.get("reshard 1 rank"), r.get(GRAPH)
        hosts = f"{one[2]:.2f}" if isinstance(one, list) else ""
        if graph:
            hosts += f" ({replayed[2]:.3f})" if isinstance(replayed, list) else " (-)"
        extra = f"{hosts}, {one[3]:.1f}, {one[4]}" if isinstance(one, list) else ""
        out.append(f"| {r['config']} | " + " | ".join(_cell(r.get(k, "-"), r.get("eager")) for k in cols)
                   + f" | {extra} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tp", type=int, nargs="*", default=[2])
    ap.add_argument("--graph", action="store_true", help="also the steps captured as CUDA graphs and replayed")
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile's column out")
    ap.add_argument("--json", type=str, default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("train_step_gpu: no CUDA device")
        return 1
    rows = []
    for name in a.configs:
        rows.append(measure(CONFIGS[name], a.steps, a.tp, a.graph, not a.no_compile))
        print(json.dumps(rows[-1]), flush=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, reshard plans with the built-in cost profile; "
          f"median of {a.steps} steps after 3 warm-up steps")
    print(table(rows, a.tp, a.graph))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
