"""The egglog sorts, tables and rulesets of reshard's e-graph, each table declared once
(``Table``: argument sorts, result, merge, meaning) and rendered by ``schema``.

Layer 1, IterDomains (sort ``ID``, values: ``reshard.ir.ids``) and what the analysis knows of
them.  Placements (sort ``P``), one per mesh axis, and distributions (sort ``Dist``), one
placement per axis; ``LkP`` (and its ``Dist`` form) is a pending transport that rules resolve
(union with its normal form), ``TrP``/``TrD`` and ``MMP``/``MMD`` functions that rules compute
where a demand (``trpw``/``trdw``, ``mmpw``/``mmdw``) asks for them (``placements``,
``propagation``).  Layer 2, tensor terms (sort ``T``): an e-class is one Fusion value with one
Dist (named by ``real(value, dist)``, which the extractor never picks), holding every
implementation found; each implementation constructor has a ``cost_<name>`` table the cost
rules fill (merged by min) and extraction reads.  Then the facts ``search.encode`` writes per
op and per mesh, and the tables of the optional families, declared only for Fusions that
need them (``Table.when``) so every other e-graph stays exactly as it was.
"""

from __future__ import annotations

import functools
import itertools

from .table import Table, render

#: the tables that only carry loaded rows to the ``load`` ruleset (``rules.loading``): not counted
#: as e-graph size
LOAD_ONLY = frozenset({"rootmap", "seamv", "seamrep", "seampart", "seamroot", "seamouter", "seamp"})
#: the relations that only ask for a function's value (``placements``' transports ``TrD`` and
#: ``TrP``, ``propagation``'s matmul strategies ``MMD`` and ``MMP``): not counted as e-graph size
DEMANDS = frozenset({"trdw", "trpw", "mmdw", "mmpw"})
#: the relations, one per mesh axis a (``<name><a>``), that restate others keyed for the rules'
#: joins (``resharding``: ``real`` and ``cand`` by one axis's placement and the others')
RESTATING = ("rat", "cat")


def unread(name: str) -> bool:
    """Whether table ``name`` is one extraction never reads back and the e-graph's size leaves
    out: the loaded rows' (``LOAD_ONLY``), the demands (``DEMANDS``) and the restating relations
    (``RESTATING``)."""
    return name in LOAD_ONLY or name in DEMANDS or (name[:3] in RESTATING and name[3:].isdigit())


RULESETS = ("load", "ids", "analysis", "strategy", "reshard", "remat", "alias", "cost")
#: the arities of the ops whose strategies are enumerated (attention: q, k, v [, mask];
#: attention_grad: q, k, v, g [, mask]; the fused linear loss: h, w [, m [, g]]), with one
#: ``attn<n>`` relation each (``rules.attention``; ``Loc2`` is every binary op's constructor)
ATTENTION_ARITIES = (2, 3, 4, 5)
#: the schema flags (``schema``'s keyword arguments) that declare the optional tables
FLAGS = ("transfers", "lookups", "expands", "remat", "attention")


def axis_sets(m: int) -> list[tuple[int, ...]]:
    """The nonempty sets of mesh axes of an ``m``-axis mesh, smallest first."""
    return [axes for n in range(1, m + 1) for axes in itertools.combinations(range(m), n)]


def target_relation(prefix: str, axes: tuple[int, ...]) -> str:
    """The relation of the candidate dists that split a value's dims on the mesh ``axes``
    (``expand``'s ``expto``, ``lookup``'s ``rowsto``): (value, dist, the dist's other placements)."""
    return f"{prefix}_{'_'.join(str(a) for a in axes)}"


def _targets(prefix: str, m: int, what: str, when: str) -> list[Table]:
    return [Table(target_relation(prefix, axes), "relation", ("i64", "Dist", *["P"] * (m - len(axes))), "",
                  f"candidate dists of a value that split its {what} on mesh axes {set(axes)}, with the dist's "
                  "placements on the other axes", when=when) for axes in axis_sets(m)]


def _t(name: str, args: tuple[str, ...], meaning: str, when: str = "") -> Table:
    return Table(name, "datatype", args, "T", meaning, when=when)


def _fn(name: str, args: tuple[str, ...], meaning: str, merge: str = "no-merge", when: str = "") -> Table:
    return Table(name, "function", args, "i64", meaning, merge, when)


def _rel(name: str, args: tuple[str, ...], meaning: str, when: str = "") -> Table:
    return Table(name, "relation", args, "", meaning, when=when)


#: the implementations of a value (sort ``T``); ``InAt`` and ``Loc``..``Loc5``, ``MMT``,
#: ``Expand``, ``LocAt`` run a Fusion op (``OP_CTORS``), the others reshard or transfer
IMPLEMENTATIONS: tuple[Table, ...] = (
    _t("InAt", ("String", "Dist"), "the program input named by the string, fed at the dist"),
    _t("Loc", ("i64", "T"), "Fusion op k run on the local tensors of its operand's class"),
    _t("Loc2", ("i64", "T", "T"), "binary Fusion op k (elementwise, matmul, lookup) run on its operands' local "
       "tensors"),
    _t("MMT", ("i64", "T", "T", "i64"), "matmul op k reading operand(s) through a transposed view, no permute copy "
       "(side 1 lhs, 2 rhs, 3 both: ``alias``)"),
    _t("AllGather", ("T", "i64"), "all-gather of the class on mesh axis a: S(x) -> R"),
    _t("LocalSlice", ("T", "i64", "P"), "each device keeps its block of the class on mesh axis a: R -> S(y), "
       "no communication"),
    _t("AllReduce", ("T", "i64"), "all-reduce of the class on mesh axis a: P(o) -> R"),
    _t("ReduceScatter", ("T", "i64", "P"), "reduce-scatter of the class on mesh axis a: P(o) -> S(y)"),
    _t("AllToAll", ("T", "i64", "P"), "all-to-all of the class on mesh axis a: S(x) -> S(y)"),
    _t("MakePartial", ("T", "i64", "P"), "the class made Partial on mesh axis a locally: R or S(x) -> P(o), "
       "no communication"),
    _t("SendRecv", ("i64", "T"), "transfer op k by parallel send/recv: source device i sends its local tensor to "
       "target device i (``crossmesh``)", "transfers"),
    _t("Bcast", ("i64", "T", "i64"), "transfer op k by a broadcast of the replicated value from source device i",
       "transfers"),
    _t("Scatter", ("i64", "T", "i64", "Dist"), "transfer op k by a scatter from source device i, each target "
       "device receiving its piece at the dist", "transfers"),
    _t("Expand", ("i64", "T", "Dist"), "broadcast op k run on a local tensor into its block of a result sharded "
       "on expanded dims at the dist (``expand``)", "expands"),
    _t("LocAt", ("i64", "T", "T", "Dist"), "scatter op k writing, from local tensors, the rows of its result block "
       "at the dist (the masked local scatter, ``lookup``)", "lookups"),
    *(_t(f"Loc{n}", ("i64", *["T"] * n), f"a fused op k of {n} operands (attention, its gradient, the fused linear "
         "loss: ``attention``) run on its operands' local tensors", "attention") for n in ATTENTION_ARITIES if n > 2),
)
#: implementation constructor -> its argument sorts
T_CONSTRUCTORS: dict[str, tuple[str, ...]] = {t.name: t.args for t in IMPLEMENTATIONS}
#: constructors that run Fusion op ``args[0]`` on local tensors
OP_CTORS = ("Loc", "Loc2", "MMT", "Expand", "LocAt", "Loc3", "Loc4", "Loc5")
#: the resharding constructors that move no data between devices, as plans name them
LOCAL_RESHARDS = {"LocalSlice": "local slice", "MakePartial": "local partial"}


@functools.lru_cache(maxsize=None)
def tables(mesh_ndim: int) -> tuple[Table, ...]:
    """Every table of an e-graph on a mesh of ``mesh_ndim`` axes, in declaration order."""
    m = mesh_ndim
    ids = (
        Table("Root", "datatype", ("i64", "i64", "i64"), "ID", "dim d of index space s (a tensor id, or a matmul's "
              "contraction space) of extent n: Root(s, d, n)"),
        Table("Outer", "datatype", ("ID", "i64"), "ID", "the block of x split into p blocks: x div (e(x) / p)"),
        Table("Inner", "datatype", ("ID", "i64"), "ID", "the position within x's p-way blocks: x mod (e(x) / p)"),
        Table("Merge", "datatype", ("ID", "ID"), "ID", "the flattened index of x and y: x * e(y) + y"),
        Table("Tr", "datatype", ("ID", "i64"), "ID", "index x carried through an op's index map c (facts on roots "
              "define it)"),
        Table("Red", "datatype", (), "ID", "the image of an index an op reduces away"),
        _fn("ext", ("ID",), "the extent e(x) of an index (known for indices built from roots)"),
        _rel("red", ("ID",), "indices an op reduces away (Red, its splits, merges of two)"),
        _rel("rect", ("ID",), "indices whose values on one device form a product of per-dim sets (one dim, or a "
             "merge of two dims)"),
        _fn("rootof", ("ID",), "the one tensor dim an index reads (none for an index of several dims)", "min"),
    )
    placements = (
        Table("Rep", "datatype", (), "P", "replicated: every device of the axis holds the whole value"),
        Table("Part", "datatype", ("String",), "P", "partial: the value is the reduction with op o (\"sum\", "
              "\"max\") of the devices' tensors"),
        Table("Bind", "datatype", ("ID",), "P", "sharded: the device's coordinate on the axis is the index x"),
        Table("D", "datatype", ("P",) * m, "Dist", "a distribution: one placement per mesh axis"),
        Table("TrP", "function", ("P", "i64"), "P", "placement p seen through an op's index map c", "old"),
        Table("TrD", "function", ("Dist", "i64"), "Dist", "dist d seen through an op's index map c (TrP per axis)",
              "old"),
        Table("MMP", "function", ("P", "P", "i64"), "P", "matmul op k's result placement on one axis from its "
              "operands'", "old"),
        Table("MMD", "function", ("Dist", "Dist", "i64"), "Dist", "matmul op k's result dist from its operands' "
              "(MMP per axis)", "old"),
        _rel("mmpw", ("P", "P", "i64"), "a rule asks for MMP(pa, pb, k): matmul op k's axis strategy "
             "(``propagation``)"),
        _rel("mmdw", ("Dist", "Dist", "i64"), "a rule asks for MMD(da, db, k): matmul op k's result dist "
             "(``propagation``)"),
        _rel("trpw", ("P", "i64"), "a rule asks for TrP(p, c): the placement transported (``placements``)"),
        _rel("trdw", ("Dist", "i64"), "a rule asks for TrD(d, c): the dist transported (``placements``)"),
        _fn("fac", ("P",), "how many pieces a placement splits the value into on its axis (1: Rep, Part)"),
        _fn("pdim", ("P",), "the one dim of the value a placement reads (-1: none)", "min"),
        _rel("okP", ("P",), "well-formed placements: Rep, Part, Bind of a rectangular index with an extent"),
        _rel("okD", ("Dist",), "dists whose every placement is well-formed"),
        _fn("shards", ("Dist",), "how many blocks a dist splits its value into: the product of its factors"),
    )
    terms = (
        *IMPLEMENTATIONS,
        Table("real", "constructor", ("i64", "Dist"), "T", "the class of Fusion value v at dist d (names the class; "
              "never extracted)"),
        Table("Seam", "constructor", ("i64",), "T", "a value fed from an earlier saturation segment: that "
              "segment's class key (``search.segments``)"),
    )
    facts = (
        _rel("cand", ("i64", "Dist"), "dists value v may be resharded to (``encode.candidates``, and rules' "
             "additions)"),
        _rel("made", ("i64",), "value v is computed by an op of this e-graph (not fed complete from an earlier "
             "segment): it gets resharding candidates and steps here"),
        _rel("parton", ("i64", "i64", "String"), "value v is realized at some dist with Part(o) on mesh axis a"),
        _rel("cdim", ("i64", "i64", "i64"), "value v's dim j has extent e (``candidates``)"),
        _rel("axdim", ("i64", "i64"), "mesh axis a may split dim j of a value into a candidate (every dim, but "
             "only the leading one on a data axis: ``encode.data_axes``)"),
        _rel("cpl", ("i64", "i64", "P", "i64"), "value v may hold placement p on mesh axis a, p splitting dim j "
             "(Replicate: j = -1 - a; ``candidates``)"),
        _rel("nestable", ("i64", "i64"), "dims of value v a dist may split along two mesh axes (``nesting``)"),
        _rel("rootmap", ("i64",) * 7, "index map c carries dim d (extent n) of value s to dim d2 (extent n2) of "
             "index space t: Tr(Root(s, d, n), c) = Root(t, d2, n2) (``rules.loading``)"),
        _rel("seamv", ("i64", "i64"), "value v is fed as the producer's class k (``rules.loading``)"),
        _rel("seamrep", ("i64", "i64"), "fed class k holds Rep on mesh axis a"),
        _rel("seampart", ("i64", "i64", "String"), "fed class k holds Part(o) on mesh axis a"),
        _rel("seamroot", ("i64",) * 5, "fed class k holds Bind(Root(v, j, e)) on mesh axis a"),
        _rel("seamouter", ("i64",) * 6, "fed class k holds Bind(Outer(Root(v, j, e), n)) on mesh axis a"),
        Table("seamp", "function", ("i64", "i64"), "P", "fed class k's placement term on mesh axis a", "no-merge"),
        _rel("keeps", ("i64", "String"), "index map c is linear for reduce op o: Part(o) passes through it"),
        _rel("redop", ("i64", "String"), "index map c reduces the indices it drops with op o"),
        _rel("unop", ("i64",) * 4, "unary op k: operand u, result o, index map c"),
        _rel("binop", ("i64",) * 6, "binary elementwise op k: operands a, b, result o, their index maps ca, cb"),
        _rel("mm", ("i64",) * 4, "matmul op k: operands a, b, result o"),
        _rel("mmcodes", ("i64",) * 7, "matmul op k's six index maps: operands into the result, into the "
             "contraction, the dims a shard may keep while the other operand is whole"),
        _rel("mmss", ("P", "P", "i64", "ID", "ID", "ID", "ID"), "matmul op k's S x S operand placements pa, pb: "
             "their indices carried into the result and into the contraction"),
        _rel("rpl", ("i64", "i64", "P"), "value v is realized at some dist with placement p on mesh axis a"),
        *[_rel(f"{RESTATING[0]}{a}", ("i64",) + ("P",) * m + ("T",), f"value v is realized (class t) at a dist "
               f"with placement p on mesh axis {a}, the other axes' placements before it (``resharding``)")
          for a in range(m) if m > 1],
        *[_rel(f"{RESTATING[1]}{a}", ("i64",) + ("P",) * m, f"value v has a candidate dist with placement p on mesh "
               f"axis {a}, the other axes' placements before it (``resharding``)") for a in range(m) if m > 1],
        _rel("binlhs", ("i64", "Dist", "T"), "binary op k's lhs is realized (term t) at a dist that transports to "
             "the valid dist od"),
        _rel("mmok", ("P", "P", "i64"), "matmul op k's axis strategy for operand placements pa, pb resolves to a "
             "placement"),
        _rel("redist", ("i64", "i64", "i64", "Dist", "Dist"), "redistribute op k: u to o at the requested dist "
             "(over u's roots, over o's)"),
        _rel("tview", ("i64",), "permute op k swaps the last two dims: a matmul may read its result as a "
             "transposed view"),
        _fn("axsize", ("i64",), "the size of mesh axis a"),
        _fn("nbytes", ("i64",), "the global bytes of value v"),
        _fn("lb", ("i64", "Dist"), "the local bytes per device of value v at dist d: nbytes / shards"),
        _fn("kf", ("P", "P"), "a matmul's contraction split factor on one axis, by lhs and result placement", "max"),
        _rel("mmaxis", ("P", "P"), "the (lhs, result) placement pairs of matmul strategies on one axis (for kf)"),
        _rel("viewop", ("i64",), "op k costs 0 (a view)"),
        _rel("memop", ("i64",), "op k is memory-bound (priced by the bytes it reads and writes)"),
        _fn("mmK", ("i64",), "matmul op k's contraction extent"),
        _fn("mmitem", ("i64",), "matmul op k's element size in bytes"),
        _fn("mmpeak", ("i64",), "matmul op k's peak rate in MFLOP/s"),
    )
    transfers = (
        _rel("xfer", ("i64",) * 4, "transfer op k moves value u (source mesh) to o (target mesh) through index "
             "map c", "transfers"),
        _rel("xsrc", ("i64", "i64"), "device indices of transfer op k's source mesh", "transfers"),
        _fn("xdev", ("i64",), "how many devices transfer op k's target mesh has", when="transfers"),
        _rel("nopart", ("P",), "placements that are not Partial", "transfers"),
    )
    lookups = (
        Table("LkP", "constructor", ("P", "P", "i64"), "P", "lookup op k's result placement on one axis from its "
              "table's and indices' (pending)", when="lookups"),
        Table("LkD", "constructor", ("Dist", "Dist", "i64"), "Dist", "lookup op k's result dist from its operands' "
              "(LkP per axis)", when="lookups"),
        _rel("lookup", ("i64",) * 4, "lookup op k: table (or a scatter's g), indices, result", "lookups"),
        _rel("lkcodes", ("i64",) * 7, "lookup op k's six index maps (``ir.ops.lookup``)", "lookups"),
        _rel("lkgather", ("i64",), "lookup op k is a gather (priced by cost-lookup)", "lookups"),
        _rel("lkcontract", ("i64",) * 3, "scatter op k's maps of g's and the indices' token dims into its "
             "contraction space", "lookups"),
        _rel("lkss", ("P", "ID", "ID"), "a lookup S x S placement's operand indices carried into the result",
             "lookups"),
        _rel("lkcss", ("P", "ID", "ID"), "a scatter S x S placement's operand indices carried into its "
             "contraction space", "lookups"),
        _rel("scatdim", ("i64", "i64"), "dim d of scatter result o is the scattered dim V", "lookups"),
        *_targets("rowsto", m, "scattered dim V (the masked local scatter's targets)", "lookups"),
    )
    expands = (
        _rel("expdim", ("i64", "i64"), "dim d of result o is expanded by a broadcast", "expands"),
        *_targets("expto", m, "expanded dims (the local expansion's targets)", "expands"),
    )
    remat = (
        _rel("twin", ("i64",) * 3, "value vs is saved(v), c the saved op's index map", "remat"),
        _rel("keep", ("i64",), "op k starts the backward pass: its operand class is kept across it", "remat"),
        _fn("kept", ("i64", "T"), "bytes per rank op k's operand class t holds when kept", "min", "remat"),
        _fn("keepw", ("i64",), "saved op k's keep moves w times its bytes (2: its value would otherwise "
            "stay in registers, written to be kept; 1: read only)", when="remat"),
        _rel("pwop", ("i64",), "op k is fused into its reader: recomputed inside the kernel that reads it", "remat"),
        _rel("fusedtwin", ("i64",), "saved value vs is read only by kernels that fuse their operands", "remat"),
    )
    attention = tuple(
        _rel(f"attn{n}", ("i64",) * (2 + n) + ("Dist",) * (1 + n) + ("i64",) * 3, f"a local strategy of fused op "
             f"k of {n} operands: result o, the operands, the result's and operands' dists, the local step's "
             "flops, extra bytes and kernels", "attention") for n in ATTENTION_ARITIES) + (
        _fn("atpeak", ("i64",), "fused op k's peak rate in MFLOP/s", when="attention"),)
    costs = tuple(_fn(f"cost_{t.name}", t.args, f"the time of a {t.name} node in ps: the least its cost rules give",
                      "min", t.when) for t in IMPLEMENTATIONS if t.name != "InAt")
    return ids + placements + terms + facts + transfers + lookups + expands + remat + attention + costs


#: tables keyed by T classes (their argument sorts) whose outputs are plain values: merged
#: snapshots (``search.segments``) find their classes like a constructor's
T_KEYED = {t.name: t.args for t in tables(1) if t.kind == "function" and "T" in t.args
           and not t.name.startswith("cost_")}


def declared(mesh_ndim: int, **flags: bool) -> list[Table]:
    """The tables of an e-graph on ``mesh_ndim`` axes with the optional families ``flags``
    (``FLAGS``) turned on."""
    unknown = set(flags) - set(FLAGS)
    if unknown:
        raise ValueError(f"schema: unknown flags {sorted(unknown)}; known: {FLAGS}")
    return [t for t in tables(mesh_ndim) if not t.when or flags.get(t.when, False)]


def schema(mesh_ndim: int, transfers: bool = False, lookups: bool = False, expands: bool = False,
           remat: bool = False, attention: bool = False) -> str:
    """egglog declarations for a mesh of ``mesh_ndim`` axes: the rulesets, then ``declared``'s
    tables (``transfers``: the cross-mesh transfers, ``crossmesh``; ``lookups``: the lookup
    strategies, ``lookup``; ``expands``: the local expansion, ``expand``; ``remat``: the
    recompute family and the kept bytes, ``remat``; ``attention``: the fused ops, ``attention``)."""
    decls = declared(mesh_ndim, transfers=transfers, lookups=lookups, expands=expands, remat=remat,
                     attention=attention)
    return "\n" + "".join(f"(ruleset {r})" for r in RULESETS) + "\n" + "\n".join(render(decls)) + "\n"
