"""Training steps on one GPU: reshard's joint (forward + backward) plans of the tiny GPT-2 and
Llama of ``tests/train/test_train.py`` (Megatron placements on tp 2, tp 4 and 2x2 dp x tp, every rank
simulated on the one GPU), their local steps run as reshard's generated kernels
(``Plan.simulate(..., device="cuda")``), checked against the module's own eager
``torch.autograd`` step on the CPU (loss and gradients: relative error; parameters after the
20 steps: elementwise, rtol = atol = 1e-4, as ``tests/train/test_train.py``); then 20 AdamW steps of that loop on the GPU
(``reshard.parallelize(..., simulate=True)`` is CPU-only, so the loop here feeds the plan's
gradients to ``torch.optim.AdamW`` itself) against eager's 20 steps.

Prints one row per configuration: the loss's and the worst gradient's relative error, the
losses and parameters after 20 steps, and how the local steps ran (all ranks of one training
step): as generated kernels, through cuBLAS (matmul), torch's SDPA kernels (attention) / views,
or as torch fallbacks (by op), and how many torch fallbacks are left.  Exit status 1 on a mismatch.

    python scripts/gpu_train_check.py            # on a machine with a CUDA device
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reshard as rs  # noqa: E402
from reshard.ir.ops import op_kind  # noqa: E402
from reshard.ir.ops.attention import FUSED_KINDS  # noqa: E402
from reshard.runtime import gpu_local  # noqa: E402
from reshard.testing.hf_models import megatron  # noqa: E402
from reshard.testing.train_models import LR, MESHES, STEPS, batch, build, input_placements  # noqa: E402

TOL = 1e-4


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def counting(tally: Counter):
    """gpu_local_step that tallies how each step ran."""
    inner = gpu_local.gpu_local_step

    def step(st, env, rank, **kw):
        xs = [env[n] for n in st.ins if n in env]
        fop = st.attr("fop")
        if st.attr("op") != "apply" or fop != "pointwise" and op_kind(fop).cost == "view":
            tally["view/remap"] += 1  # views (reshape, saved, detach, unbucket) and remaps
        elif gpu_local.kernel_path(st, xs):
            tally["kernel"] += 1
        elif st.attr("fop") in ("matmul",):
            tally["cuBLAS"] += 1
        elif st.attr("fop") in FUSED_KINDS:
            tally["SDPA"] += 1
        else:
            tally[f"torch:{st.attr('fop')}"] += 1
        return inner(st, env, rank, **kw)
    return step


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    rows, bad = [], 0
    for name in ("gpt2", "llama"):
        for mk, mesh in MESHES.items():
            t0 = time.time()
            module = build(name)
            tp = rs.plan_training(module, batch(0), mesh, input_placements=input_placements(mesh),
                                  param_placements=megatron(module, mesh))
            plan_s = time.time() - t0
            eager_mod = build(name)
            ref_opt = torch.optim.AdamW(eager_mod.parameters(), lr=LR)
            # every FQN (tied ones too) -> one GPU copy per distinct parameter / buffer
            on_gpu: dict[int, torch.Tensor] = {}
            state = {**dict(module.named_parameters(remove_duplicate=False)),
                     **dict(module.named_buffers(remove_duplicate=False))}
            opt_params = {n: on_gpu.setdefault(id(t), torch.nn.Parameter(t.detach().clone().cuda(),
                                                                         t.requires_grad))
                          for n, t in state.items()}
            opt = torch.optim.AdamW([p for p in on_gpu.values() if p.requires_grad], lr=LR)
            tally: Counter = Counter()
            gpu_local.gpu_local_step, saved = counting(tally), gpu_local.gpu_local_step
            first = {}
            losses, ref_losses = [], []
            try:
                for step in range(STEPS):
                    ids, labels = batch(step)
                    values = {n: opt_params[n].detach() for n in tp.state_inputs}
                    outs = tp.plan.simulate({**dict(zip(tp.user_inputs, (ids, labels))), **values,
                                             **tp.constants}, device="cuda")
                    grads = dict(zip(tp.grads, outs[1:]))
                    ref_loss = eager_mod(ids, labels)
                    ref_loss.backward()
                    if step == 0:
                        first["loss"] = rel(outs[0].reshape(()), ref_loss.detach())
                        first["grad"] = max(rel(grads[n], p.grad) for n, p in eager_mod.named_parameters()
                                            if n in grads)
                    for n, p in opt_params.items():
                        if n in grads:
                            p.grad = grads[n].to(p.device)
                    opt.step()
                    opt.zero_grad()
                    ref_opt.step()
                    ref_opt.zero_grad()
                    losses.append(float(outs[0]))
                    ref_losses.append(float(ref_loss.detach()))
            finally:
                gpu_local.gpu_local_step = saved
            loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
            param_err = max(float((opt_params[n].detach().cpu() - p.detach()).abs().max()) for n, p in eager_mod.named_parameters())
            params_close = all(torch.allclose(opt_params[n].detach().cpu(), p.detach(), rtol=TOL, atol=TOL)
                               for n, p in eager_mod.named_parameters())
            ok = max(first["loss"], first["grad"], loss_err) <= TOL and params_close
            bad += not ok
            per_step = {k: v // STEPS for k, v in tally.items()}
            left = sum(v for k, v in per_step.items() if k.startswith("torch:"))
            rows.append((name, mk, f"{first['loss']:.1e}", f"{first['grad']:.1e}", f"{loss_err:.1e}",
                         f"{param_err:.1e}", f"{plan_s:.1f}", ", ".join(f"{k} {v}" for k, v in sorted(per_step.items())),
                         str(left), "ok" if ok else "MISMATCH"))
    head = ("model", "mesh", "loss err", "grad err", f"{STEPS}-step loss err", "param max |diff|", "plan s",
            "local steps per training step (all ranks)", "torch steps left", "")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join(r))
    print(f"{torch.cuda.get_device_name()}: {len(rows) - bad}/{len(rows)} configurations match eager within {TOL}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
