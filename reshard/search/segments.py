"""Saturation in topological segments: optimize() time linear in program depth.

An egglog iteration costs time in proportion to the whole e-graph, and strategy
propagation needs about one iteration per op of depth, so one e-graph for an N-op program
saturates in O(N^2).  A program with more than ``Limits.segment_ops`` ops is cut into
segments of consecutive ops (an input op goes with its first consumer); each segment is its
own e-graph, saturated in topological order, so each iteration only pays for its segment.

Seam law: a value produced in an earlier segment and used in this one (a *seam value*) is
fed at every distribution its producing segment realized, as ``(union (real v D) (Seam
key))`` where ``key`` names the producer's class (``encode.seam_facts``: rows the ``loading``
rules make that union): the fed class *is* that class (same value, same distribution).  A
fed value is not *made* in the consumer (``made``, ``resharding``): its fed dists are no
candidates there, so the consumer builds no resharding steps between them (the
producer segment holds those: every candidate distribution of a value is a fact of its
producing op, so resharding closes there).  ``MergedSnapshot`` identifies the two classes and
drops every other e-node the consumer segment put into a fed class (a step into a fed dist from
a dist only the consumer found, ``nesting``), except a node running one of the consumer's own
ops: an op whose result stands for another value (``unbucket``, a gradient read back out of a
bucket, ``passes.buckets``) puts its nodes into that value's classes, fed ones included (the
value is fed to the segment of such an op, and made there).  Extraction then runs on
the merged snapshot exactly as on one e-graph: choices are global, only saturation is cut.
A fed transpose also carries the permute node that made it (with its operand fed), so the
``alias`` rules of a later segment still see it.  A segment that a limit stopped has grown
only until its seam values exist at *some* distribution, so resharding did not close there:
its seam values are fed together with their candidate distributions (``cand``) and made in
the consumer, which reshards them to the ones it needs (a pinned redistribute's operand dist, the one
a binary op's other operand has).  A ``saved`` op goes with its operand's producer, and
the saved twins of that producer's operands are fed there, with their ``twin`` facts and the
``TrD`` terms of their dists (``_Seams.twin_facts``: made with the saved op, in its own
segment), so that ``remat`` finds the producer's nodes and builds their recomputes in the
segment that holds them (GPT-2's cross entropy: ``sub``'s twin reads the saved logits view,
fed from the segment before).  A view image
(``encode.view_image``: a free reshape whose every simple dist is the image of its operand's)
has no resharding of its own where its operand is made (its steps are the operand's, carried
through the view at cost 0); a segment fed its operand makes it.  (A view's operand that takes
no steps of its own, ``encode.view_preimage``, leaves them to the view's result, made in the
view's segment, whichever that is.)  Each segment's
snapshot decodes its values up front, and the segment's facts and growth are then popped
from the one e-graph that holds the declarations (egglog ``push``/``pop``: the rules are
compiled once), so one segment's e-graph is alive at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Callable

from ..ir.errors import ReshardError
from ..ir.fusion import Fusion, Op
from ..ir.ops import op_kind
from ..ir.sharding import TensorSharding
from ..rules import remat
from ..rules.alias import is_view_transpose
from ..rules.schema import OP_CTORS, T_CONSTRUCTORS, T_KEYED
from .encode import Encoding, candidates, code, dist_term, input_feeds, seam_facts
from .saturate import (Deadline, Limits, SaturationReport, check_limits, declared, output_checks, saturate_facts,
                       saturation_ended, scratch)
from .snapshot import Row, Snapshot


def _deferred(op: Op, used: set[int]) -> bool:
    """Ops placed with their first consumer: inputs, and used transposes a matmul may read
    as a view (``alias``: the rule needs the permute's node in the consumer's e-graph)."""
    return op.kind == "input" or (is_view_transpose(op) and op.index in used)


def _saved(op: Op) -> bool:
    """A ``saved`` op: placed with its operand's producer, so that ``remat``'s twins of that
    producer's nodes are built in the segment that holds them."""
    return op_kind(op.kind).boundary == "saved"


def cut(fusion: Fusion, segment_ops: int) -> list[list[int]]:
    """Op indices per segment, each in program order: the other ops in runs of
    ``segment_ops``, each deferred op (``_deferred``) in the segment of its first consumer
    (the first segment when unused; a saved op is no use there), each saved op (``_saved``) in
    its operand's.  Every op's operands come from its own
    or an earlier segment."""
    used = {fusion.producer[t] for op in fusion.ops for t in op.inputs}
    compute = [op.index for op in fusion.ops if not _deferred(op, used) and not _saved(op)]
    segs: list[list[int]] = [compute[i:i + segment_ops] for i in range(0, len(compute), segment_ops)] or [[]]
    where = {k: s for s, ks in enumerate(segs) for k in ks}
    first_use: dict[int, int] = {}
    for op in reversed(fusion.ops):  # consumers first: a deferred op's own segment is known
        if op.index not in where:
            where[op.index] = first_use.get(op.index, 0)
        if _saved(op):
            continue  # placed with its operand's producer below: it does not place that producer
        for t in op.inputs:
            first_use[fusion.producer[t]] = min(first_use.get(fusion.producer[t], where[op.index]),
                                                where[op.index])
    for op in fusion.ops:  # program order: a saved op's operand (even a saved one) is placed
        if _saved(op):
            where[op.index] = where[fusion.producer[op.inputs[0]]]
    out: list[list[int]] = [[] for _ in segs]
    for op in fusion.ops:
        out[where[op.index]].append(op.index)
    return out


class MergedSnapshot:
    """The segments' snapshots read as one e-graph (``Snapshot``'s interface).  Every value
    is tagged ``(segment, value)``; a fed (seam) class stands for its producer's class."""

    def __init__(self, snaps: list[Snapshot], seams: list[tuple[int, Any]], own: list[set[int]]) -> None:
        self.segs = snaps
        #: per segment, its ops (a node running one of them is that segment's own, even in a fed class)
        self._own = own
        self._parent: dict[tuple[int, Any], tuple[int, Any]] = {}
        self._fed: set[tuple[int, Any]] = set()
        for s, snap in enumerate(snaps):
            for row in snap.rows("Seam"):
                fed = (s, row.output)
                self._fed.add(fed)
                self._union(fed, seams[snap.i64(row.inputs[0])])
        #: per segment, every class of it some union moved, to its root (the rows read it once
        #: per input), and its fed classes
        self._roots: list[dict[Any, tuple[int, Any]]] = [{} for _ in snaps]
        for c in self._parent:
            self._roots[c[0]][c[1]] = self._find(c)
        self._fed_in: list[set[Any]] = [set() for _ in snaps]
        for s, c in self._fed:
            self._fed_in[s].add(c)
        self._rows: dict[str, list[Row]] = {}

    def _find(self, c: tuple[int, Any]) -> tuple[int, Any]:
        while c in self._parent:
            c = self._parent[c]
        return c

    def _union(self, fed: tuple[int, Any], producer: tuple[int, Any]) -> None:
        a, b = self._find(fed), self._find(producer)
        if a != b:
            # a consumer proved two producer classes equal: keep the older one as the root
            self._parent[max(a, b, key=lambda c: c[0])] = min(a, b, key=lambda c: c[0])

    def rows(self, name: str) -> list[Row]:
        if name not in self._rows:
            self._rows[name] = self._merged_rows(name)
        return self._rows[name]

    def _merged_rows(self, name: str) -> list[Row]:
        base = name[5:] if name.startswith("cost_") else name
        sorts = {"real": ("i64", "Dist"), **T_KEYED}.get(base, T_CONSTRUCTORS.get(base))
        if name in T_KEYED:
            base = ""  # its output is a plain value, not a class
        out: list[Row] = []
        for s, snap in enumerate(self.segs):
            rows = snap.rows(name)
            snap.release(name)  # the merged rows are kept instead
            if sorts is None:  # another table: values tagged, nothing merged
                out += [Row(tuple([(s, v) for v in ins]), (s, o)) for ins, o in rows]
                continue
            out += [Row(ins, o) for ins, o, _ in self._merged(s, base, sorts, name == base,
                                                                ((ins, o, None) for ins, o in rows))]
        return out

    def _merged(self, s: int, base: str, sorts: tuple[str, ...], of_class: bool,
                rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[tuple, Any, Any]]:
        """Segment ``s``'s ``rows`` (inputs, output, one more value passed through) of a table of
        ``base`` (a constructor, ``real`` or ``T_KEYED``'s; its inputs' ``sorts``) merged: its
        values tagged ``(s, value)``, a class standing for its root (a fed class for its
        producer's); with ``of_class`` (the output is a class), a row of a class fed here is left
        out (the consumer's copy of a step its producer segment holds) unless its node runs one
        of the segment's own ops."""
        snap, root, fed = self.segs[s], self._roots[s].get, self._fed_in[s]
        own = self._own[s] if base in OP_CTORS else ()
        is_t = tuple(sort == "T" for sort in sorts)
        for ins, o, more in rows:
            if of_class and o in fed and not (own and snap.i64(ins[0]) in own):
                continue
            yield (tuple([(root(v) or (s, v)) if t else (s, v) for t, v in zip(is_t, ins)]),
                   (root(o) or (s, o)) if of_class else (s, o), more)

    def costed(self, ctor: str) -> Iterator[tuple[tuple, Any, int | None]]:
        """``Snapshot.costed``, merged: each segment's rows of ``ctor`` as ``rows(ctor)`` reads
        them, each with its cost decoded in its own segment (the cost rows are not merged: their
        inputs are the rows' own, and every constructor has an argument other than a class, which
        its segment tags, so no two segments' rows merge into one; each segment keeps its rows, as a
        snapshot keeps these tables', for the next extraction of this snapshot)."""
        for s, snap in enumerate(self.segs):
            yield from self._merged(s, ctor, T_CONSTRUCTORS[ctor], True, snap.costed(ctor))

    def i64(self, v: tuple[int, Any]) -> int:
        return self.segs[v[0]].i64(v[1])

    def string(self, v: tuple[int, Any]) -> str:
        return self.segs[v[0]].string(v[1])

    def let(self, name: str) -> tuple[int, Any]:
        for s, snap in enumerate(self.segs):
            if snap.rows(name):
                return (s, snap.let(name))
        raise ReshardError(f"internal: e-graph has no binding {name}")

    def id_terms(self) -> dict[tuple[int, Any], Any]:
        """Per segment: the smallest term of every ID class (see ``Snapshot.id_terms``)."""
        return {(s, c): x for s in range(len(self.segs)) for c, x in self.segs[s].id_terms().items()}

    def replicated(self, dist_cls: tuple[int, Any], axis: int) -> bool:
        s, raw = dist_cls
        return self.segs[s].replicated(raw, axis)

    def sharding(self, dist_cls: tuple[int, Any], mesh: Any, shape: tuple[int, ...], ids: Any = None) -> Any:
        s, raw = dist_cls
        return self.segs[s].sharding(raw, mesh, shape, self.segs[s].id_terms())

    def axis_placements(self, dist_cls: tuple[int, Any], ids: Any = None) -> tuple[Any, ...]:
        s, raw = dist_cls
        return self.segs[s].axis_placements(raw, self.segs[s].id_terms())


@dataclass
class _Seams:
    """Seam values' fed distributions: per value, (dist term, producer class) pairs, and the
    producer class of every key.  ``views``: transposes a matmul may read as views
    (``alias``), value -> (permute op, operand value); ``via[key]``: the operand dist terms
    whose permute made the fed class ``key``."""

    fusion: Fusion
    views: dict[int, tuple[int, int]]
    #: program inputs: value -> the dist terms it is fed at (``encode.input_feeds``)
    inputs: dict[int, list[str]] = field(default_factory=dict)
    #: value -> (dist term, producer class key, the facts that feed it: ``encode.seam_facts``)
    fed: dict[int, list[tuple[str, int, list[str]]]] = field(default_factory=dict)
    keys: list[tuple[int, Any]] = field(default_factory=list)
    via: dict[int, list[str]] = field(default_factory=dict)
    #: per value whose producing segment a limit stopped: its candidate dists (``cand``
    #: facts), so that consumers can reshard it themselves (``facts``)
    cands: dict[int, list[str]] = field(default_factory=dict)

    def _sharding(self, snap: Snapshot, ids: dict, v: int, dist_cls: Any) -> TensorSharding | None:
        t = self.fusion.tensors[v]
        try:
            return snap.sharding(dist_cls, t.mesh, t.shape, ids)
        except ReshardError:
            return None  # no decodable distribution: not a usable realization

    def _term(self, snap: Snapshot, ids: dict, v: int, dist_cls: Any) -> str | None:
        ts = self._sharding(snap, ids, v, dist_cls)
        return None if ts is None else dist_term(ts, v)

    def export(self, s: int, snap: Snapshot, values: set[int]) -> None:
        """Record the distributions segment ``s`` realized for ``values`` (used later)."""
        ids = snap.id_terms()
        real = {row.output: (snap.i64(row.inputs[0]), row.inputs[1]) for row in snap.rows("real")}
        made_by: dict[Any, list[Any]] = {}
        for row in snap.rows("Loc"):
            made_by.setdefault(row.output, []).append((snap.i64(row.inputs[0]), row.inputs[1]))
        for cls, (v, dist_cls) in real.items():
            ts = self._sharding(snap, ids, v, dist_cls) if v in values else None
            if ts is None:
                continue
            key = len(self.keys)
            self.fed.setdefault(v, []).append((dist_term(ts, v), key, seam_facts(ts, v, key)))
            self.keys.append((s, cls))
            if v in self.views:  # the transposes that made it, for the consumers' alias rules
                p, u = self.views[v]
                self.via[key] = [x for k, kid in made_by.get(cls, []) if k == p and kid in real
                                 for x in [self._term(snap, ids, u, real[kid][1])] if x is not None]

    def twin_facts(self, twins: list[int], readers: dict[int, list[Op]]) -> list[str]:
        """For each saved value ``vs`` = saved(v) of ``twins`` (a saved op of an earlier segment,
        whose twin a recompute here reads): its ``twin`` and ``fusedtwin`` facts
        (``remat.twin_facts``, emitted with its saved op there), and, v fed too, ``TrD(d, c)`` of
        each dist d v is fed at (the saved op's dist there, a term that only the saved op's own
        propagation builds): ``remat`` builds the twins of this segment's producers of v's
        consumers from them (a recompute reading ``vs``)."""
        out: list[str] = []
        for vs in twins:
            k = self.fusion.producer[vs]
            op, c = self.fusion.ops[k], code(k, 0)
            out += remat.twin_facts(op, c, readers) + [f"(trdw {d} {c})" for d, *_ in self.fed.get(op.inputs[0], [])]
        return out

    def facts(self, values: list[int]) -> list[str]:
        """Fed values: sizes, each fed class as its producer's (``Seam``), and a fed transpose's
        class also as the permute of its (fed) operand, so ``alias`` rules see it, and a fed
        input's class at a dist it is fed at also as that ``InAt``, so ``remat``'s kept rules see
        an input (no bytes of its own); the merged snapshot drops those copies of the producer's
        nodes.  A value whose producer was stopped
        by a limit may lack distributions a consumer needs (a pinned redistribute's operand
        dist, one a binary op's other operand has): it comes with its candidates, and the
        consumer reshards it (the resharding closure the producer did not finish)."""
        out = []
        for v in values:
            t = self.fusion.tensors[v]
            out.append(f"(set (nbytes {v}) {t.numel * t.itemsize})")
            if v in self.cands:
                out += [f"(made {v})"] + [f"(cand {v} {d})" for d in self.cands[v]]
            if v in self.views:
                out.append(f"(tview {self.views[v][0]})")
            for d, key, seam in self.fed.get(v, []):
                out += seam
                if d in self.inputs.get(v, ()):  # as fed: ``remat``'s kept rules see the input
                    out.append(f'(union (real {v} {d}) (InAt "{t.name}" {d}))')
                if v in self.views:
                    p, u = self.views[v]
                    out += [f"(union (real {v} {d}) (Loc {p} (real {u} {du})))" for du in self.via.get(key, [])]
        return out


def _snapshot(egraph: Any, detach: bool = False) -> Snapshot:
    try:
        return Snapshot(egraph, detach)
    except BaseException as e:
        if type(e).__name__ == "PanicException":
            raise ReshardError(f"egglog panicked while reading the e-graph: {e}") from e
        raise


def saturate_program(enc: Encoding, limits: Limits, progress: Callable[[SaturationReport], None] | None = None,
                     deadline: Deadline | None = None) -> tuple[Snapshot | MergedSnapshot, SaturationReport]:
    """Saturate ``enc`` within ``limits`` and ``deadline`` (default: ``limits.time_limit_s``
    from now): as one e-graph, or in segments (module docstring) when the program has more
    than ``limits.segment_ops`` ops; returns the snapshot to extract from."""
    check_limits(limits)
    deadline = deadline or Deadline(limits.time_limit_s)
    fusion = enc.fusion
    segs = cut(fusion, limits.segment_ops)
    if len(segs) == 1:  # one e-graph for the whole program, grown in the idle one of its rules
        report = SaturationReport()
        with declared(enc.declarations) as base, scratch(base) as egraph:
            saturate_facts(egraph, enc.facts(), output_checks(enc), len(fusion.ops), limits, report, deadline,
                           progress)
            snap = _snapshot(egraph, detach=True)
        report.saturated = report.limit_hit is None
        saturation_ended(report, progress)
        return snap, report
    report = SaturationReport(segments=len(segs))
    made_in = {fusion.ops[k].output: s for s, ks in enumerate(segs) for k in ks}
    views = {op.output: (op.index, op.inputs[0]) for op in fusion.ops if is_view_transpose(op)}

    saved_of = {op.inputs[0]: op.output for op in fusion.ops if _saved(op)}
    readers = fusion.readers()

    def twins_in(ks: list[int], s: int) -> set[int]:
        """The saved values of earlier segments that segment ``s``'s recomputes read: the saved
        twins of the operands of the producers of its saved values (``remat`` builds
        recomputes from them there; a transpose read as a view: of its operand)."""
        reads: set[int] = set()
        for k in ks:
            if _saved(fusion.ops[k]):
                for t in fusion.ops[fusion.producer[fusion.ops[k].inputs[0]]].inputs:
                    reads |= {t, views[t][1]} if t in views else {t}
        return {saved_of[a] for a in reads if a in saved_of and made_in[saved_of[a]] < s}

    def fed_in(ks: list[int], s: int, twins: set[int]) -> set[int]:
        """Values segment ``s`` reads from earlier segments (with a fed transpose's operand),
        and the saved twins its recomputes read (``twins``: ``twins_in``)."""
        fed = {t for k in ks for t in fusion.ops[k].inputs if made_in[t] < s}
        fed |= {v for k in ks for v in [op_kind(fusion.ops[k].kind).stands_for(fusion.ops[k])]
                if made_in.get(v, s) < s}  # the value an op's result joins (``unbucket``)
        fed |= twins
        return fed | {views[t][1] for t in fed if t in views}

    twins_of = [twins_in(ks, s) for s, ks in enumerate(segs)]
    fed_of = [fed_in(ks, s, twins_of[s]) for s, ks in enumerate(segs)]
    used_later: set[int] = set().union(*fed_of)
    outputs = [(tid, let, fact) for (tid, _), let, fact in zip(fusion.outputs, enc.output_lets, enc.output_facts)]
    seams = _Seams(fusion, views, {op.output: input_feeds(fusion, op, enc.mesh) for op in fusion.ops
                                   if op_kind(op.kind).strategy == "input"})
    snaps: list[Snapshot] = []
    with declared(enc.declarations) as base:
        every: dict[int, list[str]] = {}  # candidates, computed when a limit first stops a segment
        for s, ks in enumerate(segs):
            report.segment = s + 1
            fed = sorted(fed_of[s])
            mine = [(tid, let, fact) for tid, let, fact in outputs if made_in[tid] == s]
            exports = {fusion.ops[k].output for k in ks} & used_later
            # a view image whose operand is fed here (no steps of the operand here) is made here
            images = [x for k in ks if enc.images.get(v := fusion.ops[k].output) in fed for x in enc.made_facts(v)]
            twins = seams.twin_facts(sorted(twins_of[s]), readers)
            groups = [enc.mesh_facts, seams.facts(fed), twins, *(enc.op_facts(k) for k in ks), images,
                      [f for *_, f in mine]]
            checks = [f"(real {tid} {let})" for tid, let, _ in mine] + [f"(= x (real {v} d))" for v in sorted(exports)]
            with scratch(base) as egraph:  # popped (freed) before the next segment: one is alive at a time
                hit = saturate_facts(egraph, enc.facts(groups), checks, len(ks), limits, report, deadline, progress)
                snap = _snapshot(egraph, detach=True)
            seams.export(s, snap, exports)
            if hit is not None and exports:
                every = every or candidates(fusion, enc.mesh)
                seams.cands.update({v: every[v] for v in exports})
            snaps.append(snap)
    report.saturated = report.limit_hit is None
    saturation_ended(report, progress)
    return MergedSnapshot(snaps, seams.keys, [set(ks) for ks in segs]), report


__all__ = ["cut", "MergedSnapshot", "saturate_program"]
