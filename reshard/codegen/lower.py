"""Extracted plan (PlanNodes) -> SPMD host program.

Each PlanNode becomes a few steps on buffers named after it:

* ``InAt``: a program input (the caller feeds the local shard at the chosen sharding);
* ``Loc``/``Loc2``: one ``apply`` step (``reshape`` and ``redistribute`` to the dist a
  value already has are views);
* ``AllGather``: flatten -> ``allgather`` -> ``remap gather``;
* ``LocalSlice``: ``remap slice`` (no communication);
* ``AllReduce``: ``allreduce``;
* ``ReduceScatter``: ``remap scatter`` -> ``reduce_scatter`` -> view;
* ``AllToAll``: ``remap a2a_send`` -> ``all_to_all`` -> ``remap a2a_recv``.

Collectives always act on flat buffers along dim 0 (what NCCL moves); the remaps put
elements where the shardings say.  Buffers are freed after their last use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..egraph_rules.extract import PlanNode
from ..ir.errors import ReshardError
from ..ir.fusion import Fusion
from ..ir.sharding import Partial, TensorSharding, sharding_to_spec
from .program import Program, Step


@dataclass(frozen=True)
class Communication:
    """One collective of a plan.  ``bytes`` is the per-rank buffer NCCL is handed (result
    of an allgather, operand of the others); ``moved_bytes`` what each rank receives."""

    kind: str
    axis: str
    team_size: int
    tensor: str
    src: str
    dst: str
    bytes: int
    moved_bytes: int
    cost_s: float


@dataclass(frozen=True)
class LoweredPlan:
    program: Program
    inputs: tuple[tuple[str, str, TensorSharding], ...]      # buffer, input name, sharding
    outputs: tuple[tuple[str, TensorSharding], ...]          # buffer, sharding
    local_inputs: dict[str, tuple[tuple[int, ...], str]]     # buffer -> (local shape, dtype)
    communications: tuple[Communication, ...]
    nodes: tuple[PlanNode, ...]


_MOVED = {"allgather": (1, 1), "reduce_scatter": (1, 1), "allreduce": (2, 1), "all_to_all": (1, 1)}


def _topo(roots: list[PlanNode]) -> list[PlanNode]:
    order: list[PlanNode] = []
    seen: set[int] = set()
    stack: list[tuple[PlanNode, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if n.uid in seen:
            continue
        seen.add(n.uid)
        stack.append((n, True))
        stack.extend((a, False) for a in reversed(n.args) if a.uid not in seen)
    return order


def _apply_attrs(fusion: Fusion, op_index: int, out: PlanNode) -> dict:
    op = fusion.ops[op_index]
    t = fusion.tensors[op.output]
    attrs: dict = {"op": "apply", "fop": op.kind}
    a = op.attrs
    if op.kind in ("unary", "binary"):
        attrs["fn"] = a["fn"]
    elif op.kind == "scale":
        attrs["factor"] = a["factor"]
    elif op.kind == "cast":
        attrs["dtype"] = t.dtype
    elif op.kind == "reshape":
        attrs["shape"] = out.sharding.local_shape
    elif op.kind == "permute":
        attrs["perm"] = a["perm"]
    elif op.kind in ("slice", "pad", "cat"):
        attrs.update({k: v for k, v in a.items() if k in ("dim", "start", "stop", "lo", "hi")})
    elif op.kind == "reduce":
        attrs["fn"], attrs["dims"] = a["fn"], a["dims"]
        src = fusion.tensors[op.inputs[0]]
        attrs["count"] = math.prod(src.shape[d] for d in a["dims"])
    return attrs


def lower(fusion: Fusion, roots: list[PlanNode], seconds_per_ps: float = 1e-12) -> LoweredPlan:
    """Turn the extracted plan into a host program (identical on every rank)."""
    mesh = roots[0].sharding.mesh
    order = _topo(roots)
    buf: dict[int, str] = {}
    steps: list[Step] = []
    inputs: list[tuple[str, str, TensorSharding]] = []
    local_inputs: dict[str, tuple[tuple[int, ...], str]] = {}
    comms: list[Communication] = []
    for n in order:
        t = fusion.tensors[n.value]
        name = f"b{n.uid}"
        spec_out = sharding_to_spec(n.sharding)
        ins = [buf[a.uid] for a in n.args]
        if n.kind == "InAt":
            name = f"{n.input_name}@{n.uid}"
            inputs.append((name, n.input_name, n.sharding))
            local_inputs[name] = (n.sharding.local_shape, t.dtype)
        elif n.kind in ("Loc", "Loc2"):
            op = fusion.ops[n.op]
            if op.kind == "redistribute":
                name = ins[0]
            else:
                steps.append(Step.make("local", name, ins, **_apply_attrs(fusion, n.op, n)))
        else:
            a = n.axis
            src = n.args[0].sharding
            spec_in = sharding_to_spec(src)
            team = mesh.shape[a]
            local_bytes_in = math.prod(src.local_shape) * t.itemsize
            local_bytes_out = math.prod(n.sharding.local_shape) * t.itemsize
            kind = {"AllGather": "allgather", "AllReduce": "allreduce", "ReduceScatter": "reduce_scatter",
                    "AllToAll": "all_to_all"}.get(n.kind)
            if n.kind == "LocalSlice":
                steps.append(Step.make("local", name, ins, op="remap", mode="slice", src=spec_in, dst=spec_out,
                                       axis=a))
            elif n.kind == "AllGather":
                steps.append(Step.make("local", name + ".flat", ins, op="view", shape=(-1,)))
                steps.append(Step.make("allgather", name + ".all", [name + ".flat"], axis=a, dim=0))
                steps.append(Step.make("local", name, [name + ".all"], op="remap", mode="gather", src=spec_in,
                                       dst=spec_out, axis=a))
            elif n.kind == "AllReduce":
                p = src.axes[a]
                if not isinstance(p, Partial):
                    raise ReshardError(f"internal: AllReduce of a non-partial axis in {src}")
                steps.append(Step.make("allreduce", name, ins, axis=a, op=p.op))
            elif n.kind == "ReduceScatter":
                steps.append(Step.make("local", name + ".send", ins, op="remap", mode="scatter", src=spec_in,
                                       dst=spec_out, axis=a))
                steps.append(Step.make("reduce_scatter", name + ".flat", [name + ".send"], axis=a, dim=0,
                                       op="sum"))
                steps.append(Step.make("local", name, [name + ".flat"], op="view", shape=n.sharding.local_shape))
            elif n.kind == "AllToAll":
                steps.append(Step.make("local", name + ".send", ins, op="remap", mode="a2a_send", src=spec_in,
                                       dst=spec_out, axis=a))
                steps.append(Step.make("all_to_all", name + ".recv", [name + ".send"], axis=a, split_dim=0,
                                       cat_dim=0))
                steps.append(Step.make("local", name, [name + ".recv"], op="remap", mode="a2a_recv",
                                       src=spec_in, dst=spec_out, axis=a))
            else:
                raise ReshardError(f"internal: cannot lower plan node kind {n.kind!r}")
            if kind is not None:
                size = local_bytes_out if kind == "allgather" else local_bytes_in
                mul, div = _MOVED[kind]
                comms.append(Communication(kind, mesh.axis_names[a], team, t.name, str(src), str(n.sharding),
                                           size, size * mul * (team - 1) // (div * team), n.cost_ps * seconds_per_ps))
        buf[n.uid] = name
    outputs = tuple((buf[r.uid], ts) for r, (_, ts) in zip(roots, fusion.outputs))
    steps = _add_frees(steps, {b for b, _ in outputs} | set(local_inputs))
    program = Program(tuple(mesh.shape), tuple(mesh.ranks), tuple(local_inputs), tuple(b for b, _ in outputs),
                      tuple(steps))
    return LoweredPlan(program, tuple(inputs), outputs, local_inputs, tuple(comms), tuple(order))


def _add_frees(steps: list[Step], keep: set[str]) -> list[Step]:
    """Attach ``free`` to the step after which a buffer is last read."""
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        for b in s.ins:
            last[b] = i
    frees: dict[int, list[str]] = {}
    for b, i in last.items():
        if b not in keep:
            frees.setdefault(i, []).append(b)
    out = []
    for i, s in enumerate(steps):
        if i in frees:
            s = Step(s.kind, s.out, s.ins, tuple(sorted(s.attrs + (("free", tuple(sorted(frees[i]))),))))
        out.append(s)
    return out
