"""Uneven sharding inside a plan: the padding pass (DTensor's semantics outside, even blocks inside).

Outside, a dim of extent ``n`` sharded by mesh axes of product ``P`` that does not divide it has
DTensor's ``torch.chunk`` pieces (``ir.sharding``).  Inside, ``optimize()`` plans a rewritten
Fusion (``pad_fusion``) in which every such dim has the padded extent ``N = P * ceil(n / P)``:
the requested sharding is then an even block sharding, and DTensor's pieces are the prefixes of
its blocks: the dim's **layout** (``ir.uneven``) is ``[0, n)`` with padding at the end (a tail
layout: one axis) or, for several axes chunking it (torch.chunk inside torch.chunk), may hold
padding between the pieces (5 rows on 2x2: ``[0, 1 | 2, _ | 3, _ | 4, _]``).  The e-graph
plans the padded Fusion like any other (it chooses every sharding and collective; collectives
move whole padded blocks: "padding to the largest block", priced as such by the cost model),
and the boundary (``Padding``) pads the inputs' local tensors with zeros, supplies the
constant inputs the pass adds, and clips the outputs.

This pass decides only what is padding (semantics), never how a value is distributed.  Every
tensor of the padded Fusion records its padded dims (``Pad``: ``n``, ``N`` and the layout's
runs): the runs' positions hold the true values in order, the others values nothing may read
(padding).  Below, "below ``n``" and "at the end" are said of tail layouts; a nested layout
has the same laws with its runs in place of ``[0, n)``, except where said.  The laws, per op,
from the registry's facts (``OpKind.index_map``, ``reduced_dims``, ``ignores_padding``,
``zeroes_padding``, ``widens_new_dims``, ``keeps``):

* **requested placements** (an input's, an output's, a ``redistribute``'s): every dim they shard
  unevenly has extent ``N`` there, every other dim its true extent ``n``.  An input is padded by
  the boundary (zeros); an output or a redistribute operand is *conformed*: a dim at another
  extent is sliced back to ``n`` (``slice [0, n)``) and zero-padded to the requested extent.
* **kept dims**: an operand dim whose index map image is a result root ``j`` (elementwise ops,
  permutes, reshapes and broadcasts not touching it, slices and reductions of other dims, a
  matmul's batch / row / column dims) carries its padding to result dim ``j``: the result at
  index ``i < n`` of ``j`` reads only index ``i`` of the operand dim.  Operands mapping to one
  result dim are *aligned* first: all get the largest padded extent among them (an unpadded
  or less padded one is zero-padded at its end, or, when a broadcast made that dim from no
  operand dim, broadcast to the larger extent, or when a scatter writes it at index values
  below ``n``, scattered at the larger extent (its padding 0): ``OpKind.widens_new_dims``), so
  their indices agree.  When one of them has a nested layout, all get the first such layout:
  the others' true values are taken out (below) and laid out in its runs (each run sliced out
  and zero-padded up to the next, concatenated: zero padding).
* **reshapes keeping it at the end**: a padded dim that is the outermost factor of a result dim
  (merged with dims inside it, ``[7->8, 4] -> [28->32]``) or whose outermost factor is a result
  dim (split, ``[28->32] -> [7->8, 4]`` when the inner factors divide ``N``) carries its padding
  there, scaled: row-major order keeps the padding at the end of that result dim (a nested
  layout's runs are scaled with it; a split needs the inner factors to divide every run).
* **ignored padding**: an operand dim the op reads only below ``n`` (``ignores_padding``: a
  slice's range, a lookup table's indexed dim, read at indices below ``n``) stays as it is; its
  padding is never read.  A nested layout's true indices are not ``[0, n)``: it is taken out.
* **zeroed padding**: an operand dim whose padding the op reads and needs valid (``zeroes_padding``:
  a lookup's indices, whose padding is carried to the result) is masked to 0 first.
* **folded dims** (``reduced_dims``: reductions, a matmul's contraction): every index is read,
  so padding is masked first with the fold's identity, ``masked(x, valid, True)`` (an exact
  zero where ``valid``, a constant bool input ``[N]`` true at the runs broadcast along the dim,
  is false: the identity of sum, mean and the contraction), plus a constant ``bias`` (0 below
  ``n``, the identity above) for max (``-inf``, the int minimum), on every operand folded together
  (aligned first), so a matmul never multiplies padding (0 * NaN).  A ``mean`` over a padded
  dim divides by ``N``: its result is scaled by ``N / n``.
* **zero padding**: an input's padding is exactly zero on every rank (the boundary pads with
  zeros, every Partial summand too), and so is a zero-pad's, a sum mask's, and that of an op
  linear for sums (``keeps`` "sum": ``f(0) = 0``) whose operands' padding there is zero (plans
  keep exact zeros: collectives sum or copy them, a local partial adds zeros).  A sum, mean or
  contraction over a zero-padded dim masks nothing there (a contraction masks only its operands
  whose padding is not zero: ``0 * 0``, never ``0 * NaN``).
* **any other read** (a dim with no image, or one inside a merge: reshapes merging it as an
  inner factor, cat or pad along it, broadcast from extent 1, an op's unknown dim): the operand
  is sliced back to ``n`` first (a nested layout: its runs sliced out and concatenated).
* **requested layouts**: an output or redistribute operand whose layout is not the requested
  one is taken out and laid out in it (conformed, as above).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ..ir.dtypes import DTYPES
from ..ir.errors import ReshardError
from ..ir.fusion import Fusion, Tensor
from ..ir.ids import ID, Merge, Outer, Root, extent, root_dims
from ..ir.mesh import DeviceMesh
from ..ir.ops import op_kind
from ..ir.sharding import TensorSharding, pad_local, shard, trim_local
from ..ir.uneven import Runs, describe, tail, valid_mask

#: the constant inputs the pass adds are named with this prefix
CONSTANT_PREFIX = "__pad."

@dataclass(frozen=True)
class Pad:
    """One padded dim: true extent ``n``, padded extent ``big`` (``N``), and its layout
    (``ir.uneven``: the runs of padded positions holding the true indices)."""

    n: int
    big: int
    runs: Runs

    @staticmethod
    def of(ts: TensorSharding, d: int) -> "Pad":
        """Dim ``d`` of requested sharding ``ts``: its layout when uneven, else unpadded."""
        n = ts.global_shape[d]
        return Pad(n, ts.shape[d], ts.layouts.get(d, tail(n)))

    @property
    def tail(self) -> bool:
        """Whether the true indices are ``[0, n)`` (padding only at the end)."""
        return self.runs == tail(self.n)

    def text(self) -> str:
        """``7..8`` for a tail layout; ``of 8 outside 0:3, 4:5, 6:7`` for a nested one."""
        return f"{self.n}..{self.big}" if self.tail else f"of {self.big} outside {describe(self.runs)}"

    def key(self) -> str:
        """A constant's name part: ``7.8`` (tail) or ``5.8.0+3,4+1,6+1`` (each run's position
        and count)."""
        runs = ",".join(f"{p}+{c}" for p, c in self.runs)
        return f"{self.n}.{self.big}" if self.tail else f"{self.n}.{self.big}.{runs}"


@dataclass
class Padding:
    """The boundary between a user's Fusion and the padded one a plan runs (``pad_fusion``).

    ``inputs``: each padded input's (uneven) sharding by name; ``outputs``: each output's
    sharding as the user asked (uneven ones clip the plan's padded output blocks);
    ``constants``: the constant inputs the pass added (global values); ``notes``: what was
    padded, masked and sliced back, and why (``Plan.explain``)."""

    source: Fusion
    fusion: Fusion
    inputs: dict[str, TensorSharding]
    outputs: tuple[TensorSharding, ...]
    constants: dict[str, torch.Tensor]
    notes: tuple[str, ...]

    def user_sharding(self, name: str, ts: TensorSharding) -> TensorSharding:
        """The sharding in which the user gives input ``name`` that the plan feeds at ``ts``: its
        requested uneven sharding (a fixed input is fed at that one, ``ts`` being its even
        padded form, perhaps spelled otherwise: ``i0[2]`` for ``outer(i0[2], 2)``), else ``ts``."""
        return self.inputs.get(name, ts)

    def plan_locals(self, rank: int, lowered_inputs: Sequence[tuple[str, str, TensorSharding]],
                    user_locals: Mapping[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        """Rank ``rank``'s program inputs from its DTensor local inputs (by buffer): uneven
        ones zero-padded to their blocks, the constants added (their blocks of ``ts``, on the
        local inputs' device: a GPU's in ``simulate(device="cuda")`` and over NCCL).  An
        uneven input of another shape than the rank's DTensor local one (``local_extent``; its
        padded block included) is a ``ReshardError`` naming that shape (``Plan.run`` has every
        rank raise it)."""
        out = dict(user_locals)
        device = next((x.device for x in user_locals.values() if isinstance(x, torch.Tensor)), None)
        for buf, name, ts in lowered_inputs:
            if rank not in ts.mesh:
                continue
            coords = ts.mesh.coords(rank)
            if name in self.constants:
                out[buf] = shard(self.constants[name], ts)[rank].to(device)
            elif name in self.inputs and isinstance(out.get(buf), torch.Tensor):
                user = self.user_sharding(name, ts)
                want = user.local_extent(coords)
                if tuple(out[buf].shape) != want:
                    raise ReshardError(f"{where}: rank {rank}: local input {buf!r} (input {name!r}) has shape "
                                       f"{tuple(out[buf].shape)}, the plan expects {want} (its DTensor local "
                                       f"shape on this rank of {user.global_shape} sharded {user})")
                out[buf] = pad_local(out[buf], user, coords, f"{where}: input {name!r}")
        return out

    def user_output(self, k: int, rank: int, block: torch.Tensor) -> torch.Tensor:
        """Output ``k``'s block on rank ``rank`` clipped to its DTensor local tensor."""
        ts = self.outputs[k]
        return block if ts.true_shape is None else trim_local(block, ts, ts.mesh.coords(rank))

    def user_outputs(self, rank: int, outs: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor | None, ...]:
        """Rank ``rank``'s output blocks (None: an output of another mesh) clipped to its DTensor
        local outputs."""
        return tuple(x if x is None else self.user_output(k, rank, x) for k, x in enumerate(outs))


def requested(f: Fusion) -> list[TensorSharding]:
    """Every sharding ``f`` requests: its inputs', outputs' and redistribute targets'."""
    out = [f.tensors[i].sharding for i in f.inputs if f.tensors[i].sharding is not None]
    out += [ts for _, ts in f.outputs]
    return out + [op.attrs["sharding"] for op in f.ops if op.kind == "redistribute"]


def pad_fusion(f: Fusion) -> Padding | None:
    """The padded Fusion for ``f`` and its boundary; None when no requested sharding is uneven
    (``f`` is planned as it is)."""
    if all(ts.true_shape is None for ts in requested(f)):
        return None
    return _Padder(f).run()


def _scaled(image: ID | str | None, pad: Pad | None) -> tuple[int, Pad] | None:
    """Result dim ``j`` and its padding when a padded dim (``n`` padded to ``N``) is the
    outermost factor of ``j`` (a reshape merging it with dims inside it: image
    ``Outer(Root(j, n*r), n)``, padding ``(n*r, N*r)``, each run scaled by ``r``) or ``j`` is its
    outermost factor (a reshape splitting it: image ``Merge(Root(j, n/r), Y)``, ``ext(Y) = r``
    dividing ``N`` and every run's position and count, padding ``(n/r, N/r)``, each run divided
    by ``r``): row-major order keeps every true index's padded position, scaled.  None else."""
    if pad is None:
        return None
    if isinstance(image, Outer) and isinstance(image.x, Root) and image.parts == pad.n:
        r = image.x.extent // pad.n
        return image.x.dim, Pad(pad.n * r, pad.big * r, tuple((p * r, c * r) for p, c in pad.runs))
    if isinstance(image, Merge) and isinstance(image.x, Root):
        r = extent(image.y)
        if pad.big % r == 0 and pad.n == image.x.extent * r and all(p % r == 0 == c % r for p, c in pad.runs):
            return image.x.dim, Pad(image.x.extent, pad.big // r, tuple((p // r, c // r) for p, c in pad.runs))
    return None


def _identity(fold: str, dtype: str) -> float | int | bool:
    """The value a fold ignores: 0 for sums (and a contraction), the lowest value for max."""
    if fold in ("sum", "mean"):
        return False if dtype == "bool" else 0
    dt = DTYPES[dtype]
    if dt == torch.bool:
        return False
    return float("-inf") if dt.is_floating_point else torch.iinfo(dt).min


def _axes_text(ts: TensorSharding, d: int) -> str:
    """``Shard(d) on 2 ranks`` / ``Shard(d) on mesh axes 'x', 'y' (4 ranks)``."""
    axes = [a for a in ts.bound_axes if d in _dims_of(ts, a)]
    names = ", ".join(repr(ts.mesh.axis_names[a]) for a in axes)
    ranks = math.prod(ts.mesh.shape[a] for a in axes)
    return f"Shard({d}) on {ranks} ranks (mesh axis {names})" if len(axes) == 1 else \
        f"Shard({d}) on {ranks} ranks (mesh axes {names})"


def _padded_text(ts: TensorSharding, d: int) -> str:
    """``7 padded to 8 for Shard(0) on 2 ranks (mesh axis 'tp')``, and where DTensor's nested
    chunks sit when they are not ``[0, n)``."""
    pad = Pad.of(ts, d)
    where = "" if pad.tail else f" (DTensor's nested chunks at {describe(pad.runs)})"
    return f"{pad.n} padded to {pad.big} for {_axes_text(ts, d)}{where}"


def _dims_of(ts: TensorSharding, a: int) -> set[int]:
    return set(root_dims(ts.axes[a]))


@dataclass
class _Padder:
    """One run of the pass over ``src``: builds ``g`` op by op (``src``'s order)."""

    src: Fusion
    g: Fusion = field(default_factory=Fusion)
    new: dict[int, Tensor] = field(default_factory=dict)  # src tensor id -> g tensor
    pads: dict[int, dict[int, Pad]] = field(default_factory=dict)  # g tensor id -> its padded dims
    consts: dict[str, torch.Tensor] = field(default_factory=dict)
    const_inputs: dict[tuple[str, DeviceMesh], Tensor] = field(default_factory=dict)
    memo: dict[tuple, Tensor] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    padded_inputs: dict[str, TensorSharding] = field(default_factory=dict)
    #: (g tensor id, dim): padded dims whose padding is exactly zero on every rank (``zero`` law)
    zero: set[tuple[int, int]] = field(default_factory=set)

    # ---- building blocks ------------------------------------------------------------
    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _with(self, y: Tensor, pads: dict[int, Pad], zero: Sequence[int] = ()) -> Tensor:
        """Record ``y``'s padded dims, ``zero`` those whose padding is exactly zero."""
        self.pads[y.id] = pads
        self.zero.update((y.id, d) for d in zero if d in pads)
        return y

    def _zeros(self, x: Tensor) -> list[int]:
        return [d for d in self.pads[x.id] if (x.id, d) in self.zero]

    def _tail(self, x: Tensor, d: int) -> bool:
        """Whether dim ``d`` of ``x`` holds its true indices first (unpadded, or a tail layout)."""
        return d not in self.pads[x.id] or self.pads[x.id][d].tail

    def unpad(self, x: Tensor, d: int, why: str) -> Tensor:
        """``x`` with only the true indices of dim ``d`` (no padding there any more): sliced back
        (a tail layout), or its runs sliced out and concatenated (a nested one)."""
        if d not in self.pads[x.id]:
            return x
        pad = self.pads[x.id][d]
        key = ("unpad", x.id, d)
        if key not in self.memo:
            if pad.tail:
                self._note(f"{x.name} dim {d}: sliced back from {pad.big} to {pad.n} before {why}")
                y = self.g.slice(x, d, 0, pad.n)
            else:
                self._note(f"{x.name} dim {d}: its {pad.n} true indices taken out of {pad.big} (DTensor's nested "
                           f"chunks at {describe(pad.runs)}) before {why}")
                y = self.g.cat([self.g.slice(x, d, p, p + c) for p, c in pad.runs], d)
            self.memo[key] = self._with(y, {k: v for k, v in self.pads[x.id].items() if k != d}, self._zeros(x))
        return self.memo[key]

    def pad(self, x: Tensor, d: int, want: Pad, why: str) -> Tensor:
        """``x`` with dim ``d`` at padding ``want`` (its layout and extent): zeros appended to a
        tail layout, or the true indices laid out in ``want``'s runs with zeros between them,
        after taking them out of another layout first.  An unpadded ``want`` (``n == big``)
        slices back."""
        cur = self.pads[x.id].get(d)
        if cur == want or (cur is None and want.big == want.n):
            return x
        if cur is not None and not (cur.tail and want.tail and cur.big <= want.big):
            x = self.unpad(x, d, why)
        if want.big == want.n or x.shape[d] == want.big:
            return x
        key = ("pad", x.id, d, want)
        if key not in self.memo:
            y = self._widened(x, d, want.big) if want.tail else None
            zero = []  # a widened broadcast repeats values in its padding
            if y is None:
                y = self.g.pad(x, d, 0, want.big - x.shape[d]) if want.tail else self._embed(x, d, want, why)
                zero = self._zeros(x) + ([d] if d not in self.pads[x.id] else [])
            self.memo[key] = self._with(y, {**self.pads[x.id], d: want}, zero)
        return self.memo[key]

    def _embed(self, x: Tensor, d: int, want: Pad, why: str) -> Tensor:
        """Unpadded dim ``d`` of ``x`` laid out in ``want``'s runs: each run's true indices sliced
        out and zero-padded up to the next run (or the padded extent), concatenated."""
        ends = [p for p, _ in want.runs[1:]] + [want.big]
        pieces, at = [], 0
        for (p, c), end in zip(want.runs, ends):
            piece = x if c == x.shape[d] else self.g.slice(x, d, at, at + c)
            lo, hi = (p if at == 0 else 0), end - p - c
            pieces.append(self.g.pad(piece, d, lo, hi) if lo or hi else piece)
            at += c
        self._note(f"{x.name} dim {d}: laid out in {want.big} (DTensor's nested chunks at {describe(want.runs)}) "
                   f"for {why}")
        return self.g.cat(pieces, d)

    def _widened(self, x: Tensor, d: int, big: int) -> Tensor | None:
        """``x`` rebuilt with dim ``d`` at extent ``big`` when its producer makes that dim from no
        operand dim and may build it at any extent (``OpKind.widens_new_dims``: a broadcast's new
        or expanded dim, whose padding then repeats values); else None."""
        op = self.g.ops[self.g.producer[x.id]]
        kind = op_kind(op.kind)
        if not kind.widens_new_dims or any(
                isinstance(img, Root) and img.dim == d
                for slot in range(len(op.inputs)) for img in kind.index_map(self.g, op, slot)):
            return None
        shape = tuple(big if j == d else e for j, e in enumerate(x.shape))
        attrs = {**op.attrs, "shape": shape}
        return self.g._op(op.kind, [self.g.tensors[i] for i in op.inputs],
                          self.g._new(shape, x.dtype, x.mesh, None), **attrs)

    def constant(self, name: str, value: torch.Tensor, mesh: DeviceMesh) -> Tensor:
        """A constant input of ``g`` (the boundary supplies ``value``; the plan chooses how it is
        fed), one per name and mesh."""
        key = (name, mesh)
        if key not in self.const_inputs:
            others = sum(1 for other, _ in self.const_inputs if other == name)
            full = f"{name}@{others}" if others else name
            self.consts[full] = value
            t = self.g.input(full, tuple(value.shape), value.dtype, mesh)
            self.const_inputs[key] = self._with(t, {})
        return self.const_inputs[key]

    def mask(self, x: Tensor, d: int, fold: str, why: str) -> Tensor:
        """Padding along dim ``d`` replaced by ``fold``'s identity: ``masked(x, valid, True)`` (an
        exact zero, ``False`` for bools, where ``valid`` is false: the identity of sums), plus
        ``bias`` (0 at true indices, the identity at padding) when the identity is not zero (max:
        ``-inf`` or the int minimum; ``v + 0 == v`` for every value, NaN and inf included).
        ``valid`` (``[N]``, true at the layout's runs: below ``n`` for a tail layout) and ``bias``
        are constant inputs, broadcast along ``d``."""
        pad = self.pads[x.id][d]
        ident = _identity(fold, x.dtype)
        key = ("mask", x.id, d, ident)
        if key in self.memo:
            return self.memo[key]
        self._note(f"{x.name} dim {d}: padding {pad.text()} masked with {ident} before {why}")
        valid = valid_mask(pad.runs, pad.big)
        y = self.g.masked(x, self._along(f"valid.{pad.key()}", valid, x, d), True)
        zero = self._zeros(x) + [d]
        if ident:
            bias = torch.where(valid, 0, ident).to(DTYPES[x.dtype])
            y = self.g.add(y, self._along(f"bias.{pad.key()}.{x.dtype}", bias, x, d))
            zero = []
        self.memo[key] = self._with(y, dict(self.pads[x.id]), zero)
        return self.memo[key]

    def _along(self, name: str, value: torch.Tensor, x: Tensor, d: int) -> Tensor:
        """Constant ``value`` (``[N]``) broadcast to ``x``'s shape along dim ``d`` (one per shape)."""
        key = ("along", name, x.shape, d, x.mesh)
        if key not in self.memo:
            c = self.constant(CONSTANT_PREFIX + name, value, x.mesh)
            self.memo[key] = self._with(self.g.broadcast(c, x.shape, (d,)), {})
        return self.memo[key]

    def conform(self, x: Tensor, ts: TensorSharding, why: str) -> Tensor:
        """``x`` at the extents and layouts of requested sharding ``ts`` (padded where it is
        uneven, true elsewhere)."""
        for d in range(len(ts.shape)):
            x = self.pad(x, d, Pad.of(ts, d), why)
        return x

    # ---- the pass ---------------------------------------------------------------------
    def run(self) -> Padding:
        src = self.src
        for op in src.ops:
            t = src.tensors[op.output]
            self.new[t.id] = self.input(t) if op.kind == "input" else self.op(op, t)
        outputs = []
        for k, (tid, ts) in enumerate(src.outputs):
            for d in ts.padded_dims:
                self._note(f"output {k} ({src.tensors[tid].name}) dim {d}: {_padded_text(ts, d)}")
            x = self.conform(self.new[tid], ts, f"output {k}")
            self.g.output(x, ts.even)
            outputs.append(ts)
        return Padding(src, self.g, self.padded_inputs, tuple(outputs), self.consts, tuple(self.notes))

    def input(self, t: Tensor) -> Tensor:
        ts = t.sharding
        if ts is None or ts.true_shape is None:
            return self._with(self.g.input(t.name, t.shape, t.dtype, t.mesh, ts), {})
        for d in ts.padded_dims:
            self._note(f"input {t.name} dim {d}: {_padded_text(ts, d)}")
        self.padded_inputs[t.name] = ts
        return self._with(self.g.input(t.name, ts.shape, t.dtype, t.mesh, ts.even),
                          {d: Pad.of(ts, d) for d in ts.padded_dims},
                          list(ts.padded_dims))  # the boundary pads with zeros

    def op(self, op, t: Tensor) -> Tensor:  # noqa: ANN001  (an ir.fusion.Op)
        src, kind = self.src, op_kind(op.kind)
        what = f"{op.kind} {t.name}"
        xs = [self.new[i] for i in op.inputs]
        req: TensorSharding | None = op.attrs.get("sharding")
        if req is not None:  # a redistribute: its operand at the requested extents
            for d in req.padded_dims:
                self._note(f"{t.name} dim {d}: {_padded_text(req, d)} (redistribute)")
            xs = [self.conform(xs[0], req, what)]
        kept: dict[int, list[tuple[int, int]]] = {}
        out_scaled: dict[int, tuple[Pad, bool]] = {}
        folded: dict[int, list[tuple[int, int, str]]] = {}
        for slot in range(len(xs)):
            images = kind.index_map(src, op, slot)
            folds = kind.reduced_dims(src, op, slot)
            ignored = kind.ignores_padding(src, op, slot)
            for d in kind.zeroes_padding(src, op, slot):
                if d in self.pads[xs[slot].id]:
                    xs[slot] = self.mask(xs[slot], d, "sum", what)
            for d in range(len(xs[slot].shape)):
                scaled = _scaled(images[d], self.pads[xs[slot].id].get(d)) if len(xs) == 1 else None
                if isinstance(images[d], Root):
                    kept.setdefault(images[d].dim, []).append((slot, d))
                elif scaled is not None:
                    out_scaled[scaled[0]] = scaled[1], (xs[slot].id, d) in self.zero
                elif d in folds:
                    folded.setdefault(folds[d][1], []).append((slot, d, folds[d][0]))
                elif d not in ignored or not self._tail(xs[slot], d):  # ignored: reads true indices < n
                    xs[slot] = self.unpad(xs[slot], d, what)
        out_pads: dict[int, Pad] = {j: pad for j, (pad, _) in out_scaled.items()}
        linear = "sum" in kind.keeps(op)
        out_zero = [j for j, (_, z) in out_scaled.items() if z and linear]
        for j, members in kept.items():
            pad = self._align(xs, [(s, d) for s, d in members], what)
            if pad is not None:
                out_pads[j] = pad
                if linear and all((xs[s].id, d) in self.zero for s, d in members):
                    out_zero.append(j)
        rescale = 1.0
        for members in folded.values():
            pad = self._align(xs, [(s, d) for s, d, _ in members], what)
            if pad is None:
                continue
            for s, d, fold in members:
                if fold == "max" or (xs[s].id, d) not in self.zero:
                    xs[s] = self.mask(xs[s], d, fold, what)
            if any(fold == "mean" for *_, fold in members):
                rescale *= pad.big / pad.n
        shape = list(t.shape)
        for j, pad in out_pads.items():
            shape[j] = pad.big
        attrs = dict(op.attrs)
        if "shape" in attrs:  # an op's shape attribute is its result's shape (reshape, broadcast)
            attrs["shape"] = tuple(shape)
        sharding = None
        if req is not None:
            sharding = attrs["sharding"] = req.even
        name = None if t.name == f"t{t.id}" else t.name
        y = self._with(self.g._op(op.kind, xs, self.g._new(shape, t.dtype, t.mesh, name, sharding), **attrs),
                       out_pads, out_zero)
        if rescale != 1.0:
            self._note(f"{t.name}: mean over padded dims scaled by {rescale:g} (true count)")
            y = self._with(self.g.scale(y, rescale), out_pads, out_zero)
        return y

    def _align(self, xs: list[Tensor], members: list[tuple[int, int]], why: str) -> Pad | None:
        """Operand dims read together (one result dim, or one folded index) at one padding, so
        their indices agree: the first nested layout among them, else the largest padded tail
        one; None when none is padded."""
        pads = [self.pads[xs[s].id][d] for s, d in members if d in self.pads[xs[s].id]]
        if not pads:
            return None
        nested = [p for p in pads if not p.tail]
        want = nested[0] if nested else max(pads, key=lambda p: p.big)
        for s, d in members:
            xs[s] = self.pad(xs[s], d, want, why)
        return want
