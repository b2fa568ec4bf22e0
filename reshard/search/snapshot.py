"""The saturated e-graph read back: ``Snapshot`` reads ``egraph.freeze()``, the rows of every
table, indexed by e-class, with i64/String values decoded, and decodes IDs, placements and
distributions (``id_terms``, ``sharding``); ``real_classes`` names each T class's value and
distribution.  Saturation makes snapshots (``segments``: one per segment, read as one by
``MergedSnapshot``); extraction reads them (``extract``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from ..ir.errors import ReshardError
from ..ir.ids import ID, Inner, Merge, Outer, Root
from ..ir.mesh import DeviceMesh
from ..ir.sharding import Partial, Replicate, TensorSharding
from ..rules.schema import T_CONSTRUCTORS, T_KEYED, unread
from .egglog_pool import eb


#: the sorts whose terms decoding reads by class (IDs, distributions, placements)
DECODED_SORTS = frozenset({"ID", "Dist", "P"})
#: the tables whose rows a snapshot keeps once read: the implementations, their costs and the
#: classes' names, which decoding and extraction read again
KEPT_ROWS = frozenset({*T_CONSTRUCTORS, *(f"cost_{c}" for c in T_CONSTRUCTORS), *T_KEYED, "real", "Seam"})


class Row(NamedTuple):
    """A live row of a table: its input values and its output value."""

    inputs: tuple
    output: Any


class Snapshot:
    """Rows of the frozen e-graph, indexed for extraction and decoding.  ``detach``: decode
    every i64 and String value now and keep no reference to the e-graph, so that it can be
    freed (segmented saturation holds many snapshots; an e-graph with reshard's rules takes
    tens of MB even when nearly empty)."""

    def __init__(self, egraph: eb.EGraph, detach: bool = False) -> None:
        self.egraph: eb.EGraph | None = egraph
        frozen = egraph.freeze()
        self.tables = dict(frozen.functions)
        #: the live rows of the tables extraction reads (``KEPT_ROWS``), read out of the frozen
        #: e-graph once (a frozen row builds its inputs anew, slowly, on every read)
        self._rows: dict[str, list[Row]] = {}
        #: sort -> class -> (constructor, inputs) of its terms, for the sorts decoding reads
        #: (``DECODED_SORTS``)
        self.by_class: dict[str, dict[Any, list[tuple[str, tuple]]]] = defaultdict(lambda: defaultdict(list))
        for name, fn in self.tables.items():
            if fn.is_let_binding or fn.output_sort not in DECODED_SORTS or unread(name):
                continue
            for ins, out in self._live(name):
                self.by_class[fn.output_sort][out].append((name, tuple(ins)))
        self.ext = {row.inputs[0]: egraph.value_to_i64(row.output) for row in self.rows("ext")}
        #: with ``detach``: per sort, value -> decoded (a value's bits mean different things in
        #: different sorts)
        self._decoded: dict[str, dict[Any, Any]] | None = None
        self._id_terms: dict[Any, ID] | None = None
        if detach:
            self._decoded = self._decode_all(egraph)
            self.egraph = None

    def _decode_all(self, egraph: eb.EGraph) -> dict[str, dict[Any, Any]]:
        """Per sort (i64, String), every value of that sort in any row, decoded (but the rows
        only loading reads and the restating relations, ``schema.unread``)."""
        decode = {"i64": egraph.value_to_i64, "String": egraph.value_to_string}
        out: dict[str, dict[Any, Any]] = {s: {} for s in decode}
        for name, fn in self.tables.items():
            if unread(name):
                continue
            cols = [(i, decode[s], out[s]) for i, s in enumerate(fn.input_sorts) if s in decode]
            result = fn.output_sort in decode
            if not cols and not result:
                continue
            for ins, output in self._live(name):
                for i, dec, into in cols:
                    if ins[i] not in into:
                        into[ins[i]] = dec(ins[i])
                if result and output not in out[fn.output_sort]:
                    out[fn.output_sort][output] = decode[fn.output_sort](output)
        return out

    def rows(self, name: str) -> list[Row]:
        """The live rows of table ``name`` (none for a table this e-graph lacks)."""
        got = self._rows.get(name)
        if got is None:
            fn = self.tables.get(name)
            got = [] if fn is None else [Row(tuple(r.inputs), r.output) for r in fn.rows if not r.subsumed]
            if name in KEPT_ROWS:
                self._rows[name] = got
        return got

    def _live(self, name: str) -> Iterable[tuple[Any, Any]]:
        """(inputs, output) of each live row of ``name``: the kept rows (``KEPT_ROWS``), else read
        out of the frozen e-graph as they go."""
        if name in KEPT_ROWS:
            return self.rows(name)
        return ((r.inputs, r.output) for r in self.tables[name].rows if not r.subsumed)

    def release(self, name: str) -> None:
        """Forget the rows of ``name`` read so far (a reader that keeps its own copy of them)."""
        self._rows.pop(name, None)

    def costed(self, ctor: str) -> Iterator[tuple[tuple, Any, int | None]]:
        """Each live row of constructor table ``ctor``, in table order, as (inputs, output, the
        cost of that e-node: the ``cost_<ctor>`` row of the same inputs, decoded; None where the
        e-graph has none)."""
        cost = {r.inputs: r.output for r in self.rows(f"cost_{ctor}")}
        for ins, out in self.rows(ctor):
            c = cost.get(ins)
            yield ins, out, None if c is None else self.i64(c)

    def i64(self, v: Any) -> int:
        return self.egraph.value_to_i64(v) if self._decoded is None else self._decoded["i64"][v]

    def string(self, v: Any) -> str:
        return self.egraph.value_to_string(v) if self._decoded is None else self._decoded["String"][v]

    def let(self, name: str) -> Any:
        rows = self.rows(name)
        if not rows:
            raise ReshardError(f"internal: e-graph has no binding {name}")
        return rows[0].output

    # ---- decoding of IDs / placements / dists -------------------------------------
    def id_terms(self) -> dict[Any, ID]:
        """Smallest Root/Outer/Inner/Merge term of every ID class with an extent (computed
        once per snapshot)."""
        if self._id_terms is None:
            self._id_terms = self._smallest_id_terms()
        return self._id_terms

    def _smallest_id_terms(self) -> dict[Any, ID]:
        best: dict[Any, tuple[int, ID]] = {}
        nodes = [(cls, name, args) for cls, lst in self.by_class["ID"].items() for name, args in lst
                 if name in ("Root", "Outer", "Inner", "Merge")]
        changed = True
        while changed:
            changed = False
            for cls, name, args in nodes:
                if name == "Root":
                    size, term = 1, Root(self.i64(args[1]), self.i64(args[2]))
                elif name in ("Outer", "Inner"):
                    if args[0] not in best:
                        continue
                    s, x = best[args[0]]
                    size, term = s + 1, (Outer if name == "Outer" else Inner)(x, self.i64(args[1]))
                else:
                    if args[0] not in best or args[1] not in best:
                        continue
                    (s1, x), (s2, y) = best[args[0]], best[args[1]]
                    size, term = s1 + s2 + 1, Merge(x, y)
                if cls in self.ext and (cls not in best or size < best[cls][0]):
                    best[cls] = (size, term)
                    changed = True
        return {cls: term for cls, (_, term) in best.items()}

    def sharding(self, dist_cls: Any, mesh: DeviceMesh, shape: tuple[int, ...], ids: dict[Any, ID]) -> TensorSharding:
        return TensorSharding(mesh, shape, self.axis_placements(dist_cls, ids))

    def axis_placements(self, dist_cls: Any, ids: dict[Any, ID]) -> tuple[Any, ...]:
        """The dist class's placement on each mesh axis (Replicate, Partial or the ID bound
        there), as ``sharding`` reads them, without building (and checking) a ``TensorSharding``:
        a class of a fused or nested split may span more index points than one is built for."""
        for name, args in self.by_class["Dist"].get(dist_cls, []):
            if name != "D":
                continue
            axes = tuple(self._placement(p, ids) for p in args)
            if all(a is not None for a in axes):
                return axes
        raise ReshardError("internal: a chosen distribution has no decodable D(...) term")

    def replicated(self, dist_cls: Any, axis: int) -> bool:
        """Does the dist class hold Replicate on mesh ``axis`` (its ``D`` term's placement class
        there holds ``Rep``)?"""
        for name, args in self.by_class["Dist"].get(dist_cls, []):
            if name == "D":
                return any(n == "Rep" for n, _ in self.by_class["P"].get(args[axis], []))
        return False

    def _placement(self, p_cls: Any, ids: dict[Any, ID]) -> Any:
        found = None
        for name, args in self.by_class["P"].get(p_cls, []):
            if name == "Rep":
                return Replicate()
            if name == "Part":
                return Partial(self.string(args[0]))
            if name == "Bind" and args[0] in ids:
                found = ids[args[0]]
        return found


def _arg_value(snap: Snapshot, sort: str, v: Any) -> Any:
    if sort == "i64":
        return snap.i64(v)
    if sort == "String":
        return snap.string(v)
    return v


def real_classes(snap: Snapshot) -> dict[Any, tuple[int, Any]]:
    """T class -> (Fusion value id, Dist class); a class with two different names is an
    unsound merge and raises."""
    out: dict[Any, tuple[int, Any]] = {}
    for row in snap.rows("real"):
        key = (snap.i64(row.inputs[0]), row.inputs[1])
        prev = out.setdefault(row.output, key)
        if prev != key:
            raise ReshardError(f"internal: e-graph merged value {prev[0]} and {key[0]} or two distributions; "
                               "a rule is unsound")
    return out
