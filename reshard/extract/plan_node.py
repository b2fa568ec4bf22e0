"""The decoded plan's nodes (``PlanNode``) and the rejected alternatives priced for them
(``Alternative``): what extraction hands to lowering, ``Plan.explain`` and ``Plan.draw``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..ir.sharding import TensorSharding


@dataclass(frozen=True)
class Alternative:
    """One rejected way to produce a plan node's value (see module docstring).

    ``new_comms`` describes the collectives of the alternative's sub-plan that the chosen
    plan does not run (e.g. the allgather *before* a matmul)."""

    scope: str
    description: str
    cost_ps: int
    bytes: int
    plan_cost_ps: int
    plan_bytes: int
    new_comms: tuple[str, ...] = ()
    #: the alternative's e-node id, and the e-node ids of the whole plan with it substituted
    #: (a bitset, bit i = e-node i: extracting from those nodes alone forces the alternative;
    #: not in the repr, which could not print it for large e-graphs)
    enode: int = -1
    plan_nodes: int = field(default=0, repr=False)


@dataclass(eq=False)
class PlanNode:
    """One chosen implementation: ``kind`` is a T constructor name; ``value`` the Fusion
    tensor id; ``sharding`` its distribution; ``args`` the operand PlanNodes."""

    uid: int
    kind: str
    value: int
    sharding: TensorSharding
    args: tuple["PlanNode", ...]
    cost_ps: int
    op: int | None = None
    axis: int | None = None
    input_name: str | None = None
    #: the e-node id
    enode: int = -1
    #: cross-mesh ``Bcast``/``Scatter``: the index (row-major) of the source device on the
    #: operand's mesh
    src: int | None = None
    #: ``MMT``: which matmul operands are read through a transposed view (lhs, rhs)
    transposed: tuple[bool, bool] = (False, False)
    #: prices every plan node's rejected alternatives on first use (only explanations need
    #: them, and pricing costs about as much as extraction itself)
    pending: Callable[[], None] | None = field(default=None, repr=False)
    _alternatives: list[Alternative] = field(default_factory=list, repr=False)
    _subplan: tuple[int, int] = (0, 0)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to other processes) without the pending pricing, which holds the e-graph."""
        state = dict(self.__dict__)
        state["pending"] = None
        return state

    def _priced(self) -> None:
        if self.pending is not None:
            self.pending()

    @property
    def alternatives(self) -> list[Alternative]:
        """Rejected ways to produce this value (see ``reshard.alternatives.Explainer``), cheapest first."""
        self._priced()
        return self._alternatives

    @alternatives.setter
    def alternatives(self, v: list[Alternative]) -> None:
        self._alternatives = v

    @property
    def subplan_cost_ps(self) -> int:
        """DAG cost of this node's own sub-plan."""
        self._priced()
        return self._subplan[0]

    @subplan_cost_ps.setter
    def subplan_cost_ps(self, v: int) -> None:
        self._subplan = (v, self._subplan[1])

    @property
    def subplan_bytes(self) -> int:
        """Bytes received per rank over this node's own sub-plan."""
        self._priced()
        return self._subplan[1]

    @subplan_bytes.setter
    def subplan_bytes(self, v: int) -> None:
        self._subplan = (self._subplan[0], v)
