"""The per-rank allocation plan of a ``Program``: which storage each buffer lives in, when
each storage is live, and the peak bytes a rank holds.

Laws (what the runtimes do, and what ``runtime.simulator`` measures):

* A step's result (its ``out``; the extra outputs of a fused group are fresh storages each)
  either shares the storage of one of its operands (``shared_operand``: a
  view, such as a reshape of a contiguous buffer, ``saved`` / ``detach``, a remap that reads
  a contiguous range, a ``partial`` that keeps the buffer) or is a fresh storage of its
  local bytes.  Every fresh result is contiguous, so a view of one is contiguous too (the
  caller's inputs are taken to be contiguous, as ``shard`` makes them).
* A buffer is dropped after the step that reads it last (``last_uses``), or after the step
  that writes it when nothing reads it; the program's inputs and outputs are never dropped.
  A storage is released when its last buffer is dropped: it is live from the step that
  creates it to the last read of any buffer in it.
* Reuse: an elementwise step (or a scatter adding into its accumulator, ``codegen.scatter_add``)
  whose operand has the result's shape and dtype and whose memory
  every buffer holding it releases at that step writes its result there (``in_place``,
  ``reuse_memory``: step attribute ``into``), so it takes no fresh storage.
* The bytes a rank holds after a step (its result written, before its drops) are the local
  bytes of the program inputs it holds plus those of every live step-made storage;
  ``peak`` is the largest over the steps (and the inputs alone).  A view of an input adds
  nothing: the input's memory is the caller's, held anyway.
"""

from __future__ import annotations

import math
from collections.abc import Set
from dataclasses import dataclass, replace

from ..ir.dtypes import DTYPES
from ..ir.ops import op_kind
from ..ir.sharding import Replicate
from .remap_form import remap_is_view
from .fuse import ELEMENTWISE
from .program import Program, Step

#: buffer -> (local shape, dtype)
Meta = dict[str, tuple[tuple[int, ...], str]]


def last_uses(steps: list[Step] | tuple[Step, ...], keep: set[str]) -> dict[int, list[str]]:
    """Step index -> the buffers dropped after it: each buffer not in ``keep`` after the step
    that reads it last, or after the step that writes it when no later step reads it."""
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        for b in (*s.ins, *s.outs):
            last[b] = i
    drops: dict[int, list[str]] = {}
    for b, i in last.items():
        if b not in keep:
            drops.setdefault(i, []).append(b)
    return drops


def shared_operand(step: Step, meta: Meta, rank: int) -> int | None:
    """The operand whose storage ``step``'s result shares on ``rank`` (a view), or None for a
    fresh buffer (module docstring).  Collectives always write fresh buffers."""
    if step.kind != "local":
        return None
    op = step.attr("op")
    if op == "view":
        return 0
    if op == "remap":
        src, dst, mode = step.attr("src"), step.attr("dst"), step.attr("mode")
        return 0 if remap_is_view(mode, src, dst, step.attr("axis", -1), src.mesh.coords(rank)) else None
    if op == "partial":
        src, a = step.attr("src"), step.attr("axis")
        keeps = isinstance(src.axes[a], Replicate) and (step.attr("reduce") == "max" or src.mesh.coords(rank)[a] == 0)
        return 0 if keeps else None
    if step.attr("into") is not None:
        return step.attr("into")
    if step.attr("fop") == "pointwise":
        return None
    return op_kind(step.attr("fop")).shares_operand(step, [meta[b] for b in step.ins])


def in_place(step: Step, meta: Meta, env: dict[str, str | int], names: dict[str | int, int],
             inputs: Set[str] | None = None) -> int | None:
    """The operand an elementwise step (``fuse.ELEMENTWISE``, or a fused ``pointwise`` chain)
    or a scatter adding into an accumulator (``OpKind.accumulator``: that operand only) may
    write its result into, or None: the first operand of the result's shape and dtype, not
    read through a broadcast (nor its storage by another operand), whose storage a step made
    (not the caller's: an input's; with ``inputs``, the program's inputs, an extra output's
    storage, named by its buffer, is a step's too) and that every buffer holding it releases
    at this step (``free``): nothing reads that memory afterwards, so the result may take it
    (``into``; the runtime copies the result there).  ``env``, ``names``: each buffer's
    storage and each storage's number of buffers before the step."""
    if step.kind != "local" or step.attr("op") != "apply":
        return None
    fop = step.attr("fop")
    acc = None if fop == "pointwise" else op_kind(fop).accumulator(step)
    if fop not in ELEMENTWISE | {"pointwise"} and acc is None:
        return None
    dropped = set(step.attr("free", ()) or ())
    bcast = step.attr("bcast") or ((),) * len(step.ins)
    for k, b in enumerate(step.ins):
        if acc is not None and k != acc:
            continue
        root = env.get(b)
        made = isinstance(root, int) or inputs is not None and root is not None and root not in inputs
        if meta[b] != meta[step.out] or bcast[k] or not made:
            continue
        if any(bcast[m] and env.get(y) == root for m, y in enumerate(step.ins)):
            continue  # that memory is also read at other elements (a broadcast, a shift): not in place
        if sum(1 for x in dropped if env.get(x) == root) == names[root]:
            return k
    return None


def nbytes(meta: Meta, b: str) -> int:
    """The local bytes of buffer ``b``."""
    shape, dtype = meta[b]
    return math.prod(shape) * DTYPES[dtype].itemsize


@dataclass(frozen=True)
class Allocation:
    """One rank's allocation plan: each step-made buffer's storage (named by the step index
    that created it; an input's by the input, an extra output's by its buffer), each storage's bytes and live range (the step
    that creates it, the step after whose drops it is released; inputs from -1, and ``None``:
    held to the end), and the bytes held after each step (``held[i]``, before step i's drops);
    ``peak``: the most of them (or the inputs alone)."""

    storage: dict[str, str | int]
    bytes: dict[str | int, int]
    live: dict[str | int, tuple[int, int | None]]
    held: tuple[int, ...]
    peak: int
    #: steps marked ``into`` whose operand's memory something still holds (never in a
    #: program ``lower`` made: ``reuse_memory`` drops such marks)
    unsafe: tuple[int, ...] = ()

    def saved_bytes(self, program: Program) -> int:
        """The bytes of the saved activations (``Program.saved_buffers``) this rank holds:
        each storage once, none of an input (a view of a parameter keeps nothing)."""
        roots = {self.storage[b] for b in program.saved_buffers if b in self.storage}
        return sum(self.bytes[r] for r in roots if r not in program.inputs)


def writes(program: Program, step: Step, rank: int) -> bool:
    """Does ``step`` leave its result on ``rank``: a rank of its team or mesh, a ``send_recv``
    destination."""
    if step.kind == "send_recv":
        return any(dst == rank for _, dst in step.attr("pairs"))
    explicit = step.attr("ranks")
    return rank in (tuple(explicit) if explicit is not None else program.ranks_on(step.attr("on")))


def allocate(program: Program, meta: Meta, rank: int, reuse: dict[int, int] | None = None) -> Allocation:
    """Rank ``rank``'s allocation plan (module docstring), by walking the program as the
    runtimes do: each name refers to a storage, and a storage is released with its last name.
    ``reuse``, when given, is filled with the steps that may write their result in place
    (``in_place``), step -> operand, and the walk assumes they do."""
    env: dict[str, str | int] = {b: b for b in program.inputs if rank in program.input_ranks(b)}
    ins = set(program.inputs)  # (the other storages named by a buffer: extra outputs, which steps made)
    size: dict[str | int, int] = {b: nbytes(meta, b) for b in env}
    live: dict[str | int, tuple[int, int | None]] = {b: (-1, None) for b in env}
    names: dict[str | int, int] = {b: 1 for b in env}
    storage: dict[str, str | int] = dict(env)
    start = now = sum(size.values())
    held: list[int] = []
    unsafe: list[int] = []

    def drop(b: str, i: int) -> int:
        root = env.pop(b)
        names[root] -= 1
        if names[root]:
            return 0
        live[root] = (live[root][0], i)
        return size[root]

    for i, s in enumerate(program.steps):
        if s.kind == "send_recv" and s.out in env:  # every rank's old result goes (simulator)
            now -= drop(s.out, i)
        if writes(program, s, rank):
            if s.attr("into") is not None and in_place(s, meta, env, names, ins) != s.attr("into"):
                unsafe.append(i)
            k = shared_operand(s, meta, rank)
            if k is None and reuse is not None:
                k = in_place(s, meta, env, names, ins)
                if k is not None:
                    reuse[i] = k
            root = i if k is None else env[s.ins[k]]
            if s.out in env:
                now -= drop(s.out, i)
            if k is None:
                size[i], live[i], names[i] = nbytes(meta, s.out), (i, None), 0
                now += size[i]
            env[s.out] = storage[s.out] = root
            names[root] += 1
            for b in s.outs[1:]:  # a fused group's extra outputs: fresh storages, named by their buffers
                size[b], live[b], names[b] = nbytes(meta, b), (i, None), 1
                env[b] = storage[b] = b
                now += size[b]
        held.append(now)
        for b in s.attr("free", ()) or ():
            if b in env:
                now -= drop(b, i)
    return Allocation(storage, size, live, tuple(held), max([start, *held]), tuple(unsafe))


def alike_ranks(program: Program, meta: Meta) -> list[int]:
    """One rank of each class of ranks whose allocation plans are equal (``allocate``), in mesh
    order.  Law: ``allocate`` reads its rank only in which inputs the rank binds, which steps
    leave a result on it (``writes``) and which operand a step's result shares there
    (``shared_operand``: a remap or a ``partial`` by the rank's mesh coordinates); ranks that
    agree on all of them walk the program alike, so one of them stands for all (an SPMD
    program of even shards: one rank for the whole mesh)."""
    varying = [i for i, s in enumerate(program.steps)
               if s.kind == "send_recv" or s.attr("ranks") is not None or s.attr("on") is not None
               or s.kind == "local" and s.attr("op") in ("remap", "partial")]
    out, seen = [], set()
    for r in program.mesh_ranks:
        key = (tuple(r in program.input_ranks(b) for b in program.inputs),
               tuple(writes(program, program.steps[i], r) and (shared_operand(program.steps[i], meta, r),)
                     for i in varying))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def reuse_memory(program: Program, meta: Meta) -> Program:
    """``program`` with ``into`` on every elementwise step that may write its result into a
    dying operand's memory on every rank (``in_place``; the same operand on each), checked
    again on the marked program (a mark whose operand's memory outlives the step is dropped)."""
    decided = []
    ranks = alike_ranks(program, meta)
    for r in ranks:
        allocate(program, meta, r, reuse := {})
        decided.append(reuse)
    marks = {i: k for i, k in decided[0].items() if all(d.get(i) == k for d in decided[1:])}
    while True:
        marked = replace(program, steps=tuple(
            s.with_attrs(into=marks[i]) if i in marks else s
            for i, s in enumerate(program.steps)))
        unsafe = {i for r in ranks for i in allocate(marked, meta, r).unsafe}
        if not unsafe:
            return marked
        marks = {i: k for i, k in marks.items() if i not in unsafe}
