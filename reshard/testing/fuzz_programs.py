"""Random valid Fusions for differential fuzzing (``fusions()``), and the regressions it found.

``fusions()`` is a hypothesis strategy.  It builds a Fusion op by op through a recorder that
also writes the equivalent builder code (``fusion_source(f)``), so a failing example can be
pasted into ``REGRESSIONS`` as an explicit program.  Everything is float64 (casts go through
float32 and back; a lookup's indices are int64 inputs, flag ``lookup``) and magnitudes are kept
tame (exp/div/sqrt/rsqrt get bounded operands, attention a bounded q), so comparisons with the
reference interpreter can use tight tolerances.  A select's condition compares a pool tensor
with a fresh input only: two computations of one value may differ in the last bits (a sum in
another order), and a condition comparing them would flip with the plan, not with a bug.

Uneven shardings (flag ``uneven``): a ``Shard`` placement on a dim that the mesh axes sharding it
do not divide (DTensor's torch.chunk pieces; ``reshard.passes.padding`` pads them inside the plan)
is kept in about one draw of three where it arises, and inputs take odd extents (``UNEVEN_EXTENTS``)
now and then, so a good fraction of programs shard some dim unevenly (``is_uneven``); on 2-D
meshes some of them are nested (flag ``nested_uneven``: two axes on one dim, DTensor's chunks
of chunks with padding between pieces, 5 rows on 2x2; ``is_nested_uneven``).
``random_inputs`` plants NaN/inf in some examples (``special_values``).

``FLAGS`` switches generator features on and off; a feature that triggers a known bug can be
turned off to fuzz past it (``RESHARD_FUZZ_FLAGS="-nonblock_reshape,+partial_max"`` overrides them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from functools import lru_cache

import torch
from hypothesis import strategies as st

import reshard as rs
from reshard import DeviceMesh, Partial, Replicate, Shard, TensorSharding
from reshard.ir import Inner, Merge, Outer, Root
from reshard.rules.transport import reshape_map
from reshard.ir.fusion import DTYPES
from reshard.ir.ids import evaluate
from reshard.ir.ops.attention import mask_of

# ---- configuration ------------------------------------------------------------------------
#: Generator features.  A bug class is excluded by turning its flag off (see REGRESSIONS).
FLAGS: dict[str, bool] = {
    "mesh2d": True,          # 2x2 and 2x3 meshes
    "mesh8": True,           # a 1-D mesh of 8 (rarely)
    "partial_inputs": True,  # Partial("sum") input placements
    "partial_max": False,    # Partial("max") input placements (outside the brief; off by default)
    "partial_outputs": True,  # (rare) Partial required output placements
    "open_inputs": True,     # inputs whose sharding is left to the optimizer
    "loop_ids": True,        # loop-domain shardings (Outer/Inner/Merge IDs) on inputs/outputs/redistributes
    "redistribute": True,
    "reshape": True,
    # Bug class REGRESSIONS[0] (reshape_split_of_shard): a reshape that maps some sharding the
    # optimizer may give its operand to a non-rectangular element set.  Off = only emit reshapes that
    # keep blocks for every such sharding (``_Gen.parts`` follows them forward).
    "nonblock_reshape": True,
    "permute": True,
    "slice": True,
    "pad": True,
    "cat": True,
    "reduce": True,
    "reduce_max": True,
    # Bug class REGRESSIONS[1] (reduce_of_merged_dim_diverges): reducing a dim that a reshape made
    # by merging dims (with a sibling reduce) made saturation diverge.  Off = never reduce such a
    # dim.
    "reduce_merged_dims": True,
    "matmul": True,
    "batched_matmul": True,
    "binary": True,
    "cast": True,
    "broadcast": True,
    "cross_mesh": True,      # a transfer to a mesh of the same shape on other devices (then ops continue there)
    "uneven": True,          # Shard placements on dims their mesh axes do not divide (DTensor's chunks)
    "nested_uneven": True,   # ... by several mesh axes whose nested chunks leave padding between pieces
    "lookup": True,          # embedding / pick at int64 indices inputs (values in range)
    "attention": True,       # fused attention (GQA, additive masks)
    "scan": True,            # cumsum and flip along a dim (the dim gathered; Partial kept)
    "select": True,          # where(a > b, x, y): a compared with a fresh input (no ties)
    "linear_loss": True,     # the fused linear cross entropy's ops (linear_max / _sumexp / _sumexp_grad)
    "zero_dim": True,        # 0-dim values: 0-dim inputs (Replicate / Partial) and full reductions, broadcast back
}


def _apply_env_flags() -> None:
    spec = os.environ.get("RESHARD_FUZZ_FLAGS", "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        on = not item.startswith("-")
        name = item.lstrip("+-")
        if name not in FLAGS:
            raise ValueError(f"RESHARD_FUZZ_FLAGS: unknown flag {name!r}; known: {sorted(FLAGS)}")
        FLAGS[name] = on


_apply_env_flags()

MESHES: dict[str, DeviceMesh] = {
    "M2": DeviceMesh([0, 1], ("x",)),
    "M3": DeviceMesh([0, 1, 2], ("x",)),
    "M4": DeviceMesh([0, 1, 2, 3], ("x",)),
    "M8": DeviceMesh(list(range(8)), ("x",)),
    "M2x2": DeviceMesh([[0, 1], [2, 3]], ("x", "y")),
    "M2x3": DeviceMesh([[0, 1, 2], [3, 4, 5]], ("x", "y")),
}
M2, M3, M4, M8, M2x2, M2x3 = (MESHES[k] for k in ("M2", "M3", "M4", "M8", "M2x2", "M2x3"))
#: for cross-mesh transfers: the same shape on the next devices ("M2" [0, 1] -> "M2b" [2, 3])
OTHER: dict[str, str] = {}
for _k, _m in list(MESHES.items()):
    _n = len(_m.ranks)
    _nested = torch.arange(_n, 2 * _n).reshape(_m.shape).tolist()
    MESHES[_k + "b"] = DeviceMesh(_nested, _m.axis_names)
    OTHER[_k], OTHER[_k + "b"] = _k + "b", _k
EXTENTS = (1, 2, 3, 4, 6, 8, 12)
#: input extents that few mesh axes divide (drawn now and then with the ``uneven`` flag)
UNEVEN_EXTENTS = (5, 7)
MAX_EXTENT = 24
MAX_INPUTS = 6
DT = "float64"


# ---- code printing --------------------------------------------------------------------------
def _mesh_name(mesh: DeviceMesh) -> str:
    for k, m in MESHES.items():
        if m == mesh:
            return k
    return repr(mesh)


def _id_code(x) -> str:
    if isinstance(x, Root):
        return f"Root({x.dim}, {x.extent})"
    if isinstance(x, Outer):
        return f"Outer({_id_code(x.x)}, {x.parts})"
    if isinstance(x, Inner):
        return f"Inner({_id_code(x.x)}, {x.parts})"
    return f"Merge({_id_code(x.x)}, {_id_code(x.y)})"


def _axis_code(p) -> str:
    if isinstance(p, Replicate):
        return "Replicate()"
    if isinstance(p, Partial):
        return f"Partial({p.op!r})"
    if isinstance(p, Shard):
        return f"Shard({p.dim})"
    return _id_code(p)


def spec_code(spec) -> str:
    if spec is None:
        return "None"
    if isinstance(spec, TensorSharding):
        axes = ", ".join(_axis_code(p) for p in spec.axes)
        return f"TensorSharding({_mesh_name(spec.mesh)}, {tuple(spec.shape)}, ({axes},))"
    return "[" + ", ".join(_axis_code(p) for p in spec) + "]"


def fusion_source(f: rs.Fusion) -> str:
    """Builder code of a Fusion made by ``fusions()`` (a function body returning ``f``)."""
    lines = getattr(f, "_fuzz_lines", None)
    if lines is None:
        return repr(f)
    return "\n".join(["f = rs.Fusion()"] + lines + ["return f"])


# ---- shardings ------------------------------------------------------------------------------
def _divisors(e: int) -> list[int]:
    return [a for a in range(1, e + 1) if e % a == 0]


def id_candidates(shape: tuple[int, ...], n: int) -> list:
    """IterDomains of extent ``n`` over ``shape``'s dims: block and cyclic splits, inner
    factors of a dim (as after a reshape), merges of two dims."""
    out = []
    for d, e in enumerate(shape):
        r = Root(d, e)
        if e % n:
            continue
        out.append(Outer(r, n))
        if e > n:
            out.append(Inner(r, e // n))  # cyclic
        for a in _divisors(e):
            if 1 < a < e and (e // a) % n == 0 and e // a != n:
                out.append(Outer(Inner(r, a), n))  # block split of an inner factor
            if 1 < a < e and a % n == 0 and a != n:
                out.append(Inner(Outer(r, a), a // n))
    for d1 in range(len(shape)):
        for d2 in range(len(shape)):
            if d1 == d2:
                continue
            e1, e2 = shape[d1], shape[d2]
            if e1 == 1 or e2 == 1:
                continue
            m = Merge(Root(d1, e1), Root(d2, e2))
            if (e1 * e2) % n == 0 and e1 * e2 > n:
                out.append(Outer(m, n))
                out.append(Inner(m, e1 * e2 // n))
            for n1 in _divisors(n):
                n2 = n // n1
                if 1 < n1 < n and e1 % n1 == 0 and e2 % n2 == 0:
                    out.append(Merge(Outer(Root(d1, e1), n1), Outer(Root(d2, e2), n2)))
    return out


@st.composite
def shardings(draw, shape: tuple[int, ...], mesh: DeviceMesh, *, allow_partial: bool, allow_open: bool = False,
              partial_weight: int = 2):
    """A valid sharding spec for ``shape`` on ``mesh``: None (open), DTensor placements, or a
    loop-domain TensorSharding.  Falls back to all-Replicate when a draw is invalid."""
    if allow_open and FLAGS["open_inputs"] and draw(st.integers(0, 5)) == 0:
        return None
    use_ids = FLAGS["loop_ids"] and draw(st.integers(0, 4)) == 0
    for _ in range(4):
        axes = []
        for a, n in enumerate(mesh.shape):
            kinds = ["R"] * 2 + (["S"] * 4 if shape else [])  # a 0-dim value: R or P only
            if allow_partial:
                kinds += ["P"] * partial_weight
            if use_ids:
                kinds += ["ID"] * 4
            k = draw(st.sampled_from(kinds))
            if k == "R":
                axes.append(Replicate())
            elif k == "P":
                op = "max" if FLAGS["partial_max"] and draw(st.integers(0, 3)) == 0 else "sum"
                axes.append(Partial(op))
            elif k == "S":
                axes.append(Shard(draw(st.integers(0, len(shape) - 1))))
            else:
                cands = id_candidates(shape, n)
                axes.append(draw(st.sampled_from(cands)) if cands else Replicate())
        ops = {p.op for p in axes if isinstance(p, Partial)}
        if len(ops) > 1:
            continue
        try:
            if any(not isinstance(p, (Replicate, Partial, Shard)) for p in axes):
                ts = TensorSharding.from_placements(shape, [Replicate()] * mesh.ndim, mesh)
                conv = []
                for a, p in enumerate(axes):
                    if isinstance(p, Shard):
                        conv.append(Outer(Root(p.dim, shape[p.dim]), mesh.shape[a]))
                    else:
                        conv.append(p)
                ts = TensorSharding(mesh, tuple(shape), tuple(conv))
                return ts
            ts = TensorSharding.from_placements(shape, axes, mesh)
            if _nested(ts):  # rarer: kept whenever it arises
                if not (FLAGS["uneven"] and FLAGS["nested_uneven"]):
                    continue
            elif ts.true_shape is not None and not (FLAGS["uneven"] and draw(st.integers(0, 2)) == 0):
                continue
            return axes
        except rs.ReshardError:
            continue
    return [Replicate()] * mesh.ndim


# ---- the recorder ---------------------------------------------------------------------------
class _Gen:
    def __init__(self, mesh: DeviceMesh) -> None:
        self.f = rs.Fusion()
        self.mesh = mesh
        self.lines: list[str] = []
        self.var: dict[int, str] = {}
        self.pool: list = []
        self.bounded: set[int] = set()  # tensor ids with |values| <= 1
        self.partial: set[int] = set()  # tensor ids some plan may hold as Partial("sum")
        self.merged: dict[int, tuple[bool, ...]] = {}  # per dim: made by a reshape merging dims
        #: per tensor: values of the IDs some candidate dist may bind (simple shardings of it and of
        #: its producers, carried through the ops' index maps like the optimizer's transport)
        self.parts: dict[int, list[torch.Tensor]] = {}
        self.n_inputs = 0
        self.transfers = 0

    def emit(self, code: str, fn: Callable[[], object], bounded: bool = False):
        t = fn()
        name = f"t{t.id}"
        self.var[t.id] = name
        self.lines.append(f"{name} = {code}")
        if t.dtype == DT:  # the float32 half of a cast round trip is not an operand
            self.pool.append(t)
        if bounded:
            self.bounded.add(t.id)
        op = self.f.ops[self.f.producer[t.id]]
        if self._partial_capable(op, t):
            self.partial.add(t.id)
        self.merged[t.id] = self._merged_dims(op, t)
        self.parts[t.id] = self._partitions(op, t)
        return t

    def _partitions(self, op, t) -> list[torch.Tensor]:
        k, a = op.kind, op.attrs
        ins = [self.f.tensors[i] for i in op.inputs]
        P = [self.parts.get(i.id, []) for i in ins]

        def const_along(v: torch.Tensor, dims) -> bool:
            return all(bool((v == v.narrow(d, 0, 1)).all()) for d in dims)

        out: list[torch.Tensor] = list(_own_partitions(t.shape, self.mesh.shape))
        if k == "input":
            out += _spec_partitions(t.sharding, t.shape, self.mesh)
        elif k in ("unary", "scale", "cast", "set"):
            out += P[0]
        elif k == "redistribute":
            out += P[0] + _spec_partitions(a["sharding"], t.shape, self.mesh)
        elif k == "binary":
            out += P[0] + P[1]
        elif k == "broadcast":
            view = [1] * len(t.shape)
            for i, d in enumerate(a["dims"]):
                view[d] = ins[0].shape[i]
            out += [v.reshape(view).expand(t.shape).contiguous() for v in P[0]]
        elif k == "reshape":
            out += [v.reshape(t.shape) for v in P[0]]
        elif k == "permute":
            out += [v.permute(a["perm"]).contiguous() for v in P[0]]
        elif k in ("cumsum", "along"):  # (a partition constant along the dim scanned or flipped)
            out += [v for v in P[0] if const_along(v, [a["dim"]])]
        elif k in ("slice", "pad", "cat"):
            d = a["dim"]
            for v in P[0] + (P[1] if k == "cat" else []):
                if const_along(v, [d]):
                    out.append(v.narrow(d, 0, 1).expand(t.shape).contiguous())
        elif k == "reduce":
            for v in P[0]:
                if const_along(v, a["dims"]):
                    for d in sorted(a["dims"], reverse=True):
                        v = v.select(d, 0)
                    out.append(v.contiguous())
        elif k == "matmul":
            for v in P[0]:
                if const_along(v, [v.dim() - 1]):
                    out.append(v.narrow(-1, 0, 1).expand(t.shape).contiguous())
            for v in P[1]:
                if const_along(v, [v.dim() - 2]):
                    out.append(v.narrow(-2, 0, 1).expand(t.shape).contiguous())
        uniq: dict[bytes, torch.Tensor] = {}
        for v in out:
            uniq.setdefault(v.numpy().tobytes(), v)
        return list(uniq.values())[:256]

    def _merged_dims(self, op, t) -> tuple[bool, ...]:
        """Which dims of ``t`` are (descendants of) a reshape's merge of several dims."""
        k, a = op.kind, op.attrs
        ins = [self.f.tensors[i] for i in op.inputs]
        m = [self.merged.get(i.id, (False,) * len(i.shape)) for i in ins]
        if k == "input":
            return (False,) * len(t.shape)
        if k in ("unary", "scale", "cast", "set", "redistribute", "slice", "pad", "cumsum", "along"):
            return m[0]
        if k in ("binary", "cat"):
            return tuple(x or y for x, y in zip(m[0], m[1]))
        if k == "permute":
            return tuple(m[0][p] for p in a["perm"])
        if k == "broadcast":
            inv = {d: i for i, d in enumerate(a["dims"])}
            return tuple(m[0][inv[j]] if j in inv else False for j in range(len(t.shape)))
        if k == "reduce":
            return tuple(x for d, x in enumerate(m[0]) if d not in a["dims"])
        if k == "matmul":
            lb, rb = m[0][:-2], (m[1][:-2] if len(m[1]) > 2 else (False,) * len(m[0][:-2]))
            return tuple(x or y for x, y in zip(lb, rb)) + (m[0][-2], m[1][-1])
        if k == "reshape":
            out = [False] * len(t.shape)
            for d, img in enumerate(reshape_map(ins[0].shape, t.shape)):
                if img is None:
                    continue
                roots = _roots(img)
                group = [e for e, jmg in enumerate(reshape_map(ins[0].shape, t.shape))
                         if jmg is not None and _roots(jmg) & roots]
                merged = len(group) > 1 or m[0][d]
                for j in roots:
                    out[j] = out[j] or merged
            return tuple(out)
        return (False,) * len(t.shape)

    def _partial_capable(self, op, t) -> bool:
        """Heuristic: can ``t`` be Partial("sum") in some plan?  (Requiring a Partial output or
        redistributing to Partial is only drawn for such tensors, to keep "no plan" rare.)"""
        k, P = op.kind, self.partial
        ins = [self.f.tensors[i] for i in op.inputs]
        if k == "input":
            return t.sharding is not None and any(isinstance(p, Partial) and p.op == "sum" for p in t.sharding.axes)
        if k == "redistribute":
            return any(isinstance(p, Partial) for p in op.attrs["sharding"].axes)
        if k in ("reshape", "permute", "slice", "pad", "set", "scale", "broadcast", "cumsum"):
            return ins[0].id in P
        if k == "along":
            return op.attrs["fn"] == "flip" and ins[0].id in P
        if k == "unary":
            return op.attrs["fn"] == "neg" and ins[0].id in P
        if k == "binary":
            return op.attrs["fn"] in ("add", "sub") and all(i.id in P for i in ins)
        if k == "cat":
            return all(i.id in P for i in ins)
        if k == "reduce":
            return op.attrs["fn"] != "max" and (ins[0].id in P or any(
                ins[0].shape[d] % n == 0 for d in op.attrs["dims"] for n in self.mesh.shape))
        if k == "matmul":
            return any(i.id in P for i in ins) or any(ins[0].shape[-1] % n == 0 for n in self.mesh.shape)
        return False

    def v(self, t) -> str:
        return self.var[t.id]

    # -- builders (record code and call the Fusion builder) --
    def input(self, draw, shape: tuple[int, ...], dtype: str = DT):
        """A new input of ``shape`` at a drawn sharding (int64: a lookup's indices, never Partial,
        kept out of the pool)."""
        name = f"x{self.n_inputs}"
        self.n_inputs += 1
        spec = draw(shardings(shape, self.mesh, allow_partial=FLAGS["partial_inputs"] and dtype == DT,
                              allow_open=True))
        return self.emit(f'f.input({name!r}, {tuple(shape)}, {dtype!r}, {_mesh_name(self.mesh)}, {spec_code(spec)})',
                         lambda: self.f.input(name, shape, dtype, self.mesh, spec))

    def unary(self, fn: str, t):
        return self.emit(f"f.unary({fn!r}, {self.v(t)})", lambda: self.f.unary(fn, t),
                         bounded=fn in ("tanh", "sigmoid") or (t.id in self.bounded and fn in ("neg", "abs", "relu")))

    def binary(self, fn: str, a, b):
        bounded = fn in ("mul", "maximum") and a.id in self.bounded and b.id in self.bounded
        return self.emit(f"f.binary({fn!r}, {self.v(a)}, {self.v(b)})", lambda: self.f.binary(fn, a, b), bounded)

    def call(self, meth: str, t, *args, bounded: bool = False):
        code = f"f.{meth}({', '.join([self.v(t)] + [repr(a) for a in args])})"
        return self.emit(code, lambda: getattr(self.f, meth)(t, *args), bounded)


def _roots(x) -> set[int]:
    if isinstance(x, Root):
        return {x.dim}
    if isinstance(x, (Outer, Inner)):
        return _roots(x.x)
    return _roots(x.x) | _roots(x.y)


def _pick(draw, g: _Gen, pred: Callable = lambda t: True):
    """A pool tensor satisfying ``pred``, biased toward recent ones (deep chains)."""
    cands = [t for t in g.pool if pred(t)]
    if not cands:
        return None
    i = draw(st.integers(0, len(cands) - 1))
    if draw(st.booleans()):
        i = len(cands) - 1 - (i % min(3, len(cands)))
    return cands[i]


def _partner(draw, g: _Gen, shape: tuple[int, ...], exclude=None):
    """Another tensor of ``shape``: from the pool, or a new input."""
    same = [t for t in g.pool if t.shape == tuple(shape) and t is not exclude]
    if same and (g.n_inputs >= MAX_INPUTS or draw(st.integers(0, 2)) > 0):
        return draw(st.sampled_from(same))
    if g.n_inputs < MAX_INPUTS:
        return g.input(draw, tuple(shape))
    return exclude


def _bounded(g: _Gen, t):
    """``t`` squashed to [-1, 1] (tanh) unless it already is."""
    return t if t.id in g.bounded else g.unary("tanh", t)


# ---- ops ------------------------------------------------------------------------------------
def op_unary(draw, g):
    t = _pick(draw, g)
    fn = draw(st.sampled_from(["tanh", "tanh", "neg", "neg", "relu", "relu", "abs", "sigmoid", "silu", "gelu",
                               "exp", "sqrt", "rsqrt"]))
    if fn == "exp":
        return g.unary("exp", _bounded(g, t))
    if fn == "sqrt":
        return g.unary("sqrt", g.unary("abs", t))
    if fn == "rsqrt":
        return g.unary("rsqrt", g.unary("sigmoid", _bounded(g, t)))
    return g.unary(fn, t)


def op_scale(draw, g):
    t = _pick(draw, g)
    return g.call("scale", t, draw(st.sampled_from([-2.0, -1.0, 0.5, 2.0, 3.0])))


def op_set(draw, g):
    return g.call("set", _pick(draw, g))


def op_cast(draw, g):
    t = _pick(draw, g)
    return g.call("cast", g.call("cast", t, "float32"), DT, bounded=t.id in g.bounded)


def op_binary(draw, g):
    a = _pick(draw, g)
    b = _partner(draw, g, a.shape, exclude=a)
    fn = draw(st.sampled_from(["add", "add", "sub", "mul", "mul", "div", "maximum"]))
    if fn == "div":
        b = g.unary("sigmoid", _bounded(g, b))  # in (0.26, 0.74)
    if fn == "mul" and not (a.id in g.bounded or b.id in g.bounded):
        b = _bounded(g, b)
    return g.binary(fn, a, b)


def _factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    if k == 1:
        return [(n,)]
    return [(d,) + r for d in _divisors(n) for r in _factorizations(n // d, k - 1)]


def op_reshape(draw, g):
    t = _pick(draw, g)
    s = list(t.shape)
    mode = draw(st.sampled_from(["split", "split", "merge", "merge", "any", "unit"]))
    new = None
    if mode == "split":
        d = draw(st.integers(0, len(s) - 1))
        divs = [a for a in _divisors(s[d]) if 1 < a < s[d]]
        if divs and len(s) < 4:
            a = draw(st.sampled_from(divs))
            new = s[:d] + [a, s[d] // a] + s[d + 1:]
    elif mode == "merge" and len(s) >= 2:
        d = draw(st.integers(0, len(s) - 2))
        new = s[:d] + [s[d] * s[d + 1]] + s[d + 2:]
    elif mode == "unit":
        if 1 in s and len(s) > 1:
            d = s.index(1)
            new = s[:d] + s[d + 1:]
        elif len(s) < 4:
            d = draw(st.integers(0, len(s)))
            new = s[:d] + [1] + s[d:]
    if new is None:  # any factorization of the element count into 1-3 dims, extents <= MAX_EXTENT
        n = math.prod(s)
        opts = [f for k in (1, 2, 3) for f in _factorizations(n, k) if max(f) <= max(MAX_EXTENT, n if k == 1 else 0)]
        opts = [f for f in opts if list(f) != s] or [tuple(s)]
        new = list(draw(st.sampled_from(opts)))
    if not FLAGS["nonblock_reshape"] and not all(_is_block(v, tuple(new)) for v in g.parts[t.id]):
        return None
    return g.call("reshape", t, tuple(new), bounded=t.id in g.bounded)


def _is_block(vals: torch.Tensor, dst: tuple[int, ...]) -> bool:
    """Does every level set of ``vals`` (an ID's values in flat order) select a rectangular block of
    a tensor of shape ``dst``?"""
    flat = vals.reshape(-1)
    for c in flat.unique().tolist():
        pos = (flat == c).nonzero().flatten()
        coords = torch.stack(torch.unravel_index(pos, dst), 1) if len(dst) > 1 else pos[:, None]
        counts = [int(coords[:, j].unique().numel()) for j in range(len(dst))]
        if math.prod(counts) != pos.numel():
            return False
    return True


@lru_cache(maxsize=4096)
def _own_partitions(shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """Values (shaped ``shape``) of the IDs of the optimizer's simple candidate shardings."""
    from reshard.search.encode import replicated_subsets, simple_shardings
    mesh = next(m for m in MESHES.values() if m.shape == mesh_shape)
    ids = {p for ts in simple_shardings(shape, mesh) for sub in replicated_subsets(ts) for p in sub.axes
           if not isinstance(p, (Replicate, Partial))}
    return tuple(_id_values(x, shape) for x in ids)


def _id_values(x, shape: tuple[int, ...]) -> torch.Tensor:
    index = [torch.arange(e).view([e if j == d else 1 for j in range(len(shape))]) for d, e in enumerate(shape)]
    return evaluate(x, index).expand(shape).contiguous()


def _spec_partitions(spec, shape: tuple[int, ...], mesh: DeviceMesh) -> list[torch.Tensor]:
    if spec is None:
        return []
    ts = spec if isinstance(spec, TensorSharding) else TensorSharding.from_placements(shape, spec, mesh)
    return [_id_values(p, shape) for p in ts.axes if not isinstance(p, (Replicate, Partial))]


def op_permute(draw, g):
    t = _pick(draw, g, lambda t: len(t.shape) >= 2)
    if t is None:
        return None
    perm = tuple(draw(st.permutations(range(len(t.shape)))))
    return g.call("permute", t, perm, bounded=t.id in g.bounded)


def op_slice(draw, g):
    t = _pick(draw, g, lambda t: max(t.shape) >= 2)
    if t is None:
        return None
    d = draw(st.sampled_from([i for i, e in enumerate(t.shape) if e >= 2]))
    e = t.shape[d]
    start = draw(st.integers(0, e - 1))
    stop = draw(st.integers(start + 1, e))
    return g.call("slice", t, d, start, stop, bounded=t.id in g.bounded)


def op_pad(draw, g):
    t = _pick(draw, g)
    d = draw(st.integers(0, len(t.shape) - 1))
    lo, hi = draw(st.integers(0, 2)), draw(st.integers(0, 3))
    if t.shape[d] + lo + hi > MAX_EXTENT:
        return None
    return g.call("pad", t, d, lo, hi, bounded=t.id in g.bounded)


def op_cat(draw, g):
    t = _pick(draw, g)
    d = draw(st.integers(0, len(t.shape) - 1))
    others = [u for u in g.pool if len(u.shape) == len(t.shape) and u is not t
              and all(a == b for i, (a, b) in enumerate(zip(u.shape, t.shape)) if i != d)]
    u = draw(st.sampled_from(others)) if others and draw(st.booleans()) else t
    if t.shape[d] + u.shape[d] > MAX_EXTENT:
        return None
    first, second = (t, u) if draw(st.booleans()) else (u, t)
    bounded = t.id in g.bounded and u.id in g.bounded
    return g.emit(f"f.cat([{g.v(first)}, {g.v(second)}], {d})", lambda: g.f.cat([first, second], d), bounded)


def op_reduce(draw, g):
    ok = (lambda t: [d for d in range(len(t.shape)) if FLAGS["reduce_merged_dims"] or not g.merged[t.id][d]])
    t = _pick(draw, g, lambda t: len(t.shape) >= 2 and ok(t))
    if t is None:
        return None
    k = len(t.shape)
    dims = sorted(draw(st.sets(st.sampled_from(ok(t)), min_size=1, max_size=min(k - 1, len(ok(t))))))
    fns = ["sum", "mean"] + (["max"] if FLAGS["reduce_max"] else [])
    fn = draw(st.sampled_from(fns))
    dd = dims[0] if len(dims) == 1 and draw(st.booleans()) else tuple(dims)
    return g.call(fn, t, dd, bounded=t.id in g.bounded and fn in ("mean", "max"))


def op_matmul(draw, g):
    a = _pick(draw, g, lambda t: len(t.shape) >= 2)
    if a is None:
        return None
    k = a.shape[-1]
    batched = FLAGS["batched_matmul"] and len(a.shape) >= 3 and draw(st.booleans())
    lead = a.shape[:-2] if batched else ()
    cands = [t for t in g.pool if len(t.shape) == len(lead) + 2 and t.shape[:-2] == lead and t.shape[-2] == k]
    if cands and (g.n_inputs >= MAX_INPUTS or draw(st.booleans())):
        b = draw(st.sampled_from(cands))
    elif g.n_inputs < MAX_INPUTS:
        n = draw(st.sampled_from(EXTENTS))
        b = g.input(draw, lead + (k, n))
    else:
        return None
    if a.id not in g.bounded and b.id not in g.bounded:
        b = _bounded(g, b)
    return g.emit(f"f.matmul({g.v(a)}, {g.v(b)})", lambda: g.f.matmul(a, b))


def op_broadcast(draw, g):
    """Insert 1-2 new dims (any position), sometimes expanding an extent-1 dim too."""
    t = _pick(draw, g, lambda t: len(t.shape) <= 3)
    if t is None:
        return None
    shape = list(t.shape)
    pos = list(range(len(shape)))  # result position of each operand dim
    for _ in range(draw(st.integers(1, 2))):
        if len(shape) >= 4:
            break
        at = draw(st.integers(0, len(shape)))
        shape.insert(at, draw(st.sampled_from(EXTENTS[1:5])))
        pos = [p + (p >= at) for p in pos]
    for p in pos:
        if shape[p] == 1 and draw(st.booleans()):
            shape[p] = draw(st.sampled_from(EXTENTS[1:5]))
    if math.prod(shape) > 4 * MAX_EXTENT * MAX_EXTENT:
        return None
    return g.call("broadcast", t, tuple(shape), tuple(pos), bounded=t.id in g.bounded)


def op_scalar(draw, g):
    """A 0-dim value, a new 0-dim input or a full reduction of a pool tensor, broadcast over a
    pool tensor and combined with it (``x * s``, ``x - mean(x)``).  0-dim values stay out of
    the pool (the other ops take at least one dim)."""
    t = _pick(draw, g)
    if g.n_inputs < MAX_INPUTS and draw(st.booleans()):
        s = g.input(draw, ())
    else:
        fn = draw(st.sampled_from(["sum", "mean"] + (["max"] if FLAGS["reduce_max"] else [])))
        s = g.call(fn, t, tuple(range(len(t.shape))), bounded=t.id in g.bounded and fn in ("mean", "max"))
    g.pool.remove(s)
    b = g.call("broadcast", s, t.shape, (), bounded=s.id in g.bounded)
    fn = draw(st.sampled_from(["add", "sub", "mul"]))
    if fn == "mul" and t.id not in g.bounded:
        b = _bounded(g, b)
    return g.binary(fn, t, b)


def op_lookup(draw, g):
    """A lookup at a new int64 indices input (``fuzz_programs.random_inputs`` draws its values in
    range): ``embedding`` of a 2-D pool tensor (the table) at ids of 1-2 dims, or ``pick`` of a
    pool tensor along its last dim at an index of its leading dims' shape."""
    if g.n_inputs >= MAX_INPUTS:
        return None
    if draw(st.booleans()):
        table = _pick(draw, g, lambda t: len(t.shape) == 2)
        if table is None:
            return None
        ids = g.input(draw, tuple(draw(st.sampled_from(EXTENTS[1:5])) for _ in range(draw(st.integers(1, 2)))),
                      "int64")
        return g.emit(f"f.embedding({g.v(table)}, {g.v(ids)})", lambda: g.f.embedding(table, ids),
                      table.id in g.bounded)
    x = _pick(draw, g, lambda t: len(t.shape) >= 2)
    if x is None:
        return None
    index = g.input(draw, x.shape[:-1], "int64")
    return g.emit(f"f.pick({g.v(x)}, {g.v(index)})", lambda: g.f.pick(x, index), x.id in g.bounded)


def op_attention(draw, g):
    """Fused ``attention``: q a pool tensor of 3-4 dims ``[*B, L, D]`` (squashed to [-1, 1]), k
    and v partners ``[*B', S, D]`` and ``[*B', S, Dv]`` (``B' = B``, or on 4 dims, in one in two,
    fewer heads at dim -3 dividing q's: GQA), and in one in three an additive mask input of the
    scores' shape, some dims of extent 1 (broadcast)."""
    q = _pick(draw, g, lambda t: len(t.shape) in (3, 4))
    if q is None:
        return None
    *lead, L, D = q.shape
    heads = list(lead)
    if len(lead) == 2 and draw(st.booleans()):
        heads[1] = draw(st.sampled_from(_divisors(lead[1])))
    S, Dv = draw(st.sampled_from(EXTENTS[1:5])), draw(st.sampled_from(EXTENTS[1:5]))
    k = _partner(draw, g, (*heads, S, D))
    v = _partner(draw, g, (*heads, S, Dv))
    if k is None or v is None:
        return None
    q = _bounded(g, q)
    mask = None
    if g.n_inputs < MAX_INPUTS and draw(st.integers(0, 2)) == 0:
        mask = g.input(draw, tuple(e if draw(st.booleans()) else 1 for e in (*lead, L, S)))
        g.pool.remove(mask)  # (no operand of another op: a mask is never trained, ``trained_inputs``)
    return g.emit(f"f.attention({g.v(q)}, {g.v(k)}, {g.v(v)}{'' if mask is None else ', ' + g.v(mask)})",
                  lambda: g.f.attention(q, k, v, mask))


def op_scan(draw, g):
    """``cumsum`` or ``flip`` of a pool tensor along one of its dims."""
    t = _pick(draw, g)
    d = draw(st.integers(0, len(t.shape) - 1))
    if draw(st.booleans()):
        return g.call("cumsum", t, d)
    return g.call("flip", t, d, bounded=t.id in g.bounded)


def op_select(draw, g):
    """``where(a > b, x, y)``: ``a`` a pool tensor, ``b`` a fresh input of its shape (never a
    value ``a`` may equal: module docstring), ``x`` a pool tensor of that shape and ``y`` a
    partner."""
    if g.n_inputs >= MAX_INPUTS:
        return None
    a = _pick(draw, g)
    b = g.input(draw, a.shape)
    g.pool.remove(b)
    c = g.binary("gt", a, b)
    x = _pick(draw, g, lambda t: t.shape == a.shape)
    y = _partner(draw, g, a.shape, exclude=x)
    return g.emit(f"f.where({g.v(c)}, {g.v(x)}, {g.v(y)})", lambda: g.f.where(c, x, y),
                  x.id in g.bounded and y.id in g.bounded)


def op_linear_loss(draw, g):
    """The fused linear cross entropy's row reductions (``ir.ops.linear_loss``): ``h [N, H]`` a
    pool tensor and ``w [V, H]`` a partner (both squashed to [-1, 1]), ``m = detach(linear_max(h,
    w))`` (as the cross entropy reads it), then ``log(linear_sumexp(h, w, m)) + m`` (the rows'
    logsumexp), or, in one in three, ``linear_sumexp_grad(h, w, m, r, wrt)`` at a partner ``r
    [N]`` (each ``wrt``; its operands detached: it has no gradient)."""
    h = _pick(draw, g, lambda t: len(t.shape) == 2)
    if h is None:
        return None
    w = _partner(draw, g, (draw(st.sampled_from(EXTENTS[1:5])), h.shape[1]))
    if w is None:
        return None
    h, w = _bounded(g, h), _bounded(g, w)
    top = g.emit(f"f.linear_max({g.v(h)}, {g.v(w)})", lambda: g.f.linear_max(h, w))
    g.pool.remove(top)  # (read through ``detach`` only: it has no gradient)
    m = g.call("detach", top)
    if draw(st.integers(0, 2)) == 0:
        r = _partner(draw, g, h.shape[:1])
        if r is None:
            return None
        wrt = draw(st.sampled_from(["input", "weight", "both"]))
        # (detached: the gradient op has no gradient of its own, and training steps take these)
        h, w, r = (g.call("detach", t, bounded=True) for t in (h, w, _bounded(g, r)))
        return g.emit(f"f.linear_sumexp_grad({g.v(h)}, {g.v(w)}, {g.v(m)}, {g.v(r)}, {wrt!r})",
                      lambda: g.f.linear_sumexp_grad(h, w, m, r, wrt))
    s = g.emit(f"f.linear_sumexp({g.v(h)}, {g.v(w)}, {g.v(m)})", lambda: g.f.linear_sumexp(h, w, m))
    return g.binary("add", g.unary("log", s), m)


def op_redistribute(draw, g):
    t = _pick(draw, g)
    spec = draw(shardings(t.shape, g.mesh, allow_partial=t.id in g.partial, partial_weight=1))
    return g.emit(f"f.redistribute({g.v(t)}, {spec_code(spec)})", lambda: g.f.redistribute(t, spec),
                  t.id in g.bounded)


def op_transfer(draw, g):
    """``redistribute(t, spec, mesh=other)``: the program continues on the other mesh (only
    its tensors are operands from here on), at most twice per program."""
    if g.transfers >= 2:
        return None
    t = _pick(draw, g)
    other = OTHER[_mesh_name(g.mesh)]
    mesh = MESHES[other]
    spec = draw(shardings(t.shape, mesh, allow_partial=t.id in g.partial, partial_weight=1))
    new = g.emit(f"f.redistribute({g.v(t)}, {spec_code(spec)}, mesh={other})",
                 lambda: g.f.redistribute(t, spec, mesh=mesh), t.id in g.bounded)
    g.mesh, g.pool, g.transfers = mesh, [new], g.transfers + 1
    return new


OPS: dict[str, tuple[Callable, int, str | None]] = {
    # name: (builder, weight, flag)
    "unary": (op_unary, 6, None),
    "scale": (op_scale, 1, None),
    "set": (op_set, 1, None),
    "cast": (op_cast, 1, "cast"),
    "binary": (op_binary, 5, "binary"),
    "reshape": (op_reshape, 5, "reshape"),
    "permute": (op_permute, 3, "permute"),
    "slice": (op_slice, 2, "slice"),
    "pad": (op_pad, 2, "pad"),
    "cat": (op_cat, 2, "cat"),
    "reduce": (op_reduce, 3, "reduce"),
    "matmul": (op_matmul, 4, "matmul"),
    "redistribute": (op_redistribute, 3, "redistribute"),
    "broadcast": (op_broadcast, 2, "broadcast"),
    "scalar": (op_scalar, 2, "zero_dim"),
    "transfer": (op_transfer, 1, "cross_mesh"),
    "lookup": (op_lookup, 2, "lookup"),
    "attention": (op_attention, 2, "attention"),
    "scan": (op_scan, 1, "scan"),
    "select": (op_select, 2, "select"),
    "linear_loss": (op_linear_loss, 1, "linear_loss"),
}


@st.composite
def meshes(draw):
    opts = ["M2"] * 4 + ["M3"] * 2 + ["M4"] * 3
    if FLAGS["mesh8"]:
        opts += ["M8"]
    if FLAGS["mesh2d"]:
        opts += ["M2x2"] * 4 + ["M2x3"] * 2
    return MESHES[draw(st.sampled_from(opts))]


@st.composite
def fusions(draw, min_ops: int = 3, max_ops: int = 30):
    """A random valid Fusion (see module docstring).  ``f._fuzz_lines`` holds its builder code."""
    mesh = draw(meshes())
    g = _Gen(mesh)
    extents = EXTENTS + (UNEVEN_EXTENTS if FLAGS["uneven"] and draw(st.integers(0, 3)) == 0 else ())
    ndim = draw(st.integers(1, 3))
    g.input(draw, tuple(draw(st.sampled_from(extents)) for _ in range(ndim)))
    if draw(st.booleans()):
        g.input(draw, tuple(draw(st.sampled_from(extents)) for _ in range(draw(st.integers(1, 3)))))
    n_ops = draw(st.integers(min_ops, max_ops))
    names = [k for k, (_, _, flag) in OPS.items() if flag is None or FLAGS[flag]]
    weighted = [k for k in names for _ in range(OPS[k][1])]
    built = 0
    tries = 0
    while built < n_ops and tries < 3 * n_ops:
        tries += 1
        kind = draw(st.sampled_from(weighted))
        try:
            t = OPS[kind][0](draw, g)
        except rs.ReshardError as e:  # the generator should only build valid programs
            raise AssertionError(f"generator built an invalid {kind}: {e}\n" + "\n".join(g.lines)) from e
        if t is not None:
            built += 1
    n_out = draw(st.integers(1, 3))
    non_inputs = [t for t in g.pool if t.id not in g.f.inputs] or g.pool
    used = {i for op in g.f.ops for i in op.inputs}
    sinks = [t for t in non_inputs[:-1] if t.id not in used]
    outs = [non_inputs[-1]]
    for _ in range(n_out - 1):
        r = draw(st.integers(0, 5))
        outs.append(draw(st.sampled_from(sinks if sinks and r > 1 else non_inputs if r else g.pool)))
    for t in outs:
        partial = FLAGS["partial_outputs"] and t.id in g.partial and draw(st.integers(0, 5)) == 0
        spec = draw(shardings(t.shape, t.mesh, allow_partial=partial, partial_weight=4 if partial else 0))
        g.lines.append(f"f.output({g.v(t)}, {spec_code(spec)})")
        g.f.output(t, spec)
    g.f._fuzz_lines = g.lines  # type: ignore[attr-defined]
    return g.f


def is_uneven(f: rs.Fusion) -> bool:
    """Does ``f`` request some uneven sharding (an input's, an output's, a redistribute's)?"""
    from reshard.passes.padding import requested
    return any(ts.true_shape is not None for ts in requested(f))


def _nested(ts: TensorSharding) -> bool:
    """Is some dim of ``ts`` laid out with padding between DTensor's pieces (``ir.uneven``)?"""
    return any(runs != ((0, ts.global_shape[d]),) for d, runs in ts.layouts.items())


def is_nested_uneven(f: rs.Fusion) -> bool:
    """Does ``f`` request some nested uneven sharding (``_nested``)?"""
    from reshard.passes.padding import requested
    return any(_nested(ts) for ts in requested(f))


def special_values(f: rs.Fusion, seed: int) -> tuple[float, ...]:
    """The non-finite values ``random_inputs`` plants for ``seed``: none for three seeds in four;
    else NaN, and ±inf too when ``f`` has no product (``mul``, ``matmul``, ``attention``).  Why no
    inf with products: a plan may hold a value as Partial summands (random ones for a Partial
    input, or the value and zeros after a local Replicate/Shard -> Partial), and a product of an inf with
    a zero or with summands of mixed signs is NaN where the reference's is ±inf -- IEEE
    arithmetic on a valid plan, not a planning error.  NaN has no such case (NaN absorbs), and
    sums, maxima, unary ops and division by the generator's bounded divisors keep inf."""
    if seed % 4:
        return ()
    products = any(op.kind in ("matmul", "attention") or (op.kind == "binary" and op.attrs["fn"] == "mul")
                   for op in f.ops)
    return (math.nan,) if products else (math.nan, math.inf, -math.inf)


def trained_inputs(f: rs.Fusion) -> list[str]:
    """The inputs a training step of ``f`` differentiates: the float ones but attention masks
    (an additive mask has no gradient, ``ir.ops.attention``)."""
    masks = {mask_of(op) for op in f.ops}
    return [f.tensors[i].name for i in f.inputs if f.tensors[i].dtype == DT and i not in masks]


#: where a lookup reads its indices (operand 1) in ``[0, V)``: V of the op (``ir.ops.lookup``)
_INDEXED_EXTENT = {"embedding": lambda op, ts: ts[0].shape[0], "pick": lambda op, ts: ts[0].shape[-1],
                   "embedding_grad": lambda op, ts: op.attrs["shape"][0],
                   "unpick": lambda op, ts: op.attrs["shape"][-1]}


def _preconditions(f: rs.Fusion) -> tuple[dict[int, int], set[int]]:
    """The inputs an op's precondition fixes: those read as a lookup's indices (input -> the
    smallest V of the lookups reading it: indices lie in ``[0, V)``), and those read as the
    mask of a causal ``attention`` (which must be the causal mask, ``attention``'s law)."""
    extent: dict[int, int] = {}
    causal: set[int] = set()
    inputs = set(f.inputs)
    for op in f.ops:
        ts = [f.tensors[t] for t in op.inputs]
        if op.kind in _INDEXED_EXTENT and op.inputs[1] in inputs:
            v = _INDEXED_EXTENT[op.kind](op, ts)
            extent[op.inputs[1]] = min(v, extent.get(op.inputs[1], v))
        if op.attrs.get("causal") and mask_of(op) in inputs:
            causal.add(mask_of(op))
    return extent, causal


def causal_mask(shape: tuple[int, ...], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The additive causal mask of ``shape`` ``[.., L, S]``: 0 where key ``s <= l``, -inf above."""
    L, S = shape[-2], shape[-1]
    above = torch.ones(L, S, dtype=torch.bool).triu(1)
    return torch.zeros(L, S, dtype=dtype).masked_fill(above, -math.inf).expand(shape).clone()


def random_inputs(f: rs.Fusion, seed: int) -> dict[str, torch.Tensor]:
    """Standard normal inputs in each input's dtype (drawn in float64); for some seeds
    (``special_values``) one element of every input is NaN, inf or -inf, at a random place.
    Inputs an op's precondition fixes (``_preconditions``) are drawn to meet it, and never
    planted: a lookup's indices uniform in ``[0, V)``, a causal attention's mask the causal mask."""
    gen = torch.Generator().manual_seed(seed)
    extent, causal = _preconditions(f)
    out = {f.tensors[i].name: torch.randn(f.tensors[i].shape, generator=gen, dtype=torch.float64) for i in f.inputs}
    special = special_values(f, seed)
    for j, (i, (name, x)) in enumerate(zip(f.inputs, out.items())):
        if i in extent:
            out[name] = torch.randint(0, extent[i], x.shape, generator=gen, dtype=torch.int64)
        elif i in causal:
            out[name] = causal_mask(tuple(x.shape))
        elif special:
            flat = x.view(-1)
            flat[int(torch.randint(flat.numel(), (), generator=gen))] = special[j % len(special)]
    return {name: x.to(DTYPES[f.tensors[i].dtype]) for i, (name, x) in zip(f.inputs, out.items())}


# ---- regressions ----------------------------------------------------------------------------
# Programs the fuzzer found (minimized by hypothesis and by hand) where optimize() or a random
# extraction crashes, diverges or computes wrong values.  Each builder may carry:
#   ``perturb_seeds``: the random.Random seeds whose extractions to check (default 0..3);
#   ``diverges``: optimize() is run first in a subprocess with a memory/time limit.
# Found at commit f7447217 (reshard/ as committed there); both pass since d816074.

def _regression(**attrs):
    def deco(fn):
        for k, v in attrs.items():
            setattr(fn, k, v)
        REGRESSIONS.append(fn)
        return fn
    return deco


REGRESSIONS: list[Callable[[], rs.Fusion]] = []


@_regression()
def reshape_split_of_shard() -> rs.Fusion:
    """Crash: ``ReshardError: sharding [outer(merge(i0[3],i1[2]),2)]: the elements a device holds
    are not a rectangular block``, raised by ``optimize`` itself (search.snapshot.Snapshot.sharding while
    building the PlanNode of the reshape).

    [6] Shard(0) on 2 ranks -> reshape (3, 2): rank 0 holds flat 0..2 = (0,0), (0,1), (1,0),
    which is not a block of the [3, 2] result.  ``unop-local`` (propagation.py) gives the reshape a
    result dist TrD(d, c) whenever ``okD`` holds, and ``okD``/``ok-bind`` (placements.py) only check
    extents, never that the bound IDs select rectangular, even blocks; so the e-graph holds
    (real t1 [outer(merge(i0,i1),2)]) and extraction (cost 0 reshape "view", or any random plan)
    picks it; decoding it into a TensorSharding fails.  The valid plan (allgather, then reshape)
    exists.  Same with Shard(1) of [2, 3] -> [3, 2] on 3 ranks, cyclic shardings, [S(0), S(0)]
    on 2x3, ...  Generator flag: ``nonblock_reshape`` (off: only reshapes that keep blocks for every
    sharding the optimizer may give the operand, as tracked by ``_Gen.parts``).
    Fixed at d816074 (``rect`` analysis in id_algebra.py, required by ``ok-bind``).
    """
    f = rs.Fusion()
    x = f.input("x", (6,), "float64", M2, [Shard(0)])
    y = f.reshape(x, (3, 2))
    f.output(y, [Replicate()])
    return f


@_regression(diverges=True)
def reduce_of_merged_dim_diverges() -> rs.Fusion:
    """Divergence: ``optimize`` never returns; egglog memory grows without bound ("memory
    allocation of 335544320 bytes failed", abort) within the 2nd saturation iteration, so
    ``Limits`` (checked between iterations) cannot stop it.

    y = reshape([4] Shard(0), (2, 2)); its candidate dists bind terms over merge(i0, i1) (the reshape
    map of x's root); ``b = reshape(y, (1, 4))`` maps i0, i1 to outer(j, 2), inner(j, 2), and
    merge(outer(j, 2), inner(j, 2)) = j (merge-split); ``sum(b, 1)`` makes
    Tr(j, c) = (Red), so tr-merge puts Merge(Outer(Red, 2), Inner(Red, 2)) in the one global
    ``Red`` e-class (transport.py RED / encode.py "(Red)"): a cyclic class.  The sibling
    ``sum(y, 1)`` adds Merges with Red children, and ``merge-assoc`` (id_algebra.py, unguarded:
    no ``ext`` condition) rewrites Merge(Merge(x, y), z) over the cyclic class forever: 3, 23,
    227, 2695, 36020 matches in successive ``(run ids)`` steps.  Guarding merge-assoc by ``ext``
    (reduced indices have none), or a Red per op, would cut it.  Generator flag:
    ``reduce_merged_dims`` (off: never reduce a dim that a reshape merged).
    Fixed at d816074 (merge-assoc requires ``ext``).
    """
    f = rs.Fusion()
    x = f.input("x", (4,), "float64", M2, [Shard(0)])
    y = f.reshape(x, (2, 2))
    f.sum(y, 1)  # dead, but needed
    b = f.reshape(y, (1, 4))
    f.output(f.sum(b, 1), [Replicate()])
    return f
