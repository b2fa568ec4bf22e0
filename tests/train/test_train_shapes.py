"""A ``ParallelModule`` called with inputs of other shapes than its example inputs' (the last,
smaller batch of an epoch, an evaluation batch) plans once for those shapes and keeps the plan
(``reshard/train_plans.py``): the losses and parameters match eager's over batches of mixed
sizes, each shape is planned once for training and once for evaluation, the forward-only plan
of shapes that have a training plan is that plan's, and a module given a ``plan=`` (no example
inputs to plan from) says so for new shapes.  Every rank simulated, and 2 gloo processes (rank
0 planning each new shape, with the batch sharded over the ranks: an uneven last batch).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import reshard as rs
from reshard.ir.sharding import unshard
from tests.train.test_train_loss_fn import MESH, PLACEMENTS, Classifier, adamw, plan

#: batch sizes of the training steps: the example's (4), a last batch (3), the example's again
SIZES = (4, 3, 4, 3)


def sized(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s batch, of ``SIZES[step]`` rows."""
    g = torch.Generator().manual_seed(step)
    n = SIZES[step]
    return torch.randn(n, 8, generator=g), torch.randint(0, 6, (n,), generator=g)


def parallel(**kwargs: object) -> rs.ParallelModule:
    x, y = sized(0)
    return rs.parallelize(Classifier(), MESH, example_inputs=(x,), loss_fn=F.cross_entropy, example_targets=(y,),
                          param_placements=PLACEMENTS, **kwargs)


def eager_run() -> tuple[Classifier, list[float], float]:
    """Eager AdamW over ``SIZES``, then the loss of a batch of 5 under no_grad."""
    eager = Classifier()
    losses = adamw(lambda x, y: F.cross_entropy(eager(x), y), eager.parameters(), sized, len(SIZES))
    x, y = eval_batch()
    with torch.no_grad():
        return eager, losses, float(F.cross_entropy(eager(x), y))


def eval_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(9)
    return torch.randn(5, 8, generator=g), torch.randint(0, 6, (5,), generator=g)


def test_new_batch_sizes_plan_once_each() -> None:
    model = parallel(simulate=True)
    got = adamw(lambda x, y: model(x, targets=y), model.parameters(), sized, len(SIZES))
    eager, want, want_eval = eager_run()
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=0)
    for n, p in eager.named_parameters():
        torch.testing.assert_close(model.module.get_parameter(n), p, rtol=1e-5, atol=1e-6)
    training = {shapes[0][0][0]: tp for (train, shapes), tp in model.plans.items() if train}
    assert sorted(training) == [3, 4] and training[4] is model.training_plan  # 4 steps, 2 plans
    x, y = eval_batch()
    with torch.no_grad():
        loss = model(x, targets=y)
        model(*sized(1)[:1], targets=sized(1)[1])
    assert float(loss) == pytest.approx(want_eval, rel=1e-5)
    evaluation = {shapes[0][0][0]: tp for (train, shapes), tp in model.plans.items() if not train}
    assert sorted(evaluation) == [3, 5] and all(tp.grads == {} for tp in evaluation.values())
    assert len(evaluation[5].plan.lowered.outputs) == 1  # the loss alone, planned without the backward pass
    assert evaluation[3].constants is training[3].constants  # its forward_only (replace), not a new export
    assert model.eval_plan is None  # the example shapes were not evaluated


def test_a_given_plan_names_its_shapes() -> None:
    model = rs.parallelize(Classifier(), plan=plan(), simulate=True)
    x, y = sized(1)
    with pytest.raises(rs.ReshardError, match=r"inputs of shapes \(\[3, 8\] float32, \[3\] int64\); the plan "
                                              r"given \(plan=\) reads \(\[4, 8\] float32, \[4\] int64\)"):
        model(x, targets=y)


def gloo_worker(rank: int) -> tuple[list[float], dict[str, torch.Tensor], float, float, list]:
    torch.set_num_threads(1)
    model = parallel(input_placements=[[rs.Shard(0)], [rs.Shard(0)]])  # the batch sharded over the 2 ranks
    losses = adamw(lambda x, y: model(x, targets=y), model.parameters(), sized, len(SIZES))
    x, y = eval_batch()
    x4, y4 = sized(0)
    with torch.no_grad():
        unplanned = model(x, targets=y)  # the global batch of 5: planned here, uneven over the ranks
        mine = model(x4.chunk(2)[rank], targets=y4.chunk(2)[rank])  # this rank's shard of a planned batch
    keys = sorted((train, shapes[0][0][0]) for train, shapes in model.plans)
    model.close()
    return losses, {n: p.detach() for n, p in model.module.named_parameters()}, float(unplanned), float(mine), keys


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
def test_two_gloo_ranks_plan_new_shapes() -> None:
    results = rs.launch(gloo_worker, 2, timeout_s=180)
    eager, want, want_eval = eager_run()
    x4, y4 = sized(0)
    with torch.no_grad():
        want_mine = float(F.cross_entropy(eager(x4), y4))
    tp = parallel(simulate=True).training_plan
    for losses, _, unplanned, mine, keys in results:
        assert losses == pytest.approx(want, rel=1e-5)
        assert unplanned == pytest.approx(want_eval, rel=1e-5) and mine == pytest.approx(want_mine, rel=1e-5)
        assert keys == [(False, 4), (False, 5), (True, 3), (True, 4)]
    for n, p in eager.named_parameters():
        got = unshard({r: results[r][1][n] for r in range(2)}, tp.sharding(n))
        torch.testing.assert_close(got, p.detach(), rtol=1e-5, atol=1e-6)
