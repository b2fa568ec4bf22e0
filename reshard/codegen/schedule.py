"""The order lowering emits the plan's nodes in (``lower.order_nodes``): a list schedule of the
plan DAG that frees memory as soon as it can.

Memory, as the schedule sees it: each node's result is a storage of its local bytes, but a
view's (``views``: its first operand's buffer, such as a reshape or an identity) is its
operand's storage, and an input's is the caller's (0 bytes).  A storage is freed after the last
node reading it (through any view of it), but never where a node in ``kept`` (the program's
inputs and outputs) lives in it, nor, as far as the schedule knows, where a node in
``fusable`` reads it: fusion computes an elementwise op, reading its operands, where the op's
chain ends (``codegen.fuse``), and a node taken early to free the storage would split the chain.

Law: the nodes are taken one at a time among the *ready* ones (every operand taken), by the key
(phase, min(-gain, 1), DFS index), least first:

* phase: forward-phase nodes (0) before backward-phase ones (1) (``passes.phases``; no forward
  value reads a backward one, so the forward ones are all taken first);
* gain: the bytes of the storages that taking the node frees (those it is the last reader of)
  minus its own.  A node freeing at least what it allocates (a view, an input, the weight
  gradient of an lm head reading the large ``dlogits`` last) is taken as soon as it is ready,
  the most freeing first; the others alike (key 1);
* DFS index: the node's place in ``dfs``, the post-order of a depth-first walk from the roots
  (operands in order).  Without a node freeing more than it allocates the schedule is ``dfs``
  stably partitioned by phase (the least DFS index among the ready nodes is the next node of
  ``dfs``), but for the nodes that allocate nothing, which may come earlier.

Operands come before their readers, and the order depends on the plan alone (the same on every
rank).  The gain is a node's effect now, not on the peak: a node taken early allocates its
result early too, so where that result is large and what the DFS order holds when it would
take it is small, the peak may rise (the lm head's weight gradient of a tiny GPT-2 whose
vocabulary is large beside its hidden size and tokens).  A priority queue (a node's entry made
again when its gain grows, the stale one skipped): O((nodes + edges) log nodes).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Set

from ..extract.plan_node import PlanNode


def memory_order(dfs: list[PlanNode], backward: Set[int], nbytes: Mapping[int, int], views: Set[int],
                 kept: Set[int], fusable: Set[int]) -> list[PlanNode]:
    """``dfs`` (the depth-first post-order of the plan's nodes) rescheduled by the module's law;
    nodes by uid: ``backward`` the backward-phase ones, ``nbytes`` each one's bytes (0 for a view
    or an input), ``views`` those whose buffer is their first operand's, ``kept`` those never
    freed, ``fusable`` the elementwise ones."""
    pos = {n.uid: i for i, n in enumerate(dfs)}  # nodes by their DFS index from here on
    operands = [list(dict.fromkeys(pos[a.uid] for a in n.args)) for n in dfs]
    storage = list(range(len(dfs)))
    for i, n in enumerate(dfs):
        if n.uid in views:
            storage[i] = storage[operands[i][0]]
    reads = [sorted({storage[j] for j in ops}) for ops in operands]  # the storages each node reads
    users: list[list[int]] = [[] for _ in dfs]    # the nodes reading each node
    readers: list[list[int]] = [[] for _ in dfs]  # the nodes reading each storage
    for i in range(len(dfs)):
        for j in operands[i]:
            users[j].append(i)
        for s in reads[i]:
            readers[s].append(i)
    # the storages whose freeing counts for no gain: a kept node's, those an elementwise node reads
    uncounted = {storage[pos[u]] for u in kept} | {s for i, n in enumerate(dfs) if n.uid in fusable for s in reads[i]}
    size = [nbytes[n.uid] for n in dfs]
    phase = [n.uid in backward for n in dfs]
    waiting = [len(o) for o in operands]  # operands not taken yet
    unread = [len(r) for r in readers]    # readers not taken yet
    gain = [sum(size[s] for s in reads[i] if unread[s] == 1 and s not in uncounted) - size[i] for i in range(len(dfs))]

    def key(i: int) -> tuple[bool, int, int]:
        return phase[i], min(-gain[i], 1), i

    ready = [key(i) for i in range(len(dfs)) if not waiting[i]]
    heapq.heapify(ready)
    taken = [False] * len(dfs)
    order: list[PlanNode] = []
    while ready:
        i = heapq.heappop(ready)[2]
        if taken[i]:
            continue  # an entry made stale by a larger gain, taken at that one
        taken[i] = True
        order.append(dfs[i])
        for s in reads[i]:
            unread[s] -= 1
            if unread[s] == 1 and s not in uncounted:
                last = next(r for r in readers[s] if not taken[r])
                gain[last] += size[s]
                if not waiting[last] and gain[last] >= 0:
                    heapq.heappush(ready, key(last))
        for r in users[i]:
            waiting[r] -= 1
            if not waiting[r]:
                heapq.heappush(ready, key(r))
    return order
