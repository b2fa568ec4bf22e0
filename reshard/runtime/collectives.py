"""Reference (pure, single-process) implementations of the collectives of ``codegen.program``.

Each team collective takes ``xs``, the input tensors of the team members t_0..t_{n-1} in
team order, plus the step's attributes, and returns one output per member (``None`` where a
member gets nothing, i.e. the non-root members of ``gather``).  The semantics are exactly the
table in ``reshard.codegen.program``'s docstring (one statement of them; not repeated here).

``send_recv`` works on global ranks instead of a team.

Inputs are validated (equal shapes and dtypes across the team, chunked dims divisible by the
team size, ``root`` and dims in range, ``op`` in {"sum", "max"}); violations raise
``ReshardError`` naming the collective.  Every returned tensor is freshly allocated and
contiguous: it never aliases an input or another member's output.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from ..ir.collective_kinds import KIND_NAMES, REDUCE_OPS
from ..ir.errors import ReshardError

Tensor = torch.Tensor

#: one function per collective kind, named as the kind (``ir.collective_kinds``)
__all__ = ["REDUCE_OPS", *KIND_NAMES]


# ---- helpers -----------------------------------------------------------------------
def _fresh(t: Tensor) -> Tensor:
    """A new contiguous tensor with ``t``'s values (never aliases ``t``)."""
    return t.clone(memory_format=torch.contiguous_format)


def _check_team(name: str, xs: Sequence[Tensor], same_shape: bool = True) -> None:
    """Non-empty list of tensors with one dtype (and, if ``same_shape``, one shape)."""
    if not isinstance(xs, (list, tuple)) or len(xs) == 0:
        raise ReshardError(f"{name}: expected a non-empty list of team inputs, got {xs!r}")
    for j, x in enumerate(xs):
        if not isinstance(x, torch.Tensor):
            raise ReshardError(f"{name}: input of team member {j} is {type(x).__name__}, not a torch.Tensor")
    dtypes = [x.dtype for x in xs]
    if len(set(dtypes)) != 1:
        raise ReshardError(f"{name}: team inputs have mismatched dtypes {dtypes}")
    if same_shape:
        shapes = [tuple(x.shape) for x in xs]
        if len(set(shapes)) != 1:
            raise ReshardError(f"{name}: team inputs have mismatched shapes {shapes}")


def _norm_dim(name: str, what: str, dim: object, ndim: int) -> int:
    """Validate a tensor dim (negative allowed) against ``ndim``; return it non-negative."""
    if not isinstance(dim, int) or isinstance(dim, bool) or not -ndim <= dim < ndim:
        raise ReshardError(f"{name}: {what}={dim!r} is out of range for a {ndim}-D tensor")
    return dim % ndim


def _check_divisible(name: str, what: str, shape: Sequence[int], dim: int, n: int) -> None:
    if shape[dim] % n != 0:
        raise ReshardError(
            f"{name}: {what} {dim} of size {shape[dim]} (shape {tuple(shape)}) is not divisible "
            f"by the team size {n}"
        )


def _check_root(name: str, root: object, n: int) -> int:
    if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < n:
        raise ReshardError(f"{name}: root={root!r} is out of range for a team of size {n}")
    return root


def _reduce(name: str, xs: Sequence[Tensor], op: str) -> Tensor:
    """Elementwise reduction of the team inputs, left to right, in a fresh tensor."""
    if op not in REDUCE_OPS:
        raise ReshardError(f"{name}: unknown reduce op {op!r} (expected one of {REDUCE_OPS})")
    acc = _fresh(xs[0])
    for x in xs[1:]:
        if op == "sum":
            acc = acc + x
        else:
            acc = torch.maximum(acc, x)
    return acc.contiguous()


# ---- team collectives ----------------------------------------------------------------
def allgather(xs: list[Tensor], dim: int) -> list[Tensor | None]:
    """Every member gets ``cat([x_0, ..., x_{n-1}], dim)``."""
    _check_team("allgather", xs)
    d = _norm_dim("allgather", "dim", dim, xs[0].dim())
    full = torch.cat(list(xs), d).contiguous()
    return [_fresh(full) for _ in xs]


def reduce_scatter(xs: list[Tensor], dim: int, op: str = "sum") -> list[Tensor | None]:
    """Member t_i gets chunk i (along ``dim``) of the elementwise ``op``-reduction of all inputs."""
    _check_team("reduce_scatter", xs)
    n = len(xs)
    d = _norm_dim("reduce_scatter", "dim", dim, xs[0].dim())
    _check_divisible("reduce_scatter", "dim", xs[0].shape, d, n)
    red = _reduce("reduce_scatter", xs, op)
    return [_fresh(c) for c in torch.chunk(red, n, d)]


def allreduce(xs: list[Tensor], op: str = "sum") -> list[Tensor | None]:
    """Every member gets the elementwise ``op``-reduction of all inputs."""
    _check_team("allreduce", xs)
    red = _reduce("allreduce", xs, op)
    return [_fresh(red) for _ in xs]


def all_to_all(xs: list[Tensor], split_dim: int, cat_dim: int) -> list[Tensor | None]:
    """Member t_i gets ``cat([chunk_i(x_j, split_dim) for j in team], cat_dim)``."""
    _check_team("all_to_all", xs)
    n = len(xs)
    nd = xs[0].dim()
    s = _norm_dim("all_to_all", "split_dim", split_dim, nd)
    c = _norm_dim("all_to_all", "cat_dim", cat_dim, nd)
    _check_divisible("all_to_all", "split_dim", xs[0].shape, s, n)
    chunks = [torch.chunk(x, n, s) for x in xs]  # chunks[j][i] = chunk_i(x_j)
    return [torch.cat([chunks[j][i] for j in range(n)], c).contiguous() for i in range(n)]


def broadcast(xs: list[Tensor], root: int) -> list[Tensor | None]:
    """Every member gets ``x_root``.  Only the root's input is used, but all must match."""
    _check_team("broadcast", xs)
    r = _check_root("broadcast", root, len(xs))
    return [_fresh(xs[r]) for _ in xs]


def scatter(xs: list[Tensor], root: int, dim: int) -> list[Tensor | None]:
    """Member t_i gets ``chunk_i(x_root, dim)``.

    Only the root's input carries data; the other members' inputs may be of any shape
    (e.g. empty placeholders) but must share the root's dtype.
    """
    _check_team("scatter", xs, same_shape=False)
    n = len(xs)
    r = _check_root("scatter", root, n)
    d = _norm_dim("scatter", "dim", dim, xs[r].dim())
    _check_divisible("scatter", "dim", xs[r].shape, d, n)
    return [_fresh(c) for c in torch.chunk(xs[r], n, d)]


def gather(xs: list[Tensor], root: int, dim: int) -> list[Tensor | None]:
    """Member t_root gets ``cat([x_0..x_{n-1}], dim)``; every other member gets ``None``."""
    _check_team("gather", xs)
    n = len(xs)
    r = _check_root("gather", root, n)
    d = _norm_dim("gather", "dim", dim, xs[0].dim())
    out: list[Tensor | None] = [None] * n
    out[r] = torch.cat(list(xs), d).contiguous()
    return out


# ---- point to point --------------------------------------------------------------------
def send_recv(xs_by_rank: dict[int, Tensor], pairs: Iterable[Sequence[int]]) -> dict[int, Tensor]:
    """For each ``(src, dst)`` in ``pairs`` (global ranks), ``dst`` receives a copy of ``xs_by_rank[src]``.

    Ranks that are not a ``dst`` receive nothing (absent from the result).  A rank may send
    to several ranks but receive at most once; ``src == dst`` is a plain copy.
    """
    out: dict[int, Tensor] = {}
    for p in pairs:
        if not isinstance(p, (list, tuple)) or len(p) != 2:
            raise ReshardError(f"send_recv: each pair must be (src_rank, dst_rank), got {p!r}")
        src, dst = p
        if src not in xs_by_rank:
            raise ReshardError(
                f"send_recv: source rank {src!r} of pair {tuple(p)} has no input "
                f"(ranks with inputs: {sorted(xs_by_rank)})"
            )
        x = xs_by_rank[src]
        if not isinstance(x, torch.Tensor):
            raise ReshardError(f"send_recv: input of rank {src} is {type(x).__name__}, not a torch.Tensor")
        if dst in out:
            raise ReshardError(f"send_recv: rank {dst!r} is the destination of more than one pair")
        out[dst] = _fresh(x)
    return out
