"""The cost laws, declared once: how each kind of e-node is priced, as a formula over its local
bytes, its team's size, its op's facts and the profile's figures.

A formula is written once, in Python's integer operators, and read two ways: over ``Term``s
(egglog variables) it renders the action of the cost rule that prices the node (``rules.cost``
and the families' ``cost-*`` rules), over ints it is the node's cost at other mesh sizes
(``extract.repricing``, the symbolic mesh).  ``//`` is egglog's ``/`` (the operands are never
negative, so truncation is the floor).  ``PRICINGS`` lists, per cost rule, the constructors it
prices, the op fact that selects it and its formula; changing a law, or adding a collective
kind (a row of ``ir.collective_kinds``), is an edit here.

Units (``rules.cost``): times in ps, bandwidths as integers (collectives ``bw_scale``, HBM in
MB/s), peaks in MFLOP/s, so bytes·10^6/MB/s and flops·10^6/MFLOP/s are picoseconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Union

from ..ir.collective_kinds import KIND
from .collectives import BY_CTOR, TEAM_CTORS
from .cost_profile import CostProfile


def _op(symbol: str, reflected: bool = False) -> Callable[["Term", "Num"], "Term"]:
    """The operator method of ``Term`` that writes egglog's ``symbol`` (``reflected``: the
    other operand first, as in ``__radd__``)."""
    def method(self: "Term", other: "Num") -> "Term":
        return Term(f"({symbol} {other} {self})" if reflected else f"({symbol} {self} {other})")
    return method


class Term:
    """An egglog i64 expression, built by Python's arithmetic operators (module docstring)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text

    __add__, __radd__ = _op("+"), _op("+", True)
    __sub__ = _op("-")
    __mul__, __rmul__ = _op("*"), _op("*", True)
    __floordiv__, __rfloordiv__ = _op("/"), _op("/", True)
    __mod__, __rmod__ = _op("%"), _op("%", True)


Num = Union[int, Term]


def imax(a: Num, b: Num) -> Num:
    """max(a, b): egglog's ``max`` over terms, Python's over ints."""
    return Term(f"(max {a} {b})") if isinstance(a, Term) or isinstance(b, Term) else max(a, b)


def scaled_div(x: Num, k: Num, d: Num) -> Num:
    """floor(x·k/d) without forming x·k: (x/d)·k + ((x mod d)·k)/d."""
    return (x // d) * k + (x % d) * k // d


def mbps(gbps: float) -> int:
    """A bandwidth in GB/s as an integer MB/s (1 MB/s moves a byte in 10^6 ps)."""
    return max(1, int(round(gbps * 1000)))


_I64_SAFE = 1 << 62


def bw_scale(gbps: float, mul: int, n_max: int) -> tuple[int, int]:
    """(M, S): the bandwidth as M units of 10^e B/s, S = 10^(12-e) ps·units per byte, so that
    bytes·f(n)/busbw in ps is bytes·mul·(n-1)·S / (n·M).  e = 6 (MB/s) from 100 GB/s up; slower
    links keep 6 significant digits (smaller e), as long as n·M·mul·(n-1)·S stays within i64
    for teams up to ``n_max`` (the remainder form of ``scaled_div`` multiplies at most that)."""
    bps = gbps * 1e9
    e = min(6, max(0, math.floor(math.log10(bps)) - 5)) if bps >= 1 else 0
    while True:
        m = max(1, int(round(bps / 10 ** e)))
        s = 10 ** (12 - e)
        if e >= 12 or n_max * m * mul * max(1, n_max - 1) * s < _I64_SAFE:
            return m, s
        e += 1


@dataclass(frozen=True)
class Team:
    """The figures of one collective kind's law on a team: α in ps and the bandwidth as (M, S)
    (``bw_scale``); ``size``: the team size they are for (None: the kind's figures, any size)."""

    alpha: int
    m: int
    scale: int
    size: int | None


def team_figures(prof: CostProfile, kind: str, size: int | None, n_max: int) -> Team:
    """``kind``'s figures on teams of ``size`` (``CostProfile.collective``; None: the per-kind
    figures), its bandwidth scaled for teams up to ``n_max``."""
    ck = KIND[kind]
    alpha_us, gbps = (prof.alpha_us[kind], prof.busbw_gbps[kind]) if size is None else prof.collective(kind, size)
    m, scale = bw_scale(gbps, ck.bus_mul, n_max)
    return Team(prof.ps(alpha_us), m, scale, size)


def teams(prof: CostProfile, kind: str, sizes: list[int]) -> list[Team]:
    """The figures ``kind``'s laws use on a mesh of axis ``sizes``: one per size when the profile
    has per-team-size figures for it (each scaled for its own size), else the per-kind figures
    scaled for the largest axis."""
    if prof.collectives.get(kind):
        return [team_figures(prof, kind, n, n) for n in sorted(set(sizes))]
    return [team_figures(prof, kind, None, max(sizes, default=1))]


def team_of(prof: CostProfile, kind: str, n: int, sizes: list[int]) -> Team:
    """The figures of the law that prices ``kind`` on a team of ``n`` on a mesh of axis ``sizes``."""
    return next(t for t in teams(prof, kind, sizes) if t.size in (None, n))


@dataclass(frozen=True)
class Quantities:
    """What a law reads of one node: egglog variables (``Term``) when its rule is rendered,
    ints when the repricer evaluates it.  ``out``: the local bytes of the node's class; ``ins``:
    of its operand classes, in argument order; ``n``: the team size (of a transfer: the target
    mesh's devices, an int even in a rule: the rules are made per mesh); ``ctor``: the node's
    constructor; ``team``: a collective's figures; ``copies``: its reorder copies; ``facts``:
    its op's figures (``mmK``, ``mmitem``, ``mmpeak``, ``kprod``; ``fl``, ``pb``, ``kn`` of a
    fused op's strategy, its ``atpeak``; ``xdev``)."""

    out: Num = 0
    ins: tuple[Num, ...] = ()
    n: Num = 0
    ctor: str = ""
    team: Team | None = None
    copies: int = 0
    facts: Mapping[str, Num] = field(default_factory=dict)


def symbols(out: str, ins: tuple[str, ...] = (), **facts: str) -> Quantities:
    """Quantities naming a rule's egglog variables: the local bytes of the node's class, of its
    operands', and its op's ``facts``."""
    return Quantities(Term(out), tuple(Term(x) for x in ins), facts={k: Term(v) for k, v in facts.items()})


# ---- the laws ---------------------------------------------------------------------------
def memory(prof: CostProfile, moved: Num) -> Num:
    """A memory-bound kernel: launch + bytes read and written / hbm."""
    return prof.ps(prof.launch_us) + moved * 1000000 // mbps(prof.hbm_gbps)


def copy(prof: CostProfile, b: Num) -> Num:
    """A local copy of ``b`` bytes: launch + (read + write) / hbm."""
    return prof.ps(prof.launch_us) + 2 * (b * 1000000) // mbps(prof.hbm_gbps)


def matmul(prof: CostProfile, q: Quantities) -> Num:
    """launch + max(bytes / hbm, flops_local / peak), flops_local = 2·out/itemsize·K / Π kf."""
    flops = 2 * (q.out // q.facts["mmitem"] * q.facts["mmK"]) // q.facts["kprod"]
    return imax(memory(prof, q.ins[0] + (q.ins[1] + q.out)),
                prof.ps(prof.launch_us) + scaled_div(flops, 1000000, q.facts["mmpeak"]))


def collective(prof: CostProfile, q: Quantities) -> Num:
    """α + bytes·mul(n-1)/n / busbw + ``copies`` reorder copies of its buffer (bytes: the
    kind's ``law_buffer``, the result or the operand)."""
    ck, t = BY_CTOR[q.ctor], q.team
    assert t is not None, "a collective's law needs its team's figures"
    b = q.out if ck.law_buffer == "result" else q.ins[0]
    total = t.alpha + scaled_div(b, ck.bus_mul * ((q.n - 1) * t.scale), q.n * t.m)
    return total + q.copies * copy(prof, b) if q.copies else total


def transfer(prof: CostProfile, q: Quantities) -> Num:
    """A cross-mesh transfer (f(n) = 1): α + buffer / bw, on the kind's team (send/recv: 2;
    broadcast and scatter: the source and the target's ``n`` devices).  The buffer is the
    local operand (send/recv, broadcast), or the scatter root's |B| pieces of the result."""
    kind = BY_CTOR[q.ctor].name
    alpha, bw = prof.collective(kind, 2 if kind == "send_recv" else int(q.n) + 1)
    b = q.out * q.facts["xdev"] if kind == "scatter" else q.ins[0]
    return prof.ps(alpha) + b * 1000000 // mbps(bw)


def kept(prof: CostProfile, q: Quantities) -> Num:
    """A value kept for the backward pass: read there, and written in the forward pass where it
    would otherwise stay in registers (``ir.fused_values.in_registers``: the fused forward writes
    it only to keep it): ``keepw``·bytes / hbm, ``keepw`` 2 for such a value, else 1.  No
    launch: no kernel of its own."""
    return q.facts["keepw"] * q.ins[0] * 1000000 // mbps(prof.hbm_gbps)


def fused(prof: CostProfile, q: Quantities) -> Num:
    """launch·kernels + max(operand and result bytes / hbm, local flops / peak) + the
    intermediates' extra bytes / hbm."""
    moved = q.out
    for b in q.ins:
        moved = b + moved
    hbm = mbps(prof.hbm_gbps)
    return (prof.ps(prof.launch_us) * q.facts["kn"]
            + imax(moved * 1000000 // hbm, scaled_div(q.facts["fl"], 1000000, q.facts["atpeak"]))
            + q.facts["pb"] * 1000000 // hbm)


@dataclass(frozen=True)
class Pricing:
    """A cost rule's law: the constructors whose nodes it prices, the op fact that selects it
    (a relation or table keyed by the node's op k; ``""``: none), its formula, and ``reads``:
    the tables keyed by op k whose values the formula reads (``Quantities.facts``).  ``fixed``:
    what it prices whose quantities are known only at the e-graph's own mesh sizes (``""``:
    none; ``extract.repricing`` refuses those nodes)."""

    rule: str
    ctors: tuple[str, ...]
    selector: str
    formula: Callable[[CostProfile, Quantities], Num]
    fixed: str = ""
    reads: tuple[str, ...] = ()

    def render(self, prof: CostProfile, q: Quantities) -> str:
        """The formula over the rule's variables, as egglog text."""
        return str(self.formula(prof, q))


#: why a transfer's cost is not re-priced: its teams are the meshes, not an axis
_CROSS_MESH = "a program moving values between meshes (cross-mesh transfers)"


def _zero(prof: CostProfile, q: Quantities) -> Num:
    """A view: cost 0."""
    return 0


#: every cost rule's law, in the order the repricer tries them on a node (the first that
#: gives the node's e-graph cost prices it)
PRICINGS: tuple[Pricing, ...] = (
    Pricing("cost-view", ("Loc",), "viewop", _zero),
    Pricing("cost-keep", ("Loc",), "keepw", kept, reads=("keepw",)),
    Pricing("cost-recompute-fused", ("Loc", "Loc2", "Expand"), "pwop", _zero),
    Pricing("cost-mem-1", ("Loc",), "memop", lambda p, q: memory(p, q.ins[0] + q.out)),
    Pricing("cost-mem-2", ("Loc2",), "memop", lambda p, q: memory(p, q.ins[0] + (q.ins[1] + q.out))),
    Pricing("cost-matmul", ("Loc2", "MMT"), "mmK", matmul, reads=("mmK", "mmitem", "mmpeak")),
    Pricing("cost-lookup", ("Loc2",), "lkgather", lambda p, q: memory(p, q.ins[1] + 2 * q.out)),
    Pricing("cost-slice-outermost-view", ("LocalSlice",), "", _zero),
    Pricing("cost-local-slice", ("LocalSlice",), "", lambda p, q: copy(p, q.out)),
    Pricing("cost-partial-max-of-replicate", ("MakePartial",), "", _zero),
    Pricing("cost-partial-sum-of-replicate", ("MakePartial",), "", lambda p, q: memory(p, q.out)),
    Pricing("cost-partial-of-shard", ("MakePartial",), "", lambda p, q: memory(p, q.out + 2 * q.ins[0])),
    Pricing("cost-collective", tuple(TEAM_CTORS), "", collective),
    Pricing("cost-send-recv", ("SendRecv",), "", transfer, _CROSS_MESH),
    Pricing("cost-broadcast-xfer", ("Bcast",), "", transfer, _CROSS_MESH),
    Pricing("cost-scatter-xfer", ("Scatter",), "", transfer, _CROSS_MESH),
    Pricing("cost-expand", ("Expand",), "", lambda p, q: memory(p, q.ins[0] + q.out)),
    Pricing("cost-scatter-rows", ("LocAt",), "", lambda p, q: memory(p, q.ins[0] + (q.ins[1] + q.out))),
    Pricing("cost-attention", ("Loc2", "Loc3", "Loc4", "Loc5"), "atpeak", fused, reads=("atpeak",)),
)
PRICING: dict[str, Pricing] = {p.rule: p for p in PRICINGS}

