"""DAG-aware extraction over the e-graph's table snapshot, and decoding of the result.

egglog's own extractor sums costs over trees (shared subterms paid once per use, u64
overflow on deep DAGs), so reshard reads ``egraph.freeze()`` rows and extracts itself
(``search.snapshot``: the snapshot; ``dag``: the e-nodes, the greedy-DAG extractor and the
sharing search; ``extract_ilp``: the exact extractor).  This module selects the best entries,
puts the plan in canonical order and decodes it into ``PlanNode``s (``plan_node``); under a
memory or communication budget, ``budget.fit`` repeats the selection with kept bytes
(``memory``) or received bytes (``received``) priced by a searched multiplier.  What pricing
the plan's rejected alternatives reads is handed on (``PlanPricing``): the explanations price
them on first use (``reshard.alternatives``).
"""

from __future__ import annotations

import functools
import gc
import random
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, TypeVar


from ..passes.buckets import bucket_roots, bucket_values
from ..ir.fusion import Fusion
from ..ir.mesh import DeviceMesh
from ..ir.ops import op_kind
from ..rules.schema import OP_CTORS
from ..search.encode import data_axes, no_output_plan, unmet_redistribute
from ..search.snapshot import Snapshot, real_classes
from .budget import check_budget, fit, union_bits
from .dag import (REDUCING_KINDS, ClassGraph, ENode, Entry, EntryRows, _Costs, _graph, _plan_bits,
                  _plan_cost, _set_cost, class_bits, collect_enodes, entries_of, entry_rows, fold_dag, greedy_dag,
                  share_communication, true_priced)
from .extract_ilp import check_extractor, ilp_dag
from .memory import kept_bytes, kept_budget
from .memory import COUNTS as KEPT, KEYWORD as MEMORY
from .plan_node import PlanNode, enode_head
from .priced_out import data_axis_split, dear, model_axis_split
from .pricing import Pricer
from .received import COUNTS as RECEIVED, KEYWORD as COMM, Received, received_budget
from . import second_core
from .second_core import Forked
from .windows import WINDOW_SUB_NODES, exact_windows, op_positions


@dataclass(frozen=True)
class Extracted:
    """An extracted plan: the outputs' ``PlanNode``s, its modeled time (ps), the bytes per rank
    it keeps for the backward pass (``memory``; 0 without ``saved`` ops) and the multiplier
    that priced them (ps per byte; None: no memory budget was given), the bytes each rank
    receives (``received``: the lowered plan's ``comm_bytes``) and the multiplier that priced
    them (None: no communication budget)."""

    roots: list[PlanNode]
    cost: int
    kept: int
    multiplier: float | None
    received: int
    comm_multiplier: float | None
    #: what pricing the plan's rejected alternatives reads (the explanations', on first use)
    pricing: PlanPricing


@dataclass(frozen=True)
class PlanPricing:
    """What pricing an extracted plan's rejected alternatives reads (``reshard.alternatives``):
    the snapshot, the Fusion and mesh, the e-nodes and their costs, the extractor's best entries
    (``best``), each class's value and distribution (``names``), the ID terms (``ids``), the
    bytes received per e-node (``received``), and the plan: its entries (``roots``) and their
    ``PlanNode``s (``built``: ``id(entry)`` -> node)."""

    snap: Snapshot
    fusion: Fusion
    mesh: DeviceMesh
    nodes: list[ENode]
    costs: _Costs
    best: dict[Any, Entry]
    names: dict[Any, tuple[int, Any]]
    ids: dict[Any, Any]
    received: Received
    roots: list[Entry]
    built: Mapping[int, PlanNode]


@dataclass(frozen=True)
class Buckets:
    """A Fusion's gradient buckets in its e-graph (``passes.buckets``): the e-nodes of the ways that
    read a gradient out of a bucket (the bucket values' nodes and the ``unbucket`` nodes), and
    the classes of the buckets' reductions."""

    nodes: frozenset[int]
    reductions: frozenset[Any]
    #: reduction class -> its bucket (value id): one bucket's reductions are alternatives
    bucket_of: dict[Any, int]

    @staticmethod
    def of(fusion: Fusion, snap: Snapshot, nodes: list[ENode], names: dict[Any, tuple[int, Any]]) -> "Buckets | None":
        """The buckets of ``fusion`` (None: it has none)."""
        values, roots = bucket_values(fusion), bucket_roots(fusion)
        if not values:
            return None
        joins = {op.index for op in fusion.ops if op_kind(op.kind).bucket}
        value = {c: tid for c, (tid, _) in names.items()}
        reductions = frozenset(n.cls for n in nodes if n.ctor in REDUCING_KINDS and value.get(n.cls) in roots)
        return Buckets(frozenset(n.id for n in nodes if value.get(n.cls) in values
                                 or n.ctor in OP_CTORS and snap.i64(n.args[0]) in joins),
                       reductions, {c: value[c] for c in reductions})


def _labelled(progress: Callable[[str], None] | None, what: str) -> Callable[[str], None] | None:
    """``progress`` of the steps of ``what``: "what <its step>"."""
    return None if progress is None else lambda step: progress(f"{what} {step}")


#: the most e-nodes a window's sub-problem of the model-parallel candidate may hold to be solved
#: (``windows.WINDOW_SUB_NODES`` for the others): its search leaves many windows to improve, and
#: at 650 the GPT-2 XL step at dp 2 x tp 4 spent 9.5 s in HiGHS on 62 of them (5001.9 us), at
#: 500 2.7 s on 29 (5103.6; the plain plan 5150.1), at 400 0.4 s on 6 (the plain plan kept);
#: at tp 4 the same plan at 650, 500 and 400
MODEL_PARALLEL_WINDOW_NODES = 500


class Candidate(NamedTuple):
    """A candidate plan of ``select``."""

    #: the call that ends its search, giving (the search's cost, ps, None where an output has
    #: no entry; its entries, None where it is no candidate after all; the re-extractions spent)
    search: Callable[[], tuple[int | None, dict[Any, Entry] | None, int]]
    #: the call that finishes those entries (windows, buckets) into its best entries per class
    finish: Callable[[dict[Any, Entry]], dict[Any, Entry]]
    #: which search it is (``ExtractionReport.candidate`` names the one chosen)
    what: str = "plain"
    #: finished whatever its search costs: its search is no guide to its finished plan (the
    #: model-parallel candidate, whose windows repair much of its search)
    always: bool = False


def select(nodes: list[ENode], costs: _Costs, roots: list[Any], extractor: str = "greedy",
           time_limit_s: float | None = 30.0, report: Any = None, share: bool = True,
           stop: Callable[[], bool] | None = None, position: dict[Any, int] | None = None,
           buckets: Buckets | None = None, progress: Callable[[str], None] | None = None,
           data_split: frozenset[int] = frozenset(), model_split: frozenset[int] = frozenset()
           ) -> list[Candidate]:
    """Best entries per T class by ``extractor``: "greedy" (``greedy_dag``, every class, then
    ``share_communication`` when ``share``), "windows" (the same, then, given ``position``
    (class -> position of its value), ``windows.exact_windows``) or "ilp" (``extract_ilp.ilp_dag``: exact for the
    classes ``roots`` need, greedy entries elsewhere).  Fills ``report`` (an
    ``extract_ilp.ExtractionReport``) when given; ``stop``: see ``share_communication``;
    ``progress``: told each step as it starts ("greedy", "sharing search k/n re-extractions"
    and "... releasing i/m" (``share_communication``), "exact windows k/n", "gradient buckets
    ...": the sharing search's steps on the buckets).

    The candidates (``Candidate``), each searched and finished only when asked for: the
    sharing search's entries, then, when its output trials end cheaper, theirs
    (``share_communication``'s ``later``: their search is run by the caller), finished alike;
    ``extract`` finishes the first, adopts alternatives in
    it (``adopt_alternatives``), and finishes and adopts a later one only when its search
    already ends at or below that plan (finishing never raises a cost: a search ending at the
    plan's cost may still end below it; the 1-layer Llama-2-7B at dp 2 x tp 4, whose output
    trials end exactly at the first candidate's finished plan, then buckets the norm weights'
    gradients: 7949.6 -> 7921.6 us, 33 -> 29 collectives), keeping the cheapest: the plan is never costlier than
    without output trials, and a later candidate costs time only where it may pay off.

    ``buckets``: a bucket's one reduction pays off only when its members all read it, which the
    greedy, pricing each member on its own, does not see.  So with ``share``, the greedy, the
    sharing search and the windows first run without the buckets' nodes (the plan the e-graph
    gives without buckets), and then sharing each bucket's reduction is tried on every node
    (each at most twice, and a bucket's other reductions no more once one is kept: it is
    reduced once): a plan with buckets is never costlier than the one without.

    ``data_split``: the e-nodes that compute a value split along a data axis
    (``data_axis_split``).  With ``share`` and some, a second search runs beside the plain one
    (in a forked child where a core is spare: ``DataAxisSearch``), the *data-axis* search
    (``_priced_out_search``: those nodes priced out, so its plan computes every value whole on
    each rank of the data axis, its inputs gathered where they are fed split, unless an output
    needs otherwise), and the cheaper of the two searches is the first candidate, the other the
    second.  The greedy, pricing each class on its own, moves rows along the data axis wherever
    one step looks cheap there: the tiny Llama training step on a 2 x 2 dp x tp mesh gathered
    two of the loss's terms over dp and all-reduced six gradients over it (search 1120.5 us,
    plan 1069.3); the data-axis search gathers the batch once (its ids and labels one tensor,
    512 B), computes the whole step on every dp rank and reduces no gradient (search 913.1,
    plan 886.9), which the latency-bound tiny step prices lower.  (Pricing out only the steps
    that move rows along the axis found that plan too, but a local slice of a replicated value,
    after which the step runs split and reduces its gradients, is one such step as well; which
    of the two the greedy met first followed the order of the e-graph's rows, and a change of
    rules that reordered them gave a search of 1144.3 and the plain plan.)  At real sizes it
    ends far above the plain search (the 4-layer Llama-2-7B at dp 2 x tp 4: 45,386 against
    25,959 us), so the plan is the plain one, as without it.  The data-axis candidate's buckets
    are shared under that search's pricing too (``priced_out.dear``: a trial is kept iff the plan's cost so
    priced drops), trying only the reductions of values whole on each rank of the data axis (one
    of a split value is priced out there), then priced at the true costs and kept only where they
    are no dearer than the plan without them (finishing never raises a cost): tried at the true
    costs, each trial re-extracted most of the plan back to split steps, to be rejected (the
    tiny 4-layer steps at 2 x 2: the buckets' search 8.8 -> 1.3 s for Llama, ~6 -> 2.8 s for
    Qwen2, the same or cheaper modeled plans).

    ``model_split``: the e-nodes that compute a value split along a data dim (the batch, the
    sequence) on a model axis (``priced_out.model_axis_split``).  With ``share`` and some in the
    plain search's plan, a *model-parallel* candidate follows the first ones: its search prices
    them out (``_priced_out_search``) and its windows see none but those its plan uses, so it is
    the best plan those searches find that splits, on the model axes, only what the parameters'
    dims index (Megatron's layout: the residual stream whole on each rank, all-reduced after
    each row-parallel matmul); it is always finished
    (``Candidate.always``), adopting alternatives at the true costs as any candidate.  The
    layout is one decision over a whole layer, forward and backward (~10 collectives switch
    together), which the greedy and the windows, pricing a few classes at a time, do not make:
    where a sequence-parallel step looks cheaper one collective at a time, they mix them in (a
    reduce-scatter, then all-gathers in forward and backward).  Its search is no guide (the
    1-layer GPT-2 XL step at tp 4: 1837.6 us against the plain search's 1885.0; at 2 layers
    3033.1 against 2802.1), its finished plan is (1733.5 against 1769.7, the ILP's proved
    optimum; 2 layers 2542.2 against 2603.5, a fifth fewer bytes).  Where the plain search's
    plan splits no data dim on a model axis, it is model-parallel already and no such
    candidate is made (the tiny configs of the tests)."""
    check_extractor(extractor)
    t0 = time.perf_counter()
    if extractor in ("greedy", "windows"):
        plain = [n for n in nodes if n.id not in buckets.nodes] if share and buckets else nodes
        graph = _graph(plain, nodes)
        # the buckets' nodes and the whole e-graph, built once for every candidate ``finish`` completes
        ours = [n for n in nodes if n.id in buckets.nodes] if share and buckets and buckets.reductions else []
        ours_graph, whole_graph = (_graph(ours, nodes), _graph(nodes)) if ours else (None, None)
        solved: dict[tuple, Any] = {}  # the windows' sub-problems solved for any candidate
        axis_search = (DataAxisSearch(plain, graph, nodes, costs, roots, data_split, stop) if share and data_split
                       else None)  # (in a forked child where a core is spare: beside the plain search)
        if progress is not None:
            progress("greedy")
        best = greedy_dag(plain, costs, graph=graph)
        later: list[Callable[[], tuple[dict[Any, Entry] | None, int]]] = []
        evals, before, after = 0, None, None
        if share:
            best, evals, before, after = share_communication(plain, costs, roots, best, stop=stop, graph=graph,
                                                             later=later, progress=_labelled(progress, "sharing search"))
        firsts = [(_plan_cost(best, roots, costs), best, 0)]
        if axis_search is not None:
            if progress is not None:
                progress("data-axis search")
            cost, dp, spent = axis_search.outcome(below=firsts[0][0])
            evals += spent
            if dp is not None:
                firsts.append((cost, dp, 0))
            # the cheaper search first (the plain one on a tie; neither None: both reach every output)
            firsts.sort(key=lambda f: (f[0] is None, f[0] or 0))
            after = firsts[0][0]
        if report is not None:
            report.extractor, report.seconds = extractor, time.perf_counter() - t0
            report.search_evals, report.windows, report.greedy_cost, report.cost = evals, 0, before, after

        def with_buckets(best: dict[Any, Entry], cs: _Costs) -> dict[Any, Entry]:
            """Entries for the buckets' classes at ``cs``, built on ``best``'s (which stay)."""
            return {**greedy_dag(ours, cs, best, list(best), ours_graph), **best}

        def finish(best: dict[Any, Entry], family: frozenset[int] = frozenset(),
                   windows_without_family: bool = False) -> dict[Any, Entry]:
            """``best`` after the windows and the buckets' sharing (with ``share``); ``family``:
            ``best`` is a priced-out candidate's (``priced_out``), whose buckets are shared at its
            pricing (``priced_out.dear``) over the reductions of values it does not price out,
            and whose windows, with ``windows_without_family``, see none of the family's nodes but
            those ``best`` uses (no window takes one; the sub-problems stay small)."""
            windows, more = 0, 0
            if share and extractor == "windows" and position:
                wn, wg = plain, graph
                if windows_without_family:  # (the family's nodes the plan does not use: no window takes them)
                    used = set(costs.members(_plan_bits(best, roots) or 0).tolist())
                    wn = [n for n in plain if n.id not in family or n.id in used]
                    wg = _graph(wn, nodes)
                best, windows, _, _ = exact_windows(wn, costs, roots, best, position, stop=stop, graph=wg,
                                                   solved_before=solved, progress=_labelled(progress, "exact windows"),
                                                   most_nodes=(MODEL_PARALLEL_WINDOW_NODES if windows_without_family
                                                               else WINDOW_SUB_NODES))
            if share and buckets and buckets.reductions:
                tried, bc = buckets.reductions, costs
                if family:
                    split = {nodes[i].cls for i in family}
                    tried, bc = frozenset(c for c in tried if c not in split), dear(costs, family)
                start = true_priced(best, [], nodes, bc)[0] if family else best
                shared, more, _, _ = share_communication(nodes, bc, roots, with_buckets(start, bc),
                                                         2 * len(buckets.reductions) * len(nodes), stop=stop,
                                                         only=tried, graph=whole_graph,
                                                         one_of=buckets.bucket_of,
                                                         progress=_labelled(progress, "gradient buckets"))
                if family:  # priced at the true costs, kept where no dearer than without buckets
                    base, shared = with_buckets(best, costs), true_priced(shared, [], nodes, costs)[0]
                    if _plan_cost(shared, roots, costs) > _plan_cost(base, roots, costs):
                        shared = base
                best = shared
            if report is not None:
                report.seconds = time.perf_counter() - t0
                report.search_evals += more
                report.windows += windows
            return best

        def searched(search: Callable[[], tuple[dict[Any, Entry] | None, int]]
                     ) -> tuple[int | None, dict[Any, Entry] | None, int]:
            found, spent = search()
            return (None if found is None else _plan_cost(found, roots, costs)), found, spent

        used = _plan_bits(best, roots)  # (the plain search's plan: a model-parallel one already?)
        model = [] if not (share and model_split and used is not None and
                           not model_split.isdisjoint(costs.members(used).tolist())) else [Candidate(
            functools.partial(searched, functools.partial(_priced_out_search, plain, graph, nodes, costs, roots,
                                                          model_split, stop)),
            functools.partial(finish, family=model_split, windows_without_family=True), "model-parallel",
            always=True)]
        return [*[Candidate((lambda f=f: f), finish) if f[1] is best else
                  Candidate((lambda f=f: f), functools.partial(finish, family=data_split), "data-axis")
                  for f in firsts],
                *model, *[Candidate(functools.partial(searched, t), finish, "output trials") for t in later]]
    res = ilp_dag(nodes, costs, roots, time_limit_s=time_limit_s, stop=stop)
    if report is not None:
        report.__dict__.update(res.report.__dict__)
    # the ILP decides the classes the outputs need; the greedy's entries of the other classes
    # only serve to price rejected alternatives for explanations
    best = {**greedy_dag(nodes, costs), **res.best}
    ilp_search = (_plan_cost(best, roots, costs), best, 0)
    ilp = [Candidate(lambda: ilp_search, lambda b: b, "ilp")]
    if res.report.optimal:
        return ilp
    warnings.warn(f"reshard: {res.report}; the plan is the cheaper of its incumbent and the greedy "
                  f"extractor's plan", stacklevel=3)
    # a limit cut the proof: the greedy extractor's candidates first, so the plan is never
    # costlier than the default extractor's (``extract.choose``), then the ILP's incumbent
    return [*select(nodes, costs, roots, "greedy", time_limit_s, None, share, stop, position, buckets, progress,
                    data_split, model_split), *ilp]


def _as_rows(best: dict[Any, Entry], cls_bit: dict[Any, int], *more: list[Entry]) -> EntryRows | None:
    """``best`` and the entry lists ``more`` as rows for another process (``dag.entry_rows``);
    None where an entry is kept under another class than its node's, which rows cannot say."""
    if not all(c is e.node.cls for c, e in best.items()):
        return None
    return entry_rows([best.values(), *more], cls_bit)


def _from_rows(rows: EntryRows, nodes: list[ENode], cls_bit: dict[Any, int]) -> list[Any]:
    """``_as_rows``' entries made again here: the best entries by class, then the lists."""
    best, *more = entries_of(rows, nodes, cls_bit)
    return [{e.node.cls: e for e in best}, *more]


class DataAxisSearch:
    """``_priced_out_search``, run in a forked child beside the plain search where a core is spare
    (``second_core``; else here, when asked).  ``outcome(below)``: (its plan's cost, its entries,
    the re-extractions spent); the entries are read back from the child (``dag.entry_rows``)
    only when that cost is at most ``below`` (the plain search's: a candidate whose search ends
    above it is never finished, ``choose``), else None there.  Law: the plan chosen is the same
    wherever it ran."""

    def __init__(self, plain: list[ENode], graph: ClassGraph, nodes: list[ENode], costs: _Costs, roots: list[Any],
                 data_split: frozenset[int], stop: Callable[[], bool] | None) -> None:
        self.nodes, self.costs, self.roots = nodes, costs, roots
        self.search = functools.partial(_priced_out_search, plain, graph, nodes, costs, roots, data_split, stop)
        # (``graph`` numbers classes by every node's, as ``class_bits(nodes)``: ``select``'s ``_graph(plain, nodes)``)
        self.cls_bit = graph.cls_bit if second_core.available(len(nodes)) else None
        self.child = None if self.cls_bit is None else Forked(
            self._rows, first=self.search, shown=self._shown, spare=True)

    def _shown(self, got: tuple[dict[Any, Entry] | None, int]) -> tuple[int | None, int]:
        return (None if got[0] is None else _plan_cost(got[0], self.roots, self.costs)), got[1]

    def _rows(self, got: tuple[dict[Any, Entry] | None, int]) -> EntryRows | None:
        return None if got[0] is None else _as_rows(got[0], self.cls_bit)

    def outcome(self, below: int | None) -> tuple[int | None, dict[Any, Entry] | None, int]:
        if self.child is None:
            best, spent = self.search()
            return self._shown((best, spent))[0], best, spent
        try:
            cost, spent = self.child.first()
            if cost is None or below is not None and cost > below:
                return cost, None, spent
            rows = self.child.result()
        finally:
            self.child.close()
        best = self.search()[0] if rows is None else _from_rows(rows, self.nodes, self.cls_bit)[0]
        return cost, best, spent


def _ranked(score: int | None) -> tuple[bool, int]:
    """A finished candidate's sort key in ``extract``'s ``choose``: lower first, None last."""
    return score is None, score or 0


def _priced_out_search(plain: list[ENode], graph: ClassGraph, nodes: list[ENode], costs: _Costs, roots: list[Any],
                       family: frozenset[int], stop: Callable[[], bool] | None
                       ) -> tuple[dict[Any, Entry] | None, int]:
    """A priced-out candidate's search (``select``: the data-axis and the model-parallel
    ones): the greedy and the sharing search on ``plain`` (``graph``: its class graph) with
    each node of ``family`` priced out (``priced_out.dear``: taken only where an output has no
    way without it, an output fixed split along dp, say), its entries then priced at
    ``costs``; (the entries, None where an output has none, and the re-extractions spent)."""
    dc = dear(costs, family)  # (the searches read node costs from here, not the nodes)
    best = greedy_dag(plain, dc, graph=graph)
    if _plan_cost(best, roots, dc) is None:
        return None, 0
    best, evals, _, _ = share_communication(plain, dc, roots, best, stop=stop, graph=graph)
    return true_priced(best, [], nodes, costs)[0], evals


_V = TypeVar("_V")


def _canonical_walk(roots: list[Entry], settled: dict[Any, _V], made: Callable[[Entry, list[_V]], _V],
                    on_path: Callable[[Entry], _V]) -> list[_V]:
    """The depth-first walk of ``canonical_plan`` and ``canonical_bits``: the first entry met of
    a class stands for it everywhere.  ``settled``: class -> its value, filled in: a class walked
    gets ``made(e, its kids' values)``, children first; a kid whose class is on the walk's path
    (a cycle: not reached for ``greedy_dag``'s entries) is ``on_path(kid)``.  Returns each
    root's value.  (An explicit stack: plans are as deep as their programs.)"""
    active: set[Any] = set()

    def met(e: Entry) -> _V | None:
        """``e``'s stand-in if its class is settled (or on the walk's path), else None."""
        c = e.node.cls
        if c in settled:
            return settled[c]
        return on_path(e) if c in active else None

    out: list[_V] = []
    for root in roots:
        if met(root) is None:
            active.add(root.node.cls)
            stack: list[tuple[Entry, list[_V]]] = [(root, [])]
            while stack:
                e, kids = stack[-1]
                if len(kids) < len(e.children):
                    k = e.children[len(kids)]
                    got = met(k)
                    if got is None:
                        active.add(k.node.cls)
                        stack.append((k, []))
                    else:
                        kids.append(got)
                    continue
                stack.pop()
                active.discard(e.node.cls)
                settled[e.node.cls] = made(e, kids)
                if stack:
                    stack[-1][1].append(settled[e.node.cls])
        out.append(met(root))  # type: ignore[arg-type]
    return out


def canonical_plan(roots: list[Entry], costs: _Costs, canon: dict[Any, Entry] | None = None) -> list[Entry]:
    """The plan under ``roots`` with one entry per class: the first met in a depth-first walk
    stands for its class everywhere, with costs and node sets recomputed (``_canonical_walk``).
    (After the sharing search, entries may still point at an older entry of a class that was
    re-extracted: the same value would otherwise be computed, and communicated, twice.)  Only
    nodes already in the plan are kept, so the plan's cost can only go down.  ``canon``: classes
    already settled (``adopt_alternatives``: a sub-plan that implements them otherwise), filled in."""
    canon = {} if canon is None else canon

    def made(e: Entry, kids: list[Entry]) -> Entry:
        bits = 1 << e.node.id
        for k in kids:
            bits |= k.nodes
        # priced from its settled kids (exact: settled entries are priced here)
        cost = _set_cost(bits, (k for k in kids if canon.get(k.node.cls) is k), costs)
        return Entry(cost, e.node, tuple(kids), bits, e.classes)

    return _canonical_walk(roots, canon, made, lambda e: e)


#: adoption rounds after the sharing search (each re-prices the plan's alternatives once)
ADOPT_ROUNDS = 4
#: candidates whose whole plan is checked per round, cheapest priced whole plan first
ADOPT_TRIALS = 8


def canonical_bits(roots: list[Entry], canon: dict[Any, Entry]) -> int:
    """``union_bits(canonical_plan(roots, costs, canon))`` without making the plan's entries
    (``canon`` is left as it is): a rejected trial of ``adopt_alternatives`` is priced by its
    node set alone.  Law: the same walk (``_canonical_walk``), so the same entry stands for each
    class, and a canonical entry's set is its node's bit and its kids' sets (a kid on the walk's
    path adds its own set, as ``canonical_plan`` keeps that entry)."""
    def made(e: Entry, kids: list[int]) -> int:
        bits = 1 << e.node.id
        for k in kids:
            bits |= k
        return bits

    out = 0
    for bits in _canonical_walk(roots, {c: e.nodes for c, e in canon.items()}, made, lambda e: e.nodes):
        out |= bits
    return out


def adopt_alternatives(nodes: list[ENode], costs: _Costs, best: dict[Any, Entry], roots: list[Entry],
                       rounds: int = ADOPT_ROUNDS, trials: int = ADOPT_TRIALS,
                       stop: Callable[[], bool] | None = None) -> list[Entry]:
    """The canonical plan ``roots`` improved by adopting rejected alternatives.

    The greedy prices a class's sub-plan on its own: where two implementations tie there
    (``saved(x [R])`` and ``allreduce(saved(x [P]))`` both hold one all-reduce), it may keep
    the one whose communication the rest of the plan does not share, and the sharing search
    may run out of budget before trying it.  ``Plan.explain`` prices exactly that: each other
    e-node of a plan class with the whole plan so changed (``pricing.Pricer``).  Law: per
    round, the value alternatives whose priced whole plan is cheaper are tried cheapest first
    (at most ``trials``): the alternative's sub-plan settles its classes and the plan is
    re-canonicalized around it (``canonical_plan``); each whose *true* cost (every distinct
    node at its real cost) is lower than the plan's so far is kept, and the next round
    re-prices (none kept: done).  Every candidate is a plan of valid entries with one per
    class, so the result is as sound as the input and never costlier; the work is bounded by
    ``rounds`` x (one pricing, bounded by ``pricing.ACYCLIC_BUDGET``, + ``trials``);
    ``stop`` (see ``share_communication``) ends it before a round."""
    cur = costs.of(union_bits(roots))
    pricer = Pricer(nodes, costs, best)
    for _ in range(rounds):
        if stop is not None and stop():
            break
        pricer.new_round()
        entries = sorted(pricer.plan_entries(roots).values(), key=lambda e: e.node.id)
        plan = union_bits(roots)
        found = [p for e in entries for p in pricer.value_alternatives(e, roots, plan, below=cur)]
        found.sort(key=lambda p: (p[1], p[4].id))
        improved = False
        for p in found[:trials]:
            n = p[4]
            kids = pricer._kids(n, frozenset([n.cls]))
            if kids is None:
                continue
            canon: dict[Any, Entry] = {}  # (class bits: plan entries are never extended)
            canonical_plan([Entry(p[0], n, kids, p[2], 0)], costs, canon)
            t = costs.of(canonical_bits(roots, canon))  # (the trial plan built only when kept)
            if t < cur:
                roots, cur, improved = canonical_plan(roots, costs, canon), t, True
        if not improved:
            break
    return roots


def _finished_elsewhere(finished: Callable[..., tuple[int, dict[Any, Entry], list[Entry]]], cs: _Costs,
                        ns: list[ENode], finish: Callable[[dict[Any, Entry]], dict[Any, Entry]], report: Any,
                        cls_bit: dict[Any, int], above: int | None,
                        searched: tuple[int | None, dict[Any, Entry] | None, int]
                        ) -> tuple[int, int, int, EntryRows | None] | None:
    """A candidate finished (``choose``) as a forked child sends it back, from its search's
    outcome ``searched`` (``Candidate``): its plan's cost, the re-extractions and exact
    windows its finishing counts in ``report`` (left as it was), and its entries and plan as
    rows (``dag.entry_rows``; None where an entry is not its node's class's, which rows cannot
    say); None where the search gave no candidate, or ends above ``above`` (the first
    candidate's search: finishing never raises a cost, so the plan chosen costs no more, and
    ``choose`` does not finish this one)."""
    if searched[1] is None or searched[0] is None or above is not None and searched[0] > above:
        return None
    evals, windows, seconds = (report.search_evals, report.windows, report.seconds) if report else (0, 0, 0.0)
    cost, best, plan = finished(cs, ns, functools.partial(finish, searched[1]))
    if report is not None:
        evals, windows = report.search_evals - evals, report.windows - windows
        report.search_evals -= evals
        report.windows -= windows
        report.seconds = seconds
    return cost, evals, windows, _as_rows(best, cls_bit, plan)


def check_budgets(memory_budget: Any, comm_budget: Any) -> None:
    """``ReshardError`` unless each budget is None or a non-negative int (``budget.check_budget``)."""
    check_budget(MEMORY, memory_budget, KEPT)
    check_budget(COMM, comm_budget, RECEIVED)


_F = TypeVar("_F", bound=Callable[..., Any])


def promote_unwalked() -> None:
    """Move every object the collector tracks into its oldest generation without walking them
    (``gc.freeze()`` then ``gc.unfreeze()``; CPython 3.11 also zeroes the young generation's
    count, 3.12 keeps it, and the young collection it soon starts finds that generation empty),
    unless the process froze objects itself (its permanent generation is its own: left as it
    is, and nothing moved)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


def gc_paused(f: _F) -> _F:
    """``f`` run with Python's cyclic garbage collector off (back on after, if it was on).

    Extraction makes hundreds of thousands of long-lived objects (``Entry``s, dicts of them)
    with no reference cycles; their allocations trigger collections, each of the oldest
    generation walking every object of the process (the snapshot and the program included):
    about a third of the extraction's CPU time on the 1-layer Llama-2-7B step at dp 2 x tp 4
    (6.8 -> 3.9 s).  Turned back on, the collector would walk them all at once (their
    allocations are counted while it is off): so they are first moved to the oldest generation
    unwalked (``promote_unwalked``: the tiny Llama's 2 x 2 training plan 0.15 s less in
    collections, the 32-layer Llama-2-7B dp 2 x tp 4 step's planning 0.5-0.8 s), and what
    cyclic garbage it leaves is freed by the next full collection."""

    @functools.wraps(f)
    def run(*args: Any, **kwargs: Any) -> Any:
        was = gc.isenabled()
        gc.disable()
        try:
            return f(*args, **kwargs)
        finally:
            if was:
                promote_unwalked()
                gc.enable()

    return run  # type: ignore[return-value]


@gc_paused
def extract(snap: Snapshot, fusion: Fusion, mesh: DeviceMesh, output_lets: list[str],
            perturb: random.Random | None = None, *, extractor: str = "greedy",
            time_limit_s: float | None = 30.0, report: Any = None,
            stop: Callable[[], bool] | None = None, memory_budget: int | None = None,
            comm_budget: int | None = None, reprice: Callable[[list[ENode]], list[int]] | None = None,
            progress: Callable[[str], None] | None = None,
            rank: Callable[[list[PlanNode]], int | None] | None = None, model_parallel: bool = True) -> Extracted:
    """Extract the plan for every output (``Extracted``).

    ``perturb`` replaces every node's cost by a random one: soundness tests use it to
    extract (and then check) plans the real cost model would never choose.
    ``extractor``/``time_limit_s``/``report``/``stop``: see ``select``.  ``memory_budget``:
    bytes per rank the plan may keep for the backward pass; ``comm_budget``: bytes each rank
    may receive over the plan's communications (``budget.fit``: extraction prices kept /
    received bytes with searched multipliers, nested when both are given; None: time only).
    ``reprice``: the nodes' costs at other mesh sizes than the e-graph's (``repricing``).
    ``progress``: told each step as it starts (``select``'s, "adopting alternatives", "second
    candidate": waiting for the one finished beside, ``search.saturate.extraction_steps``).
    ``rank``: what a finished candidate's plan (its outputs' ``PlanNode``s) costs where the plan
    extracted is not the plan run (a stack's reduced program, whose middle layer's plan is
    repeated: ``plan.StackProgram``), None where it cannot serve; the candidate ranked lowest is
    chosen (None: the one whose own plan costs least).  ``model_parallel``: make the
    model-parallel candidate where it applies (``select``'s ``model_split``).
    """
    check_budgets(memory_budget, comm_budget)
    nodes = collect_enodes(snap)
    if reprice is not None:
        nodes = [ENode(n.id, n.ctor, n.cls, n.args, n.children, c) for n, c in zip(nodes, reprice(nodes))]
    if perturb is not None:
        nodes = [ENode(n.id, n.ctor, n.cls, n.args, n.children, perturb.randrange(1, 1000)) for n in nodes]
    costs = _Costs(nodes)
    names = real_classes(snap)
    by_name = {v: k for k, v in names.items()}
    pos = op_positions(fusion)
    root_classes = [by_name.get((tid, snap.let(let))) for let, (tid, _) in zip(output_lets, fusion.outputs)]
    buckets = Buckets.of(fusion, snap, nodes, names)
    data = data_axes(fusion, mesh)
    data_split = data_axis_split(snap, nodes, names, data)
    model_split = model_axis_split(snap, nodes, names, fusion, data) if model_parallel else frozenset()

    def finished(cs: _Costs, ns: list[ENode], finish: Callable[[], dict[Any, Entry]]
                 ) -> tuple[int, dict[Any, Entry], list[Entry]]:
        """A candidate finished (``select``), its outputs' canonical plan with alternatives
        adopted, and that plan's cost."""
        best = finish()
        roots: list[Entry] = []
        for cls, (tid, ts) in zip(root_classes, fusion.outputs):
            if cls is None or cls not in best:
                raise (unmet_redistribute(fusion, {names[c][0] for c in best if c in names})
                       or no_output_plan(fusion, tid, ts))
            roots.append(best[cls])
        plan = canonical_plan(roots, cs)
        if perturb is None and not (extractor == "ilp" and report is not None and report.optimal):
            # (a proved ILP plan is exact already)
            if progress is not None:
                progress("adopting alternatives")
            plan = adopt_alternatives(ns, cs, best, plan, stop=stop)
        return cs.of(union_bits(plan)), best, plan

    def choose(ns: list[ENode], cs: _Costs) -> tuple[dict[Any, Entry], list[Entry]]:
        """The best entries at node costs ``cs``, and the outputs' (canonical) plan: the
        cheapest of ``select``'s candidates finished (the first of equals), a later one
        finished only when its search ends at or below the plan so far (``select``'s law) or
        when it is finished whatever its search costs (``Candidate.always``: the
        model-parallel one); ``report.candidate`` names the one chosen.

        Where a core is spare (``second_core``), the later candidates are searched and
        finished ahead, in forked children, while this process finishes the first (those not
        always finished at a lower priority, ``second_core.SPECULATIVE_NICE``): each child
        sends its search's outcome (cost, re-extractions) at once, and one whose search ends
        above the plan so far is dropped unread (its child killed), one needed is read back
        (its cost, search counts, and entries and plan as rows, ``dag.entry_rows``: the same
        entries made again here).  The plan is the same either way."""
        cands = select(ns, cs, root_classes, extractor, time_limit_s, report, share=perturb is None, stop=stop,
                       position={c: pos[tid] for c, (tid, _) in names.items() if tid in pos}, buckets=buckets,
                       progress=progress, data_split=data_split, model_split=model_split)
        ahead: list[Forked] = []
        if len(cands) > 1 and second_core.available(len(ns)):
            cls_bit = class_bits(ns)  # (how ``select``'s graphs number classes)
            above = cands[0][0]()[0]  # (the first's search: no plan chosen will cost more)
            ahead = [Forked(functools.partial(_finished_elsewhere, finished, cs, ns, c.finish, report, cls_bit,
                                              None if c.always else above),
                            first=c.search, shown=lambda got: (got[0], got[1] is not None, got[2]), spare=True,
                            nice=0 if c.always else second_core.SPECULATIVE_NICE)
                     for c in cands[1:]]
        try:
            chosen: tuple[int, dict[Any, Entry], list[Entry]] | None = None
            chosen_at, chosen_score = 0, None
            for i, (search, finish, _, always) in enumerate(cands):
                child = ahead[i - 1] if i and ahead else None
                if child is not None:
                    searched, found, spent = child.first()
                else:
                    searched, entries, spent = search()
                    found = entries is not None
                if report is not None:
                    report.search_evals += spent
                if not found or chosen is not None and not always and (searched is None or searched > chosen[0]):
                    continue  # (no candidate after all, or its search ends above the plan so far)
                rows = None
                if child is not None:
                    if progress is not None:
                        progress("second candidate")
                    got_there = child.result()
                    cost, evals, windows, rows = got_there or (0, 0, 0, None)
                    if rows is None:  # (the child's rows cannot say its entries, or it did not finish: here)
                        searched, entries, _ = search()
                if rows is None:
                    got = finished(cs, ns, functools.partial(finish, entries))
                else:
                    best, plan = _from_rows(rows, ns, cls_bit)
                    got = (cost, best, plan)
                    if report is not None:
                        report.search_evals += evals
                        report.windows += windows
                score = got[0] if rank is None or len(cands) == 1 else rank(plan_nodes(got[2])[0])
                if chosen is None or _ranked(score) < _ranked(chosen_score):
                    chosen, chosen_at, chosen_score = got, i, score
        finally:
            for forked in ahead:
                forked.close()
        assert chosen is not None  # (select gives at least one candidate)
        if report is not None:
            report.candidate = cands[chosen_at].what
        if extractor == "ilp" and report is not None and not report.optimal:
            # (the ILP's result is the last candidate; it may be its own greedy already)
            report.fallback = report.fallback or chosen_at < len(cands) - 1
        return chosen[1], chosen[2]

    mem = kept_bytes(snap, nodes)
    ids = snap.id_terms()

    #: ``plan_nodes`` built, by the plan's identity (with the plan, which it keeps alive): ``rank``
    #: reads each candidate's, and the one chosen is returned
    made: dict[int, tuple[list[Entry], list[PlanNode], dict[int, PlanNode]]] = {}

    def plan_nodes(roots: list[Entry]) -> tuple[list[PlanNode], dict[int, PlanNode]]:
        """The plan ``roots`` as ``PlanNode``s (each value on its own mesh), and them by entry;
        built once per plan (``made``)."""
        known = made.get(id(roots))
        if known is not None and known[0] is roots:
            return known[1], known[2]
        built: dict[int, PlanNode] = {}

        def build(e: Entry, args: list[PlanNode]) -> PlanNode:
            tid, dcls = names[e.node.cls]
            t = fusion.tensors[tid]
            ts = snap.sharding(dcls, t.mesh, t.shape, ids)
            n = e.node
            return PlanNode(len(built), enode_head(snap, n), tid, ts, tuple(args), n.cost, enode=n.id)

        fold_dag(roots, lambda e: e.children, build, memo=built)
        made[id(roots)] = (roots, [built[id(e)] for e in roots], built)
        return made[id(roots)][1], built

    received = Received(snap, fusion, nodes, names, ids)
    budgets = [] if memory_budget is None else [kept_budget(mem, memory_budget)]
    if comm_budget is not None:
        budgets.append(received_budget(received.array(), comm_budget))
    found = fit(nodes, budgets, choose)
    best, roots, bits = found.best, found.roots, union_bits(found.roots)
    plan_roots, built = plan_nodes(roots)
    return Extracted(plan_roots, costs.of(bits), int(mem[costs.members(bits)].sum()), found.multipliers.get(MEMORY),
                     received.bytes_of(bits, costs), found.multipliers.get(COMM),
                     PlanPricing(snap, fusion, mesh, nodes, costs, best, names, ids, received, roots, built))
