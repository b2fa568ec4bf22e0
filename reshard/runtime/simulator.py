"""In-process simulator: run an SPMD ``Program`` over all ranks of its mesh in one process.

Each rank has an environment ``{buffer name: tensor}``, seeded from ``inputs[rank]``.  Steps
run in order on every rank:

* ``kind == "local"``: ``local_step(step, env, rank)`` is called for each rank (in mesh
  order) and its result is stored under ``step.out`` in that rank's env (a step writing
  several buffers, ``Step.outs``, returns one tensor per buffer: ``local_results``).
* a team collective: runs over every team of mesh axis ``step.attr("axis")`` (an axis index
  or name) with the functions of ``reshard.runtime.collectives``; member t_i's output is
  stored under ``step.out`` on t_i (members that get nothing, e.g. non-roots of ``gather``,
  end up without ``step.out``).
* ``send_recv``: over the global ``(src, dst)`` pairs of ``step.attr("pairs")``.
* multi-mesh programs (``Program.meshes``): a step with ``on`` = j runs on mesh j's ranks
  only (local steps there, team collectives on the teams inside mesh j); a step with
  ``ranks`` runs on exactly those ranks (a ``broadcast``/``scatter`` on that explicit team, in
  that order; members other than the root need not hold the input).  Inputs are required
  on the ranks of their own mesh (``Program.input_ranks``).

A step attribute ``"free"`` (tuple of buffer names) drops those buffers from every rank's
env after the step.  The result maps each rank to its ``program.outputs`` buffers (a buffer a
rank does not hold, such as a non-root ``gather`` result, is absent from its dict).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..codegen.program import Program, Step
from ..ir.collective_kinds import KIND, TEAM_KIND_NAMES
from ..ir.errors import ReshardError
from ..ir.mesh import DeviceMesh
from . import collectives as C
from .walk import walk

Tensor = torch.Tensor
Env = dict[str, Tensor]
LocalStep = Callable[[Step, Env, int], Tensor | tuple[Tensor, ...]]

__all__ = ["simulate", "held_bytes", "build_mesh", "run_team_collective", "step_teams",
           "local_results"]


def local_results(step: Step, out: object, where: Callable[[], str]) -> list[tuple[str, Tensor]]:
    """(buffer, tensor) of each buffer local step ``step`` writes (``Step.outs``), from what a
    ``local_step`` returned: a tensor, or for a step writing several buffers a tuple of one
    per buffer.  ``ReshardError`` (``where()`` names the step: made only then) for anything else."""
    outs = step.outs
    if len(outs) == 1 and isinstance(out, Tensor):
        return [(step.out, out)]
    got = out if len(outs) > 1 else (out,)
    if not isinstance(got, tuple) or len(got) != len(outs) or not all(isinstance(t, Tensor) for t in got):
        raise ReshardError(f"{where()}: local_step returned {type(out).__name__}, not "
                           + ("a torch.Tensor" if len(outs) == 1 else f"a tuple of {len(outs)} torch.Tensors"))
    return list(zip(outs, got))


def step_teams(program: Program, mesh: DeviceMesh, step: Step, idx: int) -> list[tuple[int, ...]]:
    """The teams a team collective runs on: its explicit ``ranks`` team, else the teams of its
    axis (inside its mesh ``on``)."""
    explicit = step.attr("ranks")
    if explicit is not None:
        team = tuple(explicit)
        bad = [r for r in team if r not in mesh]
        if bad or len(set(team)) != len(team) or not team:
            raise ReshardError(f"step {idx} ({step.kind} -> {step.out!r}): explicit team {team} must be distinct "
                               f"ranks of {mesh!r}")
        return [team]
    axis = _required(step, idx, "axis")
    try:
        teams = mesh.teams(axis)  # type: ignore[arg-type]
    except ReshardError as e:
        raise ReshardError(f"step {idx} ({step.kind} -> {step.out!r}): {e}") from None
    if step.attr("on") is None:
        return teams
    on = set(program.ranks_on(step.attr("on")))
    return [t for t in teams if t[0] in on]


def build_mesh(program: Program, axis_names: Sequence[str] | None = None) -> DeviceMesh:
    """The program's mesh: ``mesh_ranks`` (row-major) reshaped to ``mesh_shape``, its axes named
    ``axis_names`` (the plan's mesh's, for messages; default ``x``, ``y``, ...: a program holds
    axis indices only)."""
    shape, ranks = tuple(program.mesh_shape), list(program.mesh_ranks)
    size = 1
    for s in shape:
        size *= s
    if not shape or size != len(ranks):
        raise ReshardError(f"simulate: mesh_shape {shape} does not fit {len(ranks)} mesh_ranks {ranks}")
    nested: object = ranks
    for s in reversed(shape[1:]):
        flat = nested  # type: ignore[assignment]
        nested = [flat[i:i + s] for i in range(0, len(flat), s)]  # type: ignore[index]
    return DeviceMesh(nested, axis_names)


def _required(step: Step, idx: int, name: str) -> object:
    v = step.attr(name)
    if v is None:
        raise ReshardError(f"step {idx} ({step.kind} -> {step.out!r}): missing attribute {name!r}")
    return v


def run_team_collective(step: Step, idx: int, xs: list[Tensor]) -> list[Tensor | None]:
    """Apply the team collective ``step`` (index ``idx``, for messages) to one team's inputs.
    The reference function is ``collectives.<kind>``, called with the kind's required
    ``attrs`` (``ir.collective_kinds``) in order, then its ``op`` (default "sum") when it
    reduces."""
    if step.kind not in TEAM_KIND_NAMES:
        raise ReshardError(f"step {idx}: unknown step kind {step.kind!r}")
    ck = KIND[step.kind]
    args = [_required(step, idx, a) for a in ck.attrs]
    if ck.reduce_ops:
        args.append(step.attr("op", "sum"))
    return getattr(C, ck.name)(xs, *args)


def _read(envs: dict[int, Env], rank: int, step: Step, idx: int, name: str) -> Tensor:
    if name not in envs[rank]:
        raise ReshardError(
            f"step {idx} ({step.kind} -> {step.out!r}): rank {rank} has no buffer {name!r} "
            f"(it holds {sorted(envs[rank])})"
        )
    return envs[rank][name]


def _single_input(step: Step, idx: int) -> str:
    if len(step.ins) != 1:
        raise ReshardError(f"step {idx} ({step.kind} -> {step.out!r}): expected exactly 1 input buffer, got {step.ins}")
    return step.ins[0]


def held_bytes(env: Env, inputs: list[str]) -> int:
    """The bytes a rank holds: each of its ``inputs``' bytes (the caller's memory), plus each
    distinct storage of the other buffers that no input shares (a view of an input adds
    nothing), whole (a view of part of a storage holds all of it)."""
    caller = {env[b].untyped_storage().data_ptr() for b in inputs}
    own = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in env.values()}
    return (sum(env[b].numel() * env[b].element_size() for b in inputs)
            + sum(n for p, n in own.items() if p not in caller))


def simulate(
    program: Program,
    inputs: dict[int, dict[str, Tensor]],
    local_step: LocalStep,
    stats: dict[str, dict[int, int]] | None = None,
) -> dict[int, dict[str, Tensor]]:
    """Run ``program`` on every rank of its mesh; return ``{rank: {output name: tensor}}``.

    ``inputs[rank]`` binds ``program.inputs`` on each rank (extra buffers are allowed).
    ``local_step(step, env, rank)`` evaluates a ``"local"`` step on one rank and returns the
    tensor to store under ``step.out``.  Raises ``ReshardError`` (naming the step index and the
    buffer or attribute) for missing buffers, unknown step kinds and invalid collectives.
    ``stats``, when given, gets, per rank, measured on the tensors after each step (before
    its frees): ``"saved_peak_bytes"``, the most bytes its saved activations
    (``Program.saved_buffers``) held at once (each storage once, none of the caller's inputs),
    and ``"peak_bytes"``, the most bytes it held (``held_bytes``); the allocation plan predicts
    both (``codegen.alloc``).
    """
    mesh = build_mesh(program)
    missing_ranks = [r for r in mesh.ranks if r not in inputs]
    if missing_ranks:
        raise ReshardError(f"simulate: no inputs for ranks {missing_ranks} of {mesh!r}")
    extra = sorted(set(inputs) - set(mesh.ranks))
    if extra:
        raise ReshardError(f"simulate: inputs given for ranks {extra} not in {mesh!r}")
    envs: dict[int, Env] = {r: dict(inputs[r]) for r in mesh.ranks}
    for name in program.inputs:
        for r in program.input_ranks(name):
            if name not in envs[r]:
                raise ReshardError(f"simulate: rank {r} is missing program input buffer {name!r}")

    inputs_of = {r: list(inputs[r]) for r in mesh.ranks}  # the caller's buffers
    sim = _Simulated(program, mesh, envs, local_step, inputs_of, stats is not None)
    walk(program, sim)
    if stats is not None:
        stats["saved_peak_bytes"] = sim.saved_peak
        stats["peak_bytes"] = sim.held_peak
    return {r: {name: envs[r][name] for name in program.outputs if name in envs[r]} for r in mesh.ranks}


class _Simulated:
    """Every rank of ``mesh`` in this process: ``walk``'s backend for ``simulate``."""

    where = ""

    def __init__(self, program: Program, mesh: DeviceMesh, envs: dict[int, Env], local_step: LocalStep,
                 inputs_of: dict[int, list[str]], measured: bool) -> None:
        self.program, self.mesh, self.envs, self.local_step = program, mesh, envs, local_step
        self.inputs_of, self.measured = inputs_of, measured
        self.saved = program.saved_buffers
        self.saved_peak = {r: 0 for r in mesh.ranks}
        self.held_peak = {r: held_bytes(envs[r], inputs_of[r]) for r in mesh.ranks}

    def takes_part(self, step: Step) -> bool:
        return True

    def local(self, step: Step, idx: int) -> None:
        envs = self.envs
        runners = self.program.step_ranks[idx]
        bad = [r for r in runners if r not in envs]
        if bad:
            raise ReshardError(f"step {idx} (local -> {step.out!r}): ranks {bad} are not in {self.mesh!r}")
        for r in runners:
            env = envs[r]
            for name in step.ins:
                if name not in env:
                    _read(envs, r, step, idx, name)
            out = self.local_step(step, env, r)  # (reads env; the results are stored here)
            env.update(local_results(step, out, lambda r=r: f"step {idx} (local {step.attr('op')!r} -> {step.out!r}) "
                                                            f"on rank {r}"))

    def send_recv(self, step: Step, idx: int) -> None:
        envs, mesh = self.envs, self.mesh
        name = _single_input(step, idx)
        pairs = _required(step, idx, "pairs")
        for p in pairs:  # type: ignore[union-attr]
            for r in tuple(p):
                if r not in mesh:
                    raise ReshardError(f"step {idx} (send_recv -> {step.out!r}): rank {r} of pair {p} is not in {mesh!r}")
        srcs = {p[0] for p in pairs}  # type: ignore[union-attr]
        xs_by_rank = {r: _read(envs, r, step, idx, name) for r in sorted(srcs)}
        try:
            received = C.send_recv(xs_by_rank, pairs)  # type: ignore[arg-type]
        except ReshardError as e:
            raise ReshardError(f"step {idx} (send_recv -> {step.out!r}): {e}") from None
        for r in mesh.ranks:
            envs[r].pop(step.out, None)
        for r, t in received.items():
            envs[r][step.out] = t

    def collective(self, step: Step, idx: int) -> None:
        envs = self.envs
        name = _single_input(step, idx)
        axis = step.attr("axis", "ranks")
        results: dict[int, Tensor | None] = {}
        for team in step_teams(self.program, self.mesh, step, idx):
            if step.attr("ranks") is not None and KIND[step.kind].cross_mesh:
                # an explicit team's receivers need not hold the input: they read the root's
                root = _required(step, idx, "root")
                if not isinstance(root, int) or not 0 <= root < len(team):
                    raise ReshardError(f"step {idx} ({step.kind} -> {step.out!r}): root={root!r} is out of "
                                       f"range for the explicit team {team}")
                x_root = _read(envs, team[root], step, idx, name)
                xs = [envs[r].get(name, x_root) for r in team]
            else:
                xs = [_read(envs, r, step, idx, name) for r in team]
            try:
                outs = run_team_collective(step, idx, xs)
            except ReshardError as e:
                raise ReshardError(
                    f"step {idx} ({step.kind} {name!r} -> {step.out!r}) on team {team} of axis {axis!r}: {e}"
                ) from None
            results.update(zip(team, outs))
        for r, t in results.items():  # write after all teams read (out may equal the input name)
            if t is None:
                envs[r].pop(step.out, None)
            else:
                envs[r][step.out] = t

    def after(self, step: Step) -> None:
        """``simulate``'s ``stats``: the saved activations' and every held buffer's bytes."""
        if not self.measured:
            return
        for r in self.mesh.ranks:
            env, mine = self.envs[r], self.inputs_of[r]
            kept = {b: env[b] for b in self.saved if b in env}
            caller = {b: env[b] for b in mine}
            self.saved_peak[r] = max(self.saved_peak[r], held_bytes({**caller, **kept}, mine) - held_bytes(caller, mine))
            self.held_peak[r] = max(self.held_peak[r], held_bytes(env, mine))

    def free(self, names: Sequence[str]) -> None:
        for name in names:
            for env in self.envs.values():
                env.pop(name, None)
