"""The order lowering emits the plan's nodes in (``codegen.schedule.memory_order``):

* on hand-built DAGs, the law: a node freeing more than it allocates is taken as soon as it is
  ready (through views of what it frees; not a storage an elementwise node reads, which fusion
  reads where its chain ends), the other nodes keep the depth-first order, forward phase first;
  on random DAGs, operands before readers, and the order a function of the DAG's
  shape (not of its node ids);
* on a tiny GPT-2's training plan (tied lm head, vocabulary large beside the hidden size), the
  lm head's weight gradient runs right after the input gradient instead of at the end of the
  backward, so ``dlogits`` is freed early: ``plan.peak_bytes`` is lower than with the
  depth-first order, still the simulator's measured peak, and the loss and gradients are
  autograd's."""

from __future__ import annotations

import os
import random

import pytest
import torch

import reshard as rs
import reshard.codegen.lower as lower_module
from reshard.codegen.lower import _topo
from reshard.codegen.schedule import memory_order
from reshard.extract import second_core
from reshard.extract.plan_node import Head, PlanNode, Tag


def _node(uid: int, *args: PlanNode, tag: Tag = Tag.APPLY) -> PlanNode:
    return PlanNode(uid, Head(tag), 0, None, args, 0)  # type: ignore[arg-type]  # no sharding: the order reads none


def _dfs_order(dfs: list[PlanNode], backward: set[int], *_: object) -> list[PlanNode]:
    """The depth-first order, forward phase first (lowering's order before the memory-aware one)."""
    return sorted(dfs, key=lambda n: n.uid in backward)


def _uids(order: list[PlanNode]) -> list[int]:
    return [n.uid for n in order]


def test_a_node_freeing_memory_runs_once_ready() -> None:
    """``a`` (large) is read by ``b`` and ``c``; the DFS reaches ``c`` only after the chain
    ``d1, d2`` on ``b``.  Taking ``c`` after ``b`` frees ``a`` (``c`` is its last reader, and
    smaller): ``c`` comes before the chain."""
    x = _node(0, tag=Tag.INPUT)
    a = _node(1, x)
    b = _node(2, a)
    d1 = _node(3, b)
    d2 = _node(4, d1)
    c = _node(5, a)
    out = _node(6, d2, c)
    dfs = _topo([out])
    assert _uids(dfs) == [0, 1, 2, 3, 4, 5, 6]
    nbytes = {0: 0, 1: 100, 2: 10, 3: 50, 4: 50, 5: 10, 6: 10}
    assert _uids(memory_order(dfs, set(), nbytes, set(), {0, 6}, set())) == [0, 1, 2, 5, 3, 4, 6]
    # a kept `a` (an output) is never freed: nothing to gain, the DFS order
    assert _uids(memory_order(dfs, set(), nbytes, set(), {0, 1, 6}, set())) == _uids(dfs)
    # `c` allocating more than `a` frees: the DFS order
    assert _uids(memory_order(dfs, set(), {**nbytes, 5: 101}, set(), {0, 6}, set())) == _uids(dfs)
    # `b` elementwise: fusion may read `a` where `b`'s chain ends, so `c` frees nothing sure: the DFS order
    assert _uids(memory_order(dfs, set(), nbytes, set(), {0, 6}, {2})) == _uids(dfs)


def test_the_lm_head_weight_gradient_frees_dlogits_through_views() -> None:
    """``dlogits`` is read by the input gradient ``dh`` and, through a reshape (a view), by the
    weight gradient ``dw``, which also reads a view of a forward activation; the DFS reaches
    ``dw`` only after the layers' backward ``e1, e2``.  The views allocate nothing and are taken
    when ready, so ``dw`` runs right after ``dh`` and ``dlogits`` is freed before ``e1``."""
    h = _node(0, tag=Tag.INPUT)
    w = _node(1, tag=Tag.INPUT)
    dlogits = _node(2, h, w)
    dh = _node(3, dlogits, w)
    e1 = _node(4, dh)
    e2 = _node(5, e1)
    flat = _node(6, dlogits)       # view of dlogits
    saved_h = _node(7, h)          # view of h
    dw = _node(8, flat, saved_h)
    dfs = _topo([e2, dw])
    assert _uids(dfs).index(8) > _uids(dfs).index(5)
    nbytes = {0: 0, 1: 0, 2: 1000, 3: 10, 4: 40, 5: 40, 6: 0, 7: 0, 8: 100}
    backward = {2, 3, 4, 5, 6, 7, 8}
    order = _uids(memory_order(dfs, backward, nbytes, {6, 7}, {0, 1, 5, 8}, set()))
    assert order.index(8) < order.index(4), order
    assert order.index(3) < order.index(8)


def _random_dag(rng: random.Random, n: int) -> tuple[list[PlanNode], list[PlanNode], set[int], dict[int, int], set[int]]:
    """Nodes 0..n-1 (each reading up to 3 earlier ones; the first few inputs), their roots (the
    nodes nothing reads), a backward phase closed under readers, sizes and views."""
    nodes: list[PlanNode] = []
    for i in range(n):
        if i < 3:
            nodes.append(_node(i, tag=Tag.INPUT))
            continue
        nodes.append(_node(i, *rng.sample(nodes, rng.randint(1, min(3, i)))))
    read = {a.uid for v in nodes for a in v.args}
    roots = [v for v in nodes if v.uid not in read]
    backward: set[int] = set()
    for v in nodes:
        if v.args and (rng.random() < 0.15 or any(a.uid in backward for a in v.args)):
            backward.add(v.uid)
    views = {v.uid for v in nodes if v.args and rng.random() < 0.2}
    nbytes = {v.uid: 0 if v.uid in views or not v.args else rng.choice([1, 10, 100, 1000]) for v in nodes}
    return nodes, roots, backward, nbytes, views


@pytest.mark.parametrize("seed", range(20))
def test_random_dags_operands_first_phases_in_order_and_ids_irrelevant(seed: int) -> None:
    rng = random.Random(seed)
    nodes, roots, backward, nbytes, views = _random_dag(rng, 60)
    kept = {v.uid for v in nodes if not v.args} | {r.uid for r in roots}
    dfs = _topo(roots)
    fusable = {v.uid for v in nodes if v.args and rng.random() < 0.2}
    order = memory_order(dfs, backward, nbytes, views, kept, fusable)
    assert sorted(_uids(order)) == sorted(_uids(dfs))
    at = {v.uid: i for i, v in enumerate(order)}
    assert all(at[a.uid] < at[v.uid] for v in order for a in v.args)
    phases = [v.uid in backward for v in order]
    assert phases == sorted(phases)
    # the same DAG under other node ids: the same order, node for node
    relabel = dict(zip(range(len(nodes)), rng.sample(range(1000, 2000), len(nodes))))
    copies: dict[int, PlanNode] = {}
    for v in nodes:
        copies[v.uid] = _node(relabel[v.uid], *(copies[a.uid] for a in v.args), tag=v.head.tag)
    other = memory_order(_topo([copies[r.uid] for r in roots]), {relabel[u] for u in backward},
                         {relabel[u]: b for u, b in nbytes.items()}, {relabel[u] for u in views},
                         {relabel[u] for u in kept}, {relabel[u] for u in fusable})
    assert _uids(other) == [relabel[u] for u in _uids(order)]


def test_without_gains_the_order_is_depth_first() -> None:
    """Every node allocating more than any operand it could free: the DFS order, forward first,
    but for the inputs (allocating nothing), which come first."""
    rng = random.Random(7)
    nodes, roots, backward, _, _ = _random_dag(rng, 80)
    nbytes = {v.uid: 0 if not v.args else 2 ** v.uid for v in nodes}
    dfs = _topo(roots)
    inputs = [v.uid for v in dfs if not v.args]
    order = _uids(memory_order(dfs, backward, nbytes, set(), set(inputs), set()))
    assert order == inputs + [u for u in _uids(_dfs_order(dfs, backward)) if u not in inputs]
    assert order != _uids(_dfs_order(dfs, backward))  # (the DFS order has inputs between other nodes)


@pytest.mark.hf
def test_tied_gpt2_frees_dlogits_early(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.lower.test_loss_memory import simulated_matches_autograd

    T = pytest.importorskip("transformers")
    vocab, hidden, batch, seq = 512, 64, 2, 128  # dlogits (tokens x vocab) large beside dW (vocab x hidden)

    def plan() -> tuple[torch.nn.Module, rs.TrainingPlan]:
        torch.manual_seed(0)
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=1, n_head=4, n_positions=seq,
                                               attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0))
        return model, rs.plan_training(model, mesh=rs.DeviceMesh([0], ("tp",)), example_kwargs=_batch(), cache=False)

    def _batch() -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
        return {"input_ids": ids, "labels": ids}

    model, tp = plan()
    with monkeypatch.context() as m:
        m.setattr(lower_module, "memory_order", _dfs_order)
        _, depth_first = plan()
    assert depth_first.plan.digest() != tp.plan.digest()
    assert tp.plan.peak_bytes < depth_first.plan.peak_bytes
    assert tp.plan.saved_bytes == depth_first.plan.saved_bytes
    stats = simulated_matches_autograd(model, tp, _batch())
    assert stats["peak_bytes"] == {0: tp.plan.peak_bytes}


@pytest.mark.hf
def test_lowering_keeps_the_order_that_peaks_lower(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tied GPT-2 whose vocabulary is large beside its hidden size and tokens: the schedule takes
    the lm head's weight gradient (vocab x hidden) as soon as it frees dlogits, while the saved
    activations are still held, and that raises the peak; ``lower`` tries both orders
    (``node_orders``) and keeps the depth-first one here, so the plan peaks at the lower of the two.
    With the later order lowered in a forked child (``FORK_MIN_NODES``), the same program."""
    T = pytest.importorskip("transformers")
    vocab, hidden, batch, seq = 2048, 32, 2, 64

    def planned(orders: str | None) -> rs.Plan:
        torch.manual_seed(0)
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=1, n_head=4, n_positions=seq,
                                               attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0))
        ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
        with monkeypatch.context() as m:
            if orders is not None:
                both = lower_module.node_orders
                m.setattr(lower_module, "node_orders",
                          lambda f, r: [both(f, r)[0 if orders == "depth-first" else -1]])
            tp = rs.plan_training(model, mesh=rs.DeviceMesh([0], ("tp",)),
                                  example_kwargs={"input_ids": ids, "labels": ids}, cache=False)
        return tp.plan

    depth_first, scheduled, kept = (planned(o).peak_bytes for o in ("depth-first", "schedule", None))
    assert scheduled > depth_first  # the schedule's local gain raised the peak here
    assert kept == min(depth_first, scheduled)
    forks: list[bool] = []
    with monkeypatch.context() as m:
        m.setattr(second_core, "SECOND_CORE", True)
        m.setattr(second_core, "spare_cpu", lambda: True)
        m.setattr(lower_module, "FORK_MIN_NODES", 0)
        m.setattr(lower_module, "Forked", lambda fn, spare: forks.append(spare) or second_core.Forked(fn, spare=spare))
        forked = planned(None)
    assert forks == [hasattr(os, "fork")]
    assert forked.peak_bytes == kept and forked.digest() == planned(None).digest()
