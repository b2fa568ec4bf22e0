"""Recompute instead of save: a ``saved`` value's class also holds its op run on saved operands.

``saved(v)`` (``reshard.ir.ops.gradient``) is the identity and the forward / backward
boundary: the backward pass reads every forward value it needs through it, so keeping
``saved(v)``'s operand ``v`` alive across the boundary is what costs memory.  For
``v = op_k(a, b)`` whose operands have saved twins ``as = saved(a)``, ``bs = saved(b)``
(facts ``twin(v, vs, c)``: tensor ``vs`` is ``saved(v)``, ``c`` the saved op's transport code),

    saved(op_k(a, b)) = op_k(saved(a), saved(b))

since ``saved`` is the identity (values, index map, and every Partial it keeps).  So every
implementation node of op k in class ``(v, d)`` reading classes ``(a, da)``, ``(b, db)`` gets
a twin in class ``(vs, TrD(d, c_v))`` reading ``(as, TrD(da, c_a))``, ``(bs, TrD(db, c_b))``
(the same local tensors on every rank, since the saved op's index map is the identity):
op k recomputed in the backward pass from the saved operands.  One rule per implementation
constructor that runs a Fusion op (``schema.OP_CTORS``: ``Loc``, ``Loc2`` (lookups too),
``MMT``, ``Expand``, ``LocAt``, and a fused attention's ``Loc3`` / ``Loc4``; ``Loc5`` runs only
its gradient, never saved), plus the cost rules: a twin costs what its original costs
(the same op on local tensors of the same sizes).  Chains recompute through twins of twins (``vs``'s
class holds both ``Loc(saved, v)``, the kept value, and op k on the twins).

Prices, as lowering runs the two (``codegen.fuse``: a pointwise op is computed inside the kernel
that reads it, never written on its own):

    cost(keep v at d)        = w·lb(v, d) / hbm,  w = 2 when v would stay in registers, else 1
    cost(twin of op k)       = 0 when op k is fused into its reader (``OpKind.fused_read``: an
                               elementwise op, a broadcast) and every reader of the saved value
                               fuses it (``ir.fused_values.read_fused``), else cost(op k)

Keeping a value costs its read in the backward pass, and its write in the forward pass where
lowering would not write it otherwise (``ir.fused_values.in_registers``: a pointwise op makes it
and its one reader computes it in its own kernel; a matmul's or a collective's result, or a
value read by several kernels, is written anyway).  A pointwise op recomputed in the backward pass is one
more instruction of the kernel reading it: it moves no bytes of its own, its saved operands'
reads are their keeps'.  So recomputing ``exp(x - m)`` from the saved bf16 logits ``x`` (read:
the logits' bytes) beats keeping the float32 numerator (written and read: four times those
bytes), as torch.compile's partitioner decides; a chain of pointwise ops recomputed from many
kept values pays each of those reads.  (A twin read by a matmul is written by a kernel of its
own: so such a twin is priced as its op.)  Facts: ``keepw(k)`` per saved op (its ``w``),
``pwop(k)`` per op fused into its reader, ``fusedtwin(vs)`` per saved value read fused.
``passes.recompute`` gives the operands of such ops saved twins (without a memory budget only
along chains of them), so that the twins exist.

Keeping also costs memory: ``kept(k, t)`` is the local bytes of
the operand class ``t = (v, d)`` of an op k that starts the backward pass (fact ``keep(k)``: a
saved op, or the seed, which reads the loss), and 0 when ``t`` is a program input as fed
(parameters and inputs are alive anyway; an input resharded in the forward pass is a buffer
of its own), or when it is a transpose of a program input as fed (the backward pass reads it
transposed, through a matmul, which lowering turns into a read of the input's buffer:
``codegen.transposes``).  Extraction prices it
(``extract.memory``: with a memory budget, a multiplier per kept byte).

The rules only add nodes to existing classes (the saved twins' classes exist once their
forward classes do: ``saved`` is a unary op), so they run once after growth (ruleset
``remat``, after ``alias``, so that a matmul reading a transpose as a view has its twin too:
it needs only the transpose's operand saved).  Declarations, facts
and rules enter only e-graphs of Fusions with ``saved`` or ``grad_seed`` ops (``search.encode``):
every other e-graph is unchanged (declarations: ``schema.tables``, ``when="remat"``).
"""

from __future__ import annotations

from ..ir.fused_values import in_registers, read_fused
from ..ir.fusion import Fusion, Op
from ..ir.ops import op_kind
from .cost_laws import PRICING, symbols
from .cost_profile import CostProfile
from .rule import Rule

R = "remat"
C = "cost"

#: per implementation constructor: its arguments, "T" marking the operand classes; "D" the
#: result's dist (``Expand``, ``LocAt``)
_CTORS = {"Loc": ("k", "T"), "Loc2": ("k", "T", "T"), "MMT": ("k", "T", "T", "side"), "Expand": ("k", "T", "D"),
          "LocAt": ("k", "T", "T", "D"), "Loc3": ("k", "T", "T", "T"), "Loc4": ("k", "T", "T", "T", "T")}


def trains(fusion: Fusion) -> bool:
    """Does the Fusion have ops that start a backward pass (``saved``, ``grad_seed``: then its
    e-graph gets this family)?"""
    return any(op_kind(op.kind).boundary is not None for op in fusion.ops)


def facts(fusion: Fusion, k: int, c: int, readers: dict[int, list[Op]]) -> list[str]:
    """The facts of op ``k`` (``c``: its transport code; ``readers``: ``Fusion.readers``) in an
    e-graph of this family: ``pwop`` for an op fused into its reader; when it starts the backward pass
    (``OpKind.boundary``), ``keep`` (its operand class is read across the boundary), and a
    saved op's twin pair and ``keepw`` (module docstring)."""
    op = fusion.ops[k]
    spec = op_kind(op.kind)
    if spec.fused_read:
        return [f"(pwop {k})"]
    if spec.boundary is None:
        return []
    if spec.boundary == "seed":
        return [f"(keep {k})"]
    w = 2 if in_registers(fusion, op.inputs[0], readers) else 1
    return [f"(keep {k})", f"(set (keepw {k}) {w})"] + twin_facts(op, c, readers)


def twin_facts(op: Op, c: int, readers: dict[int, list[Op]]) -> list[str]:
    """The twin facts of saved op ``op`` (``c``: its transport code): its twin pair
    ``(twin v vs c)`` and, when every reader of the saved value fuses it, ``fusedtwin``; with
    the op's own facts, and in a later segment that recomputes from its saved value
    (``segments``)."""
    fused = [f"(fusedtwin {op.output})"] if read_fused(op, readers) else []
    return [f"(twin {op.inputs[0]} {op.output} {c})", *fused]


def _twin(ctor: str) -> tuple[str, str, str, str]:
    """(the original node, the twin pattern's query, the twin node, the twin's class) for
    ``ctor``'s nodes (module docstring)."""
    args, twin, query = [], [], []
    for i, a in enumerate(_CTORS[ctor]):
        if a == "T":
            args.append(f"t{i}")
            twin.append(f"e{i}")
            query.append(f"(= t{i} (real a{i} d{i})) (twin a{i} s{i} c{i}) (= e{i} (real s{i} (TrD d{i} c{i})))")
        elif a == "D":
            args.append("d")
            twin.append("ds")
        else:
            args.append(a)
            twin.append(a)
    node = f"({ctor} {' '.join(args)})"
    q = f"(= g {node}) (= g (real v d)) (twin v vs cv) (= ds (TrD d cv)) (= gs (real vs ds)) " + " ".join(query)
    return node, q, f"({ctor} {' '.join(twin)})", "gs"


def rules(prof: CostProfile, expands: bool, lookups: bool, attention: bool = False) -> list[Rule]:
    """The family's rules (``expands``, ``lookups``, ``attention``: the e-graph declares
    ``Expand``, ``LocAt``, ``Loc3`` / ``Loc4``; ``prof``: the keeps' hbm)."""
    keep = PRICING["cost-keep"].render(prof, symbols("b", ("b",), keepw="w"))
    out: list[Rule] = [
        Rule("cost-keep", "cost(keep v at d) = w·lb(v, d) / hbm: read in the backward pass, and written in the "
             "forward pass too (w = 2) where v would otherwise stay in registers (ir.fused_values.in_registers)",
             "(= g (Loc k t)) (= w (keepw k)) (= t (real v d)) (= b (lb v d))", f"(set (cost_Loc k t) {keep})", C),
    ]
    for ctor in ("Loc", "Loc2") + (("Expand",) if expands else ()):
        node, q, twin, cls = _twin(ctor)
        out.append(Rule("cost-recompute-fused", f"cost(twin of a {ctor} op fused into its reader) = 0: computed "
                        "inside the backward kernel that reads it", f"{q} (= {cls} {twin}) (pwop k) (fusedtwin vs)",
                        f"(set (cost_{twin[1:-1]}) 0)", C, variant=ctor))
    for ctor in _CTORS:
        if ctor == "Expand" and not expands or ctor == "LocAt" and not lookups or \
                ctor in ("Loc3", "Loc4") and not attention:
            continue
        node, q, twin, cls = _twin(ctor)
        out += [
            Rule("recompute", f"saved(op_k(a..)) = op_k(saved(a)..): {ctor} node {node} of v at d has a twin in "
                 "saved(v)'s class at the same dist, reading the saved operands' classes (op k run in the backward "
                 "pass from the saved operands instead of keeping v)", q, f"(union {cls} {twin})", R, variant=ctor),
            Rule("cost-recompute", f"cost(twin of {ctor}) = cost of the original node (the same op on local tensors of "
                 "the same sizes)", f"{q} (= {cls} {twin}) (= c (cost_{ctor} {node[1 + len(ctor):-1]}))",
                 f"(set (cost_{twin[1:-1]}) c)", C, variant=ctor),
        ]
    out += [
        Rule("kept-bytes", "keeping the operand class (v, d) of op k (a saved op or the seed) across the boundary "
             "holds lb(v, d) bytes per rank", "(= g (Loc k t)) (keep k) (= t (real v d)) (= b (lb v d))",
             "(set (kept k t) b)", C),
        Rule("kept-input", "a program input's class as fed holds no bytes of its own (its buffer is alive anyway; "
             "kept merges by min)", "(= g (Loc k t)) (keep k) (= t (InAt n d))", "(set (kept k t) 0)", C),
        Rule("kept-input-transpose", "a transpose of a program input as fed holds no bytes either: the backward "
             "matmul that reads it transposed reads the input's buffer (codegen.transposes)",
             "(= g (Loc k t)) (keep k) (= t (Loc p ti)) (tview p) (= ti (InAt n d))", "(set (kept k t) 0)", C),
    ]
    return out
