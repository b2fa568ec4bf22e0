"""The e-graph's rows as a DAG of e-nodes, and the greedy DAG extractor.

``collect_enodes`` lists the T e-nodes (``ENode``) of a snapshot (``search.snapshot``) with
their costs; ``greedy_dag`` is a worklist greedy-DAG extractor: a class's best entry (``Entry``) is
(cost, node, child entries, node set); a node's cost is the sum of the distinct nodes in its
sub-DAG, so a shared value (a gathered weight used twice) is paid once.  Entries only point
at older entries, so the result is acyclic by construction.  ``share_communication`` then
lets plans share collectives the greedy priced separately.  ``extract`` (the plan),
``extract_ilp`` (the exact extractor) and ``pricing`` (rejected alternatives) build on these.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from operator import attrgetter
from typing import Any, Callable, NamedTuple

import numpy as np

from ..rules.collectives import BY_CTOR
from ..rules.schema import T_CONSTRUCTORS
from ..search.snapshot import Snapshot
from . import second_core
from .second_core import Forked


class ENode(NamedTuple):
    """An e-node: its number (``collect_enodes``' order, or a sub-problem's), constructor, class,
    inputs (the row's values), its T children (classes) and its cost.  A tuple: made by the
    hundred thousand (the snapshot's, each window's sub-problem), several times cheaper than a
    frozen dataclass."""

    id: int
    ctor: str
    cls: Any
    args: tuple
    children: tuple  # T classes
    cost: int


class Entry:
    """A class's best implementation so far: ``nodes``/``classes`` are bitsets (Python ints,
    bit i = ENode.id / class index i) of its sub-DAG; ``cost`` the sum over ``nodes``.  Never
    changed once made.  Law: an entry's node set is its node's bit and its children's sets (its
    node in none of them: entries are acyclic).  So an entry of one child may be made with
    ``nodes`` None, its set made on first read (``_chained``): most such entries are superseded
    or never read, and on a large e-graph each set is as wide as the e-graph."""

    __slots__ = ("cost", "node", "children", "_nodes", "classes")

    def __init__(self, cost: int, node: ENode, children: tuple["Entry", ...], nodes: int | None,
                 classes: int) -> None:
        self.cost, self.node, self.children, self._nodes, self.classes = cost, node, children, nodes, classes

    @property
    def nodes(self) -> int:
        bits = self._nodes
        return _chained(self) if bits is None else bits

    def __repr__(self) -> str:
        return f"Entry(cost={self.cost}, node={self.node.id}, children={[k.node.id for k in self.children]})"


def _chained(e: Entry) -> int:
    """``e.nodes`` for an entry made without them: down its chain of such entries to one that
    has them, then each one's set made on the way up (and kept), on an explicit stack (chains are
    as long as their programs)."""
    chain = []
    while e._nodes is None:
        chain.append(e)
        e = e.children[0]
    bits = e._nodes
    for x in reversed(chain):
        bits = x._nodes = bits | 1 << x.node.id
    return bits


class _Costs:
    """Node costs (``costs``, by ENode.id) and their sums over bitsets, vectorized (bitsets of
    shared sub-plans can be large; ``_words``)."""

    def __init__(self, nodes: list[ENode]) -> None:
        self._set(np.array([n.cost for n in nodes], dtype=np.int64))

    @staticmethod
    def of_array(costs: np.ndarray) -> "_Costs":
        """The costs ``costs`` (copied)."""
        c = _Costs([])
        c._set(costs)
        return c

    def zeroed(self, bits: int) -> "_Costs":
        """These costs with the nodes of bitset ``bits`` at 0 (``by_id`` copied and zeroed where
        it is, not converted again: the trials' costs are as long as the e-graph)."""
        at = self.members(bits)
        costs, by_id = self.costs.copy(), self.by_id.copy()
        costs[at] = 0
        for i in at.tolist():
            by_id[i] = 0
        c = _Costs([])
        c._set(costs, by_id)
        return c

    def _set(self, costs: np.ndarray, by_id: list[int] | None = None) -> None:
        """Keep a copy of ``costs`` (read-only from then on): ``costs``, padded to whole words
        in ``_rows`` (one row of 64 costs per word), and ``by_id``, as Python ints (cheaper to
        read one at a time; given: ``costs`` as such a list)."""
        words = (len(costs) + 63) // 64
        padded = np.zeros(words * 64, dtype=np.int64)
        padded[:len(costs)] = costs
        self.costs, self._rows = padded[:len(costs)], padded.reshape(words, 64)
        self.by_id: list[int] = self.costs.tolist() if by_id is None else by_id
        #: no cost below 0: an entry costs at least any of its kids
        self.nonnegative = bool((costs >= 0).all())

    def members(self, bits: int) -> np.ndarray:
        """The node ids in bitset ``bits``, ascending."""
        return np.array(_bits(bits), dtype=np.int64)

    def of(self, bits: int) -> int:
        """The sum of the costs of the nodes in bitset ``bits``."""
        by_id, total = self.by_id, 0
        for _ in range(FIRST_BITS):  # (``_bits``' walk, summed as it goes)
            if not bits:
                return total
            top = bits.bit_length() - 1
            total += by_id[top]
            bits ^= 1 << top
        if bits.bit_count() <= FEW_BITS - FIRST_BITS:
            while bits:
                top = bits.bit_length() - 1
                total += by_id[top]
                bits ^= 1 << top
            return total
        at, hit = _words(bits)
        return total + int((self._rows[at] * hit).sum())


#: set bits up to which a bitset is read bit by bit (``_bits``), not by unpacking its words
#: (``_words``: about 10 us whatever the count, on a 33k-node e-graph)
FEW_BITS = 32
#: set bits taken before a bitset's bits are counted: most sets priced hold a few nodes, and
#: counting reads every word (``int.bit_count``: 5 us on a set as wide as the 135k e-nodes of the
#: 4-layer Llama-2-7B dp 2 x tp 4 stack, more than taking the few)
FIRST_BITS = 8


def _words(x: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the nonzero 64-bit words of bitset ``x`` and their bits, one row of 64
    (0/1, lowest bit first) per word: only those words are unpacked (the sets read are mostly
    sparse in a long range of ids)."""
    words = np.frombuffer(x.to_bytes(8 * ((x.bit_length() + 63) // 64), "little"), dtype="<u8")
    at = np.flatnonzero(words)
    return at, np.unpackbits(words[at].view(np.uint8), bitorder="little").reshape(len(at), 64)


def _positions(x: int) -> np.ndarray:
    """Positions of the set bits of ``x``, ascending (``_words``)."""
    at, hit = _words(x)
    word, bit = np.nonzero(hit)
    return at[word] * 64 + bit


def collect_enodes(snap: Snapshot) -> list[ENode]:
    """The T e-nodes of ``snap`` with a known cost (``InAt``: 0), in table order (constructor by
    constructor, each table's rows in order), numbered from 0.

    Each class is one object in every node's ``cls`` and ``children`` (the first met, ``one``):
    a snapshot's rows hold equal but distinct class keys, and a dict or set of classes
    compares a key to an equal one element by element, through the e-graph's value type, but
    to itself at once: the from-scratch greedy of the 4-layer Llama-2-7B dp 2 x tp 4 e-graph
    (135k e-nodes) 1.00 -> 0.70 s CPU."""
    nodes: list[ENode] = []
    one: dict[Any, Any] = {}
    for ctor, sorts in T_CONSTRUCTORS.items():
        kids = [i for i, s in enumerate(sorts) if s == "T"]
        for key, out, c in snap.costed(ctor):
            if ctor == "InAt":
                c = 0
            elif c is None:
                continue  # no cost known: not a well-formed implementation
            nodes.append(ENode(len(nodes), ctor, one.setdefault(out, out), key,
                               tuple([one.setdefault(key[i], key[i]) for i in kids]), c))
    return nodes


def parents_of(nodes: Iterable[ENode]) -> dict[Any, list[ENode]]:
    """The class graph: class -> the nodes of ``nodes`` having it among their children (each
    once, in the order of ``nodes``; a class no node reads maps to [])."""
    parents: dict[Any, list[ENode]] = defaultdict(list)
    for n in nodes:
        for c in set(n.children):
            parents[c].append(n)
    return parents


class GraphIndex(NamedTuple):
    """A ``ClassGraph`` numbered for ``greedy_dag``'s hot path: its classes (``classes``; ``cidx``:
    class -> number) and, by node id (lists where the graph's node ids are dense, else dicts,
    read alike), each node's class number (``ncls``), its one child's class number (``nkid``;
    -1: not one child), its children's class numbers otherwise (``nkids``), its class's bit
    (``nbit``; None: the class has none, read again at the visit, which fails as it did) and
    the node (``nobj``); by class number, its parents' node ids (``par``).  Lists read by a
    small int, not dicts keyed by classes (a class key hashes through the e-graph's value type):
    a from-scratch greedy over the 4-layer Llama-2-7B dp 2 x tp 4 e-graph 0.49 -> 0.42 s."""

    cidx: dict[Any, int]
    classes: list[Any]
    ncls: Any
    nkid: Any
    nkids: Any
    nbit: Any
    nobj: Any
    par: list[Sequence[int]]


@dataclass(frozen=True)
class ClassGraph:
    """The class graph ``greedy_dag`` walks: each class's parent nodes (``parents_of``; by id:
    ``parent_ids``), the class bits entries are made with (``cls_bit``), and every node it may
    visit by id (``node_of``); ``index``: the same numbered (``GraphIndex``), made on first use."""

    parents: dict[Any, list[ENode]]
    cls_bit: dict[Any, int]
    parent_ids: dict[Any, list[int]]
    node_of: dict[int, ENode]

    @staticmethod
    def of(parents: dict[Any, list[ENode]], cls_bit: dict[Any, int], nodes: Iterable[ENode] = ()) -> "ClassGraph":
        """The graph of ``parents`` and ``cls_bit`` whose nodes are the parents and ``nodes``."""
        node_of = {n.id: n for n in nodes}
        for ps in parents.values():
            for p in ps:
                node_of[p.id] = p
        return ClassGraph(parents, cls_bit, {c: [p.id for p in ps] for c, ps in parents.items()}, node_of)

    @cached_property
    def index(self) -> GraphIndex:
        node_of = self.node_of
        cidx: dict[Any, int] = {}
        for n in node_of.values():
            cidx.setdefault(n.cls, len(cidx))
            for c in n.children:
                cidx.setdefault(c, len(cidx))
        for c in self.parent_ids:
            cidx.setdefault(c, len(cidx))
        par: list[Sequence[int]] = [()] * len(cidx)
        for c, ids in self.parent_ids.items():
            par[cidx[c]] = ids
        bit, items = self.cls_bit.get, node_of.items()
        tables = ({i: cidx[n.cls] for i, n in items},
                  {i: cidx[n.children[0]] if len(n.children) == 1 else -1 for i, n in items},
                  {i: tuple([cidx[k] for k in n.children]) for i, n in items if len(n.children) != 1},
                  {i: bit(n.cls) for i, n in items}, node_of)
        top = max(node_of, default=-1) + 1
        if 2 * len(node_of) >= top:  # dense ids: lists (read faster than dicts by int)
            tables = tuple(list(map(t.get, range(top))) for t in tables)
        return GraphIndex(cidx, list(cidx), *tables, par)


def _graph(nodes: list[ENode], every: list[ENode] | None = None) -> ClassGraph:
    """The class graph of ``nodes`` (``parents_of``), class bits in table order: the bits of the
    classes of ``every`` (default ``nodes``), so that entries extracted from a part of the
    e-nodes and from all of them number classes alike."""
    return ClassGraph.of(parents_of(nodes), class_bits(nodes if every is None else every), nodes)


def class_bits(nodes: Iterable[ENode]) -> dict[Any, int]:
    """Each class of ``nodes`` -> its bit in entries' class sets: classes in table order (the
    numbering ``_graph`` gives and ``entry_rows`` / ``entries_of`` rely on)."""
    return {c: 1 << i for i, c in enumerate(dict.fromkeys(n.cls for n in nodes))}


def _improved(n: ENode, kids: list[Entry], cur: Entry | None, costs: _Costs, bit: int) -> Entry | None:
    """The entry node ``n`` makes from ``kids`` (its children's entries) if it costs less than
    ``cur`` (the class's entry so far, None: none) and is acyclic (no kid holds n's class,
    bit ``bit``), else None.

    DAG cost: shared sub-plans are paid once.  Start from the costliest kid's set and add only
    what each other kid brings new (usually a few nodes: ``costs.of`` is then cheap); n itself
    is in no kid's set (that entry would be cyclic).  Without negative node costs an entry
    costs at least its node plus its costliest kid, which rejects most visits before any
    node set is built."""
    first = max(kids, key=_cost) if kids else None
    cost = costs.by_id[n.id] + (first.cost if first is not None else 0)
    if cur is not None and cost >= cur.cost and (len(kids) < 2 or costs.nonnegative):
        return None
    for e in kids:
        if e.classes & bit:
            return None
    node_set = 1 << n.id
    if first is not None:
        bits = first._nodes  # (``Entry.nodes``, read without the property: this is the hot path)
        node_set |= _chained(first) if bits is None else bits
        for e in kids:
            if e is not first:
                bits = e._nodes
                union = (_chained(e) if bits is None else bits) | node_set
                if union != node_set:  # (what e brings new is ``union ^ node_set``: no ``& ~``, which
                    # complements a set as wide as the e-graph, several times slower)
                    cost += costs.of(union ^ node_set)
                    node_set = union
        if cur is not None and cost >= cur.cost:
            return None
    classes = bit
    for e in kids:
        classes |= e.classes
    return Entry(cost, n, tuple(kids), node_set, classes)


@lru_cache(maxsize=4)
def _zeros(n: int) -> list[int]:
    """``n`` zeros (``greedy_dag``'s lift where keys are not lifted; shared, never written)."""
    return [0] * n


#: an entry's cost (a sort key; in C: ``greedy_dag``'s hot path reads it)
_cost = attrgetter("cost")


#: a queued visit is one int, ``cost << _ID_BITS | node id`` (ids below 2**32): ordered as (cost, id),
#: compared faster than a tuple
_ID_BITS = 32
_ID_MASK = (1 << _ID_BITS) - 1


def greedy_dag(nodes: list[ENode], costs: _Costs, seed: dict[Any, Entry] | None = None,
               changed: Iterable[Any] = (), graph: ClassGraph | None = None, lifted: bool = False
               ) -> dict[Any, Entry]:
    """Best entry per T class (see module docstring); node costs are ``costs.costs``.  With
    ``seed`` (entries already priced under those costs), only the parents of the ``changed``
    classes are revisited.

    Nodes are (re)visited cheapest first, ties by id: a node waits in a heap keyed by the cost
    of the entry that queued it (a parent never costs less than a child), so most classes get
    their final entry on the first visit instead of improving step by step, which on deep
    programs re-queued every ancestor each time (quadratic).  ``lifted``: keyed by that cost
    plus the node's own, a lower bound of the entry it makes (with no negative cost an entry
    costs at least its node and its costliest kid; exact for a node of one child whose kid's
    entry stays), as Dijkstra keys its distances: a costly node is no longer visited early
    only for its class to improve later, each improvement re-queuing every parent.  Either
    order ends in a valid greedy extraction, but not the same one where choices cost alike
    (the first made is kept), and the searches built on it then go elsewhere.  The release
    trials (``release_trial``) walk lifted: from scratch over the whole buckets e-graph of the
    Llama-2-7B dp 2 x tp 4 step, 2.97 entries a class unlifted (3.4M visits for 11 trials over
    139k e-nodes, 0.9-1.0 s a trial), lifted 1.13 (1.6M visits, 0.38-0.45 s), and the same
    plan.  The other walks stay unlifted: the first greedy lifted changed 20 of the 84 digests
    of ``scripts/plan_digests.py`` and started the 2-layer Llama-2-7B forward at tp 8 and seq
    4096 at 21,697 us instead of 18,793 (its plan 16,107 us instead of 15,823); the free
    trials (``free_trial``, incremental) lifted changed 43 of the 48 plans of
    ``benchmarks/train_scale.py``: 15 cheaper (GPT-2 XL at dp 2 x tp 4 by up to 1.9%), 9
    dearer (by up to 0.13%), and no faster.  The first visits (the leaves, or the changed
    classes' parents: most of them) are sorted once instead and merged with the heap.  A node
    of one child (most nodes) extends its child's entry: the cost is exact without building a
    node set, since the node is in no kid's set (that entry would be cyclic); others are
    priced by ``_improved``.  The entries are kept by class number (``ClassGraph.index``) as
    they are made and returned by class, each class where the walk first gave it one (after
    ``seed``'s, in its order)."""
    node_cost, nonnegative = costs.by_id, costs.nonnegative
    lift = node_cost if lifted else _zeros(len(node_cost))
    g = graph or _graph(nodes)
    cidx, classes, ncls, nkid, nkids, nbit, nobj, par = g.index
    cls_bit = g.cls_bit
    out: dict[Any, Entry] = dict(seed) if seed is not None else {}
    best: list[Entry | None] = [None] * len(classes) if seed is None else list(map(seed.get, classes))
    if seed is None:
        first = [node_cost[n.id] << _ID_BITS | n.id for n in nodes if not n.children]
    else:
        first = []
        for c in changed:
            e, ci = out.get(c), cidx.get(c)
            key = e.cost if e is not None else 0
            first += [(key + lift[i]) << _ID_BITS | i for i in (() if ci is None else par[ci])]
    first.sort()
    queued = {k & _ID_MASK for k in first}
    unqueue, enqueue = queued.discard, queued.add
    later: list[int] = []
    pop, push = heapq.heappop, heapq.heappush
    j, end = 0, len(first)
    made: list[int] = []  # class numbers, in the order they first got an entry here
    unmade = [True] * len(classes)
    # (the loop below is greedy_dag's hot path: names bound locally, every read by number)
    while True:
        if later and (j == end or later[0] < first[j]):
            i = pop(later) & _ID_MASK
        elif j < end:
            i = first[j] & _ID_MASK
            j += 1
        else:
            break
        if i not in queued:
            continue  # a duplicate of a visit already made
        unqueue(i)
        k = nkid[i]
        if k >= 0:
            kid = best[k]
            if kid is None:
                continue
            cost = node_cost[i] + kid.cost
            ci = ncls[i]
            cur = best[ci]
            if cur is not None and cost >= cur.cost:
                continue
            bit = nbit[i]
            if bit is None:
                bit = cls_bit[nobj[i].cls]
            if kid.classes & bit:
                continue
            e = Entry(cost, nobj[i], (kid,), None, bit | kid.classes)
        else:
            got = [best[x] for x in nkids[i]]
            if None in got:
                continue
            ci = ncls[i]
            cur = best[ci]
            if cur is not None and nonnegative and got and node_cost[i] + max(map(_cost, got)) >= cur.cost:
                continue  # (``_improved``'s first test, without the call: most visits of such nodes end here)
            bit = nbit[i]
            e = _improved(nobj[i], got, cur, costs, cls_bit[nobj[i].cls] if bit is None else bit)
            if e is None:
                continue
        best[ci] = e
        if unmade[ci]:
            unmade[ci] = False
            made.append(ci)
        key = e.cost
        for p in par[ci]:
            if p not in queued:
                enqueue(p)
                push(later, (key + lift[p]) << _ID_BITS | p)
    for ci in made:
        out[classes[ci]] = best[ci]  # type: ignore[assignment]
    return out


#: the sharing search's work bound: re-extractions x e-nodes (deterministic, unlike a time
#: limit: every rank must extract the same plan)
SHARING_BUDGET = 300_000
#: constructors whose nodes the sharing search considers: every communication
SHARED_KINDS = frozenset(BY_CTOR)
#: the communications that reduce a Partial value (a gradient bucket's, ``extract.select``)
REDUCING_KINDS = frozenset(c for c, k in BY_CTOR.items() if k.reduce_ops)


def _bits(x: int) -> list[int]:
    """Positions of the set bits of ``x``, ascending."""
    out: list[int] = []
    for _ in range(FIRST_BITS):  # highest first: what is left shrinks with every bit taken
        if not x:
            return out[::-1]
        top = x.bit_length() - 1
        out.append(top)
        x ^= 1 << top
    if x.bit_count() > FEW_BITS - FIRST_BITS:
        return _positions(x).tolist() + out[::-1]
    while x:
        top = x.bit_length() - 1
        out.append(top)
        x ^= 1 << top
    return out[::-1]


def _plan_bits(best: dict[Any, Entry], roots: list[Any]) -> int | None:
    """The node set of the plan for ``roots`` (None: a root has no entry)."""
    used = 0
    for r in roots:
        if r is None or r not in best:
            return None
        used |= best[r].nodes
    return used


def _plan_cost(best: dict[Any, Entry], roots: list[Any], costs: _Costs) -> int | None:
    used = _plan_bits(best, roots)
    return None if used is None else costs.of(used)


def fold_dag(roots: Iterable[Any], children: Callable[[Any], Sequence[Any]], combine: Callable[[Any, list], Any],
             memo: dict[int, Any] | None = None) -> dict[int, Any]:
    """``combine(x, [results of children(x)])`` for every object under ``roots``, children
    first, left to right, once per object (memoized by ``id``, into ``memo`` when given, which
    is returned).  The same order as the obvious recursion, on an explicit stack: plans and
    entries are as deep as their programs, far past Python's recursion limit."""
    done: dict[int, Any] = {} if memo is None else memo
    for root in roots:
        if id(root) in done:
            continue
        stack: list[tuple[Any, list]] = [(root, [])]
        while stack:
            x, got = stack[-1]
            kids = children(x)
            while len(got) < len(kids) and id(kids[len(got)]) in done:
                got.append(done[id(kids[len(got)])])
            if len(got) < len(kids):
                stack.append((kids[len(got)], []))
                continue
            stack.pop()
            done[id(x)] = combine(x, got)
            if stack:
                stack[-1][1].append(done[id(x)])
    return done


#: entries as plain rows (``entry_rows``): per entry, children first, (cost, node id, the
#: children's row numbers, its class bits or None where derived, its node bits or None where
#: derived or not made yet); and the row numbers of each group of entries given
EntryRows = tuple[list[tuple[int, int, tuple[int, ...], int | None, int | None]], list[list[int]]]


def entry_rows(groups: Sequence[Iterable[Entry]], cls_bit: dict[Any, int]) -> EntryRows:
    """The entries under ``groups`` as rows (``EntryRows``), for ``entries_of`` in another
    process: an entry shared is one row.  Bits that follow from ``Entry``'s law (its node's
    bit and its children's) are left out (None): ``cls_bit`` numbers the classes as the entries
    were made (``class_bits``)."""
    rows: list[tuple[int, int, tuple[int, ...], int | None, int | None]] = []

    def row(e: Entry, kids: list[int]) -> int:
        classes = cls_bit.get(e.node.cls, 0)
        bits = e._nodes
        if bits is not None:
            made = 1 << e.node.id
            for k in e.children:
                made |= k.nodes
            bits = None if made == bits else bits
        for k in e.children:
            classes |= k.classes
        rows.append((e.cost, e.node.id, tuple(kids), None if classes == e.classes else e.classes, bits))
        return len(rows) - 1

    made: dict[int, int] = {}
    fold_dag([e for g in groups for e in g], lambda e: e.children, row, made)
    return rows, [[made[id(e)] for e in g] for g in groups]


def entries_of(got: EntryRows, nodes: list[ENode], cls_bit: dict[Any, int]) -> list[list[Entry]]:
    """The groups of entries of ``entry_rows`` made again here, on ``nodes`` (by id) and
    ``cls_bit``: the same costs, nodes, children (shared alike), node and class bits."""
    rows, groups = got
    out: list[Entry] = []
    for cost, node_id, kids, classes, bits in rows:
        n = nodes[node_id]
        children = tuple(out[k] for k in kids)
        if classes is None:
            classes = cls_bit.get(n.cls, 0)
            for k in children:
                classes |= k.classes
        if bits is None and len(children) != 1:  # (a one-child entry's set is made on first read)
            bits = 1 << n.id
            for k in children:
                bits |= k.nodes
        out.append(Entry(cost, n, children, bits, classes))
    return [[out[i] for i in g] for g in groups]


def _recost(best: dict[Any, Entry], costs: _Costs) -> dict[Any, Entry]:
    """``best`` with every entry's cost recomputed from ``costs`` (DAG cost = the sum over its
    node set), children included."""
    fixed = fold_dag(best.values(), lambda e: e.children, lambda e, kids: repriced(e, e.node, kids, costs))
    return {c: fixed[id(e)] for c, e in best.items()}


def repriced(e: Entry, node: ENode, kids: list[Entry], costs: _Costs) -> Entry:
    """``e`` with node ``node`` (``e``'s e-node, maybe at another cost) on ``kids`` (its
    children's entries, priced under ``costs``: the same node sets), priced under ``costs``.
    A one-child entry's set is its node's and its child's (``Entry``'s law; its node is in no
    child's set), so it costs its node plus its child, and keeps a set not made yet unmade."""
    if len(kids) == 1:
        return Entry(costs.by_id[node.id] + kids[0].cost, node, (kids[0],), e._nodes, e.classes)
    return Entry(_set_cost(e.nodes, kids, costs), node, tuple(kids), e.nodes, e.classes)


def true_priced(entries: dict[Any, Entry], roots: list[Entry], nodes: list[ENode], costs: _Costs
                ) -> tuple[dict[Any, Entry], list[Entry]]:
    """Entries (and ``roots``, entries among or below them) chosen under other costs (a budget's
    Lagrangian ones, ``budget.fit``; the data-axis search's, ``extract.select``),
    re-priced with the true ``nodes`` and ``costs``: the same node sets."""
    done = fold_dag([*entries.values(), *roots], lambda e: e.children,
                    lambda e, kids: repriced(e, nodes[e.node.id], kids, costs))
    return {c: done[id(e)] for c, e in entries.items()}, [done[id(e)] for e in roots]


def _set_cost(nodes: int, kids: Iterable[Entry], costs: _Costs) -> int:
    """The sum of ``costs`` over bitset ``nodes``, given ``kids``, entries already priced under
    ``costs``: the costliest kid whose nodes are all in ``nodes`` plus the rest (usually a few
    nodes), not the whole set summed again."""
    base = max((k for k in kids if k.nodes & nodes == k.nodes), key=_cost, default=None)
    # (the rest as ``nodes ^ base``, base being within nodes: no complement of a set as wide as the e-graph)
    return costs.of(nodes) if base is None else base.cost + costs.of(nodes ^ base.nodes)


def _holding(best: dict[Any, Entry], ids: list[int], start: set[Any], parents: dict[Any, list[ENode]],
             holders: "_Holders | None" = None) -> dict[Any, int]:
    """The classes whose entry in ``best`` holds a node of ``ids`` (node ids, ascending), each
    with the nodes of ``ids`` it holds, narrowed: bit k stands for node ``ids[k]`` (a set as
    wide as ``ids``, not as the e-graph, is cheap to combine, hash and price).  ``start``: the
    classes of those nodes; ``parents``: the class graph ``best`` was extracted on.

    Law: an entry holds a node only through a chain of child entries, each entry's node a
    parent of the next one's class, so only the entries of the classes above ``start`` are
    read (``_above``; on the gradient buckets' e-graphs a few hundred of ten thousands), or,
    where those are many (over a quarter of ``best``), every entry, cheaper than walking the
    graph, or, given a search's ``holders``, the entries above those of ``ids``' nodes in the
    entries' own graph (``_EntryDag``, built once per state of the search); and by ``Entry``'s
    law, what an entry holds is what its node and its children hold (``_held``): no node set
    not made yet is made (each is as wide as the e-graph)."""
    index = holders.cached(best) if holders is not None else None
    if index is None:
        above = _above(start, parents, len(best) // 4)
        if above is not None or holders is None:
            read = best if above is None else [k for k in above if k in best]
            hits = _held([best[k] for k in read], {i: 1 << k for k, i in enumerate(ids)}, above)
            return {k: hits[id(best[k])] for k in read if hits[id(best[k])]}
        index = holders.of(best)
    return index.holding(ids)


class _Holders:
    """A search's ``_EntryDag``, kept for the entries it was built on (one at a time): a search's
    entries change only when a trial is kept, so the trials of one state (a gradient bucket's
    reductions, tried one by one) read one index.  Built the first time a trial's holders are
    too many to find through the class graph (``_above``)."""

    def __init__(self) -> None:
        self._dag: _EntryDag | None = None

    def cached(self, best: dict[Any, Entry]) -> "_EntryDag | None":
        """The index of ``best`` if it is the one kept."""
        dag = self._dag
        return dag if dag is not None and dag.best is best and dag.size == len(best) else None

    def of(self, best: dict[Any, Entry]) -> "_EntryDag":
        """The index of ``best``, built and kept (in place of the one kept before)."""
        self._dag = _EntryDag(best)
        return self._dag


class _EntryDag:
    """The entries under ``best`` (its entries and theirs below, by ``id``) indexed for
    ``_holding``: each one's parents among them, the entries of each e-node, and an order with
    every entry after its children; a trial then walks up from the entries of its own nodes
    instead of walking every entry (the tiny 4-layer Llama's buckets at 2 x 2: 90 trials, the
    holders 44 -> 8 ms each).  Law (``_holding``'s): an entry holds a node iff the node is its
    own or one of its children holds it, so the holders of ``ids`` are the entries above those
    whose node is one of them, and what each holds is its node's bit and its children's."""

    def __init__(self, best: dict[Any, Entry]) -> None:
        self.best, self.size = best, len(best)
        order: list[Entry] = []  # (children first)
        self.rank = fold_dag(best.values(), lambda e: e.children, lambda e, _: order.append(e) or len(order) - 1)
        self.parents: dict[int, list[Entry]] = defaultdict(list)
        self.of_node: dict[int, list[Entry]] = defaultdict(list)
        for e in order:
            self.of_node[e.node.id].append(e)
            for k in e.children:
                self.parents[id(k)].append(e)
        self.keys: dict[int, list[Any]] = defaultdict(list)
        for k, e in best.items():
            self.keys[id(e)].append(k)

    def holding(self, ids: list[int]) -> dict[Any, int]:
        """``_holding(self.best, ids, ...)``: the keys of ``best`` whose entry holds a node of
        ``ids``, each with those nodes (bit k: ``ids[k]``)."""
        paid = {i: 1 << k for k, i in enumerate(ids)}
        above: dict[int, Entry] = {}
        stack = [e for i in ids for e in self.of_node.get(i, ())]
        while stack:
            e = stack.pop()
            if id(e) not in above:
                above[id(e)] = e
                stack.extend(self.parents.get(id(e), ()))
        hits: dict[int, int] = {}
        held, rank = hits.get, self.rank
        for e in sorted(above.values(), key=lambda e: rank[id(e)]):
            hit = paid.get(e.node.id, 0)
            for k in e.children:
                hit |= held(id(k), 0)
            hits[id(e)] = hit
        return {k: hit for i, hit in hits.items() if hit for k in self.keys.get(i, ())}


def _above(start: set[Any], parents: dict[Any, list[ENode]], most: int) -> set[Any] | None:
    """The classes above ``start`` in the class graph ``parents`` (``start`` included), or None
    once they are more than ``most``."""
    seen, stack = set(start), list(start)
    while stack:
        for p in parents.get(stack.pop(), ()):
            if p.cls not in seen:
                seen.add(p.cls)
                if len(seen) > most:
                    return None
                stack.append(p.cls)
    return seen


def _held(roots: list[Entry], paid: dict[int, int], classes: set[Any] | None) -> dict[int, int]:
    """``id(e)`` -> the OR of ``paid`` (e-node id -> a bit) over e's node set, for every entry e
    under ``roots`` whose class is in ``classes`` (None: every class); an entry of another class
    is not read and holds none of ``paid``'s nodes (the caller's law: ``_holding``).  By
    ``Entry``'s law, an entry holds what its node and its children hold: children first, on
    an explicit stack (entries are as deep as their programs)."""
    hits: dict[int, int] = {}
    held, node_bit = hits.get, paid.get
    for root in roots:
        stack = [root]
        while stack:
            e = stack[-1]
            if id(e) in hits:
                stack.pop()
                continue
            todo = False
            for k in e.children:
                if id(k) not in hits and (classes is None or k.node.cls in classes):
                    stack.append(k)
                    todo = True
            if todo:
                continue
            stack.pop()
            hit = node_bit(e.node.id, 0)
            for k in e.children:
                hit |= held(id(k), 0)
            hits[id(e)] = hit
    return hits


def free_trial(nodes: list[ENode], costs: _Costs, cur_costs: _Costs, best: dict[Any, Entry], delta: int,
               changed: list[Any], graph: ClassGraph, by_id: dict[int, ENode], holders: _Holders | None = None
               ) -> tuple[dict[Any, Entry], _Costs]:
    """Re-extract greedily assuming the nodes of bitset ``delta`` are already paid for: their
    costs become 0 (returned: ``cur_costs`` so changed), entries holding them get cheaper
    (``_holding``; ``by_id``: the e-nodes by id), and the parents of the ``changed`` classes
    are revisited.  The caller keeps the result iff its true cost (under ``costs``) is lower:
    every result is a valid greedy extraction.  ``holders``: the search's index of ``best``'s
    entries (``_holding``)."""
    trial_costs, ids = cur_costs.zeroed(delta), _bits(delta)
    narrow = _Costs.of_array(cur_costs.costs[ids])  # delta's nodes' costs, as ``_holding`` numbers them
    seed, saved = dict(best), {}  # saved: each distinct hit priced once (consumers share most of it)
    for k, hit in _holding(best, ids, {by_id[i].cls for i in ids}, graph.parents, holders).items():
        e = best[k]
        paid = saved.get(hit)
        if paid is None:
            paid = saved[hit] = narrow.of(hit)
        # (the same node set, made or not: ``Entry``'s law holds of the same children)
        seed[k] = Entry(e.cost - paid, e.node, e.children, e._nodes, e.classes)
    return greedy_dag(nodes, trial_costs, seed, changed, graph), trial_costs


def release_trial(nodes: list[ENode], costs: _Costs, used: int, delta: int, graph: ClassGraph
                  ) -> tuple[dict[Any, Entry], _Costs]:
    """Re-extract greedily, from scratch, assuming every node of the plan ``used`` is paid for
    except those of ``delta``: they cost what they really cost again (returned: the costs so
    changed).  A sub-plan assumed paid stays cheap for every later trial, so a consumer that
    could avoid it (a lookup that needs no whole embedding table gathered) is never priced
    against it again; here it is, with the rest of the plan as it is.  The caller keeps
    the result iff its true cost is lower: every result is a valid greedy extraction (walked
    in ``greedy_dag``'s lifted order)."""
    trial_costs = costs.zeroed(used & ~delta)
    return greedy_dag(nodes, trial_costs, graph=graph, lifted=True), trial_costs


@dataclass
class _Search:
    """The sharing search's state: the entries, their plan's true cost, the nodes assumed paid
    (``free``; ``cur_costs``: the node costs with them at 0), the deltas accepted so far (in
    order) and the re-extractions spent."""

    best: dict[Any, Entry]
    cur: int
    free: int
    cur_costs: _Costs
    accepted: list[int]
    evals: int = 0
    #: the index of ``best``'s entries its trials read (``_holding``)
    holders: _Holders = field(default_factory=_Holders)

    def copy(self) -> "_Search":
        """The same state, to go on from separately (entries are never changed in place)."""
        return _Search(self.best, self.cur, self.free, self.cur_costs, list(self.accepted), self.evals, self.holders)


def _try_free(s: _Search, c: Any, nodes: list[ENode], costs: _Costs, roots: list[Any], graph: ClassGraph,
              class_list: list[Any], by_id: dict[int, ENode]) -> bool:
    """One free trial (``free_trial``) of class ``c``'s sub-plan, kept in ``s`` iff the plan's
    true cost drops; False when nothing of it is left unpaid (no trial run) or it was not kept.

    Law: the trial is a function of ``c`` and the state it reads (``s``'s entries, paid nodes,
    their costs and the plan's cost), and a trial not kept leaves ``s`` as it was; the state
    only changes when a trial is kept (``s.accepted`` grows).  So a trial that failed fails
    again, with the same result, until some trial is kept: ``share_communication`` does not
    repeat it in the next pass unless one was (the plan is the same, with fewer
    re-extractions)."""
    delta = s.best[c].nodes & ~s.free if c in s.best else 0
    if not delta:
        return False
    # the other consumers of c's sub-plan (parents of its classes) are revisited: that is
    # where sharing can now pay off (``class_list``: ``graph``'s classes by bit)
    changed = [class_list[i] for i in _bits(s.best[c].classes)]
    trial, trial_costs = free_trial(nodes, costs, s.cur_costs, s.best, delta, changed, graph, by_id, s.holders)
    s.evals += 1
    t = _plan_cost(trial, roots, costs)
    if t is None or t >= s.cur:
        return False
    s.best, s.cur, s.free, s.cur_costs = trial, t, s.free | delta, trial_costs
    s.accepted.append(delta)
    return True


def _release(s: _Search, deltas: list[int], nodes: list[ENode], costs: _Costs, roots: list[Any], graph: ClassGraph,
             stop: Callable[[], bool] | None, progress: Callable[[str], None] | None = None) -> None:
    """Release each of ``deltas`` still in the plan once (``release_trial``), in order, kept in
    ``s`` iff the plan's true cost drops; ``progress`` told before each ("releasing i/m")."""
    for i, delta in enumerate(deltas):
        if stop is not None and stop():
            break
        used = _plan_bits(s.best, roots)
        if not used & delta:
            continue
        if progress is not None:
            progress(f"releasing {i + 1}/{len(deltas)}")
        trial, trial_costs = release_trial(nodes, costs, used, delta, graph)
        s.evals += 1
        t = _plan_cost(trial, roots, costs)
        if t is not None and t < s.cur:
            s.best, s.cur, s.free, s.cur_costs = trial, t, used & ~delta, trial_costs


#: seconds the later half of a pass's trials is expected to take (its trials x the fastest of the
#: state's first ``AHEAD_AFTER`` failed ones) from which it is tried ahead on a spare core
#: (``_Ahead``): forking a process that holds the e-graph's entries costs both processes copies
#: of the pages they then write (the next trial here 0.05 -> 0.46 s on the tiny 2 x 2 Llama's
#: buckets, 250k e-nodes); the 4-layer one's bucket search (92 trials of 0.12 s, one kept)
#: 11.9 -> 7.4 s
AHEAD_MIN_S = 2.0
#: failed trials in one state timed before the rest's time is estimated, at the fastest of them
#: (a search's first trials are slower than the rest: the 4-layer Llama-2-7B at dp 2 x tp 4's
#: sharing search, 0.1 s each, then 5 ms)
AHEAD_AFTER = 3


class _Ahead:
    """The later half of a pass's trials, tried ahead in a forked child (``second_core.Forked``)
    on the state the pass is in, while this process tries the first half.

    Law: a trial is a function of its class and the search's state, and the state changes only
    when a trial is kept (``_try_free``'s law); so, until this process keeps one, each trial
    the child ran failed here as it failed there, with the same re-extractions spent.  The
    child tries its classes in order on a copy of the state and stops after the first it
    keeps; ``failed(i)`` gives the re-extractions of the failed trial of ``order[i]`` (None:
    not tried ahead, or kept there: the caller runs it here, where it is kept alike).  The
    caller drops the child (``close``) once it keeps a trial of its own, and reads only the
    outcomes of classes it has not skipped, in order: the search's plan and re-extractions are
    those of trying every class here, one after another."""

    def __init__(self, classes: list[int], child: Forked) -> None:
        self.classes, self.child = classes, child  # (positions in ``order``, ascending)
        self.outcomes: dict[int, int | None] | None = None

    @staticmethod
    def of(s: _Search, order: list[Any], start: int, skipped: Callable[[Any], bool],
           trial: Callable[[_Search, Any], bool], trial_s: float, evals: int) -> "_Ahead | None":
        """The child trying the later half of the classes of ``order`` from ``start`` that
        ``skipped`` keeps, at most ``evals`` of them (the re-extractions left; None: expected
        to take less than ``AHEAD_MIN_S`` at ``trial_s`` seconds a trial, or no core spare)."""
        todo = [i for i in range(start, len(order)) if not skipped(order[i])][:evals]
        later = todo[len(todo) // 2:]
        if len(later) < 2 or len(later) * trial_s < AHEAD_MIN_S or not second_core.available():
            return None

        def tried() -> list[int | None]:
            t, out = s.copy(), []
            for i in later:
                spent = t.evals
                if trial(t, order[i]):
                    out.append(None)
                    break
                out.append(t.evals - spent)
            return out

        return _Ahead(later, Forked(tried, spare=True))

    def failed(self, i: int) -> int | None:
        """The re-extractions of ``order[i]``'s trial if it was tried ahead and failed (the
        child's outcomes are read, waiting for them, when the first of its classes is met)."""
        if i < self.classes[0]:
            return None
        if self.outcomes is None:
            self.outcomes = dict(zip(self.classes, self.child.result()))
        return self.outcomes.get(i)

    def close(self) -> None:
        self.child.close()


def _round_robin(order: list[Any], one_of: dict[Any, Hashable]) -> list[Any]:
    """``order`` with each group's first class (``one_of``; a class outside it is a group of
    its own) before any group's second, and so on, in ``order`` within each round."""
    rank: dict[Any, int] = {}
    taken: dict[Hashable, int] = defaultdict(int)
    for c in order:
        g = one_of.get(c, c)
        rank[c], taken[g] = taken[g], taken[g] + 1
    return sorted(order, key=rank.__getitem__)


def share_communication(nodes: list[ENode], costs: _Costs, roots: list[Any], best: dict[Any, Entry],
                        budget: int | None = None, stop: Callable[[], bool] | None = None,
                        only: frozenset[Any] | None = None, graph: ClassGraph | None = None,
                        one_of: dict[Any, Hashable] | None = None,
                        later: list[Callable[[], tuple[dict[Any, Entry] | None, int]]] | None = None,
                        progress: Callable[[str], None] | None = None
                        ) -> tuple[dict[Any, Entry], int, int | None, int | None]:
    """Improve a greedy extraction where outputs could share a communication.

    The greedy prices each class's sub-plan on its own, so two consumers that could share one
    all-gather each buy their own cheaper-looking path (in the demo block: 78 us where 62 us
    exists).  Law of the search: for a class c whose implementation is a communication, assume
    c's sub-plan is already paid for (its nodes cost 0), re-extract greedily, and keep the
    result iff its *true* cost (every distinct node at its real cost) is lower.  Accepted
    classes stay free; passes repeat until none improves, ``budget`` (re-extractions x
    e-nodes; None: ``SHARING_BUDGET``, read at the call) is spent or ``stop()`` says so
    (optimize()'s time limit).  Then each accepted sub-plan still in the plan is released
    once (``release_trial``, in acceptance order): the rest of the plan paid, it is priced
    at its real cost again, kept iff the true cost is lower (the whole Llama-2-7B at tp 8:
    the first accepted trial assumed the embedding table's all-gather paid, 219 MiB per rank;
    released, the table is all-to-alled to hidden-sharded instead, 27 MiB, 4989.5 -> 4272.6
    us on 2 layers, Megatron-SP 4268.6).

    Output trials (with ``later``, a list): outputs share sub-plans too, and the greedy
    prices each output's on its own; a training step's gradients re-price the whole forward
    pass the loss pays for, so they may pick shardings of saved values that the forward does
    not produce, and no single communication's trial undoes that.  So, from the state the
    passes end in, each output's sub-plan is also tried as paid (in output order, at most as
    many trials as the passes may re-extract), and those accepted are released with the
    others.  The trials are not run here: a call is appended to ``later`` that runs them when
    called and returns (their entries where that ends cheaper than the plain release, else
    None, and the re-extractions they spent), the same whenever it is called, here or in a
    forked child (the returned entries stay the plain search's: ``extract.select`` makes the
    trials' entries a second candidate, and ``extract.choose`` searches and finishes it
    beside finishing the plain search's plan, keeping the cheaper).  Llama medium at tp 4,
    training: the passes' 33 re-extractions (of 2,033 candidate classes) left the backward's
    norms sequence-sharded behind reduce-scatters and all-gathers (4022.5 us after the buckets and adoption, 75 MiB
    per rank); with the loss's sub-plan paid, the backward all-reduces the residual
    gradients as Megatron does: 3864.8 us, 60 MiB.

    Every candidate plan is a valid greedy extraction, so the result is as sound as the
    greedy's and never costlier.  ``only``: the classes to try (default: every class
    implemented by a communication); ``graph``: ``_graph(nodes)`` or one numbering classes
    alike for a part of the e-nodes.  ``progress``: told before each of the passes' trials
    ("k/n re-extractions": so far / the budget's) and each release ("releasing i/m").
    ``one_of``: class -> its group, classes that are
    alternatives for one thing (a gradient bucket's reductions, one per dist of the bucket):
    once one of a group is kept, the others are not tried (measured on the tiny 2x2 Llama:
    of a bucket's 9-28 reduction classes, the first tried was kept and no other, in two
    passes; on the 7B-shaped dp 2 x tp 4 stack the other 540 trials took 190 s).  A group
    kept is mostly kept at its first class, so the groups are tried round robin
    (``_round_robin``): every group's first class, then every group's second, and so on; the
    trials kept then come early in a pass, and a trial that failed after the pass's last kept
    one is not repeated (``_try_free``'s law; the 4-layer Llama-2-7B at dp 2 x tp 4: the
    buckets' searches 85 and 116 trials in table order, 77 and 100 round robin: most are the
    24 reductions each of the 3-4 buckets never kept, each tried once).  Where a pass's trials
    are many and slow and a core is spare, the later half of them is tried ahead in a forked
    child (``_Ahead``: the same plan and re-extractions).  Returns (best, re-extractions, cost
    before, cost after)."""
    before = _plan_cost(best, roots, costs)
    if before is None:
        return best, 0, before, before
    order: list[Any] = []
    seen: set[Any] = set()
    for n in nodes:  # deterministic order (table order), one candidate per class
        if n.ctor in SHARED_KINDS and n.cls not in seen and (only is None or n.cls in only):
            seen.add(n.cls)
            order.append(n.cls)
    if one_of is not None:
        order = _round_robin(order, one_of)
    graph = graph or _graph(nodes)
    class_list, by_id = list(graph.cls_bit), {n.id: n for n in nodes}
    s = _Search(best, before, 0, costs, [])
    improved = True
    max_evals = max(1, (SHARING_BUDGET if budget is None else budget) // max(1, len(nodes)))
    settled: set[Hashable] = set()  # the groups of ``one_of`` with a kept trial
    failed_at: dict[Any, int] = {}  # class -> the state (``len(s.accepted)``) its trial last failed in

    def skipped(c: Any) -> bool:
        # (settled, or its trial would run on the state it failed in: ``_try_free``'s law)
        return one_of is not None and one_of.get(c, c) in settled or failed_at.get(c) == len(s.accepted)

    def trial(t: _Search, c: Any) -> bool:
        return _try_free(t, c, nodes, costs, roots, graph, class_list, by_id)

    while improved and s.evals < max_evals:
        improved = False
        ahead: _Ahead | None = None  # (the later trials of this state, tried on a spare core)
        asked, timed = False, []  # (whether a child was considered for this state; its failed trials' seconds)
        for i, c in enumerate(order):
            if s.evals >= max_evals or (stop is not None and stop()):
                improved = False
                break
            if skipped(c):
                continue
            if progress is not None:
                progress(f"{s.evals}/{max_evals} re-extractions")
            failed = ahead.failed(i) if ahead is not None else None
            if failed is not None:
                s.evals += failed
            else:
                spent, start = s.evals, time.perf_counter()
                if trial(s, c):
                    improved, asked, timed = True, False, []
                    if one_of is not None:
                        settled.add(one_of.get(c, c))
                    if ahead is not None:
                        ahead.close()
                        ahead = None
                    continue
                if not asked and s.evals > spent:
                    timed.append(time.perf_counter() - start)
                    if len(timed) >= AHEAD_AFTER:
                        asked = True
                        ahead = _Ahead.of(s, order, i + 1, skipped, trial, min(timed), max_evals - s.evals)
            failed_at[c] = len(s.accepted)
        if ahead is not None:
            ahead.close()
    tried = s.copy()  # the state the passes end in
    _release(s, list(s.accepted), nodes, costs, roots, graph, stop, progress)

    def output_trials() -> tuple[dict[Any, Entry] | None, int]:
        """Output trials from ``tried``, then every accepted sub-plan released: (the entries,
        where they end below the plain release's ``s.cur``, and the re-extractions spent)."""
        t = tried.copy()
        first = len(t.accepted)
        t.evals = 0
        for c in dict.fromkeys(roots):
            if t.evals >= max_evals or (stop is not None and stop()):
                break
            unpaid = _plan_bits(t.best, roots) & ~t.free
            if c in t.best and t.best[c].nodes & unpaid != unpaid:  # (else the whole plan is paid: no change)
                _try_free(t, c, nodes, costs, roots, graph, class_list, by_id)
        if len(t.accepted) > first:
            _release(t, list(t.accepted), nodes, costs, roots, graph, stop)
            if t.cur < s.cur:
                return _recost(t.best, costs), t.evals
        return None, t.evals

    if later is not None:
        later.append(output_trials)
    return (_recost(s.best, costs) if s.cur != before else s.best), s.evals, before, s.cur
