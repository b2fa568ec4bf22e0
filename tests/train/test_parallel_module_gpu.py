"""Training through ``parallelize`` on a GPU takes the fast path by default: simulated ranks
with the module on a GPU run there, each plan's step replayed as a CUDA graph (or walked through
reshard's kernels with ``cuda_graph=False``), the loss and gradients GPU tensors, trained as
eager; a process-group runtime on a CUDA device runs reshard's kernels (a 1-rank NCCL group,
all one GPU allows).  On the CPU the module keeps the CPU simulation and says so."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import reshard as rs
from tests.train.test_train_loss_fn import Classifier, adamw, batch, plan

def _plan(ranks: int) -> rs.TrainingPlan:
    if ranks == 2:
        return plan()
    x, y = batch(0)
    return rs.plan_training(Classifier(), (x,), rs.DeviceMesh([0], ("tp",)), loss_fn=F.cross_entropy,
                            example_targets=(y,))


def test_on_the_cpu_the_ranks_are_simulated_on_the_cpu() -> None:
    model = rs.parallelize(Classifier(), plan=plan(), simulate=True)
    assert model.runs_on == "not run yet"
    x, y = batch(0)
    loss = model(x, targets=y)
    assert loss.device.type == "cpu" and model.runs_on == "every rank simulated on the CPU"


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [None, False])
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_module_on_the_gpu_trains_there_as_eager(ranks: int, cuda_graph: bool | None) -> None:
    """3 AdamW steps on the GPU match eager's losses and parameters; the loss is a GPU tensor
    and a loss kept from an earlier step keeps its value (the graph's outputs are cloned)."""
    model = rs.parallelize(Classifier().cuda(), plan=_plan(ranks), simulate=True, cuda_graph=cuda_graph)
    kept = []

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = model(x.cuda(), targets=y.cuda())
        assert loss.is_cuda
        kept.append((loss, float(loss.detach())))
        return loss

    got = adamw(step, model.parameters())
    assert ("CUDA graph" in model.runs_on) == (cuda_graph is None), model.runs_on
    assert [float(loss.detach()) for loss, _ in kept] == [v for _, v in kept]
    eager = Classifier().cuda()
    want = adamw(lambda x, y: F.cross_entropy(eager(x.cuda()), y.cuda()), eager.parameters())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    for n, p in eager.named_parameters():
        torch.testing.assert_close(model.module.get_parameter(n), p, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # evaluation: the forward-only plan, captured too
        x, y = (t.cuda() for t in batch(7))
        torch.testing.assert_close(model(x, targets=y).reshape(()), F.cross_entropy(eager(x), y),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_a_process_group_runtime_on_the_gpu_runs_reshards_kernels(tmp_path) -> None:
    """``parallelize`` as one rank of a 1-rank NCCL group (all one GPU allows): the runtime's
    local steps are reshard's kernels (the path ``Plan.simulate(device="cuda")`` runs) and the
    step's loss and gradients are eager's."""
    import torch.distributed as dist

    from reshard.runtime.gpu_local import gpu_local_step

    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        model = rs.parallelize(Classifier().cuda(), plan=_plan(1))
        x, y = (t.cuda() for t in batch(0))
        loss = model(x, targets=y)
        loss.backward()
        assert model.runs_on == "rank 0 of the nccl process group, local steps on cuda:0 through reshard's kernels"
        assert all(rt.local_step is gpu_local_step for rt in model._runtimes.values())
        eager = Classifier().cuda()
        want = F.cross_entropy(eager(x), y)
        want.backward()
        torch.testing.assert_close(loss.reshape(()), want.detach(), rtol=1e-5, atol=1e-6)
        for n, p in eager.named_parameters():
            torch.testing.assert_close(model.module.get_parameter(n).grad, p.grad, rtol=1e-5, atol=1e-6)
        model.close()
    finally:
        dist.destroy_process_group()
