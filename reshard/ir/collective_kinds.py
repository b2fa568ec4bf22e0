"""The one table of collective kinds: every layer reads what it knows about a collective here.

A ``CollectiveKind`` row says, for one communication step of the host program:

* ``name``: the program step kind (``codegen.program.Step.kind``), the cost profile's key
  (``CostProfile.alpha_us`` / ``busbw_gbps`` / ``collectives``), the reference function of
  ``runtime.collectives``, and how ``Plan.explain`` / ``Plan.draw`` name it (``label``);
* ``cross_mesh``: whether it is a transfer between two meshes rather than a team collective on
  one mesh axis (the e-graph's constructor of each kind it chooses: ``rules.collectives``);
* the bytes law: ``t = α + bytes·f(n)/busbw`` with f(n) = ``bus_mul``·(n-1)/n when
  ``team_factor`` (nccl-tests' bus factor), ``bus_mul`` otherwise; ``bytes`` is the
  ``law_buffer`` ("result": the gathered result; "operand": the operand each rank hands
  in); each rank receives ``moved_bytes`` = buffer·bus_mul·(n-1)/n of a team collective, and
  of a cross-mesh transfer its ``transfer_buffer`` ("operand": its whole operand shard,
  "result": its piece of the result);
* the layout: ``reorder_copies`` of a team collective's buffers on a dim that is not the
  outermost one, one fewer when a tensor on one of ``outermost_sides`` ("operand",
  "result") is a block split of dim 0;
* the runtime: the step attributes the reference collective takes (``attrs``, in its
  argument order, besides ``axis``/``ranks``), the reduce ops of its ``op`` attribute
  (``reduce_ops``, default "sum").  The ``torch.distributed`` call it is run with is the
  runtime's (``runtime.distributed.TORCH_CALLS``).

Backends and reduce ops: NCCL and gloo both take "sum" and "max" for ``allreduce`` and
``reduce_scatter``.  Gloo builds before torch 2.5 have no ``reduce_scatter_tensor``, and some
lack the single-tensor all-gather and all-to-all: ``DistRuntime(fallback="auto")`` then
switches that kind to a portable form for good (gloo raises before any communication):
allgather -> list ``all_gather`` + cat, reduce_scatter -> ``all_reduce`` then this member's
chunk, all_to_all -> point-to-point ``batch_isend_irecv`` (``runtime.distributed``).
The torch of this repository's environment (2.13) runs all of them natively on gloo,
``reduce_scatter`` with MAX included.

The default cost figures (``default_alpha_us``, ``default_busbw_gbps``) are the built-in
2xH200 NVLink profile's.  This module imports nothing of reshard but ``ir.errors``: every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ReshardError


@dataclass(frozen=True)
class CollectiveKind:
    """One row of the table (see the module docstring for each field's meaning)."""

    name: str
    bus_mul: int
    team_factor: bool
    law_buffer: str
    default_alpha_us: float
    default_busbw_gbps: float
    cross_mesh: bool = False
    transfer_buffer: str = ""
    reorder_copies: int = 0
    outermost_sides: tuple[str, ...] = ()
    attrs: tuple[str, ...] = ()
    reduce_ops: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """How ``Plan.explain`` and ``Plan.draw`` name the kind: its step kind."""
        return self.name

    @property
    def team(self) -> bool:
        """Whether it runs on the teams of one mesh axis (or an explicit team): every kind
        but ``send_recv``, which works on (src, dst) pairs of global ranks."""
        return "pairs" not in self.attrs

    def bus_factor(self, n: int) -> float:
        """f(n) of the α-β law ``t = α + bytes·f(n)/busbw`` (nccl-tests' bus-bandwidth factor)."""
        return self.bus_mul * (n - 1) / n if self.team_factor else float(self.bus_mul)

    def moved_bytes(self, buffer: int, team: int) -> int:
        """Bytes each rank receives from a team collective on a ``buffer``-byte buffer: the
        bus factor's multiplier times (n-1)/n of it, e.g. 2(n-1)/n for an allreduce."""
        return buffer * self.bus_mul * (team - 1) // team


_SUM_MAX = ("sum", "max")

#: every collective kind, in the order the cost rules and profiles list them
KINDS: tuple[CollectiveKind, ...] = (
    CollectiveKind("allgather", bus_mul=1, team_factor=True, law_buffer="result",
                   default_alpha_us=8.0, default_busbw_gbps=265.0,
                   reorder_copies=1, outermost_sides=("operand",),
                   attrs=("dim",)),
    CollectiveKind("reduce_scatter", bus_mul=1, team_factor=True, law_buffer="operand",
                   default_alpha_us=8.0, default_busbw_gbps=256.0,
                   reorder_copies=1, outermost_sides=("result",),
                   attrs=("dim",), reduce_ops=_SUM_MAX),
    CollectiveKind("allreduce", bus_mul=2, team_factor=True, law_buffer="operand",
                   default_alpha_us=10.0, default_busbw_gbps=328.0,
                   reduce_ops=_SUM_MAX),
    CollectiveKind("all_to_all", bus_mul=1, team_factor=True, law_buffer="operand",
                   default_alpha_us=10.0, default_busbw_gbps=330.0,
                   reorder_copies=2, outermost_sides=("operand", "result"),
                   attrs=("split_dim", "cat_dim")),
    CollectiveKind("broadcast", bus_mul=1, team_factor=False, law_buffer="operand",
                   default_alpha_us=8.0, default_busbw_gbps=265.0,
                   cross_mesh=True, transfer_buffer="operand", attrs=("root",)),
    CollectiveKind("scatter", bus_mul=1, team_factor=True, law_buffer="operand",
                   default_alpha_us=8.0, default_busbw_gbps=265.0,
                   cross_mesh=True, transfer_buffer="result", attrs=("root", "dim")),
    CollectiveKind("gather", bus_mul=1, team_factor=True, law_buffer="result",
                   default_alpha_us=8.0, default_busbw_gbps=265.0,
                   attrs=("root", "dim")),
    CollectiveKind("send_recv", bus_mul=1, team_factor=False, law_buffer="operand",
                   default_alpha_us=6.0, default_busbw_gbps=370.0,
                   cross_mesh=True, transfer_buffer="operand", attrs=("pairs",)),
)

#: kind name -> row
KIND: dict[str, CollectiveKind] = {k.name: k for k in KINDS}
#: every kind name (``Step.kind`` values other than "local")
KIND_NAMES: tuple[str, ...] = tuple(KIND)
#: the kinds that run on a team (of a mesh axis, or explicit ``ranks``): all but send_recv
TEAM_KIND_NAMES: frozenset[str] = frozenset(k.name for k in KINDS if k.team)
#: every reduce op any kind takes
REDUCE_OPS: tuple[str, ...] = _SUM_MAX


def kind(name: str) -> CollectiveKind:
    """The row of ``name``; an unknown name is a ``ReshardError`` listing the known ones."""
    if name not in KIND:
        raise ReshardError(f"unknown collective kind {name!r} (expected one of {list(KIND_NAMES)})")
    return KIND[name]
