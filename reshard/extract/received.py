"""Bytes each rank receives over one communicating node: the one home of ``Plan.comm_bytes``'s
convention, for lowered plans (``codegen.lower``, ``explain``) and for e-nodes (``Received``:
the explanations' alternatives and the communication budget, ``extract.budget``).

Law: a team collective's rank receives ``CollectiveKind.moved_bytes`` of its buffer (the
kind's ``law_buffer``: the result of an allgather, the operand of the others) on a team of
the mesh axis' size; a cross-mesh transfer's receiving rank its ``transfer_buffer`` (its whole
operand shard for a send_recv / broadcast, its piece of the result for a scatter); every other
node 0.  An e-node's bytes are those of the plan node it lowers to (the same shardings: its
operand class's and its own class's), so the sum over a plan's distinct e-nodes is the lowered
plan's ``comm_bytes``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir.collective_kinds import KIND
from ..ir.errors import ReshardError
from ..ir.fusion import Fusion
from ..ir.sharding import TensorSharding
from ..rules.collectives import TEAM_CTORS, TRANSFER_CTORS
from ..search.snapshot import Snapshot
from .budget import Budget
from .dag import ENode, _Costs

#: T constructor -> collective kind name (``ir.collective_kinds``; LocalSlice moves nothing)
COLLECTIVES = {c: k.name for c, k in TEAM_CTORS.items()}
#: cross-mesh transfer constructors -> their communication
TRANSFERS = {c: k.name for c, k in TRANSFER_CTORS.items()}
#: every constructor that communicates
COMMS = {**COLLECTIVES, **TRANSFERS}
#: ``optimize``'s keyword for a budget on these bytes (``extract.budget``), and what it counts
KEYWORD, COUNTS = "comm_budget", "bytes received per rank"


def collective_bytes(kind: str, src: TensorSharding, dst: TensorSharding, itemsize: int, team: int
                     ) -> tuple[int, int]:
    """(per-rank buffer NCCL is handed, bytes each rank receives) of one collective: the
    buffer is the kind's ``law_buffer`` (the result of an allgather, the operand of the
    others); received: ``CollectiveKind.moved_bytes``."""
    ck = KIND[kind]
    size = math.prod((dst if ck.law_buffer == "result" else src).local_shape) * itemsize
    return size, ck.moved_bytes(size, team)


def transfer_bytes(kind: str, src: TensorSharding, dst: TensorSharding, itemsize: int) -> int:
    """Bytes a receiving rank gets in a cross-mesh transfer: the kind's ``transfer_buffer``
    (its whole operand shard for a send_recv / broadcast, its piece of the result for a scatter)."""
    return math.prod((dst if KIND[kind].transfer_buffer == "result" else src).local_shape) * itemsize


def received_bytes(kind: str, src: TensorSharding, dst: TensorSharding, itemsize: int, axis: int | None) -> int:
    """Bytes each rank receives in a communication of collective kind ``kind`` from ``src`` to
    ``dst`` (``axis``: a team collective's mesh axis) of elements of ``itemsize`` bytes (module law)."""
    if KIND[kind].cross_mesh:
        return transfer_bytes(kind, src, dst, itemsize)
    if axis is None:
        raise ReshardError(f"internal: collective {kind} without a mesh axis")
    return collective_bytes(kind, src, dst, itemsize, dst.mesh.shape[axis])[1]


class Received:
    """The shardings of a snapshot's T classes (decoded once each) and the bytes each rank
    receives per e-node (``of``, ``array``, ``bytes_of``; module law)."""

    def __init__(self, snap: Snapshot, fusion: Fusion, nodes: list[ENode], names: dict[Any, tuple[int, Any]],
                 ids: dict[Any, Any]) -> None:
        self.snap, self.fusion, self.nodes, self.names, self.ids = snap, fusion, nodes, names, ids
        mask = 0
        for n in nodes:
            if n.ctor in COMMS:
                mask |= 1 << n.id
        #: bitset of the communicating e-nodes
        self.mask = mask
        self._ts: dict[Any, TensorSharding | None] = {}
        self._bytes = np.full(len(nodes), -1, dtype=np.int64)  # ``of`` by e-node id, -1: not yet

    def sharding(self, cls: Any) -> TensorSharding | None:
        """The sharding of T class ``cls`` on its value's own mesh (None: not decodable)."""
        if cls not in self._ts:
            ts = None
            if cls in self.names:
                tid, dcls = self.names[cls]
                try:
                    t = self.fusion.tensors[tid]
                    ts = self.snap.sharding(dcls, t.mesh, t.shape, self.ids)
                except ReshardError:
                    ts = None
            self._ts[cls] = ts
        return self._ts[cls]

    def of(self, n: ENode) -> int:
        """Bytes each rank receives for e-node ``n`` (0 for a node that does not communicate,
        or whose shardings do not decode: no plan can lower it)."""
        if self._bytes[n.id] < 0:
            src = self.sharding(n.children[0]) if n.ctor in COMMS else None
            dst = self.sharding(n.cls) if src is not None else None
            if dst is None:
                self._bytes[n.id] = 0
            else:
                axis = None if n.ctor in TRANSFERS else self.snap.i64(n.args[1])
                t = self.fusion.tensors[self.names[n.cls][0]]
                self._bytes[n.id] = received_bytes(COMMS[n.ctor], src, dst, t.itemsize, axis)
        return int(self._bytes[n.id])

    def array(self) -> np.ndarray:
        """Bytes each rank receives, for every e-node (by id)."""
        for n in self.nodes:
            if n.ctor in COMMS:
                self.of(n)
        return np.maximum(self._bytes, 0)

    def bytes_of(self, bits: int, costs: _Costs) -> int:
        """Bytes each rank receives over the communicating e-nodes of bitset ``bits`` (node
        ids by ``costs.members``)."""
        bits &= self.mask
        if not bits:
            return 0
        ids = costs.members(bits)
        for i in ids[self._bytes[ids] < 0]:  # priced once per e-node
            self.of(self.nodes[int(i)])
        return int(self._bytes[ids].sum())


def received_budget(received: np.ndarray, value: int) -> Budget:
    """The budget of ``value`` bytes received per rank on the bytes per e-node ``received``
    (``Received.array``): extraction then minimizes ``time + lambda * received`` with a searched
    multiplier (``budget``); the plan's ``comm_bytes`` is the sum over its distinct e-nodes."""
    return Budget(KEYWORD, COUNTS, "the plan receiving the fewest ({bytes} bytes per rank, over the communications "
                  "the e-graph holds)", received, value)
