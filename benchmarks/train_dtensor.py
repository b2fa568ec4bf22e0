"""One training step of GPT-2 and Llama: DTensor's plan side by side with reshard's.

    python benchmarks/train_dtensor.py [--models gpt2 llama] [--sizes tiny medium] [--tp 2 4] [--json F]

The step is forward, the loss and backward: ``TrainStep(lm)(input_ids, labels)`` is the mean
cross entropy of the language model's logits against ``labels`` (already shifted, as a data
loader hands them to torchtitan); the gradients end at their parameters' placements.

**DTensor** runs the step in ``tp`` gloo processes (``reshard.launch``: spawn, ``file://``
rendezvous, ``GLOO_SOCKET_IFNAME=lo``) with torchtitan's tensor + sequence parallel plan
(``dtensor_plan``): the embedding row-parallel with a sequence-sharded output, the norms
``SequenceParallel``, attention and MLP inputs all-gathered (``PrepareModuleInput``),
q/k/v/gate/up ``ColwiseParallel``, o/down ``RowwiseParallel`` back to sequence-sharded, the
lm head column-parallel with vocab-sharded logits and the loss under ``loss_parallel``.  GPT-2's
``Conv1D`` layers are converted to ``nn.Linear`` (the same function, weights transposed);
its fused ``c_attn`` is column-parallel over each rank's heads of q, k and v (DTensor's
``_StridedShard(0, split_factor=3)``, Megatron's layout; each rank's attention splits its local
``[q | k | v]`` into thirds), its learned position embedding is replicated and its output
chunked to the sequence shard.  After backward, a gradient whose placement is not its
parameter's (the norms' ``Partial`` weight gradients) is redistributed to it: that is part of
the step.  Every collective is recorded with its size by the recorder of
``benchmarks/dtensor_run.py`` (a dispatch mode over the c10d functional collectives),
``CommDebugMode`` counting beside it as a cross-check; rank 0 checks the loss and every gradient
against the unsharded module's eager step.

**reshard** plans the same module with the same placements (``from_torch(..., train=True)``:
the joint forward + backward program; inputs and loss replicated, every parameter at the
placement DTensor gave it, read back from the DTensor run): ``plan.communications``; the row
"reshard (comm_budget = DTensor's bytes)" plans it again with ``optimize(..., comm_budget=B)``, B
the bytes DTensor's step receives per rank (the fastest plan found within them, with a time limit
that does not cut the search; "infeasible" with the fewest bytes found when none is).

Both sides are priced by the same model: bytes received per rank (the convention of
``collective_kinds.CollectiveKind.moved_bytes``) and the α-β law of the cost profile
(``--profile``, default the built-in one) per collective; reshard's ``plan.cost`` (kernels
included) is shown beside.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's reshard and benchmarks, also in the spawned ranks

import torch  # noqa: E402
from torch.distributed.tensor import Replicate, Shard, distribute_tensor  # noqa: E402
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,  # noqa: E402
                                               RowwiseParallel, SequenceParallel, parallelize_module)
from torch.distributed.tensor.placement_types import _StridedShard  # noqa: E402

import reshard as rs  # noqa: E402
from benchmarks.dtensor_run import Coll, CollectiveRecorder  # noqa: E402
from benchmarks.real_models import Shapes  # noqa: E402
from reshard.extract.budget import OverBudget  # noqa: E402
from reshard.rules.cost_profile import CostProfile  # noqa: E402


#: (model, size) -> shapes; tiny is reshard/testing/hf_models.py's sizes; medium has GPT-2 medium's
#: width (Llama: GQA, SwiGLU of 2816) at 2 layers and 1024 tokens; GPT-2's vocabulary is padded
#: to 50304 (nanoGPT's choice; 50257 does not divide 2 or 4)
SHAPES: dict[tuple[str, str], Shapes] = {
    ("gpt2", "tiny"): Shapes(hidden=64, layers=1, heads=8, kv_heads=8, intermediate=256, vocab=128, seq=8, batch=1),
    ("llama", "tiny"): Shapes(hidden=64, layers=1, heads=8, kv_heads=4, intermediate=128, vocab=128, seq=8, batch=1),
    ("gpt2", "medium"): Shapes(hidden=1024, layers=2, heads=16, kv_heads=16, intermediate=4096, vocab=50304, seq=1024,
                               batch=1),
    ("llama", "medium"): Shapes(hidden=1024, layers=2, heads=16, kv_heads=8, intermediate=2816, vocab=32000, seq=1024,
                                batch=1),
}


# ---- the module -----------------------------------------------------------------------------------------------
class TrainStep(torch.nn.Module):
    """(input_ids, labels) -> the mean cross entropy of the logits against labels (already shifted)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        hidden = self.lm.base_model(input_ids=input_ids, position_ids=positions, use_cache=False).last_hidden_state
        logits = self.lm.lm_head(hidden)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))


def _conv1d_to_linear(module: torch.nn.Module) -> None:
    """Replace every ``transformers`` ``Conv1D`` (y = x W + b, W [in, out]) by the equal ``nn.Linear``."""
    from transformers.pytorch_utils import Conv1D

    for name, child in list(module.named_children()):
        if isinstance(child, Conv1D):
            n_in, n_out = child.weight.shape
            lin = torch.nn.Linear(n_in, n_out)
            with torch.no_grad():
                lin.weight.copy_(child.weight.t())
                lin.bias.copy_(child.bias)
            setattr(module, name, lin)
        else:
            _conv1d_to_linear(child)


def build(model: str, size: str, seed: int = 0) -> tuple[TrainStep, tuple[torch.Tensor, torch.Tensor]]:
    """The module (random weights, fp32, no dropout, untied lm head) and its (input_ids, labels)."""
    import transformers as T

    s = SHAPES[(model, size)]
    torch.manual_seed(seed)
    if model == "gpt2":
        cfg = T.GPT2Config(vocab_size=s.vocab, n_embd=s.hidden, n_layer=s.layers, n_head=s.heads,
                           n_inner=s.intermediate, n_positions=max(64, s.seq), resid_pdrop=0.0, embd_pdrop=0.0,
                           attn_pdrop=0.0, tie_word_embeddings=False, attn_implementation="sdpa")
        lm = T.GPT2LMHeadModel(cfg)
        _conv1d_to_linear(lm)
    else:
        cfg = T.LlamaConfig(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                            num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                            max_position_embeddings=max(64, s.seq), tie_word_embeddings=False,
                            attn_implementation="sdpa")
        lm = T.LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, s.vocab, (s.batch, s.seq), generator=g)
    labels = torch.randint(0, s.vocab, (s.batch, s.seq), generator=g)
    return TrainStep(lm.eval()), (ids, labels)


# ---- DTensor's plan --------------------------------------------------------------------------------------------
#: whether this torch's DTensor redistributes GPT-2's fused qkv (``_StridedShard(0, 3)`` on a 1-D
#: mesh): 2.13 does; 2.11 raises "use_strided_shard_as_shard_order is True, but placements ... is
#: unable to be interpreted into a corresponding shard_order" (its parameter's spec flag set off
#: as well); 2.12 not checked
FUSED_QKV_DTENSOR = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


class FusedColwise(ColwiseParallel):
    """``ColwiseParallel`` of a fused ``[q | k | v]`` Linear: weight and bias ``_StridedShard(0, 3)``,
    so each rank holds its heads of q, k and v (Megatron's layout) and keeps its output local."""

    def _partition_linear_fn(self, name: str, module: torch.nn.Module, device_mesh: Any) -> None:
        for pname, param in module.named_parameters():
            strided = distribute_tensor(param, device_mesh, [_StridedShard(0, split_factor=3)],
                                        src_data_rank=self.src_data_rank)
            module.register_parameter(pname, torch.nn.Parameter(strided))

    @staticmethod
    def _prepare_output_fn(output_layouts: Any, use_local_output: bool, mod: Any, outputs: Any,
                           device_mesh: Any) -> Any:
        return outputs.to_local()  # each rank's [q_r | k_r | v_r], as the weight's layout makes it


def dtensor_plan(step: TrainStep, model: str, mesh: Any) -> None:
    """Apply torchtitan's tensor + sequence parallel plan to ``step`` (in place)."""
    def rowwise_to_sequence() -> RowwiseParallel:
        return RowwiseParallel(output_layouts=Shard(1), use_local_output=False)

    def gather_input(kw: str | None = None) -> PrepareModuleInput:
        if kw:
            return PrepareModuleInput(input_kwarg_layouts={kw: Shard(1)}, desired_input_kwarg_layouts={kw: Replicate()})
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))

    base = "lm." + step.lm.base_model_prefix
    lm_head = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    embed = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)
    if model == "gpt2":
        plan: dict[str, Any] = {
            f"{base}.wte": embed,
            f"{base}.wpe": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                               use_local_output=False),
            f"{base}.ln_f": SequenceParallel(), "lm.lm_head": lm_head}
        for i, block in enumerate(step.lm.base_model.h):
            p = f"{base}.h.{i}."
            plan |= {p + "ln_1": SequenceParallel(), p + "attn": gather_input(), p + "attn.c_attn": FusedColwise(),
                     p + "attn.c_proj": rowwise_to_sequence(), p + "ln_2": SequenceParallel(),
                     p + "mlp": gather_input(), p + "mlp.c_fc": ColwiseParallel(),
                     p + "mlp.c_proj": rowwise_to_sequence()}
            block.attn.split_size //= mesh.size()  # each rank splits its own [q | k | v] heads
    else:
        plan = {f"{base}.embed_tokens": embed, f"{base}.norm": SequenceParallel(), "lm.lm_head": lm_head}
        for i in range(len(step.lm.base_model.layers)):
            p = f"{base}.layers.{i}."
            plan |= {p + "input_layernorm": SequenceParallel(), p + "self_attn": gather_input("hidden_states"),
                     **{p + f"self_attn.{w}_proj": ColwiseParallel() for w in "qkv"},
                     p + "self_attn.o_proj": rowwise_to_sequence(), p + "post_attention_layernorm": SequenceParallel(),
                     p + "mlp": gather_input(), p + "mlp.gate_proj": ColwiseParallel(),
                     p + "mlp.up_proj": ColwiseParallel(), p + "mlp.down_proj": rowwise_to_sequence()}
    parallelize_module(step, mesh, plan)


# ---- one DTensor step on one rank --------------------------------------------------------------------------------
def _placements(p: Any) -> list[str]:
    return [repr(x) for x in p.placements]


def dtensor_worker(rank: int, model: str, size: str, seed: int) -> dict:
    """Run the step on this rank; rank 0 also checks loss and gradients against eager."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import loss_parallel

    warnings.filterwarnings("ignore", category=UserWarning)  # backward hooks on HF outputs, config ids
    world = torch.distributed.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    step, (ids, labels) = build(model, size, seed)
    dtensor_plan(step, model, mesh)
    rec, cdm = CollectiveRecorder(), CommDebugMode()
    t0 = time.perf_counter()
    with rec(), cdm:
        with loss_parallel():
            loss = step(ids, labels)
            n_forward = len(rec.colls)
            loss.backward()
        n_backward = len(rec.colls)
        grad_fixes = []
        for name, p in step.named_parameters():
            if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                grad_fixes.append(f"{name}: {_placements(p.grad)} -> {_placements(p)}")
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
    wall = time.perf_counter() - t0
    loss_value = (loss.full_tensor() if isinstance(loss, DTensor) else loss).item()
    params = {n: list(p.placements) for n, p in step.named_parameters() if isinstance(p, DTensor)}
    grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad) for n, p in step.named_parameters()}
    phases = ["forward"] * n_forward + ["backward"] * (n_backward - n_forward)
    phases += ["gradient placement"] * (len(rec.colls) - n_backward)
    out = {"colls": rec.colls, "phases": phases, "commdebug_total": cdm.get_total_counts(),
           "commdebug": {str(k): v for k, v in cdm.get_comm_counts().items()}, "grad_fixes": grad_fixes,
           "params": params, "loss": loss_value, "step_s": wall}
    if rank == 0:
        ref, args = build(model, size, seed)
        want = ref(*args)
        want.backward()
        out["loss_rel_err"] = abs(loss_value - want.item()) / abs(want.item())
        out["grad_rel_err"] = max(((grads[n] - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-30)).item()
                                  for n, p in ref.named_parameters())
    return out


def run_dtensor(model: str, size: str, tp: int, seed: int = 0, timeout_s: float = 600.0) -> dict:
    """The DTensor step on ``tp`` gloo processes: rank 0's record, ``ranks_agree`` added
    (``ReshardError`` for GPT-2 where this torch's DTensor cannot run its fused qkv:
    ``FUSED_QKV_DTENSOR``)."""
    if model == "gpt2" and not FUSED_QKV_DTENSOR:
        raise rs.ReshardError(f"the DTensor baseline of GPT-2 (its fused qkv as _StridedShard(0, 3)) needs torch 2.13 "
                              f"or newer: torch {torch.__version__}'s DTensor cannot redistribute it on a 1-D mesh")
    per_rank = rs.launch(dtensor_worker, tp, model, size, seed, timeout_s=timeout_s)
    r0 = per_rank[0]
    r0["ranks_agree"] = all(r["colls"] == r0["colls"] for r in per_rank)
    return r0


# ---- reshard's plan -----------------------------------------------------------------------------------------------
def _phases(fusion: Any, tensors: list[str]) -> list[str]:
    """The phase (``passes.phases``) of each named value of the joint Fusion."""
    from reshard.passes.phases import backward_values

    backward = {fusion.tensors[i].name for i in backward_values(fusion)}
    known = {t.name for t in fusion.tensors}
    missing = sorted(set(tensors) - known)
    if missing:
        raise rs.ReshardError(f"communications of values the Fusion does not name: {missing[:5]}")
    return ["backward" if t in backward else "forward" for t in tensors]


@contextlib.contextmanager
def sharing_budget(budget: int | None) -> Iterator[None]:
    """Diagnostic: inside the block, the greedy extractor's sharing search may spend ``budget``
    (re-extractions x e-nodes; default ``extract.dag.SHARING_BUDGET``); None changes nothing."""
    from reshard.extract import dag

    default = dag.SHARING_BUDGET
    if budget is not None:
        dag.SHARING_BUDGET = budget
    try:
        yield
    finally:
        dag.SHARING_BUDGET = default


def run_reshard(model: str, size: str, tp: int, placements: dict[str, list], prof: CostProfile, seed: int = 0,
                check: bool = False, budget: int | None = None, comm_budget: int | None = None) -> dict:
    """Plan the step with reshard (``from_torch(..., train=True)``) at DTensor's parameter placements:
    its collectives as ``Coll`` records, the plan's modeled time and optimize()'s wall time; with
    ``check``, the simulated loss and gradients against the eager step's; ``budget``: the sharing
    search's (``sharing_budget``), with a time limit that does not cut it; ``comm_budget``:
    ``optimize``'s (bytes received per rank), with a time limit that does not cut its multiplier
    search's sharing searches (each extraction runs one)."""
    step, args = build(model, size, seed)
    mesh = rs.DeviceMesh(list(range(tp)), ("tp",))
    prog = rs.from_torch(step, args, [[Replicate()], [Replicate()]], [[Replicate()]], mesh,
                         param_placements=placements, train=True)
    limits = rs.Limits() if budget is None and comm_budget is None else rs.Limits(time_limit_s=600)
    t0 = time.perf_counter()
    with sharing_budget(budget):
        plan = rs.optimize(prog.fusion, cost_profile=prof, limits=limits, comm_budget=comm_budget,
                           cache=False)  # timed, and the sharing budget is patched: no key sees it
    out = {"optimize_s": time.perf_counter() - t0, "plan_s": plan.cost, "ops": len(prog.fusion.ops),
           "colls": [Coll(c.kind, c.team_size, c.bytes) for c in plan.communications],
           "tensors": [c.tensor for c in plan.communications], "comm_bytes": plan.comm_bytes,
           "phases": _phases(plan.fusion, [c.tensor for c in plan.communications]),
           "report": f"{plan.report}; {plan.extraction}"}
    if check:
        got = plan.simulate(prog.inputs(*args))
        want = step(*args)
        want.backward()
        grads = {prog.grads[n]: p.grad for n, p in step.named_parameters() if n in prog.grads}
        names = [prog.fusion.tensors[t].name for t, _ in prog.fusion.outputs]
        refs = [want.detach()] + [grads[n] for n in names[1:]]
        out["rel_err"] = max(((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item() for g, w in zip(got, refs))
    return out


# ---- pricing -----------------------------------------------------------------------------------------------------
def price(colls: list[Coll], prof: CostProfile) -> dict:
    """Counts per kind, bytes received per rank and modeled seconds of collectives, every side
    by the same law (``dtensor_run.collective_time_s``: α-β of the profile, no reorder copies)."""
    return {"collectives": dict(Counter(c.kind for c in colls)), "bytes": sum(c.moved_bytes for c in colls),
            "comm_s": sum(c.cost_s(prof) for c in colls)}


_SHORT = {"allgather": "AG", "reduce_scatter": "RS", "allreduce": "AR", "all_to_all": "A2A"}


def _kinds(colls: list[Coll], phases: list[str] | None = None) -> str:
    """``3 AG, 2 RS`` per phase (``fwd: ...; bwd: ...``) when phases are known."""
    def one(cs: list[Coll]) -> str:
        return ", ".join(f"{n} {_SHORT.get(k, k)}" for k, n in sorted(Counter(c.kind for c in cs).items())) or "-"
    if phases is None:
        return one(colls)
    by: dict[str, list[Coll]] = {}
    for c, ph in zip(colls, phases):
        by.setdefault(ph, []).append(c)
    return "; ".join(f"{ph}: {one(cs)}" for ph, cs in by.items())


def table(rows: list[dict]) -> str:
    lines = ["| model | size | tp | plan | collectives | MiB / rank | comm ms (modeled) | plan ms (modeled) "
             "| optimize() s | vs DTensor bytes / time |", "|---|---|---:|---|---|---:|---:|---:|---:|---:|"]
    base = {(r["model"], r["size"], r["tp"]): r for r in rows if r["plan"] == "DTensor" and "error" not in r}
    for r in rows:
        head = f"| {r['model']} | {r['size']} | {r['tp']} | {r['plan']} "
        if "error" in r:
            lines.append(head + f"| error: {r['error']} ||||||")
            continue
        b = base.get((r["model"], r["size"], r["tp"]))
        vs = (f"{r['bytes'] / b['bytes']:.2f}x / {r['comm_s'] / b['comm_s']:.2f}x"
              if b is not None and r is not b else "")
        plan_ms = f"{r['plan_s'] * 1e3:.3f}" if "plan_s" in r else ""
        opt_s = f"{r['optimize_s']:.1f}" if "optimize_s" in r else ""
        lines.append(head + f"| {r['kinds']} | {r['bytes'] / 2**20:,.3f} | {r['comm_s'] * 1e3:.3f} | {plan_ms} | "
                     f"{opt_s} | {vs} |")
    return "\n".join(lines)


#: the label of the row planned with ``comm_budget`` at DTensor's bytes
AT_DTENSOR_BYTES = "reshard (comm_budget = DTensor's bytes)"


def _case(model: str, size: str, tp: int, prof: CostProfile, check: bool, budgets: list[int]) -> list[dict]:
    key = {"model": model, "size": size, "tp": tp}
    try:
        d = run_dtensor(model, size, tp)
    except rs.ReshardError as e:
        return [key | {"plan": "DTensor", "error": str(e).splitlines()[0][:300]}]
    rows = [key | {"plan": "DTensor", "kinds": _kinds(d["colls"], d["phases"])} | price(d["colls"], prof)]
    print(f"  {model} {size} tp {tp} DTensor: {d['step_s']:.1f} s, loss {d['loss']:.4f} (rel err "
          f"{d['loss_rel_err']:.1e}, grads {d['grad_rel_err']:.1e}), ranks agree {d['ranks_agree']}, "
          f"CommDebugMode {d['commdebug']}; grads redistributed: {d['grad_fixes']}", file=sys.stderr, flush=True)
    runs = [("reshard", None, None), (AT_DTENSOR_BYTES, None, rows[0]["bytes"])]
    runs += [(f"reshard, sharing budget {budget:,}", budget, None) for budget in budgets]
    for label, budget, comm_budget in runs:
        try:
            r = run_reshard(model, size, tp, d["params"], prof, check=check and budget is None, budget=budget,
                            comm_budget=comm_budget)
        except OverBudget as e:
            fewest = "" if e.least is None else f": the fewest found is {e.least / 2**20:,.3f} MiB / rank"
            rows.append(key | {"plan": label, "error": f"infeasible{fewest}"})
            continue
        except (rs.ReshardError, TypeError) as e:  # TypeError: a from_torch without train=
            rows.append(key | {"plan": label, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
            continue
        priced = price(r["colls"], prof)
        assert priced["bytes"] == r["comm_bytes"], "reshard's moved bytes and the shared convention disagree"
        rows.append(key | {"plan": label, "kinds": _kinds(r["colls"], r["phases"]), "plan_s": r["plan_s"],
                           "optimize_s": r["optimize_s"]} | priced)
        print(f"  {model} {size} tp {tp} {label}: {r['ops']} ops, optimize() {r['optimize_s']:.1f} s ({r['report']})"
              + (f", simulated vs eager rel err {r['rel_err']:.1e}" if "rel_err" in r else "")
              + "; " + ", ".join(f"{c.kind} {t} {c.buffer}" for c, t in zip(r["colls"], r["tensors"])),
              file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama"], choices=["gpt2", "llama"])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "medium"], choices=["tiny", "medium"])
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--profile", default=None, help="cost profile for both sides (default: the built-in one)")
    ap.add_argument("--check", action="store_true", help="also simulate reshard's plan and compare with eager")
    ap.add_argument("--sharing-budget", type=int, nargs="*", default=[],
                    help="diagnostic: also plan with the greedy extractor's sharing search given this budget")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    prof = CostProfile.load(args.profile)
    rows = [row for model in args.models for size in args.sizes for tp in args.tp
            for row in _case(model, size, tp, prof, args.check, args.sharing_budget)]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"One training step (fp32); {when}, {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; "
          f"cost profile {prof.name}\n\n{table(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
