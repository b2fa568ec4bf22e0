"""Communication-aware cost model, attached to e-nodes by egglog rules.

Times are integer picoseconds.  Collectives follow α-β with nccl-tests' bus bandwidth:
``t = α + bytes * f(n) / busbw`` with f(n) = (n-1)/n for allgather (bytes = result),
reduce-scatter (bytes = operand), all-to-all (bytes = operand), scatter (bytes = the root's
whole buffer) and gather (bytes = the root's result), 2(n-1)/n for allreduce, 1 for
broadcast and send/recv (bytes = the buffer).  α and busbw are per collective kind and,
optionally, per team size n (``CostProfile.collective``); the rules are emitted per team size
present on the mesh.  Kernels are rooflines: ``launch + max(bytes_moved / hbm, flops / peak)``.
Views (reshape of a contiguous local tensor, redistribute to the dist it already has, slicing
the outermost dim) cost 0.  Figures come from a ``CostProfile`` (``cost_profile``; JSON;
``reshard tune`` measures one); the default is 2xH200 (``reshard/profiles/h200x2.json``).  The
rules use exact i64 arithmetic: collective bandwidths as integers with 6 significant digits
(MB/s from 100 GB/s up), HBM in MB/s, peaks in MFLOP/s, and floor(x·k/d) in the remainder form
(x/d)·k + ((x mod d)·k)/d, so calibrated CPU figures keep their precision without overflow.
The formulas are ``cost_laws``' (each written once, and read again by the symbolic mesh's
repricer); these rules bind their quantities (local bytes, team size, op facts) to e-nodes.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..ir.collective_kinds import KIND
from ..ir.errors import ReshardError
from .collectives import CONSTRUCTORS, TEAM_CTORS
from .cost_laws import PRICING, Quantities, Team, Term, symbols, team_figures, teams
from .cost_profile import CostProfile
from .rule import Rule

C = "cost"


def _coll(kind: str, node: str, key: str, bytes_query: str, prof: CostProfile, team: Team, copies: int = 0,
          variant: tuple[str, str] | None = None) -> Rule:
    """``cost_laws.collective`` on ``team``'s figures (``team.size``: a rule for teams of that
    size only, ``CostProfile.collective``), with ``copies`` reorder copies of its buffer;
    ``variant``: (name suffix, law) of a rule whose ``node`` pattern is a special case.  The rule
    is ``cost-collective`` with variant ``<kind>[-n<team size>][<layout suffix>]`` (reported e.g.
    as ``cost-collective-allgather-n2-outermost-0``)."""
    ctor = CONSTRUCTORS[kind][0]
    variant_name, guard, law_n = kind, "", ""
    if team.size is not None:
        variant_name, guard, law_n = f"{kind}-n{team.size}", f" (= n {team.size})", f" on teams of n = {team.size}"
    mul = KIND[kind].bus_mul
    law = f"cost({node}) = α_{kind} + bytes·{mul}(n-1)/n / busbw_{kind}{law_n}"
    b = Term("b")
    total = PRICING["cost-collective"].render(prof, Quantities(b, (b,), Term("n"), ctor, team, copies))
    if copies:
        law += f" + {copies} reorder cop{'y' if copies == 1 else 'ies'} of its buffer (launch + 2·bytes / hbm)"
    if variant is not None:
        variant_name, law = variant_name + variant[0], law + variant[1]
    axis = node.split()[2].rstrip(")")
    return Rule("cost-collective", law, f"(= g {node}) {bytes_query} (= n (axsize {axis})){guard}",
                f"(set ({key}) {total})", C, variant=variant_name)


#: placements dealing out blocks of dim 0 (a block split, or dim 0 itself when it has one
#: element per device): the buffers a collective exchanges are then contiguous pieces of the
#: local tensors, and no reorder copy is needed
OUTERMOST = ("(Bind (Outer (Root s 0 e) k))", "(Bind (Root s 0 e))")
def _source_outermost(a: int, m: int, pat: str) -> str:
    """Query: the collective's operand t is realized with placement ``pat`` on axis a."""
    return "(= t (real u (D " + " ".join(pat if i == a else f"q{i}" for i in range(m)) + ")))"


def _layout_variants(kind: str, m: int) -> list[tuple[str, str, str, int, str]]:
    """(node, key, extra query, copies, name suffix) of the cases of ``kind`` on an ``m``-axis
    mesh whose buffers need one reorder copy fewer than ``CollectiveKind.reorder_copies``
    (costs merge by min, so the special case wins where it applies): the tensor on one of the
    kind's ``outermost_sides`` is an outermost block split (``OUTERMOST``) -- the gathered
    source of an allgather, the scattered target of a reduce-scatter, either side of an
    all-to-all.  A result side is matched in the node's placement argument ``p`` (suffix
    ``-outermost``), an operand side by the operand's realization on each axis ``a``
    (``-outermost-<a>``); a kind with both sides says ``to-`` / ``from-``."""
    ck = KIND[kind]
    ctor, pattern = CONSTRUCTORS[kind]
    args = pattern.split()
    sides = [s for s in ("result", "operand") if s in ck.outermost_sides]
    out = []
    for i, pat in enumerate(OUTERMOST):
        tag = "" if i == 0 else "-dim"
        for side in sides:
            word = ("to-" if side == "result" else "from-") if len(sides) > 1 else ""
            if side == "result":
                node = " ".join(pat if x == "p" else x for x in args)
                out.append((f"({ctor} {node})", f"cost_{ctor} {node}", "", ck.reorder_copies - 1,
                            f"-{word}outermost{tag}"))
            else:
                for a in range(m):
                    node = " ".join(str(a) if x == "a" else x for x in args)
                    out.append((f"({ctor} {node})", f"cost_{ctor} {node}", _source_outermost(a, m, pat),
                                ck.reorder_copies - 1, f"-{word}outermost{tag}-{a}"))
    return out


def rules(prof: CostProfile, team_sizes: Iterable[int] | None = None) -> list[Rule]:
    """Collective and local-slice cost rules.  ``team_sizes``: the mesh's axis sizes; a kind
    with per-team-size figures (``prof.collectives``) gets one rule per size, guarded by it
    (needs ``team_sizes``); other kinds one rule with the per-kind figures.  A collective on a
    dim that is not outermost also pays its buffers' reorder copies (``CollectiveKind.reorder_copies``,
    ``_layout_variants``)."""
    out_bytes = "(= g (real v d)) (= b (lb v d))"
    in_bytes = "(= t (real u di)) (= b (lb u di))"
    axes = [int(n) for n in team_sizes] if team_sizes is not None else None
    colls: list[Rule] = []
    for ctor, ck in TEAM_CTORS.items():
        args = CONSTRUCTORS[ck.name][1]
        kind, node, key = ck.name, f"({ctor} {args})", f"cost_{ctor} {args}"
        query = out_bytes if ck.law_buffer == "result" else in_bytes
        if axes is not None:
            figures = teams(prof, kind, axes)
        elif prof.collectives.get(kind):
            raise ReshardError(f"cost profile {prof.name!r} has per-team-size figures for {kind}: "
                               "cost rules need the mesh's team sizes (rules(profile, mesh.shape))")
        else:
            figures = [team_figures(prof, kind, None, 64)]
        for team in figures:
            colls.append(_coll(kind, node, key, query, prof, team, copies=ck.reorder_copies))
            for v_node, v_key, extra, copies, suffix in _layout_variants(kind, len(axes or [])):
                law = f"; {suffix.strip('-').replace('-', ' ')} (fewer reorder copies: {copies})"
                colls.append(_coll(kind, v_node, v_key, f"{query} {extra}".rstrip(), prof, team, copies=copies,
                                   variant=(suffix, law)))
    return colls + [
        Rule("cost-local-slice", "a local slice copies its result: launch + 2·bytes / hbm",
             f"(= g (LocalSlice t a p)) {out_bytes}",
             f"(set (cost_LocalSlice t a p) {PRICING['cost-local-slice'].render(prof, symbols('b'))})", C),
        Rule("cost-slice-outermost-view", "slicing dim 0 of a contiguous tensor is a view: cost 0",
             "(= g (LocalSlice t a (Bind (Outer (Root s 0 e) n))))",
             f"(set (cost_LocalSlice t a (Bind (Outer (Root s 0 e) n))) "
             f"{PRICING['cost-slice-outermost-view'].render(prof, Quantities())})", C),
    ]


def partial_rules(prof: CostProfile, mesh_ndim: int) -> list[Rule]:
    """Costs of ``MakePartial`` (``resharding``'s local R/S -> P(o) on one axis), per axis a
    (the law depends on the operand's placement there): R -> P(max) keeps every copy, a view
    (0); R -> P(sum) keeps the value on one coordinate and zero-fills the result elsewhere
    (launch + bytes / hbm); S -> P(o) fills the full-extent result with o's identity and
    copies the block in (launch + (result + 2·block bytes) / hbm)."""
    out_bytes = "(= g (real v d)) (= b (lb v d))"
    max_of_rep = PRICING["cost-partial-max-of-replicate"].render(prof, Quantities())
    sum_of_rep = PRICING["cost-partial-sum-of-replicate"].render(prof, symbols("b"))
    of_shard = PRICING["cost-partial-of-shard"].render(prof, symbols("b", ("bi",)))
    out: list[Rule] = []
    for a in range(mesh_ndim):
        rep = _source_outermost(a, mesh_ndim, "(Rep)")
        src = "(D " + " ".join("(Bind x)" if i == a else f"q{i}" for i in range(mesh_ndim)) + ")"
        bind = f"(= t (real u {src})) (= bi (lb u {src}))"
        out += [
            Rule("cost-partial-max-of-replicate", "R -> P(max) keeps every copy: a view, cost 0",
                 f'(= g (MakePartial t {a} (Part "max"))) {rep}',
                 f'(set (cost_MakePartial t {a} (Part "max")) {max_of_rep})', C, variant=str(a)),
            Rule("cost-partial-sum-of-replicate", "R -> P(sum): one write of the result (zeros off coordinate "
                 "0): launch + bytes / hbm",
                 f'(= g (MakePartial t {a} (Part "sum"))) {rep} {out_bytes}',
                 f'(set (cost_MakePartial t {a} (Part "sum")) {sum_of_rep})', C, variant=str(a)),
            Rule("cost-partial-of-shard", "S -> P(o): fill the result, copy the block in: launch + "
                 "(result + 2·block bytes) / hbm",
                 f"(= g (MakePartial t {a} p)) {bind} {out_bytes}",
                 f"(set (cost_MakePartial t {a} p) {of_shard})", C, variant=str(a)),
        ]
    return out


def local_cost_facts(k: int, law: str, prof: CostProfile, *, contraction: int = 0, itemsize: int = 4) -> list[str]:
    """Facts that select the cost law of Fusion op ``k``'s Loc/Loc2 nodes (the laws are the
    generic rules of ``local_rules``; ``law``: the op's declared ``cost``, ``reshard.ir.ops``):
    "view" costs 0; "matmul" is a roofline of its K and peak rate; "mem" is memory-bound; "kept"
    (a saved op) is ``rules.remat``'s."""
    if law == "view":
        return [f"(viewop {k})"]
    if law == "kept":  # priced by ``rules.remat`` (its facts)
        return []
    if law == "mem":
        return [f"(memop {k})"]
    if law != "matmul":
        raise ReshardError(f"internal: unknown cost law {law!r} of op {k}")
    return [f"(set (mmK {k}) {contraction})", f"(set (mmitem {k}) {itemsize})",
            f"(set (mmpeak {k}) {peak_rate(prof, itemsize)})"]


def peak_rate(prof: CostProfile, itemsize: int) -> int:
    """The matmul peak rate for elements of ``itemsize`` bytes, in MFLOP/s (at least 1)."""
    return max(1, int(round(prof.peak_tflops.get(str(itemsize), 100.0) * 1e6)))


def local_rules(prof: CostProfile, mesh_ndim: int) -> list[Rule]:
    """Costs of Loc/Loc2 nodes.  views: 0.  memory-bound ops: launch + (in + out bytes) / hbm.
    matmul: launch + max(memory, 2·out_local·K_local / peak) with K_local = K / Π kf.
    (hbm in MB/s, peak in MFLOP/s: bytes·10^6/hbm and flops·10^6/peak are picoseconds.)"""
    q1 = "(= g (real o do)) (= bo (lb o do)) (= t (real u di)) (= bi (lb u di))"
    q2 = "(= g (real o do)) (= bo (lb o do)) (= ta (real a da)) (= ba (lb a da)) (= tb (real b db)) (= bb (lb b db))"
    one, two = symbols("bo", ("bi",)), symbols("bo", ("ba", "bb"))
    pa = " ".join(f"pa{i}" for i in range(mesh_ndim))
    po = " ".join(f"po{i}" for i in range(mesh_ndim))
    kprod = "1"
    for i in range(mesh_ndim):
        kprod = f"(* {kprod} kf{i})"
    q_mm = (f"(= g (Loc2 k ta tb)) (= K (mmK k)) (= isz (mmitem k)) (= peak (mmpeak k)) {q2} "
            f"(= da (D {pa})) (= do (D {po}))")
    matmul = symbols("bo", ("ba", "bb"), mmK="K", mmitem="isz", mmpeak="peak", kprod=kprod)
    return [
        Rule("cost-view", "a view op (reshape of a contiguous local tensor, redistribute to the dist it "
             "already has) costs 0", "(= g (Loc k t)) (viewop k)",
             f"(set (cost_Loc k t) {PRICING['cost-view'].render(prof, Quantities())})", C),
        Rule("cost-mem-1", "cost(unary op) = launch + (in + out bytes) / hbm",
             f"(= g (Loc k t)) (memop k) {q1}",
             f"(set (cost_Loc k t) {PRICING['cost-mem-1'].render(prof, one)})", C),
        Rule("cost-mem-2", "cost(binary op) = launch + (in + in + out bytes) / hbm",
             f"(= g (Loc2 k ta tb)) (memop k) {q2}",
             f"(set (cost_Loc2 k ta tb) {PRICING['cost-mem-2'].render(prof, two)})", C),
        Rule("cost-matmul-axes", "matmul: record (lhs, result) placement pairs for kf",
             q_mm, " ".join(f"(mmaxis pa{i} po{i})" for i in range(mesh_ndim)), C),
        Rule("cost-matmul", "cost(matmul) = launch + max(bytes / hbm, flops_local / peak)",
             f"{q_mm} " + " ".join(f"(= kf{i} (kf pa{i} po{i}))" for i in range(mesh_ndim)),
             f"(set (cost_Loc2 k ta tb) {PRICING['cost-matmul'].render(prof, matmul)})", C),
    ]


def kf_rules() -> list[Rule]:
    """kf(lhs placement, result placement): the contraction split factor on one axis."""
    return [
        Rule("kf-default", "kf = 1 unless the lhs contraction index is split on this axis",
             "(mmaxis pa po)", "(set (kf pa po) 1)", C),
        Rule("kf-contract", "kf(S(x), P) = e(x): the contraction dim is split e(x) ways",
             '(mmaxis pa po) (= pa (Bind x)) (= e (ext x)) (= po (Part "sum"))', "(set (kf pa po) e)", C),
    ]
