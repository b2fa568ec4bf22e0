"""The decoded plan's nodes (``PlanNode``) and the rejected alternatives priced for them
(``Alternative``): what extraction hands to lowering, ``Plan.explain`` and ``Plan.draw``.

An e-node's constructor is decoded here, once, into a ``Head``: a ``Tag`` saying what the node
does (``INPUT``, ``APPLY``, ``COLLECTIVE``, ``LOCAL`` reshard, cross-mesh ``TRANSFER``) and the
arguments that tag reads.  Lowering and the explanations dispatch on the tag and never see an
e-graph constructor name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Sequence

from ..ir.collective_kinds import KIND
from ..ir.sharding import TensorSharding
from ..rules.collectives import BY_CTOR
from ..rules.schema import LOCAL_RESHARDS, OP_CTORS, T_CONSTRUCTORS
from ..search.snapshot import Snapshot, _arg_value
from .dag import ENode


class Tag(Enum):
    """What a plan node does."""

    #: a program input, fed by the caller at the node's sharding (``input_name``)
    INPUT = "input"
    #: Fusion op ``op`` run on local tensors (``form``: how, below)
    APPLY = "apply"
    #: a team collective on mesh axis ``axis`` (``form``: its ``ir.collective_kinds`` name)
    COLLECTIVE = "collective"
    #: a change of mesh axis ``axis``'s placement that moves no data (``form``: "local slice",
    #: R -> S, or "local partial", R or S -> P)
    LOCAL = "local reshard"
    #: a cross-mesh transfer (``form``: its collective kind name; ``src``: the source device of
    #: a broadcast or scatter)
    TRANSFER = "transfer"


#: ``APPLY`` forms: the op on its operands' blocks; a broadcast building its block of a result
#: sharded on expanded dims (``rules.expand``); a scatter writing the rows of its result block
#: (``rules.lookup``)
APPLY_FORMS = {"Loc": "local", "Loc2": "local", "Loc3": "local", "Loc4": "local", "Loc5": "local", "MMT": "local",
               "Expand": "expand", "LocAt": "scatter rows"}

#: ``LOCAL`` forms: how plans and alternatives name the resharding steps that move no data
LOCAL_FORMS: tuple[str, ...] = tuple(LOCAL_RESHARDS.values())


@dataclass(frozen=True)
class Head:
    """What one e-node does, decoded from its constructor and arguments (module docstring):
    ``tag``, ``form`` (per tag), the Fusion ``op`` it applies, the mesh ``axis`` it changes, the
    ``input_name`` it feeds, the ``src`` device of a transfer, and which matmul operands it
    reads through a transposed view (``transposed``: lhs, rhs)."""

    tag: Tag
    form: str = ""
    op: int | None = None
    axis: int | None = None
    input_name: str | None = None
    src: int | None = None
    transposed: tuple[bool, bool] = (False, False)

    @property
    def communicates(self) -> bool:
        """Whether devices exchange data: a team collective or a cross-mesh transfer."""
        return self.tag in (Tag.COLLECTIVE, Tag.TRANSFER)

    @property
    def label(self) -> str:
        """How explanations name a resharding node: its collective kind's label, or its local form."""
        return KIND[self.form].label if self.communicates else self.form


def tag_of(ctor: str) -> Tag:
    """The tag of e-graph constructor ``ctor`` (``rules.schema``'s T constructors)."""
    if ctor == "InAt":
        return Tag.INPUT
    if ctor in OP_CTORS:
        return Tag.APPLY
    if ctor in LOCAL_RESHARDS:
        return Tag.LOCAL
    return Tag.TRANSFER if BY_CTOR[ctor].cross_mesh else Tag.COLLECTIVE


def decode(ctor: str, vals: Sequence[Any]) -> Head:
    """The ``Head`` of an e-node of constructor ``ctor`` whose arguments are ``vals`` (i64 and
    String arguments as Python values, in ``rules.schema.T_CONSTRUCTORS``'s order)."""
    tag = tag_of(ctor)
    if tag is Tag.INPUT:
        return Head(tag, input_name=vals[0])
    if tag is Tag.APPLY:
        side = vals[3] if ctor == "MMT" else 0  # operands read through a transposed view (``alias``)
        return Head(tag, APPLY_FORMS[ctor], op=vals[0], transposed=(bool(side & 1), bool(side & 2)))
    if tag is Tag.LOCAL:
        return Head(tag, LOCAL_RESHARDS[ctor], axis=vals[1])
    kind = BY_CTOR[ctor].name
    if tag is Tag.COLLECTIVE:
        return Head(tag, kind, axis=vals[1])
    return Head(tag, kind, src=vals[2] if len(vals) > 2 else None)  # a broadcast's or scatter's source


def enode_head(snap: Snapshot, n: ENode) -> Head:
    """The ``Head`` of e-node ``n`` of snapshot ``snap`` (``decode`` of its arguments' values)."""
    return decode(n.ctor, [_arg_value(snap, s, v) for s, v in zip(T_CONSTRUCTORS[n.ctor], n.args)])


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
    """One chosen implementation: ``head`` what it does (``Tag`` and its arguments); ``value``
    the Fusion tensor id; ``sharding`` its distribution; ``args`` the operand PlanNodes."""

    uid: int
    head: Head
    value: int
    sharding: TensorSharding
    args: tuple["PlanNode", ...]
    cost_ps: int
    #: the e-node id
    enode: int = -1
    #: prices every plan node's rejected alternatives on first use (only explanations need
    #: them, and pricing costs about as much as extraction itself); called with this node. It
    #: holds the e-graph snapshot but no strong reference back to the plan's nodes, so a dropped
    #: plan is freed by reference counting, not left as cyclic garbage for the collector
    pending: Callable[["PlanNode"], None] | None = field(default=None, repr=False)
    _alternatives: list[Alternative] = field(default_factory=list, repr=False)
    _subplan: tuple[int, int] = (0, 0)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to other processes) without the pending pricing, which holds the e-graph."""
        state = dict(self.__dict__)
        state["pending"] = None
        return state

    def _priced(self) -> None:
        if self.pending is not None:
            self.pending(self)

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
