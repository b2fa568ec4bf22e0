"""The e-graph's constructor for each collective kind it chooses: the rules' names for the rows of
``ir.collective_kinds`` (the one table of what a collective is), with the argument pattern the
cost rules match (``t`` the operand class, ``a`` the mesh axis, ``p`` the target placement).

Team collectives on one mesh axis (``rules.resharding``) and cross-mesh transfers
(``rules.crossmesh``; ``CollectiveKind.cross_mesh``); ``gather`` has none: programs never
contain it (``reshard tune`` measures it).
"""

from __future__ import annotations

from ..ir.collective_kinds import KIND, CollectiveKind

#: collective kind -> (its T constructor, its argument pattern as the cost rules match it)
CONSTRUCTORS: dict[str, tuple[str, str]] = {
    "allgather": ("AllGather", "t a"),
    "reduce_scatter": ("ReduceScatter", "t a p"),
    "allreduce": ("AllReduce", "t a"),
    "all_to_all": ("AllToAll", "t a p"),
    "broadcast": ("Bcast", ""),
    "scatter": ("Scatter", ""),
    "send_recv": ("SendRecv", ""),
}
#: e-graph constructor -> row, for the kinds the e-graph chooses
BY_CTOR: dict[str, CollectiveKind] = {c: KIND[k] for k, (c, _) in CONSTRUCTORS.items()}
#: team collectives on one mesh axis, by constructor (``AllGather`` -> allgather, ...)
TEAM_CTORS: dict[str, CollectiveKind] = {c: k for c, k in BY_CTOR.items() if not k.cross_mesh}
#: cross-mesh transfers, by constructor (``SendRecv``, ``Bcast``, ``Scatter``)
TRANSFER_CTORS: dict[str, CollectiveKind] = {c: k for c, k in BY_CTOR.items() if k.cross_mesh}
