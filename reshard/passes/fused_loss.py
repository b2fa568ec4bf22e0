"""The fused linear cross entropy of every softmax-over-a-linear in a training Fusion, declared
equal to its unfused values: ``with_fused_loss``.

For logits ``x = h @ w^T`` (a ``matmul`` reading ``w [V, H]`` transposed, through reshapes that
keep the last dim, permutes of 2-D values, ``saved`` and ``detach``), the cross entropy's forward
values and the gradient's matmuls equal, value for value (``ir.ops.linear_loss``):

    max(x, -1)                      = linear_max(h, w)
    sum(exp(x - m), -1)             = linear_sumexp(h, w, m)
    pick(x, i)                      = sum(h * embedding(w, i), -1)
    dx @ w                          = linear_sumexp_grad(h, w, m, G, "input")  [+ u * embedding(w, i)]
    h^T @ dx  (= (dx^T @ h)^T)      = linear_sumexp_grad(h, w, m, G, "weight")^T
                                                                     [+ embedding_grad(u * h, i, V)^T]

(and each softmax part also as its rows of ``linear_sumexp_grad(h, w, m, G, "both")``, one pass
computing both, shared by the two matmuls)

for the gradient ``dx = G * saved(exp(x - m)) [+ unpick(u, i)]`` autodiff forms (``G``, ``u``
broadcast along V: the exp's and the target logit's gradients).  Each right-hand side is added
to the Fusion as ops of its own (``h``, ``w``, ``m`` and ``i`` read through ``saved`` in the
backward pass), joined to the left-hand side's value by an ``alternative`` op, so the e-graph
holds both ways and extraction picks per class by cost: the unfused way is faster (one matmul,
no recomputation); the fused way never holds ``[tokens, vocab]`` (its local steps chunk the
tokens) and keeps ``m`` and the sum instead of ``exp(x - m)``.  (A budget on saved bytes alone,
``extract.memory``, is met as well, and faster, by recomputing ``exp(x - m)`` in the backward
pass from saved operands, ``rules.remat``; what only the fused way saves is the backward pass's
``[tokens, vocab]`` buffers, which that budget does not count.)  Where ``x`` feeds anything else
(a returned logits tensor, label smoothing's class sum) the unfused values stay needed; the
alternatives are still sound.

The pass runs after ``passes.padding``.  Over a padded vocab the max and the sum read masked
logits and do not match; the pick and the gradient's matmuls do, and stay exact: the pick reads
rows below V only, and a matmul reading ``w`` unmasked reads zero padding rows (an input's
padding; padding whose values are unknown is masked first, and a masked ``w`` does not match), so
the padded logits' terms add nothing to ``dx @ w``, and the weight gradient's padding rows are
never read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.fusion import Fusion, Op, Tensor
from ..ir.names import saved_name

#: identities the matrix reading looks through (the values are the operand's)
_IDENTITIES = ("saved", "detach")


@dataclass(frozen=True)
class _Linear:
    """Logits ``x = h @ w^T``: ``h [*B, H]`` and ``w [V, H]`` as Fusion values (``w_t``: the
    Fusion holds ``w`` as ``[H, V]``, read transposed)."""

    h: int
    w: int
    w_t: bool


class _Reader:
    """What the pass reads of a Fusion: producers, consumers, and values as matrices."""

    def __init__(self, fusion: Fusion) -> None:
        self.f = fusion
        self.users: dict[int, list[Op]] = {}
        for op in fusion.ops:
            for i in op.inputs:
                self.users.setdefault(i, []).append(op)

    def op(self, t: int) -> Op | None:
        p = self.f.producer.get(t)
        return None if p is None else self.f.ops[p]

    def is_op(self, t: int, kind: str, **attrs: object) -> Op | None:
        op = self.op(t)
        if op is None or op.kind != kind or any(op.attrs.get(k) != v for k, v in attrs.items()):
            return None
        return op

    def through(self, t: int) -> int:
        """``t`` with ``saved`` / ``detach`` looked through."""
        while (op := self.op(t)) is not None and op.kind in _IDENTITIES:
            t = op.inputs[0]
        return t

    def matrix(self, t: int) -> tuple[int, bool]:
        """(base, transposed): ``t`` flattened to ``[rows, last dim]`` is ``base`` flattened so
        (transposed: its transpose), through identities, reshapes keeping the last dim and
        permutes of 2-D values."""
        flip = False
        while (op := self.op(t)) is not None:
            shape = self.f.tensors[t].shape
            src = self.f.tensors[op.inputs[0]].shape if op.inputs else ()
            if op.kind in _IDENTITIES or op.kind == "reshape" and src and src[-1:] == shape[-1:]:
                t = op.inputs[0]
            elif op.kind == "permute" and len(shape) == 2 and op.attrs["perm"] == (1, 0):
                t, flip = op.inputs[0], not flip
            else:
                break
        return t, flip

    def linear(self, x: int) -> _Linear | None:
        """``x``'s matmul ``h @ w^T`` with ``w`` 2-D (read through ``matrix``), or None."""
        base, flip = self.matrix(x)
        mm = self.is_op(base, "matmul")
        if mm is None or flip:
            return None
        a, b = mm.inputs
        wb, wflip = self.matrix(b)
        if len(self.f.tensors[b].shape) != 2 or len(self.f.tensors[wb].shape) != 2:
            return None
        return _Linear(a, wb, not wflip)

    def add_terms(self, t: int) -> list[int]:
        """The summands of ``t`` (an ``add`` of two, else ``t`` alone)."""
        op = self.is_op(t, "binary", fn="add")
        return list(op.inputs) if op is not None else [t]


@dataclass(frozen=True)
class _Loss:
    """One softmax over linear logits ``x``: its max op (None: not read), its exps
    ``exp(x - m)`` (op index -> the m tensor), its picks (op -> index tensor)."""

    x: int
    lin: _Linear
    maxes: tuple[Op, ...]
    exps: dict[int, int]
    picks: tuple[Op, ...]


def _losses(r: _Reader) -> list[_Loss]:
    """Every logits value read by a max, an ``exp(x - broadcast(m))`` or a pick along V."""
    found = []
    for t in r.f.tensors:
        if len(t.shape) != 2 or not t.dtype.startswith("float"):
            continue
        lin = r.linear(t.id)
        if lin is None:
            continue
        last = len(t.shape) - 1
        maxes, exps, picks = [], {}, []
        for u in r.users.get(t.id, []):
            if u.kind == "reduce" and u.attrs["fn"] == "max" and tuple(u.attrs["dims"]) == (last,):
                maxes.append(u)
            elif u.kind == "pick" and u.inputs[0] == t.id:
                picks.append(u)
            elif u.kind == "binary" and u.attrs["fn"] == "sub" and u.inputs[0] == t.id:
                b = r.is_op(u.inputs[1], "broadcast", dims=(0,))
                for e in r.users.get(u.output, []) if b is not None else []:
                    if e.kind == "unary" and e.attrs["fn"] == "exp":
                        exps[e.index] = b.inputs[0]
        if maxes or exps or picks:
            found.append(_Loss(t.id, lin, tuple(maxes), exps, tuple(picks)))
    return found


class _Builder:
    """The fused forms' operands in the Fusion being built: h as ``[N, H]``, w as ``[V, H]``,
    each once per phase (forward values, or their ``saved`` twins for the backward pass)."""

    def __init__(self, out: Fusion, loss: _Loss, saved: dict[int, Tensor]) -> None:
        self.out, self.loss, self.saved = out, loss, saved
        self.memo: dict[tuple, Tensor] = {}

    def value(self, t: int, backward: bool) -> Tensor:
        """Tensor ``t``, through its ``saved`` op in the backward pass (an existing one, else a
        new one)."""
        x = self.out.tensors[t]
        if not backward or self.out.producer.get(t) is not None and self.out.ops[self.out.producer[t]].kind == "saved":
            return x
        if t not in self.saved:
            self.saved[t] = self.out.saved(x, name=saved_name(x.name))
        return self.saved[t]

    def h(self, backward: bool) -> Tensor:
        if ("h", backward) not in self.memo:
            h = self.value(self.loss.lin.h, backward)
            rows = (math.prod(h.shape[:-1]), h.shape[-1])
            self.memo["h", backward] = h if h.shape == rows else self.out.reshape(h, rows)
        return self.memo["h", backward]

    def w(self, backward: bool) -> Tensor:
        if ("w", backward) not in self.memo:
            w = self.value(self.loss.lin.w, backward)
            self.memo["w", backward] = self.out.permute(w, (1, 0)) if self.loss.lin.w_t else w
        return self.memo["w", backward]

    def both(self, m: int, g: int) -> Tensor:
        """Both gradients' softmax parts at once (``linear_sumexp_grad``'s ``"both"``), once
        per ``(m, g)``."""
        if ("both", m, g) not in self.memo:
            self.memo["both", m, g] = self.out.linear_sumexp_grad(self.h(True), self.w(True), self.value(m, True),
                                                                  self.out.tensors[g], "both")
        return self.memo["both", m, g]

    def rowdot(self, w_rows: Tensor, backward: bool) -> Tensor:
        """``sum(h * w_rows, -1)``."""
        return self.out.sum(self.out.mul(self.h(backward), w_rows), 1)


def _gradient(r: _Reader, loss: _Loss, dx: int) -> tuple[int, int, tuple[int, int] | None] | None:
    """``dx = G * saved(exp(x - m)) [+ unpick(u, i)]``: (m, G, (u, i) or None), or None."""
    soft, target = None, None
    for term in r.add_terms(dx):
        mul = r.is_op(term, "binary", fn="mul")
        up = r.is_op(term, "unpick")
        if mul is not None and soft is None:
            for k in (0, 1):
                read = r.through(mul.inputs[k])  # the exp, read through its saved op (the backward pass)
                e, b = r.op(read), r.is_op(mul.inputs[1 - k], "broadcast", dims=(0,))
                if e is not None and e.index in loss.exps and b is not None and read != mul.inputs[k]:
                    soft = (loss.exps[e.index], b.inputs[0])
        elif up is not None and target is None:
            target = (up.inputs[0], up.inputs[1])
        else:
            return None
    if soft is None or len(r.add_terms(dx)) != 1 + (target is not None):
        return None
    return soft[0], soft[1], target


def _backward(r: _Reader, out: Fusion, loss: _Loss, b: _Builder) -> None:
    """Alternatives for the matmuls reading the logits' gradient (module docstring)."""
    for mm in [op for op in r.f.ops if op.kind == "matmul"]:
        (lb, lt), (rb, rt) = r.matrix(mm.inputs[0]), r.matrix(mm.inputs[1])
        for dx, other, wrt in ((lb, (rb, rt), "input"), (rb, (lb, lt), "weight")):
            if (lt if wrt == "input" else rt) or r.is_op(dx, "binary") is None:
                continue
            if wrt == "input" and other != (loss.lin.w, loss.lin.w_t) or \
                    wrt == "weight" and other != (r.matrix(loss.lin.h)[0], True):
                continue
            grad = _gradient(r, loss, dx)
            if grad is not None:
                _fused_grad(out, mm, b, grad, wrt)


def _fused_grad(out: Fusion, mm: Op, b: _Builder, grad: tuple[int, int, tuple[int, int] | None], wrt: str) -> None:
    """``mm``'s value from the fused gradient (module docstring), two ways: its own
    ``linear_sumexp_grad`` and its rows of the one computing both gradients (shared by the
    input's and the weight's matmuls); ``[N, H]`` reshaped to the matmul's result
    (``wrt="input"``), or ``[V, H]`` transposed (``"weight"``)."""
    m, g, target = grad
    h, w = b.h(True), b.w(True)
    n = h.shape[0]
    rows = (0, n) if wrt == "input" else (n, n + w.shape[0])
    res = out.tensors[mm.output]
    for soft in (out.linear_sumexp_grad(h, w, b.value(m, True), out.tensors[g], wrt),
                 out.slice(b.both(m, g), 0, *rows)):
        val = soft
        if target is not None:
            u, i = out.tensors[target[0]], b.value(target[1], True)
            if wrt == "input":
                part = out.mul(out.broadcast(u, h.shape, (0,)), out.embedding(w, i))
            else:
                part = out.embedding_grad(out.mul(out.broadcast(u, h.shape, (0,)), h), i, w.shape[0])
            val = out.add(val, part)
        val = out.reshape(val, res.shape) if wrt == "input" else out.permute(val, (1, 0))
        out.alternative(val, res, name=f"{res.name}.fused_loss")


def with_fused_loss(fusion: Fusion) -> Fusion:
    """A copy of ``fusion`` with the fused linear cross entropy declared equal to the unfused
    values it matches (module docstring; a Fusion without a backward pass gets the forward
    ones); ``fusion`` itself when nothing matches.  The new ops come last: values, inputs and
    outputs, op indices and tensor ids stay."""
    r = _Reader(fusion)
    losses = _losses(r)
    if not losses:
        return fusion
    out = fusion.copy()
    saved = {op.inputs[0]: out.tensors[op.output] for op in fusion.ops if op.kind == "saved"}
    for loss in losses:
        b = _Builder(out, loss, saved)
        for mx in loss.maxes:
            res = out.tensors[mx.output]
            out.alternative(out.linear_max(b.h(False), b.w(False)), res, name=f"{res.name}.fused_loss")
        for e, m in loss.exps.items():
            for s in r.users.get(fusion.ops[e].output, []):
                if s.kind == "reduce" and s.attrs["fn"] == "sum" and tuple(s.attrs["dims"]) == (1,):
                    res = out.tensors[s.output]
                    fused = out.linear_sumexp(b.h(False), b.w(False), out.tensors[m])
                    out.alternative(fused, res, name=f"{res.name}.fused_loss")
        for p in loss.picks:
            res = out.tensors[p.output]
            rows = out.embedding(b.w(False), out.tensors[p.inputs[1]])
            out.alternative(b.rowdot(rows, False), res, name=f"{res.name}.fused_loss")
        _backward(r, out, loss, b)
    return out
