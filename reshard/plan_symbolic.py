"""``optimize_symbolic``: one planning for every size of a symbolic mesh, specialized per size.

A program on a symbolic mesh (``ir.symbolic.SymbolicMesh``) is a function from the concrete
mesh to a Fusion.  ``optimize_symbolic`` builds it at every size of the mesh's domain, groups
the sizes into classes (``ir.symbolic.size_class``: sizes whose e-graphs differ only in the
sizes; as a check, also the number of candidate distributions of each value, which must
agree) and saturates one e-graph per class, at its first size.  ``SymbolicPlan.specialize(tp=8)``
then extracts the plan at that size from its class's e-graph, every e-node re-priced at the
size (``extract.repricing``), without saturating again: the plan ``optimize`` makes of the
concrete program at that size, up to ties.  ``table()`` is the decision table (the sizes,
grouped where the cheapest plan stays the same), ``explain()`` shows it with each size's
modeled time and per-rank memory, and ``smallest`` answers which size fits a memory budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from .extract.dag import ENode, collect_enodes
from .extract.repricing import Repricer, SizedSnapshot
from .ir.dtypes import DTYPES
from .ir.errors import ReshardError
from .ir.fusion import Fusion
from .ir.fusion_meshes import fusion_meshes
from .ir.mesh import DeviceMesh
from .ir.symbolic import Sizes, SymbolicMesh, on_mesh, size_class
from .passes.prepare import Options, prepare
from .passes.padding import Padding
from .plan import Plan, Saturated, StackProgram, optimize
from .rules.cost_profile import CostProfile
from .search.saturate import Limits
from .search.encode import candidates
from .summary import collective_kinds, parts, run_name, runs

#: a program on a symbolic mesh: the Fusion at a concrete mesh
MeshProgram = Callable[[DeviceMesh], Fusion]


@dataclass(frozen=True)
class Prepared:
    """The program at one size (``source``) and what is saturated of it (``planned``): the
    prepared program (``padding``: its boundary when it was padded), or, with a stack of layers
    (``stack``), the stack's reduced program."""

    source: Fusion
    planned: Fusion
    padding: Padding | None
    stack: StackProgram | None


def _key(sizes: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sizes.items())


@dataclass
class SizeClass:
    """Sizes saturated as one e-graph (``sat``, saturated at ``sizes[0]``); ``repricer`` reads
    it at the others (made on first use)."""

    sizes: list[Sizes]
    sat: Saturated | None = None
    repricer: Repricer | None = None
    #: False when a limit cut its saturation short: no other size is read from it
    shared: bool = True


@dataclass(frozen=True)
class Range:
    """A row of the decision table: consecutive sizes whose cheapest plans are the same (the
    same steps at the same placements), and those plans by size."""

    sizes: list[Sizes]
    plans: list[Plan]


def _signature(plan: Plan) -> tuple:
    """A plan without its sizes: per node, what it does and the placements it holds."""
    return tuple((n.head.tag.value, n.head.form, n.head.op, n.head.axis, n.value,
                  n.sharding.placements if n.sharding.placements is not None else str(n.sharding))
                 for n in plan.lowered.nodes)


def _describe(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{a}={n}" for a, n in sizes.items())


class SymbolicPlan:
    """The plans of a program for every size of a symbolic mesh (module docstring).
    ``saturations``: how many e-graphs were saturated (one per size class)."""

    def __init__(self, program: MeshProgram, mesh: SymbolicMesh, profile: CostProfile, limits: Limits,
                 extractor: str) -> None:
        self.program, self.mesh, self.profile, self.limits, self.extractor = program, mesh, profile, limits, extractor
        #: per size: the program and its prepared form
        self._prepared: dict[tuple, Prepared] = {}
        self.classes: list[SizeClass] = []
        self._class_of: dict[tuple, SizeClass] = {}
        self._plans: dict[tuple, Plan] = {}
        self._by_key: dict[tuple, SizeClass] = {}
        for sizes in mesh.points():
            key = self._class_key(sizes)
            cls = self._by_key.get(key)
            if cls is None:
                cls = self._by_key[key] = SizeClass([])
                self.classes.append(cls)
            cls.sizes.append(sizes)
            self._class_of[_key(sizes)] = cls
        self.saturations = 0
        for cls in list(self.classes):
            self._saturate(cls)

    def _class_key(self, sizes: Sizes) -> tuple:
        """The size class of ``sizes`` (``ir.symbolic.size_class`` of the prepared program, and
        the number of candidate distributions of each value, which must agree too)."""
        prep = self._prepare(sizes)
        cands = candidates(prep.planned, fusion_meshes(prep.planned)[0])
        return size_class(prep.planned, sizes, self.mesh.axis_names), tuple(len(c) for c in cands.values())

    def _prepare(self, sizes: Sizes) -> Prepared:
        """The program at ``sizes``, checked (one mesh; every fixed split covered by a fact), and
        prepared as ``optimize`` prepares it (``passes.prepare``; a stack of layers reduced as
        ``plan.StackProgram`` reduces it, unless ``limits.reuse_layers`` is off)."""
        mesh = self.mesh.at(**sizes)
        fusion = self.program(mesh)
        where = f"optimize_symbolic at {_describe(sizes)}"
        if not isinstance(fusion, Fusion):
            raise ReshardError(f"{where}: the program must return a Fusion, got {type(fusion).__name__}")
        meshes = fusion_meshes(fusion)
        if len(meshes) != 1 or meshes[0] != mesh:
            raise ReshardError(f"{where}: the program must put every tensor on the mesh it is given "
                               f"({mesh}); it uses {meshes}")
        self.mesh.check_program(fusion, sizes)
        stack = StackProgram.of(fusion) if self.limits.reuse_layers else None
        if stack is not None:
            prep = Prepared(fusion, stack.reduced.fusion, None, stack)
        else:
            whole = prepare(fusion, Options())
            prep = Prepared(fusion, whole.fusion, whole.padding, None)
        self._prepared[_key(sizes)] = prep
        return prep

    def _saturate(self, cls: SizeClass) -> None:
        """Saturate ``cls``'s e-graph at its first size.  An e-graph cut short by a limit is not
        re-priced (what the limit left out may differ between sizes): each other size of the
        class becomes a class of its own, saturated in turn."""
        first = cls.sizes[0]
        prep = self._prepared[_key(first)]
        cls.sat = (prep.stack.saturate(self.profile, self.limits) if prep.stack is not None
                   else Saturated.build(prep.source, self.profile, self.limits))
        self.saturations += 1
        if cls.sat.report.limit_hit is not None:
            cls.shared = False
        if len(cls.sizes) > 1 and not cls.shared:
            rest = cls.sizes[1:]
            cls.sizes = [first]
            for sizes in rest:
                own = SizeClass([sizes])
                self.classes.append(own)
                self._class_of[_key(sizes)] = own
                self._saturate(own)

    # ---- plans --------------------------------------------------------------------------
    def specialize(self, **sizes: int) -> Plan:
        """The plan at ``sizes`` (one per axis), extracted from its size class's e-graph without
        saturating again (``extract.repricing``).  Sizes outside the mesh's domain are planned
        when they fall in one of its classes (the program built there has the same class key);
        else, or when they violate a divisibility fact: ``ReshardError``."""
        point = self.mesh.point(sizes, "SymbolicPlan.specialize", next(iter(self._prepared.values())).source)
        key = _key(point)
        if key not in self._class_of:
            cls = self._by_key.get(self._class_key(point))
            if cls is None or not cls.shared:
                raise ReshardError(f"SymbolicPlan.specialize: {_describe(point)} falls in none of the size classes "
                                   f"saturated for {self.mesh.domain} (the program's dims divide, or are divided by, "
                                   "these sizes otherwise); optimize_symbolic with these sizes in the domain")
            self._class_of[key] = cls
        if key not in self._plans:
            self._plans[key] = self._extract(point)
        return self._plans[key]

    def _extract(self, point: Sizes) -> Plan:
        cls = self._class_of[_key(point)]
        sat = cls.sat
        assert sat is not None
        prep = self._prepared[_key(point)]
        if point != cls.sizes[0]:
            if cls.repricer is None:
                cls.repricer = Repricer(sat.snapshot, sat.fusion, collect_enodes(sat.snapshot),  # type: ignore[arg-type]
                                        sat.encoding.mesh, self.profile)
            mesh = fusion_meshes(prep.planned)[0]
            prices = cls.repricer.prices(mesh.shape)

            def reprice(nodes: list[ENode]) -> list[int]:
                if len(nodes) != len(prices):
                    raise ReshardError("internal: the e-graph's nodes changed between pricing and extraction")
                return prices

            read = SizedSnapshot(sat.snapshot, sat.encoding.mesh)
            enc = replace(sat.encoding, fusion=prep.planned, mesh=mesh)
            sat = Saturated(prep.planned, enc, read,  # type: ignore[arg-type]
                            sat.report, self.profile, prep.padding, reprice)
        if prep.stack is None:
            return sat.plan(extractor=self.extractor)
        plan = prep.stack.plan(sat)
        if plan is None:  # no middle layer's plan repeats: the whole program, planned at this size
            self.saturations += 1
            return optimize(prep.source, cost_profile=self.profile, limits=replace(self.limits, reuse_layers=False),
                            extractor=self.extractor, cache=False)
        return plan

    def table(self) -> list[Range]:
        """The decision table: the domain's sizes in order, grouped into ranges of consecutive
        sizes with the same cheapest plan (``Range``); the plan changes between ranges."""
        out: list[Range] = []
        last = None
        for sizes in self.mesh.points():
            plan = self.specialize(**sizes)
            sig = _signature(plan)
            if out and sig == last:
                out[-1].sizes.append(sizes)
                out[-1].plans.append(plan)
            else:
                out.append(Range([sizes], [plan]))
            last = sig
        return out

    def smallest(self, axis: str, fits: int, **others: int) -> Plan | None:
        """The plan at the smallest size of ``axis`` (the other axes at ``others``) whose per-rank
        peak memory (``Plan.peak_bytes``) is at most ``fits`` bytes; None when no size fits."""
        if axis not in self.mesh.axis_names:
            raise ReshardError(f"SymbolicPlan.smallest: no axis {axis!r} in {list(self.mesh.axis_names)}")
        for n in self.mesh.domain[axis]:
            plan = self.specialize(**{**others, axis: n})
            if plan.peak_bytes <= fits:
                return plan
        return None

    def explain(self) -> str:
        """The decision table: per range of sizes, the plan's collectives and, per size, its
        modeled time and per-rank memory (its inputs: parameters and activations fed; its peak;
        the saved activations of a training step; the bytes it receives), then where the
        cheapest plan changes.  The inputs per rank are also given as a formula in the sizes
        (``_input_formula``); the other figures are evaluated at each size."""
        lines = [f"symbolic plan on {self.mesh}: {len(self.classes)} e-graph(s) saturated for "
                 f"{len(self.mesh.points())} sizes"]
        table = self.table()
        for i, r in enumerate(table):
            head = r.plans[0]
            comms = _collectives(head)
            lines.append(f"range {i + 1}: {' | '.join(_describe(s) for s in r.sizes)}")
            lines.append(f"  plan: {len(head.steps)} steps; {comms}")
            lines.append(f"  inputs per rank: {_input_formula(head)} bytes")
            lines.append(f"  {'sizes':<20} {'time (us)':>12} {'inputs B/rank':>14} {'peak B/rank':>14} "
                         f"{'saved B/rank':>14} {'recv B/rank':>14}")
            for s, p in zip(r.sizes, r.plans):
                lines.append(f"  {_describe(s):<20} {p.cost * 1e6:>12.3f} {_input_bytes(p):>14} {p.peak_bytes:>14} "
                             f"{p.saved_bytes:>14} {p.comm_bytes:>14}")
        for a, b in zip(table, table[1:]):
            lines.append(f"the cheapest plan changes between {_describe(a.sizes[-1])} and {_describe(b.sizes[0])}")
        return "\n".join(lines)


#: up to this many collectives, ``explain`` names each; above, it counts them per part of the plan
NAMED_COLLECTIVES = 8


def _collectives(plan: Plan) -> str:
    """The plan's collectives: each with its axis and value, or, in a longer plan, their kinds per
    part (``summary.parts``: a layer, an op outside layers), consecutive layers with the same
    steps as one run (``model.layers.1 .. model.layers.30 (30 layers) each: allgather x2``)."""
    comms = plan.communications
    if not comms:
        return "no communication"
    if len(comms) <= NAMED_COLLECTIVES:
        return ", ".join(f"{c.kind}({c.axis}) {c.tensor}" for c in comms)
    out = []
    for ps in parts(plan).values():
        for run in runs(ps):
            kinds = collective_kinds(run[0].nodes)
            if kinds:
                out.append(f"{run_name(run, 72)}{' each' if len(run) > 1 else ''}: {kinds}")
    return f"{len(comms)} collectives; " + "; ".join(out)


def _input_formula(plan: Plan) -> str:
    """A plan's input bytes per rank as a formula in the mesh sizes: each input's global bytes over
    the product of the axes its sharding splits (exact at every size with the same placements)."""
    terms: dict[tuple[str, ...], int] = {}
    for buf, _, ts in plan.lowered.inputs:
        axes = tuple(ts.mesh.axis_names[a] for a in ts.bound_axes)
        terms[axes] = terms.get(axes, 0) + math.prod(ts.shape) * DTYPES[plan.lowered.local_inputs[buf][1]].itemsize
    return " + ".join(f"{b}" if not axes else f"{b}/{'*'.join(axes)}" for axes, b in sorted(terms.items())) or "0"


def _input_bytes(plan: Plan) -> int:
    """Bytes per rank of a plan's inputs (parameters and fed activations): its local input buffers."""
    return sum(math.prod(shape) * DTYPES[dtype].itemsize for shape, dtype in plan.lowered.local_inputs.values())


def optimize_symbolic(program: Fusion | MeshProgram, mesh: SymbolicMesh, *,
                      cost_profile: CostProfile | dict | str | None = None, limits: Limits | None = None,
                      extractor: str = "greedy") -> SymbolicPlan:
    """Plan ``program`` for every size of
    symbolic ``mesh``: one saturation per size class (``ir.symbolic``), the plans extracted per
    size on demand (``SymbolicPlan``).  ``program``: a function of the concrete mesh returning
    a Fusion (its shapes may read the sizes), or a Fusion built on a mesh of the same axis
    names, read at each size by its placements (``ir.symbolic.on_mesh``).  ``cost_profile``,
    ``limits``, ``extractor``: as ``optimize`` (``extractor`` "greedy" or "windows")."""
    if not isinstance(mesh, SymbolicMesh):
        raise ReshardError(f"optimize_symbolic: expected a SymbolicMesh, got {type(mesh).__name__}")
    if isinstance(program, Fusion):
        fusion = program
        program = lambda m: on_mesh(fusion, m)  # noqa: E731
    elif not callable(program):
        raise ReshardError("optimize_symbolic: the program must be a Fusion or a function of the mesh returning one")
    if extractor not in ("greedy", "windows"):
        raise ReshardError(f"optimize_symbolic: extractor {extractor!r}: 'greedy' or 'windows'")
    return SymbolicPlan(program, mesh, CostProfile.load(cost_profile), limits or Limits(), extractor)
