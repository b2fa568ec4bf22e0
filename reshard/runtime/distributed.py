"""Multi-process runtime: execute an SPMD ``Program`` with ``torch.distributed`` (gloo or NCCL).

Every process runs the same ``Program`` on its own rank; mesh rank ``r`` is global
process-group rank ``r`` (all mesh ranks must be ``< world_size``; ranks outside the mesh
take part in set-up and then return ``{}`` from ``run``).

Semantics mirrored (exactly those of ``reshard.runtime.simulator`` /
``reshard.runtime.collectives`` and the table in ``reshard.codegen.program``):

* steps run in program order; ``local`` steps call the runtime's ``local_step(step, env, rank)``
  with a shallow copy of the rank's env, as the simulator does, and must return a tensor (a
  tuple of one per buffer for a step writing several, ``Step.outs``) (on a
  CUDA device reshard's kernels, ``gpu_local.gpu_local_step``, as ``Plan.simulate(device=
  "cuda")`` runs them; on the CPU torch's ``run_local``);
* a team collective acts on the team of this rank along mesh axis ``attr axis`` (index or
  name), ordered t_0..t_{n-1} by the axis coordinate (``DeviceMesh.team``).  The process
  groups are created once per team with ``new_group``; torch orders a group's ranks by
  global rank, which need not be team order (meshes may list ranks in any order), so every
  collective maps team positions <-> group ranks explicitly:

  - ``allgather``      cat([x_0..x_{n-1}], dim)            all_gather_single of the flattened input
                                                           (flat "concatenation" form, which
                                                           gloo and NCCL both accept) into a
                                                           buffer that is the result when ``dim``
                                                           is outermost (else one re-ordering copy)
  - ``reduce_scatter`` chunk_i(op(x_0..x_{n-1}), dim)      reduce_scatter_single of the ``dim``
                                                           chunks laid out flat in group-rank order
                                                           (the input itself when ``dim`` is outermost)
  - ``allreduce``      op(x_0..x_{n-1})                    all_reduce (sum -> SUM, max -> MAX)
  - ``all_to_all``     cat([chunk_i(x_j, split_dim)], cat_dim)  all_to_all_single of the chunks
                                                           laid out flat in group-rank order
  - ``broadcast``      x_root                              broadcast from the root's global rank
  - ``scatter``        chunk_i(x_root, dim)                the root first broadcasts a small shape
                                                           header (non-root inputs may be any
                                                           shape, e.g. placeholders), then scatter
  - ``gather``         root: cat([x_j], dim); others: no buffer   gather to the root
  - ``send_recv``      dst gets a copy of src's buffer (``pairs`` of global ranks); a shape/dtype
                       header goes first (the receiver need not hold the buffer), then the
                       payload, both with ``batch_isend_irecv`` on the default group;
                       ``src == dst`` is a local copy; every mesh rank drops ``out`` first.

  The layouts handed to the backend are ``staging.to_blocks`` / ``from_blocks``: views when
  the communicated dim is outermost and team order is group order, else one copy.
  Every output is a contiguous tensor that aliases no live buffer: ``allreduce`` and a
  ``broadcast`` root write into their input when the program frees it at that step and no
  other buffer or caller's input shares its memory, every other output is fresh; a member
  that gets nothing (non-root ``gather``) ends up without ``out``.  Reductions happen in the backend's
  order, so float sums can differ from the simulator's left-to-right order by rounding.
* ``free`` attributes drop buffers after their step; ``run`` returns the ``program.outputs``
  buffers this rank holds.
* multi-mesh programs (``Program.meshes``, cross-mesh transfers): a rank skips the steps whose
  mesh ``on`` or explicit ``ranks`` do not include it; a ``broadcast``/``scatter`` with ``ranks``
  runs on that explicit team (its group is created after the axis teams', in program
  order, identically on every rank); its root first broadcasts a shape header, as for
  ``scatter``, since the other members need not hold the buffer.  Inputs are required on the
  ranks of their own mesh only.

Checks.  Before anything else the constructor all-gathers ``program.digest()`` over the
default group and raises ``ReshardError`` on every rank, naming the ranks whose program
differs, when they disagree.  ``run`` validates the local inputs (presence, type and, when
the plan's ``local_inputs`` are known, shape and dtype) and, with ``check_inputs``, agrees on
the outcome over the mesh so that every mesh rank raises instead of some of them waiting in a
collective: a one-element MAX all_reduce of a failure flag over the mesh (with NCCL, reading
it synchronizes the device once per run; ``check_inputs=False`` skips it), and the messages
gathered only when some rank failed.  Step attributes (dims, roots, ops, divisibility) are validated on every rank
before communicating, with the reference's checks and messages (``check_team_collective``), so
all members of a team raise alike.
``validate=True`` additionally all-gathers every collective input's shape and dtype across the
team first (one extra small collective per step) and reports exactly the simulator's errors on
every member (mismatched shapes/dtypes, missing buffers) instead of a backend failure or hang.
Backend failures and timeouts are re-raised as ``ReshardError`` naming rank, step index and
kind, chained to the original.  (With NCCL, collectives are asynchronous: a timeout is
detected by NCCL's watchdog, which may abort the process rather than raise here.)  A
rank-local failure that the checks above cannot see (e.g. a local step raising on one rank
only) leaves its peers waiting until the process-group timeout; under ``launch`` the failed
rank's exit ends them first (``grace_s``).

Fallbacks (``fallback=``): ``"never"`` always uses the native single-tensor ops
(``all_gather_single``/``reduce_scatter_single``, or on torch versions without them
``all_gather_into_tensor``/``reduce_scatter_tensor``);
``"always"`` uses the portable forms below; ``"auto"`` (default) uses the native op, and on a
gloo group switches to the portable form for good when the backend reports the op as
unsupported (gloo raises that before any communication, so the retry is safe):

  - allgather      -> list ``all_gather`` + cat
  - reduce_scatter -> ``all_reduce`` of the whole tensor, then this member's chunk
  - all_to_all     -> point-to-point ``batch_isend_irecv`` of the chunks

Devices: tensors live on ``device`` (default: ``cuda:<current device>`` when the default
group uses NCCL, else CPU); local inputs on another device are moved there.  With NCCL call
``torch.cuda.set_device(local_rank)`` before building the runtime (``launch`` and
``init_from_env`` do).

Entry points: ``DistRuntime``, ``run_plan``, ``launch`` (spawned single-node processes,
``file://`` rendezvous) and ``init_from_env`` (``torchrun``, ``env://``).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..codegen.program import Program, Step
from ..ir.collective_kinds import KIND, TEAM_KIND_NAMES
from ..ir.errors import ReshardError
from ..ir.inputs import check_inputs
from . import collectives as C
from .local_ops import run_local
from .simulator import build_mesh, local_results, run_team_collective
from .staging import from_blocks, to_blocks
from .walk import walk

Tensor = torch.Tensor
LocalStep = Callable[[Step, dict[str, Tensor], int], Tensor | tuple[Tensor, ...]]

__all__ = ["DistRuntime", "run_plan", "launch", "init_from_env"]

#: the ``torch.distributed`` call each collective kind (``ir.collective_kinds``) is run with
#: (allgather and reduce_scatter: ``all_gather_single`` / ``reduce_scatter_single`` where torch
#: has them; the portable forms of ``DistRuntime(fallback="auto")`` aside)
TORCH_CALLS: dict[str, str] = {
    "allgather": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter_tensor",
    "allreduce": "all_reduce",
    "all_to_all": "all_to_all_single",
    "broadcast": "broadcast",
    "scatter": "scatter",
    "gather": "gather",
    "send_recv": "batch_isend_irecv",
}

TIMEOUT_ENV = "RESHARD_TIMEOUT_S"
#: what torch.distributed's backends say when a collective or the rendezvous waits too long
_TIMEOUT_MARKERS = ("timed out", "timeout")

# header of shape/dtype messages: [status, dtype code, ndim, d_0 .. d_{MAX_DIMS-1}]
_MAX_DIMS = 16
_HDR_LEN = 3 + _MAX_DIMS
_OK, _MISSING, _UNSUPPORTED = 0, 1, 2
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
_UNSUPPORTED_MARKERS = ("not supported", "does not support", "not implemented", "unsupported")


def _reduce_op(op: str) -> Any:
    """The ``dist.ReduceOp`` of a reduce op of ``ir.collective_kinds.REDUCE_OPS`` (SUM, MAX)."""
    if op in C.REDUCE_OPS:
        return getattr(dist.ReduceOp, op.upper())
    raise ReshardError(f"unknown reduce op {op!r} (expected one of {C.REDUCE_OPS})")


def _default_local_step(device: torch.device) -> LocalStep:
    """The executor of local steps on ``device``: reshard's kernels on a CUDA device (the
    fastest path, the one ``Plan.simulate(device="cuda")`` and CUDA graphs run), torch's
    ``run_local`` on the CPU."""
    if device.type == "cuda":
        from .gpu_local import gpu_local_step
        return gpu_local_step
    return run_local


class _Spec:
    """Shape and dtype of a collective input: what the checks below need (no tensor, no meta
    device, whose first use costs about a second)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[int], dtype: torch.dtype) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype

    @staticmethod
    def of(x: Tensor) -> "_Spec":
        return _Spec(x.shape, x.dtype)


def check_team_collective(step: Step, idx: int, specs: list[_Spec]) -> None:
    """The validation of ``simulator.run_team_collective`` / ``collectives`` on shapes and dtypes
    (same messages): required attributes, equal shapes/dtypes, dims and roots in range,
    divisibility, reduce ops."""
    k = step.kind

    def req(name: str) -> Any:
        v = step.attr(name)
        if v is None:
            raise ReshardError(f"step {idx} ({step.kind} -> {step.out!r}): missing attribute {name!r}")
        return v

    def team(same_shape: bool = True) -> None:
        dtypes = [s.dtype for s in specs]
        if len(set(dtypes)) != 1:
            raise ReshardError(f"{k}: team inputs have mismatched dtypes {dtypes}")
        if same_shape and len({s.shape for s in specs}) != 1:
            raise ReshardError(f"{k}: team inputs have mismatched shapes {[s.shape for s in specs]}")

    def op_ok(op: Any) -> None:
        if op not in C.REDUCE_OPS:
            raise ReshardError(f"{k}: unknown reduce op {op!r} (expected one of {C.REDUCE_OPS})")

    n = len(specs)
    if k not in TEAM_KIND_NAMES:
        raise ReshardError(f"step {idx}: unknown step kind {k!r}")
    if k == "allgather":
        dim = req("dim")
        team()
        C._norm_dim(k, "dim", dim, len(specs[0].shape))
    elif k == "reduce_scatter":
        dim = req("dim")
        team()
        d = C._norm_dim(k, "dim", dim, len(specs[0].shape))
        C._check_divisible(k, "dim", specs[0].shape, d, n)
        op_ok(step.attr("op", "sum"))
    elif k == "allreduce":
        team()
        op_ok(step.attr("op", "sum"))
    elif k == "all_to_all":
        split_dim, cat_dim = req("split_dim"), req("cat_dim")
        team()
        nd = len(specs[0].shape)
        sd = C._norm_dim(k, "split_dim", split_dim, nd)
        C._norm_dim(k, "cat_dim", cat_dim, nd)
        C._check_divisible(k, "split_dim", specs[0].shape, sd, n)
    elif k == "broadcast":
        root = req("root")
        team()
        C._check_root(k, root, n)
    elif k == "scatter":
        root, dim = req("root"), req("dim")
        team(same_shape=False)
        r = C._check_root(k, root, n)
        d = C._norm_dim(k, "dim", dim, len(specs[r].shape))
        C._check_divisible(k, "dim", specs[r].shape, d, n)
    elif k == "gather":
        root, dim = req("root"), req("dim")
        team()
        C._check_root(k, root, n)
        C._norm_dim(k, "dim", dim, len(specs[0].shape))


class _Team:
    """This rank's team along one axis and the process group over it."""

    def __init__(self, ranks: tuple[int, ...], me: int, group: Any) -> None:
        self.ranks = ranks
        self.n = len(ranks)
        self.pos = ranks.index(me)
        self.group = group
        granks = list(dist.get_process_group_ranks(group)) if group is not None else sorted(ranks)
        if sorted(granks) != sorted(ranks):
            raise ReshardError(f"internal: process group over {granks} for team {ranks}")
        self.gidx = [granks.index(r) for r in ranks]   # team position -> group rank
        self.order = [ranks.index(r) for r in granks]  # group rank -> team position


class DistRuntime:
    """Executes ``program`` on this process's rank of an initialized default process group.

    Every process of the default group must construct the runtime (same ``program``, same
    order of construction): construction all-gathers the program digest and creates the
    process groups of the mesh teams (``new_group`` is collective over the whole world).

    ``expected_inputs``: ``{buffer: (local shape, dtype name)}`` (``LoweredPlan.local_inputs``)
    to validate the local inputs against.  ``timeout_s``: the timeout of the team groups
    (default: ``$RESHARD_TIMEOUT_S`` if set, else torch's default).  ``validate``: exchange
    and check collective input shapes/dtypes before each collective.  ``check_inputs``:
    agree on local-input validity across the mesh before the first step of ``run``.
    ``fallback``: "auto" | "always" | "never" (see the module docstring).  ``local_step``:
    the executor of local steps (default: by ``device``, reshard's kernels on a CUDA device,
    ``runtime.gpu_local.gpu_local_step``, else torch's ``run_local``).  ``input_names``: ``{buffer: input name}``,
    and ``axis_names``: the mesh's axis names, for messages.  ``DistRuntime.from_plan(plan, **kw)``
    fills ``expected_inputs``, ``input_names`` and ``axis_names`` from a ``reshard.Plan``.
    """

    def __init__(self, program: Program, *, expected_inputs: Mapping[str, tuple[tuple[int, ...], str]] | None = None,
                 device: torch.device | str | None = None, timeout_s: float | None = None,
                 validate: bool = False, check_inputs: bool = True, fallback: str = "auto",
                 local_step: LocalStep | None = None, input_names: Mapping[str, str] | None = None,
                 axis_names: Sequence[str] | None = None) -> None:
        if not isinstance(program, Program):
            raise ReshardError(f"DistRuntime: expected a Program, got {type(program).__name__}")
        if not (dist.is_available() and dist.is_initialized()):
            raise ReshardError("DistRuntime: torch.distributed is not initialized (call init_process_group, "
                               "reshard.runtime.distributed.init_from_env, or use launch)")
        if fallback not in ("auto", "always", "never"):
            raise ReshardError(f"DistRuntime: fallback must be 'auto', 'always' or 'never', got {fallback!r}")
        self.program = program
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.backend = str(dist.get_backend())
        self.expected_inputs = dict(expected_inputs) if expected_inputs is not None else None
        self.input_names = dict(input_names or {})
        self.validate = validate
        self.check_inputs = check_inputs
        self.fallback = fallback
        if timeout_s is None and os.environ.get(TIMEOUT_ENV):
            timeout_s = float(os.environ[TIMEOUT_ENV])
        self.timeout = timedelta(seconds=timeout_s) if timeout_s is not None else None
        self.device = torch.device(device) if device is not None else self._default_device()
        self.local_step = local_step if local_step is not None else _default_local_step(self.device)
        self._use_fallback: set[str] = set()
        self._caller_memory: set[int] = set()  # storages of the current run's local inputs
        self._teams_of: dict[int, tuple[tuple[int, ...], _Team | None, str]] = {}  # step index -> team
        self._checked: set[tuple[int, tuple[int, ...], torch.dtype]] = set()  # steps whose checks passed

        self._check_digest()
        self.mesh = build_mesh(program, axis_names)
        outside = [r for r in self.mesh.ranks if r >= self.world_size]
        if outside:
            raise ReshardError(f"rank {self.rank}: the program's mesh {self.mesh!r} needs ranks {outside}, but the "
                               f"process group has only {self.world_size} ranks (world size >= "
                               f"{max(self.mesh.ranks) + 1} required)")
        self.in_mesh = self.rank in self.mesh
        self._groups: dict[tuple[int, ...], Any] = {}
        self.teams: dict[int, _Team] = {}
        #: explicit teams (``ranks`` attribute) this rank belongs to, by team
        self.explicit_teams: dict[tuple[int, ...], _Team] = {}
        self._create_groups()

    # ---- set-up ------------------------------------------------------------------------
    def _default_device(self) -> torch.device:
        if "nccl" in self.backend and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _check_digest(self) -> None:
        mine = self.program.digest()
        digests: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(digests, mine)
        except Exception as e:
            raise ReshardError(f"rank {self.rank}: exchanging program digests failed: {type(e).__name__}: {e}") from e
        if len(set(digests)) == 1:
            return
        counts = Counter(digests)
        common = max(counts, key=lambda d: (counts[d], -digests.index(d)))  # ties: the lowest rank's
        differ = [r for r, d in enumerate(digests) if d != common]
        agree = [r for r, d in enumerate(digests) if d == common]
        detail = ", ".join(f"rank {r}: {digests[r][:12]}" for r in differ)
        raise ReshardError(
            f"rank {self.rank}: program digest mismatch: ranks {differ} run a different program than ranks {agree} "
            f"(digest {common[:12]}; {detail}); every rank must execute the same Program")

    def _new_group(self, ranks: list[int]) -> Any:
        kw = {"timeout": self.timeout} if self.timeout is not None else {}
        try:
            return dist.new_group(ranks, **kw)
        except Exception as e:
            raise ReshardError(f"rank {self.rank}: creating the process group over ranks {ranks} failed: "
                               f"{type(e).__name__}: {e}") from e

    def _create_groups(self) -> None:
        """Groups of every team of every axis used by a team collective, in the same
        deterministic order on every rank (the program is equal everywhere)."""
        axes: set[int] = set()
        for step in self.program.steps:
            if step.kind in TEAM_KIND_NAMES:
                try:
                    axes.add(self.mesh.axis_index(step.attr("axis")))
                except (ReshardError, TypeError):
                    pass  # reported when the step runs
        world = list(range(self.world_size))
        mesh_sorted = sorted(self.mesh.ranks)
        self.mesh_group = None if mesh_sorted == world else self._new_group(mesh_sorted)
        for a in sorted(axes):
            if self.mesh.shape[a] == 1:
                continue
            for team in self.mesh.teams(a):
                key = tuple(sorted(team))
                if key not in self._groups:
                    self._groups[key] = self._new_group(list(key))  # own group: ``timeout_s`` applies
                if self.rank in team:
                    self.teams[a] = _Team(team, self.rank, self._groups[key])
        for step in self.program.steps:  # explicit teams, in program order
            ranks = step.attr("ranks")
            if step.kind not in TEAM_KIND_NAMES or ranks is None:
                continue
            team = tuple(ranks)
            if len(team) < 2 or len(set(team)) != len(team) or any(r not in self.mesh for r in team):
                continue  # reported when the step runs
            key = tuple(sorted(team))
            if key not in self._groups:
                self._groups[key] = self._new_group(list(key))
            if self.rank in team:
                self.explicit_teams[team] = _Team(team, self.rank, self._groups[key])

    def close(self) -> None:
        """Destroy the team groups this runtime created (call on every rank)."""
        skip = (None, dist.GroupMember.NON_GROUP_MEMBER)
        groups = [g for g in list(self._groups.values()) + [self.mesh_group] if all(g is not k for k in skip)]
        for g in groups:
            try:
                dist.destroy_process_group(g)
            except Exception:
                pass
        self._groups.clear()
        self.teams.clear()
        self.explicit_teams.clear()
        self.mesh_group = None

    @staticmethod
    def from_plan(plan: Any, **kwargs: Any) -> "DistRuntime":
        """A runtime for a ``reshard.Plan`` that validates inputs against its local shapes."""
        kwargs.setdefault("expected_inputs", plan.lowered.local_inputs)
        kwargs.setdefault("input_names", {buf: name for buf, name, _ in plan.lowered.inputs})
        if not plan.program.meshes:  # one mesh: the plan's (a multi-mesh program stacks its meshes)
            source = plan.source
            kwargs.setdefault("axis_names", source.tensors[source.inputs[0]].mesh.axis_names)
        return DistRuntime(plan.program, **kwargs)

    # ---- execution ---------------------------------------------------------------------
    def run(self, local_inputs: Mapping[str, Tensor], input_problem: str | None = None) -> dict[str, Tensor]:
        """Execute the program on this rank; return ``{output buffer: tensor}`` (``{}`` off-mesh).
        ``input_problem``: what the caller found wrong with ``local_inputs`` (``Plan.run``: an
        uneven input that is not this rank's DTensor local tensor), reported as the runtime's
        own input check reports (every rank raises when one has a problem)."""
        if not self.in_mesh:
            return {}
        env = self._prepare_inputs(local_inputs, input_problem)
        self._caller_memory = {t.untyped_storage().data_ptr() for t in local_inputs.values()}
        walk(self.program, _ThisRank(self, env))
        return {name: env[name] for name in self.program.outputs if name in env}

    def _prepare_inputs(self, local_inputs: Mapping[str, Tensor], problem: str | None = None) -> dict[str, Tensor]:
        err = problem
        try:
            mine = [n for n in self.program.inputs if self.rank in self.program.input_ranks(n)]
            expected: dict[str, Any] = {n: None for n in self.program.inputs}  # another mesh's: any tensor
            expected.update({n: spec for n, spec in (self.expected_inputs or {}).items()
                             if n in mine or n not in self.program.inputs})
            required = mine + [n for n in expected if n not in self.program.inputs]
            check_inputs(local_inputs, expected, f"rank {self.rank}", what="local input", required=required,
                         labels=self.input_names, allow_unknown=self.expected_inputs is None)
        except ReshardError as e:
            err = err or str(e)
        if self.check_inputs:  # one flag all_reduce; the messages only when some rank failed
            errs: list[Any] = [None] * len(self.mesh.ranks)
            try:
                flag = torch.tensor([0 if err is None else 1], device=self.device)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.mesh_group)
                if flag.item():
                    dist.all_gather_object(errs, err, group=self.mesh_group)
            except Exception as e:
                raise ReshardError(f"rank {self.rank}: agreeing on local input validity failed: "
                                   f"{type(e).__name__}: {e}") from e
            if err is not None:
                raise ReshardError(err)
            bad = [m for m in errs if m is not None]
            if bad:
                granks = dist.get_process_group_ranks(self.mesh_group) if self.mesh_group is not None \
                    else list(range(self.world_size))
                ranks = [granks[i] for i, m in enumerate(errs) if m is not None]
                raise ReshardError(f"rank {self.rank}: not running: invalid local inputs on rank(s) {ranks}: {bad[0]}")
        elif err is not None:
            raise ReshardError(err)
        return {k: (v if v.device == self.device else v.to(self.device)) for k, v in local_inputs.items()}

    def _where(self, step: Step, idx: int) -> str:
        ins = ", ".join(repr(i) for i in step.ins)
        return f"rank {self.rank}: step {idx} ({step.kind} {ins} -> {step.out!r})"

    def _required(self, step: Step, idx: int, name: str) -> Any:
        v = step.attr(name)
        if v is None:
            raise ReshardError(f"{self._where(step, idx)}: missing attribute {name!r}")
        return v

    def _read(self, env: dict[str, Tensor], step: Step, idx: int, name: str) -> Tensor:
        if name not in env:
            raise ReshardError(f"{self._where(step, idx)}: rank {self.rank} has no buffer {name!r} "
                               f"(it holds {sorted(env)})")
        return env[name]

    def _local(self, step: Step, idx: int, env: dict[str, Tensor]) -> None:
        for name in step.ins:
            self._read(env, step, idx, name)
        try:
            out = self.local_step(step, env, self.rank)  # (reads env; the results are stored here)
        except ReshardError as e:
            raise ReshardError(f"{self._where(step, idx)} local {step.attr('op')!r}: {e}") from e
        env.update(local_results(step, out, lambda: self._where(step, idx)))

    def _comm(self, step: Step, idx: int, fn: Callable[[], Any]) -> Any:
        """Run the communication ``fn``; wrap backend failures and timeouts."""
        try:
            return fn()
        except ReshardError:
            raise
        except Exception as e:
            hint = ""
            if any(m in str(e).lower() for m in _TIMEOUT_MARKERS):
                waited = f"{self.timeout.total_seconds():g} s" if self.timeout is not None else "torch's default"
                hint = (f" (the wait for the team passed its timeout, {waited}: DistRuntime(timeout_s=...), "
                        f"${TIMEOUT_ENV}, launch(timeout_s=...) or init_from_env(timeout_s=...) set it; a peer is "
                        "hung, dead or that far behind)")
            raise ReshardError(f"{self._where(step, idx)} failed in torch.distributed ({self.backend}): "
                               f"{type(e).__name__}: {e}{hint}") from e

    def _native_or_fallback(self, kind: str, group: Any, native: Callable[[], Any],
                            portable: Callable[[], Any]) -> Any:
        if self.fallback == "always" or kind in self._use_fallback:
            return portable()
        if self.fallback == "never":
            return native()
        try:
            return native()
        except (RuntimeError, NotImplementedError, AttributeError) as e:
            msg = str(e).lower()
            if "gloo" in str(dist.get_backend(group)).lower() and any(m in msg for m in _UNSUPPORTED_MARKERS):
                self._use_fallback.add(kind)
                return portable()
            raise

    # ---- team collectives ----------------------------------------------------------------
    def _team_collective(self, step: Step, idx: int, env: dict[str, Tensor]) -> None:
        if len(step.ins) != 1:
            raise ReshardError(f"{self._where(step, idx)}: expected exactly 1 input buffer, got {step.ins}")
        name = step.ins[0]
        explicit = step.attr("ranks")
        _, team, ctx = self._teams_of.get(idx) or self._team_of(step, idx)

        def check(specs: list[_Spec]) -> None:
            try:
                check_team_collective(step, idx, specs)
            except ReshardError as e:
                raise ReshardError(f"{ctx}: {e}") from None

        if team is None:  # a team of one: the reference collective is exact
            x = self._read(env, step, idx, name)
            check([_Spec.of(x)])
            out = run_team_collective(step, idx, [x])[0]
            self._store(env, step, out)
            return
        x = env.get(name)
        metas: list[_Spec] | None = None
        rooted = explicit is not None and KIND[step.kind].cross_mesh  # receivers hold no input
        if self.validate and not rooted:
            metas = self._exchange_metas(step, idx, team, x, ctx)
            check(metas)
        elif step.kind != "scatter" and not rooted:
            x = self._read(env, step, idx, name)
            key = (idx, tuple(x.shape), x.dtype)
            if key not in self._checked:  # the checks depend on the step and the input's shape and dtype only
                check([_Spec.of(x)] * team.n)
                self._checked.add(key)
        k = step.kind
        if k == "scatter":
            out = self._scatter(step, idx, team, x, ctx, check, metas)
        elif rooted:
            out = self._broadcast_from_root(step, idx, team, x, ctx, check)
        else:
            assert x is not None
            x = x.contiguous()
            if k == "allgather":
                out = self._allgather(step, idx, team, x, step.attr("dim") % x.dim())
            elif k == "reduce_scatter":
                out = self._reduce_scatter(step, idx, team, x, step.attr("dim") % x.dim(), step.attr("op", "sum"))
            elif k == "allreduce":
                y = x if self._reusable(env, step, name, x) else x.clone(memory_format=torch.contiguous_format)
                op = _reduce_op(step.attr("op", "sum"))
                self._comm(step, idx, lambda: dist.all_reduce(y, op=op, group=team.group))
                out = y
            elif k == "all_to_all":
                out = self._all_to_all(step, idx, team, x, step.attr("split_dim") % x.dim(),
                                       step.attr("cat_dim") % x.dim())
            elif k == "broadcast":
                root = team.ranks[step.attr("root")]
                if root != self.rank:
                    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
                else:
                    y = x if self._reusable(env, step, name, x) else x.clone(memory_format=torch.contiguous_format)
                self._comm(step, idx, lambda: dist.broadcast(y, src=root, group=team.group))
                out = y
            elif k == "gather":
                out = self._gather(step, idx, team, x, step.attr("root"), step.attr("dim") % x.dim())
            else:  # pragma: no cover - walk's COLLECTIVES and run_team_collective agree
                raise ReshardError(f"{ctx}: unknown step kind {k!r}")
        self._store(env, step, out)

    def _team_of(self, step: Step, idx: int) -> tuple[tuple[int, ...], _Team | None, str]:
        """This rank's team for a team collective step (``None`` for a team of one) and the
        context its messages start with; remembered per step index once resolved."""
        explicit = step.attr("ranks")
        if explicit is not None:
            team_ranks = tuple(explicit)
            if team_ranks not in self.explicit_teams:
                raise ReshardError(f"{self._where(step, idx)}: explicit team {team_ranks} must be at least 2 "
                                   f"distinct ranks of {self.mesh!r}")
            team: _Team | None = self.explicit_teams[team_ranks]
            ctx = f"{self._where(step, idx)} on explicit team {team_ranks}"
        else:
            axis = self._required(step, idx, "axis")
            try:
                a = self.mesh.axis_index(axis)
            except ReshardError as e:
                raise ReshardError(f"{self._where(step, idx)}: {e}") from None
            team_ranks = self.mesh.team(self.rank, a)
            team = self.teams[a] if len(team_ranks) > 1 else None
            ctx = f"{self._where(step, idx)} on team {team_ranks} of axis {self.mesh.axis_names[a]!r}"
        self._teams_of[idx] = (team_ranks, team, ctx)
        return self._teams_of[idx]

    def _reusable(self, env: dict[str, Tensor], step: Step, name: str, x: Tensor) -> bool:
        """Whether an in-place collective may write into ``x``: it is contiguous, the program
        frees ``name`` at this step, and no other live buffer and no caller's input shares its
        memory (so nothing can observe the write)."""
        if name not in (step.attr("free", ()) or ()) or not x.is_contiguous():
            return False
        mem = x.untyped_storage().data_ptr()
        if mem in self._caller_memory:
            return False
        return not any(t.untyped_storage().data_ptr() == mem for k, t in env.items() if k != name)

    @staticmethod
    def _store(env: dict[str, Tensor], step: Step, out: Tensor | None) -> None:
        if out is None:
            env.pop(step.out, None)
        else:
            env[step.out] = out

    def _exchange_metas(self, step: Step, idx: int, team: _Team, x: Tensor | None, ctx: str) -> list[_Spec]:
        mine = None if x is None else (tuple(x.shape), str(x.dtype).removeprefix("torch."))
        got: list[Any] = [None] * team.n
        self._comm(step, idx, lambda: dist.all_gather_object(got, mine, group=team.group))
        by_pos = [got[team.gidx[j]] for j in range(team.n)]
        missing = [team.ranks[j] for j, m in enumerate(by_pos) if m is None]
        if missing:
            raise ReshardError(f"{ctx}: rank(s) {missing} have no buffer {step.ins[0]!r}")
        return [_Spec(s, getattr(torch, d)) for s, d in by_pos]

    def _allgather(self, step: Step, idx: int, team: _Team, x: Tensor, d: int) -> Tensor:
        def native() -> Tensor:
            # flat "concatenation" form: accepted by every backend (gloo rejects the stacked form)
            buf = torch.empty(team.n * x.numel(), dtype=x.dtype, device=x.device)
            fn = getattr(dist, "all_gather_single", None) or getattr(dist, TORCH_CALLS["allgather"])
            fn(buf, x.reshape(-1), group=team.group)
            return from_blocks(buf, x.shape, d, team.n, team.gidx)

        def portable() -> Tensor:
            parts = [torch.empty_like(x) for _ in range(team.n)]
            dist.all_gather(parts, x, group=team.group)
            return torch.cat([parts[team.gidx[j]] for j in range(team.n)], d)

        return self._comm(step, idx, lambda: self._native_or_fallback("allgather", team.group, native, portable))

    def _reduce_scatter(self, step: Step, idx: int, team: _Team, x: Tensor, d: int, op_name: str) -> Tensor:
        op = _reduce_op(op_name)

        def native() -> Tensor:
            inp = to_blocks(x, d, team.n, team.order)
            chunk_shape = list(x.shape)
            chunk_shape[d] //= team.n
            out = torch.empty(chunk_shape, dtype=x.dtype, device=x.device)
            fn = getattr(dist, "reduce_scatter_single", None) or getattr(dist, TORCH_CALLS["reduce_scatter"])
            fn(out.view(-1), inp, op=op, group=team.group)
            return out

        def portable() -> Tensor:
            full = x.clone(memory_format=torch.contiguous_format)
            dist.all_reduce(full, op=op, group=team.group)
            return torch.chunk(full, team.n, d)[team.pos].contiguous()

        return self._comm(step, idx, lambda: self._native_or_fallback("reduce_scatter", team.group, native, portable))

    def _all_to_all(self, step: Step, idx: int, team: _Team, x: Tensor, s: int, c: int) -> Tensor:
        def native() -> Tensor:
            inp = to_blocks(x, s, team.n, team.order)
            out = torch.empty_like(inp)
            dist.all_to_all_single(out, inp, group=team.group)
            block_shape = list(x.shape)
            block_shape[s] //= team.n
            return from_blocks(out, block_shape, c, team.n, team.gidx)

        def portable() -> Tensor:
            chunks = [ch.contiguous() for ch in torch.chunk(x, team.n, s)]  # chunks[j] goes to team member j
            parts: list[Tensor] = [torch.empty_like(chunks[0]) for _ in range(team.n)]
            ops = []
            for j, peer in enumerate(team.ranks):
                if j == team.pos:
                    parts[j] = chunks[j]
                    continue
                ops.append(dist.P2POp(dist.isend, chunks[j], peer))
                ops.append(dist.P2POp(dist.irecv, parts[j], peer))
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            return torch.cat(parts, c)

        return self._comm(step, idx, lambda: self._native_or_fallback("all_to_all", team.group, native, portable))

    def _scatter(self, step: Step, idx: int, team: _Team, x: Tensor | None, ctx: str,
                 check: Callable[[list[_Spec]], Any], metas: list[_Spec] | None) -> Tensor:
        root_pos = self._required(step, idx, "root")
        if not isinstance(root_pos, int) or isinstance(root_pos, bool) or not 0 <= root_pos < team.n:
            check([_Spec((), torch.float32)] * team.n)  # raises the reference's root error
        root = team.ranks[root_pos]
        if metas is not None:  # validate mode: every member already knows the root's shape
            shape, dtype = tuple(metas[root_pos].shape), metas[root_pos].dtype
        else:  # the root broadcasts a shape header: non-root inputs may be any shape
            dtype, shape = self._root_header(step, idx, team, x, ctx, root)
            check([_Spec(shape, dtype)] * team.n)
        d = step.attr("dim") % len(shape)
        chunk_shape = list(shape)
        chunk_shape[d] //= team.n
        out = torch.empty(chunk_shape, dtype=dtype, device=self.device)
        scatter_list = None
        if root == self.rank:
            assert x is not None
            chunks = torch.chunk(x, team.n, d)
            scatter_list = [chunks[team.order[g]].contiguous() for g in range(team.n)]
        self._comm(step, idx, lambda: dist.scatter(out, scatter_list, src=root, group=team.group))
        return out

    def _root_header(self, step: Step, idx: int, team: _Team, x: Tensor | None, ctx: str,
                     root: int) -> tuple[torch.dtype, tuple[int, ...]]:
        """The root broadcasts its input's dtype and shape to the team (members that hold no
        input learn what they will receive); raises when the root has no usable input."""
        hdr_t = self._encode(x) if root == self.rank else torch.zeros(_HDR_LEN, dtype=torch.int64, device=self.device)
        self._comm(step, idx, lambda: dist.broadcast(hdr_t, src=root, group=team.group))
        status, dtype, shape = self._decode(hdr_t)
        if status == _MISSING:
            raise ReshardError(f"{ctx}: the root rank {root} has no buffer {step.ins[0]!r}")
        if status != _OK:
            raise ReshardError(f"{ctx}: the root's input has an unsupported dtype or more than {_MAX_DIMS} dims")
        return dtype, tuple(shape)

    def _broadcast_from_root(self, step: Step, idx: int, team: _Team, x: Tensor | None, ctx: str,
                             check: Callable[[list[_Spec]], Any]) -> Tensor:
        """A broadcast whose non-root members need not hold the input: the root broadcasts a
        shape header first (as ``_scatter`` does), then the payload."""
        root_pos = self._required(step, idx, "root")
        if not isinstance(root_pos, int) or isinstance(root_pos, bool) or not 0 <= root_pos < team.n:
            check([_Spec((), torch.float32)] * team.n)  # raises the reference's root error
        root = team.ranks[root_pos]
        dtype, shape = self._root_header(step, idx, team, x, ctx, root)
        check([_Spec(shape, dtype)] * team.n)
        if root == self.rank:
            assert x is not None
            y = x.clone(memory_format=torch.contiguous_format)
        else:
            y = torch.empty(shape, dtype=dtype, device=self.device)
        self._comm(step, idx, lambda: dist.broadcast(y, src=root, group=team.group))
        return y

    def _gather(self, step: Step, idx: int, team: _Team, x: Tensor, root_pos: int, d: int) -> Tensor | None:
        root = team.ranks[root_pos]
        parts = [torch.empty_like(x) for _ in range(team.n)] if root == self.rank else None
        self._comm(step, idx, lambda: dist.gather(x, parts, dst=root, group=team.group))
        if parts is None:
            return None
        return torch.cat([parts[team.gidx[j]] for j in range(team.n)], d).contiguous()

    # ---- point to point --------------------------------------------------------------------
    def _encode(self, x: Tensor | None) -> Tensor:
        h = [0] * _HDR_LEN
        if x is None:
            h[0] = _MISSING
        elif x.dim() > _MAX_DIMS or x.dtype not in _DTYPES:
            h[0] = _UNSUPPORTED
        else:
            h[1], h[2] = _DTYPES.index(x.dtype), x.dim()
            h[3:3 + x.dim()] = list(x.shape)
        return torch.tensor(h, dtype=torch.int64, device=self.device)

    @staticmethod
    def _decode(h: Tensor) -> tuple[int, torch.dtype, tuple[int, ...]]:
        v = h.cpu().tolist()
        if v[0] != _OK:
            return v[0], torch.float32, ()
        return _OK, _DTYPES[v[1]], tuple(v[3:3 + v[2]])

    def _send_recv(self, step: Step, idx: int, env: dict[str, Tensor]) -> None:
        if len(step.ins) != 1:
            raise ReshardError(f"{self._where(step, idx)}: expected exactly 1 input buffer, got {step.ins}")
        name = step.ins[0]
        pairs = self._required(step, idx, "pairs")
        ctx = self._where(step, idx)
        try:
            pairs = [tuple(p) if isinstance(p, (list, tuple)) else p for p in pairs]
            for p in pairs:
                if isinstance(p, tuple) and len(p) == 2:
                    for r in p:
                        if r not in self.mesh:
                            raise ReshardError(f"rank {r} of pair {p} is not in {self.mesh!r}")
            dsts: set[int] = set()
            for p in pairs:  # the checks of collectives.send_recv
                if not isinstance(p, tuple) or len(p) != 2:
                    raise ReshardError(f"send_recv: each pair must be (src_rank, dst_rank), got {p!r}")
                if p[1] in dsts:
                    raise ReshardError(f"send_recv: rank {p[1]!r} is the destination of more than one pair")
                dsts.add(p[1])
            srcs = {p[0] for p in pairs}
        except (ReshardError, TypeError) as e:
            raise ReshardError(f"{ctx}: {e}") from None
        sends = [dst for src, dst in pairs if src == self.rank and dst != self.rank]
        recv_from = next((src for src, dst in pairs if dst == self.rank), None)
        x = env.get(name)

        if self.validate:  # every mesh rank learns which sources hold the buffer, and its shape
            mine = None if x is None else (tuple(x.shape), str(x.dtype).removeprefix("torch."))
            got: list[Any] = [None] * len(self.mesh.ranks)
            self._comm(step, idx, lambda: dist.all_gather_object(got, mine, group=self.mesh_group))
            granks = dist.get_process_group_ranks(self.mesh_group) if self.mesh_group is not None \
                else list(range(self.world_size))
            meta_of = dict(zip(granks, got))
            lacking = sorted(s for s in srcs if meta_of[s] is None)
            if lacking:
                raise ReshardError(f"{ctx}: source rank(s) {lacking} have no buffer {name!r}")
            if recv_from is not None:
                shape, dt = meta_of[recv_from]
                dtype = getattr(torch, dt)
        else:
            hdr_in = torch.zeros(_HDR_LEN, dtype=torch.int64, device=self.device)
            ops = []
            if sends:
                hdr_out = self._encode(x)
                ops += [dist.P2POp(dist.isend, hdr_out, dst) for dst in sends]
            if recv_from is not None and recv_from != self.rank:
                ops.append(dist.P2POp(dist.irecv, hdr_in, recv_from))
            if ops:
                self._comm(step, idx, lambda: [w.wait() for w in dist.batch_isend_irecv(ops)])
            if (sends or recv_from == self.rank) and x is None:
                raise ReshardError(f"{ctx}: rank {self.rank} has no buffer {name!r} (it holds {sorted(env)})")
            if recv_from is not None and recv_from != self.rank:
                status, dtype, shape = self._decode(hdr_in)
                if status == _MISSING:
                    raise ReshardError(f"{ctx}: source rank {recv_from} has no buffer {name!r}")
                if status != _OK:
                    raise ReshardError(f"{ctx}: source rank {recv_from}'s {name!r} has an unsupported dtype or "
                                       f"more than {_MAX_DIMS} dims")
            elif sends and (x.dim() > _MAX_DIMS or x.dtype not in _DTYPES):  # type: ignore[union-attr]
                raise ReshardError(f"{ctx}: {name!r} has an unsupported dtype or more than {_MAX_DIMS} dims")

        out: Tensor | None = None
        ops = []
        if sends:
            assert x is not None
            xc = x.contiguous()
            ops += [dist.P2POp(dist.isend, xc, dst) for dst in sends]
        if recv_from is not None:
            if recv_from == self.rank:
                assert x is not None
                out = x.clone(memory_format=torch.contiguous_format)
            else:
                out = torch.empty(shape, dtype=dtype, device=self.device)
                ops.append(dist.P2POp(dist.irecv, out, recv_from))
        if ops:
            self._comm(step, idx, lambda: [w.wait() for w in dist.batch_isend_irecv(ops)])
        env.pop(step.out, None)
        if out is not None:
            env[step.out] = out


class _ThisRank:
    """This process's rank of a ``DistRuntime``, with its buffers ``env``: ``walk``'s backend."""

    def __init__(self, rt: DistRuntime, env: dict[str, Tensor]) -> None:
        self.rt, self.env, self.where = rt, env, f"rank {rt.rank}: "

    def takes_part(self, step: Step) -> bool:
        """Every step but another mesh's or an explicit team's without this rank (a
        ``send_recv`` always: every mesh rank takes part in its checks)."""
        rt = self.rt
        return step.kind == "send_recv" or not rt.program.meshes or rt.rank in rt.program.ranks_of(step)

    def local(self, step: Step, idx: int) -> None:
        self.rt._local(step, idx, self.env)

    def collective(self, step: Step, idx: int) -> None:
        self.rt._team_collective(step, idx, self.env)

    def send_recv(self, step: Step, idx: int) -> None:
        self.rt._send_recv(step, idx, self.env)

    def after(self, step: Step) -> None:
        pass

    def free(self, names: Sequence[str]) -> None:
        for name in names:
            self.env.pop(name, None)


# ---- plans -------------------------------------------------------------------------------------
def run_plan(plan: Any, local_inputs: Mapping[str, Tensor], runtime: DistRuntime | None = None,
             input_problem: str | None = None, **runtime_kwargs: Any) -> tuple[Tensor, ...]:
    """Run a ``reshard.Plan`` on the calling rank (``dist.get_rank()``): its local output
    tensors in the order of ``plan.lowered.outputs`` (``()`` on a rank outside the mesh; in a
    multi-mesh plan, None for an output on another mesh than this rank's).

    Builds a ``DistRuntime`` (digest check, team groups) for the call and closes it after, so
    every rank must call it; to execute a plan repeatedly, pass ``runtime``, a
    ``DistRuntime.from_plan(plan)`` built once (kept open).  ``input_problem``: what the
    caller found wrong with this rank's inputs (``DistRuntime.run``).
    """
    rt = runtime if runtime is not None else DistRuntime.from_plan(plan, **runtime_kwargs)
    try:
        outs = rt.run(local_inputs, input_problem=input_problem)
    finally:
        if runtime is None:
            rt.close()
    if not rt.in_mesh:
        return ()
    # multi-mesh plans: an output lives on its own mesh's ranks (None on the others)
    mine = [buf for buf, _ in plan.lowered.outputs if rt.rank in plan.program.output_ranks(buf)]
    missing = [buf for buf in mine if buf not in outs]
    if missing:
        raise ReshardError(f"rank {rt.rank}: the program left no output buffer(s) {missing}")
    return tuple(outs[buf] if buf in mine else None for buf, _ in plan.lowered.outputs)


# ---- process management ------------------------------------------------------------------------
def init_from_env(backend: str | None = None, timeout_s: float | None = None) -> tuple[int, int, torch.device]:
    """Initialize the default process group from ``torchrun``'s environment (``env://``:
    RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK); return (rank, world size, device).

    ``backend`` defaults to "nccl" when CUDA is available, else "gloo".  With NCCL the CUDA
    device is ``LOCAL_RANK``.  Does nothing but report if the group is already initialized.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
        if missing:
            raise ReshardError(f"init_from_env: environment variables {missing} are not set (run under torchrun)")
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if "nccl" in backend:
            torch.cuda.set_device(local_rank)
        kw = {"timeout": timedelta(seconds=timeout_s)} if timeout_s is not None else {}
        if timeout_s is not None:
            os.environ.setdefault(TIMEOUT_ENV, str(timeout_s))
        dist.init_process_group(backend, init_method="env://", **kw)
    nccl = "nccl" in str(dist.get_backend())
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


#: names a running ``launch``'s result folder; its spawned processes inherit it
LAUNCH_DIR_ENV = "RESHARD_LAUNCH_DIR"


def _failure(e: BaseException) -> dict[str, Any]:
    """What went wrong in a spawned process, for the parent's error: the exception's type and
    message, its traceback, and the exception itself pickled (None when it does not pickle)."""
    try:
        exc: bytes | None = pickle.dumps(e)
    except Exception:
        exc = None
    return {"summary": "".join(traceback.format_exception_only(type(e), e)).strip(),
            "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__)), "exception": exc}


def _save(obj: Any, path: str) -> None:
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)  # the parent never reads half a file


def _refuse_unguarded_launch() -> None:
    """``launch`` called while a spawned process re-imports the main module (spawn runs its
    top-level code again in every process): report it to the launch that spawned this
    process (through ``$RESHARD_LAUNCH_DIR``), whose error then names the guard, and raise."""
    main = sys.modules.get("__mp_main__")
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv else "the main module")
    err = ReshardError(f"launch was called while a spawned process re-imported the main module {path}: spawn "
                       "runs the main module's top-level code again in every process it starts, so call "
                       "reshard.launch (and other code that must run once) under `if __name__ == \"__main__\":`")
    folder = os.environ.get(LAUNCH_DIR_ENV)
    if folder and os.path.isdir(folder):
        _save(("error", _failure(err), time.time()), os.path.join(folder, f"startup_{os.getpid()}.pt"))
    raise err


def _heartbeat(beats: Any, rank: int, every_s: float) -> None:
    """Write ``time.monotonic()`` into ``beats[rank]`` every ``every_s`` seconds, from a daemon
    thread, for as long as the process runs Python (``launch``'s liveness check)."""
    import threading

    def beat() -> None:
        while True:
            beats[rank] = time.monotonic()
            time.sleep(every_s)

    threading.Thread(target=beat, name=f"reshard-heartbeat{rank}", daemon=True).start()


def _launch_worker(rank: int, nprocs: int, init_file: str, result_dir: str, backend: str, timeout_s: float,
                   payload: bytes, beats: Any, beat_every_s: float, env: dict[str, str] | None) -> None:
    if env is not None:  # forkserver: the process inherited the server's environment, not the caller's
        os.environ.clear()
        os.environ.update(env)
    if beat_every_s > 0:
        _heartbeat(beats, rank, beat_every_s)
    open(os.path.join(result_dir, f"started_{rank}"), "w").close()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(nprocs), TIMEOUT_ENV: str(timeout_s)})
    failed = False
    try:
        try:
            fn, args = pickle.loads(payload)
        except Exception as e:
            raise ReshardError(f"rank {rank} could not load fn and its arguments ({e}): a function must be "
                               "importable in a spawned process: defined at the top level of a module or of the "
                               "main script, not in an interactive session or `python -c`") from e
        if "nccl" in backend:
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=nprocs,
                                timeout=timedelta(seconds=timeout_s))
        result: tuple = ("ok", fn(rank, *args), time.time())
    except BaseException as e:
        failed = True
        result = ("error", _failure(e), time.time())
    try:
        path = os.path.join(result_dir, f"result_{rank}.pt")
        try:
            _save(result, path)
        except Exception as e:
            failed = True
            err = ReshardError(f"rank {rank}: fn's return value could not be sent back (pickled): {e}")
            _save(("error", _failure(err), time.time()), path)
    finally:
        if dist.is_initialized() and not failed:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
    if failed:
        os._exit(1)  # skip interpreter teardown: peers may still be blocked on this rank


def _unpickled(exc: bytes | None) -> BaseException | None:
    try:
        e = pickle.loads(exc) if exc is not None else None
    except Exception:
        return None
    return e if isinstance(e, BaseException) else None


#: ``launch``'s start method when the call names none (``spawn`` when unset)
START_METHOD_ENV = "RESHARD_START_METHOD"
#: what a forkserver imports once, before it forks the ranks; not egglog (``reshard.plan``): a
#: rank that plans must start egglog's thread pool itself (``forksafe``: a forked pool has no
#: threads; importing ``reshard.plan`` starts the pool, and ranks forked from a server that had
#: imported it hung in their first optimize())
_FORKSERVER_PRELOAD = ["torch", "torch.distributed", "reshard.runtime.distributed"]


def launch(fn: Callable[..., Any], nprocs: int, *args: Any, backend: str = "gloo", timeout_s: float = 60.0,
           heartbeat_timeout_s: float | None = 120.0, join_timeout_s: float | None = None,
           grace_s: float = 10.0, start_method: str | None = None) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``nprocs`` spawned processes with an initialized default
    process group (``file://`` rendezvous in a fresh temp dir, no ports; ``GLOO_SOCKET_IFNAME=lo``
    unless set; NCCL: ``cuda:rank``); return the ranks' return values in rank order.

    ``fn`` and ``args`` must be picklable (``fn`` a function defined at the top level of a module
    or script), and so must the return values (tensors in them come back on the CPU).  Every
    process re-imports the caller's main module first (spawn), so a script calls ``launch`` under
    ``if __name__ == "__main__":``; without it the processes fail and the error says so.

    A healthy run is never cut short, however long it runs; a hang is found by the processes
    themselves:

    * ``timeout_s``: the communication timeout: the process group's (rendezvous and every
      collective) and, through ``$RESHARD_TIMEOUT_S``, that of ``DistRuntime``'s team groups.  A
      rank waiting longer than that for its peers in one collective fails (its error says so and
      names ``timeout_s``); it bounds the wait for a peer that is hung or dead, not the run.
    * ``heartbeat_timeout_s``: each process beats from a thread of its own every second or
      so; a process whose beat is older than this (stopped, or blocked in native code that
      holds Python's GIL) is hung: it is killed and the error names it and this knob.  None: no
      heartbeat.
    * ``join_timeout_s``: an optional wall-clock cap on the whole run (default None: none);
      processes still running after it are terminated and the error names it.

    If a rank fails, the others get ``grace_s`` seconds to finish before they are terminated,
    then ``ReshardError`` is raised with each failing rank's exception (type, message,
    traceback; earliest failure first), chained to the first one's exception.

    ``start_method`` (default ``$RESHARD_START_METHOD``, else ``"spawn"``): ``"spawn"`` starts a
    fresh interpreter per rank (each imports torch: seconds per launch); ``"forkserver"`` forks the
    ranks from a server process that imported torch and reshard once (at the caller's first
    forkserver launch), so later launches start in a fraction of a second.  Either way a rank runs
    with the caller's environment as it is at the call, and re-imports the main module.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # multiprocessing's own test
        _refuse_unguarded_launch()
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ReshardError(f"launch: nprocs must be a positive int, got {nprocs!r}")
    for knob, value, optional in (("timeout_s", timeout_s, False), ("heartbeat_timeout_s", heartbeat_timeout_s, True),
                                  ("join_timeout_s", join_timeout_s, True), ("grace_s", grace_s, False)):
        least = 0.0 if knob == "grace_s" else math.ulp(0.0)
        if not ((value is None and optional) or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                                 and value >= least)):
            what = "a non-negative" if knob == "grace_s" else "a positive"
            raise ReshardError(f"launch: {knob} must be {what} number of seconds{' or None' if optional else ''}, "
                               f"got {value!r}")
    try:
        payload = pickle.dumps((fn, args))
    except Exception as e:
        raise ReshardError(f"launch: fn and its arguments are sent to the spawned processes pickled, and they do "
                           f"not pickle ({e}); fn must be a function defined at the top level of a module or script, "
                           "not a lambda or a nested function") from e
    method = start_method if start_method is not None else os.environ.get(START_METHOD_ENV, "spawn")
    if method not in ("spawn", "forkserver"):
        raise ReshardError(f"launch: start_method (or ${START_METHOD_ENV}) must be 'spawn' or 'forkserver', "
                           f"got {method!r}")
    ctx = torch.multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_FORKSERVER_PRELOAD)  # read when the server starts: the first launch
    tmp = tempfile.mkdtemp(prefix="reshard-launch-")
    init_file = os.path.join(tmp, "pg_init")
    procs: list[Any] = []
    beats = ctx.RawArray("d", nprocs)  # each rank's last heartbeat (time.monotonic(); 0 before its first)
    beat_every_s = 0.0 if heartbeat_timeout_s is None else min(1.0, heartbeat_timeout_s / 4)
    deadline = None if join_timeout_s is None else time.monotonic() + join_timeout_s
    ended = _Ended()
    try:
        outer = os.environ.get(LAUNCH_DIR_ENV)
        os.environ[LAUNCH_DIR_ENV] = tmp  # inherited by the processes started here
        try:
            for r in range(nprocs):
                p = ctx.Process(target=_launch_worker, name=f"reshard-rank{r}",
                                args=(r, nprocs, init_file, tmp, backend, timeout_s, payload, beats, beat_every_s,
                                      dict(os.environ) if method == "forkserver" else None))
                p.start()
                procs.append(p)
        finally:
            if outer is None:
                del os.environ[LAUNCH_DIR_ENV]
            else:
                os.environ[LAUNCH_DIR_ENV] = outer
        first_failure: float | None = None
        while alive := [p for p in procs if p.is_alive()]:
            now = time.monotonic()
            if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure = now
            if first_failure is not None and now - first_failure > grace_s:
                break
            if deadline is not None and now > deadline:
                ended.capped = True
                break
            if heartbeat_timeout_s is not None:
                ended.hung = {r: now - beats[r] for r, p in enumerate(procs)
                              if p.is_alive() and beats[r] > 0 and now - beats[r] > heartbeat_timeout_s}
                if ended.hung:
                    break
            alive[0].join(0.05)  # (it may have ended since: join returns at once)
    finally:
        ended.stragglers = [r for r, p in enumerate(procs) if p.is_alive()]
        for r, p in enumerate(procs):
            if p.is_alive() and r in ended.hung:
                p.kill()  # a stopped process ignores SIGTERM until it resumes
            elif p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
    try:
        results: dict[int, tuple] = {}
        started = set()
        for r, p in enumerate(procs):
            for path in (os.path.join(tmp, f"result_{r}.pt"), os.path.join(tmp, f"startup_{p.pid}.pt")):
                if os.path.exists(path):
                    results[r] = torch.load(path, weights_only=False, map_location="cpu")
            if os.path.exists(os.path.join(tmp, f"started_{r}")):
                started.add(r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _launch_results(results, procs, started, ended, backend, timeout_s, heartbeat_timeout_s,
                           join_timeout_s)


class _Ended:
    """Why ``launch`` ended processes that were still running: ``hung``, rank -> seconds since
    its last heartbeat; ``capped``, the wall-clock cap ``join_timeout_s`` passed;
    ``stragglers``, the ranks still running then."""

    def __init__(self) -> None:
        self.hung: dict[int, float] = {}
        self.capped = False
        self.stragglers: list[int] = []


def _launch_results(results: dict[int, tuple], procs: list[Any], started: set[int], ended: _Ended, backend: str,
                    timeout_s: float, heartbeat_timeout_s: float | None, join_timeout_s: float | None) -> list[Any]:
    """The ranks' return values, or ``ReshardError`` saying what went wrong in each failed rank
    (ranks that failed alike are named together), naming the ``launch`` knob behind a timeout."""
    errors = sorted((res[2], r, res[1]) for r, res in results.items() if res[0] == "error")
    alike: dict[tuple[str, str], list[int]] = {}
    for _, r, f in errors:
        alike.setdefault((f["summary"], f["traceback"]), []).append(r)
    lines = []
    for (summary, tb), rs in alike.items():
        hint = ""
        if any(m in summary.lower() for m in _TIMEOUT_MARKERS) and "timeout_s" not in summary:  # (DistRuntime's names it)
            hint = (f"\n(a wait for the other ranks in the rendezvous or a collective passed the communication "
                    f"timeout, launch(timeout_s={timeout_s:g}): a peer is hung, dead or that far behind; raise "
                    "timeout_s if a rank legitimately spends longer between collectives)")
        lines.append(f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, sorted(rs)))} failed: "
                     f"{summary}{hint}\n{tb}")
    main = getattr(sys.modules.get("__main__"), "__file__", None) or "the main module"
    for r, p in enumerate(procs):
        if r in results:
            continue
        if r in ended.hung:
            lines.append(f"rank {r} was hung: no heartbeat for {ended.hung[r]:.0f} s, more than "
                         f"launch(heartbeat_timeout_s={heartbeat_timeout_s:g}) (the process was stopped, or blocked in "
                         "native code holding Python's GIL), and was killed (no result); raise heartbeat_timeout_s "
                         "if such a call legitimately takes longer, or pass None to turn the check off")
        elif r in ended.stragglers:
            why = (f"was still running at the wall-clock cap launch(join_timeout_s={join_timeout_s:g}) (leave it None: "
                   "no cap)" if ended.capped else "was still running after another rank failed or hung")
            lines.append(f"rank {r} {why} and was terminated (no result)")
        elif r not in started:
            lines.append(f"rank {r} exited with code {p.exitcode} while starting, before running fn (its traceback "
                         f"is on stderr): a spawned process first re-imports the main module ({main}), running its "
                         "top-level code again, and unpickles fn; code that must run once, such as the call to "
                         "reshard.launch, belongs under `if __name__ == \"__main__\":`")
        else:
            lines.append(f"rank {r} exited with code {p.exitcode} while running fn, without a result")
    if lines:
        cause = next((e for e in (_unpickled(f["exception"]) for _, _, f in errors) if e is not None), None)
        raise ReshardError(f"launch of {len(procs)} processes ({backend}) failed; " + "\n".join(lines)) from cause
    return [results[r][1] for r in range(len(procs))]
