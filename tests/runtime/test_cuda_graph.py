"""A plan's step captured as a CUDA graph (``runtime.cuda_graph``, ``Plan.graphed``): clear
errors without CUDA or for what cannot be captured; on a GPU, replays equal the uncaptured
step (1 rank, and tp 2 simulated on the one GPU), new inputs give new results, and a replay
costs far less host time than walking the program."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
import torch.nn.functional as F

import reshard as rs
from reshard.ir.errors import ReshardError
from reshard.ir.tensor_cache import retained, tensor_lru
from reshard.plan_graph import GraphedPlan, read_in_place
from reshard.runtime.cuda_graph import GraphedStep, copy_inputs
from reshard.runtime.local_ops import run_local
from reshard.runtime.simulator import simulate

from reshard.testing import programs as P


@pytest.fixture(scope="module")
def one_rank():
    f = P.mlp(P.MESH_ONE)
    return f, rs.optimize(f)


@pytest.fixture(scope="module")
def mlp2():
    f = P.mlp(P.MESH1)
    return f, rs.optimize(f)


@pytest.fixture(scope="module", params=["mlp", "training_block"])
def tp2(request, mlp2):
    if request.param == "mlp":
        return mlp2
    f = P.training_block()
    return f, rs.optimize(f)


def _cuda(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.cuda() for k, v in inputs.items()}


# ---- without a GPU ----------------------------------------------------------------------

def test_cpu_inputs_are_an_error_naming_the_buffer(one_rank):
    _, plan = one_rank
    per_rank = plan.shard_inputs(P.random_inputs(one_rank[0]))
    with pytest.raises(ReshardError, match=r"rank 0's input '[^']+' is on cpu: a CUDA graph reads CUDA tensors"):
        GraphedStep(plan.program, per_rank)


def test_graphed_on_the_cpu_is_an_error(one_rank):
    f, plan = one_rank
    with pytest.raises(ReshardError, match="Plan.graphed: device='cpu': a CUDA graph runs on a CUDA device"):
        plan.graphed(P.random_inputs(f), device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error of a machine without CUDA")
def test_graphed_without_cuda_is_an_error(one_rank):
    f, plan = one_rank
    with pytest.raises(ReshardError, match="Plan.graphed: device='cuda', but this torch .* sees no CUDA device"):
        plan.graphed(P.random_inputs(f))


def test_a_padded_plan_is_not_graphed():
    f = rs.Fusion()
    x = f.input("x", (5, 4), "float32", P.MESH1, [rs.Shard(0)])
    f.output(f.exp(x), [rs.Shard(0)])
    plan = rs.optimize(f)
    assert plan.padding is not None
    with pytest.raises(ReshardError, match="uneven shardings"):
        GraphedPlan(plan, {"x": torch.randn(5, 4)}, device=torch.device("cuda"))


def test_inputs_every_rank_holds_whole_are_read_in_place(one_rank, mlp2):
    """A 1-rank plan's inputs (even ``Shard`` ones) and replicated ones are read in place;
    sharded or Partial ones are not."""
    assert all(read_in_place(ts) for _, _, ts in one_rank[1].lowered.inputs)
    assert not any(read_in_place(ts) for _, _, ts in mlp2[1].lowered.inputs)
    assert read_in_place(rs.TensorSharding.from_placements((4, 6), [rs.Replicate()], P.MESH1))
    assert not read_in_place(rs.TensorSharding.from_placements((4, 6), [rs.Partial()], P.MESH1))


def test_retained_keeps_what_the_caches_return():
    calls = []

    @tensor_lru(max_entries=1)
    def make(n: int) -> torch.Tensor:
        calls.append(n)
        return torch.full((n,), float(n))

    with retained() as held:
        a, b, a2 = make(2), make(3), make(3)  # a miss, a miss that evicts 2, a hit
    make(4)
    assert calls == [2, 3, 4] and [t is u for t, u in zip(held, (a, b, a2))] == [True] * 3
    assert make(5) is not None and len(held) == 3  # nothing kept outside the block
    with retained() as outer:  # nested blocks: the innermost gets them, each block ends its own
        make(6)
        with retained() as inner:
            make(7)
        make(8)
    assert [int(t[0]) for t in outer] == [6, 8] and [int(t[0]) for t in inner] == [7]


class _WalkedStep:
    """``GraphedStep``'s contract on the CPU: inputs copied into the capture's buffers
    (``copy_inputs``), the program walked (``run_local``), its results written into the
    output tensors of the first walk (a graph's, the same each replay)."""

    def __init__(self, program, inputs):
        self.program, self.inputs = program, {r: dict(bufs) for r, bufs in inputs.items()}
        self.outputs = simulate(self.program, self.inputs, run_local)

    def replay(self, inputs=None):
        copy_inputs(self.inputs, inputs or {})
        for r, outs in simulate(self.program, self.inputs, run_local).items():
            for b, t in outs.items():
                self.outputs[r][b].copy_(t)

    def __call__(self, inputs=None, *, clone=None):
        self.replay(inputs)
        return {r: {b: t.clone() for b, t in outs.items()} for r, outs in self.outputs.items()} if clone \
            else self.outputs


@pytest.fixture
def walked(monkeypatch):
    """``GraphedPlan`` on the CPU, its graph a walked step: what it feeds the graph is checked."""
    import reshard.plan_graph as G
    monkeypatch.setattr(G, "GraphedStep", _WalkedStep)
    return lambda plan, inputs: GraphedPlan(plan, inputs, device=torch.device("cpu"))


def test_inputs_read_in_place_see_in_place_updates(one_rank, walked):
    """1 rank: the given tensors are the graph's buffers: an in-place update is read without
    passing it, and a new tensor is copied into the given one (torch's convention)."""
    f, plan = one_rank
    inputs = P.random_inputs(f, seed=5)
    step = walked(plan, inputs)
    _close(step(), plan.simulate(inputs))
    inputs["w1"].mul_(0.5)
    _close(step(), plan.simulate(inputs))
    new_x = torch.randn_like(inputs["x"])
    _close(step({"x": new_x, "w1": inputs["w1"]}), plan.simulate({**inputs, "x": new_x}))
    assert torch.equal(inputs["x"], new_x)
    outs, kept = step(), step(clone=True)  # the graph's own outputs, one tuple; a clone is not overwritten
    assert step() is outs and all(k is not o and torch.equal(k, o) for k, o in zip(kept, outs))
    assert step.read_in_place == set(inputs)  # (1 rank: every input is its buffer)


def test_sharded_inputs_are_sharded_again_when_passed(mlp2, walked):
    """tp 2: the graph holds shards: an in-place update of a given tensor is read once the tensor
    is passed again (not before); a wrong shape or an unknown name is an error naming it."""
    f, plan = mlp2
    inputs = P.random_inputs(f, seed=6)
    before = plan.simulate(inputs)
    step = walked(plan, inputs)
    inputs["w1"].mul_(0.5)
    _close(step(), before)
    _close(step({"w1": inputs["w1"]}), plan.simulate(inputs))
    with pytest.raises(ReshardError, match=r"input 'w1' is \(3, 3\) torch.float32, the graph was captured for"):
        step({"w1": torch.zeros(3, 3)})
    with pytest.raises(ReshardError, match=r"no input 'w9' \(the plan reads \['w1', 'w2', 'x'\]\)"):
        step({"w9": inputs["w1"]})


def _close(outs: tuple[torch.Tensor, ...], refs: tuple[torch.Tensor, ...]) -> None:
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o.cpu(), r, atol=1e-5, rtol=1e-5)


# ---- on a GPU ---------------------------------------------------------------------------

def _equal(outs: tuple[torch.Tensor, ...], refs: tuple[torch.Tensor, ...]) -> None:
    assert all(o.is_cuda for o in outs)
    _close(outs, refs)


@pytest.mark.gpu
def test_replays_equal_the_uncaptured_step_on_one_rank(one_rank):
    f, plan = one_rank
    first, second = P.random_inputs(f, seed=1), P.random_inputs(f, seed=2)
    given = _cuda(first)
    step = plan.graphed(given)
    outs = step()
    _equal(outs, plan.simulate(first, device="cuda"))
    again = step(_cuda(second))  # new tensors: copied into the captured ones
    _equal(again, plan.simulate(second, device="cuda"))
    assert again[0] is outs[0]  # the graph's own output, overwritten
    given["w1"].mul_(0.5)  # read in place: the next replay sees the update
    halved = dict(second, w1=second["w1"] * 0.5)
    kept = step(clone=True)
    _equal(kept, plan.simulate(halved, device="cuda"))
    assert kept[0] is not outs[0]
    step(_cuda(first))
    _equal(kept, plan.simulate(halved, device="cuda"))  # a clone is not overwritten


@pytest.mark.gpu
def test_replays_equal_the_uncaptured_step_on_two_simulated_ranks(tp2):
    f, plan = tp2
    first, second = P.random_inputs(f, seed=3), P.random_inputs(f, seed=4)
    step = plan.graphed(_cuda(first))
    _equal(step(), plan.simulate(first, device="cuda"))
    _equal(step(_cuda(second)), plan.simulate(second, device="cuda"))


@pytest.mark.gpu
def test_a_replay_costs_little_host_time(tp2):
    f, plan = tp2
    from reshard.runtime.gpu_local import gpu_local_step
    per_rank = {r: _cuda(bufs) for r, bufs in plan.shard_inputs(P.random_inputs(f)).items()}
    step = GraphedStep(plan.program, per_rank)

    def host(run) -> float:
        times = []
        for _ in range(20):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    walked = host(lambda: simulate(plan.program, per_rank, gpu_local_step))
    replayed = host(step)
    assert replayed < walked / 4 and replayed < 1e-3, (replayed, walked)


@pytest.mark.gpu
def test_a_host_sync_in_a_step_is_an_error_naming_it(one_rank):
    f, plan = one_rank
    from reshard.runtime.gpu_local import gpu_local_step
    per_rank = {r: _cuda(bufs) for r, bufs in plan.shard_inputs(P.random_inputs(f)).items()}
    last = max(i for i, s in enumerate(plan.program.steps) if s.kind == "local")

    def syncing(step, env, rank):
        out = gpu_local_step(step, env, rank)
        if step is plan.program.steps[last]:
            out.sum().item()
        return out

    def to_cpu(step, env, rank):
        out = gpu_local_step(step, env, rank)
        return out.cpu() if step is plan.program.steps[last] else out
    with pytest.raises(ReshardError, match=rf"warm-up\): step {last} \(local .*\) on rank 0 cannot run in a CUDA "
                                           r"graph: RuntimeError: .*synchroniz"):
        GraphedStep(plan.program, per_rank, syncing)
    with pytest.raises(ReshardError, match=rf"step {last} .* returned a tensor on cpu"):
        GraphedStep(plan.program, per_rank, to_cpu)
    step = GraphedStep(plan.program, per_rank)  # the device is usable after the failures
    with pytest.raises(ReshardError, match="the graph was captured for"):
        step({0: {next(iter(per_rank[0])): torch.zeros(3, device="cuda")}})
    with pytest.raises(ReshardError, match=r"inputs for rank 5, the program runs on ranks \[0\]"):
        step({5: {}})


# ---- a training step: TrainingPlan.graphed --------------------------------------------

def _classifier_plan(ranks: int) -> rs.TrainingPlan:
    from tests.train.test_train_loss_fn import PLACEMENTS, Classifier, batch
    x, y = batch(0)
    return rs.plan_training(Classifier(), (x,), rs.DeviceMesh(list(range(ranks)), ("tp",)), loss_fn=F.cross_entropy,
                            example_targets=(y,), param_placements=PLACEMENTS if ranks > 1 else None)


def test_a_training_step_is_graphed_from_the_gpu_only():
    from tests.train.test_train_loss_fn import Classifier, batch, plan
    x, y = batch(0)
    with pytest.raises(ReshardError, match=r"TrainingPlan.graphed: the module's state is not on a CUDA device"):
        plan().graphed(Classifier(), x, targets=y)


@pytest.mark.gpu
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_graphed_training_step_trains_as_eager(ranks):
    """3 AdamW steps, each gradient from a replay of ``TrainingPlan.graphed`` (a new batch each
    step, the parameters updated in place between replays), match eager's losses and parameters."""
    from tests.train.test_train_loss_fn import Classifier, batch
    model, eager = Classifier().cuda(), Classifier().cuda()
    x, y = batch(0)
    step = _classifier_plan(ranks).graphed(model, x.cuda(), targets=y.cuda())
    opt, opt_eager = torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.AdamW(eager.parameters(), lr=1e-2)
    for i in range(3):
        x, y = (t.cuda() for t in batch(i))
        loss, grads = step(x, targets=y)
        for n, p in model.named_parameters():
            p.grad = grads[n]
        want = F.cross_entropy(eager(x), y)
        want.backward()
        torch.testing.assert_close(loss.reshape(()), want.detach(), rtol=1e-5, atol=1e-6)
        for o in (opt, opt_eager):
            o.step()
            o.zero_grad()
    for n, p in eager.named_parameters():
        torch.testing.assert_close(model.get_parameter(n), p, rtol=1e-5, atol=1e-6)
