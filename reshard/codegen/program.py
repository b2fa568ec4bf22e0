"""The per-rank host program: what codegen produces and the runtime executes.

A ``Program`` is SPMD: the same list of steps on every rank of a mesh.  Buffers are named
by strings.  Each step reads ``ins`` and writes ``out``.  Collective steps act on the
*teams* of one mesh axis (all teams of that axis run the collective in parallel);
``team`` below means the ranks sharing every mesh coordinate but the one along ``axis``,
in axis order t_0..t_{n-1} (``DeviceMesh.team``).

Collective semantics (x_j = the input buffer on team member t_j; chunks are equal,
contiguous, along the named tensor dim):

======================  =========================================================
``allgather``           out on every member = cat([x_0, ..., x_{n-1}], dim)
``reduce_scatter``      out on t_i = chunk_i(reduce_op(x_0..x_{n-1}), dim)
``allreduce``           out on every member = reduce_op(x_0..x_{n-1})
``all_to_all``          out on t_i = cat([chunk_i(x_j, split_dim) for j], cat_dim)
``broadcast``           out on every member = x_root
``scatter``             out on t_i = chunk_i(x_root, dim)
``gather``              out on t_root = cat([x_0..x_{n-1}], dim); others get nothing
``send_recv``           attrs ``pairs`` = ((src_rank, dst_rank), ...) global ranks;
                        out on dst = x on src (ranks not a dst get nothing)
======================  =========================================================

``reduce_op`` is "sum" or "max".

Multi-mesh programs (cross-mesh transfers): ``mesh_shape`` is (k, *S), k meshes of shape S
stacked along axis 0 (``meshes`` = k; 0 for a one-mesh program).  A step with attribute
``on`` = j runs only on mesh j's ranks: a local step on those ranks, a team collective on
the teams of its axis inside mesh j (axis a of mesh j is stacked axis a + 1, so teams never
cross meshes).  A ``broadcast``/``scatter`` with attribute ``ranks`` runs on that explicit
team (global ranks, in team order; ``root`` indexes it); members other than the root need
not hold the input buffer.  ``inputs_on``/``outputs_on`` give each input/output buffer's
mesh.  Local steps (``kind == "local"``) carry an ``op`` name and
attributes; their meaning is in ``reshard.runtime.local_ops``.

Shardings: the ``src``/``dst`` attributes of ``remap`` and ``partial`` steps are
``TensorSharding`` objects, the ones lowering chose, which the runtime reads as they are.
``Program.shardings`` is the table of them (in order of first use); the canonical JSON
(``to_json``, hence ``digest``) writes that table once and each step attribute as its index
into it.  The JSON is for hashing and comparing programs, never parsed back to run one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..ir.collective_kinds import KIND_NAMES
from ..ir.sharding import TensorSharding, sharding_to_spec

#: every communication step kind (``ir.collective_kinds``)
COLLECTIVES = frozenset(KIND_NAMES)


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


@dataclass(frozen=True)
class Step:
    """One step of the host program.

    kind: "local" or one of ``COLLECTIVES``.
    out: the buffer written (a local step may write more: ``outs``).  ins: the buffers read.
    attrs: for collectives ``axis`` (mesh axis index) plus the table above; for local
    steps ``op`` and that op's parameters.  Stored as a sorted tuple of pairs (hashable).
    """

    kind: str
    out: str
    ins: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = field(default=())

    @staticmethod
    def make(kind: str, out: str, ins: tuple[str, ...] | list[str], **attrs: Any) -> "Step":
        return Step(kind, out, tuple(ins), _freeze(attrs))

    def with_attrs(self, *, out: str | None = None, ins: tuple[str, ...] | list[str] | None = None,
                   **attrs: Any) -> "Step":
        """This step writing ``out`` and reading ``ins`` (default: its own) with ``attrs`` added
        or replaced; ``Step.make`` of them all, but its other attributes are kept as they are,
        not frozen again (already frozen; a fused group's are large: re-freezing them was most
        of lowering's memory reuse, ``alloc.reuse_memory``)."""
        merged = dict(self.attrs)
        merged.update((k, _freeze(v)) for k, v in attrs.items())
        return Step(self.kind, self.out if out is None else out, self.ins if ins is None else tuple(ins),
                    tuple(sorted(merged.items())))

    @cached_property
    def _attr_map(self) -> dict[str, Any]:
        """``attrs`` as a dict, made once (a step's attributes are read on every run)."""
        return dict(self.attrs)

    def attr(self, name: str, default: Any = None) -> Any:
        return self._attr_map.get(name, default)

    @property
    def outs(self) -> tuple[str, ...]:
        """Every buffer the step writes: ``out``, then its ``extra_outs`` (a fused pointwise
        group's other results, ``codegen.fuse``), in that order."""
        return (self.out, *self.attr("extra_outs", ()))

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVES

    def shardings(self) -> tuple[TensorSharding, ...]:
        """The ``TensorSharding`` attribute values, in attribute order."""
        return tuple(v for _, v in self.attrs if isinstance(v, TensorSharding))

    def to_json(self, table: dict[TensorSharding, int]) -> list[Any]:
        """Canonical JSON form; a ``TensorSharding`` attribute is its index in ``table``."""
        return [self.kind, self.out, list(self.ins),
                [[k, table[v] if isinstance(v, TensorSharding) else v] for k, v in self.attrs]]


@dataclass(frozen=True)
class Program:
    """An SPMD per-rank program over ``mesh_shape``/``mesh_ranks``.

    inputs: buffer names bound by the caller (local tensors); outputs: buffers returned.
    """

    mesh_shape: tuple[int, ...]
    mesh_ranks: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[Step, ...]
    #: multi-mesh programs: the number of stacked meshes (0: one mesh; see the module docstring)
    meshes: int = 0
    #: multi-mesh programs: the mesh index of each input / output buffer
    inputs_on: tuple[int, ...] = ()
    outputs_on: tuple[int, ...] = ()
    #: training programs (``passes.phases``): the index of the first backward-phase step (every
    #: step before it is forward phase); None: no backward phase
    backward_from: int | None = None

    @cached_property
    def saved_buffers(self) -> tuple[str, ...]:
        """The saved activations: buffers written by forward steps and read by backward ones
        (the program's inputs are not written by steps: alive anyway); all alive at the boundary."""
        if self.backward_from is None:
            return ()
        made = {b for s in self.steps[:self.backward_from] for b in s.outs}
        return tuple(sorted(made & {b for s in self.steps[self.backward_from:] for b in s.ins}))

    @cached_property
    def shardings(self) -> tuple[TensorSharding, ...]:
        """The table of the shardings the steps carry, each once, in order of first use."""
        return tuple(dict.fromkeys(ts for step in self.steps for ts in step.shardings()))

    def ranks_of(self, step: Step) -> tuple[int, ...]:
        """The ranks that take part in ``step``: its explicit ``ranks``, else the ranks of its
        mesh ``on`` (every rank of the program when it has none)."""
        explicit = step.attr("ranks")
        return tuple(explicit) if explicit is not None else self.ranks_on(step.attr("on"))

    @cached_property
    def step_ranks(self) -> tuple[tuple[int, ...], ...]:
        """``ranks_of`` each step, in order, worked out once (the walk reads it every step)."""
        return tuple(self.ranks_of(s) for s in self.steps)

    def ranks_on(self, j: int | None) -> tuple[int, ...]:
        """The ranks of mesh ``j`` of a multi-mesh program (every rank for ``j`` None)."""
        if j is None or not self.meshes:
            return tuple(self.mesh_ranks)
        if not isinstance(j, int) or isinstance(j, bool) or not 0 <= j < self.meshes:
            from ..ir.errors import ReshardError
            raise ReshardError(f"program step attribute on={j!r}: not one of the program's {self.meshes} meshes")
        per = len(self.mesh_ranks) // self.meshes
        return tuple(self.mesh_ranks[j * per:(j + 1) * per])

    def input_ranks(self, name: str) -> tuple[int, ...]:
        """The ranks that must bind input buffer ``name``."""
        if not self.inputs_on:
            return tuple(self.mesh_ranks)
        return self.ranks_on(self.inputs_on[self.inputs.index(name)])

    def output_ranks(self, name: str) -> tuple[int, ...]:
        """The ranks that hold output buffer ``name`` after the run."""
        if not self.outputs_on:
            return tuple(self.mesh_ranks)
        return self.ranks_on(self.outputs_on[self.outputs.index(name)])

    def to_json(self) -> str:
        table = {ts: i for i, ts in enumerate(self.shardings)}
        body = {
            "mesh_shape": list(self.mesh_shape),
            "mesh_ranks": list(self.mesh_ranks),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "steps": [s.to_json(table) for s in self.steps],
        }
        if table:  # programs without remap/partial steps keep their digests
            body["shardings"] = [sharding_to_spec(ts) for ts in self.shardings]
        if self.backward_from is not None:  # programs without a backward phase keep their digests
            body["backward_from"] = self.backward_from
        if self.meshes:  # one-mesh programs keep their digests
            body.update(meshes=self.meshes, inputs_on=list(self.inputs_on), outputs_on=list(self.outputs_on))
        return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)

    def digest(self) -> str:
        """sha256 of the canonical JSON: equal on every rank iff the programs are equal."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()
