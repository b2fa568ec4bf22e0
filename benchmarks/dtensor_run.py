"""Run the suite's DTensor programs on CPU in gloo processes and account their collectives.

Accounting convention (the same as ``reshard.codegen.lower.Communication.moved_bytes``):
for each collective, with n the team (process-group) size,

- allgather: buffer = the per-rank *result* (n x the local input); received = buffer·(n-1)/n
- reduce-scatter: buffer = the per-rank *operand*; received = buffer·(n-1)/n
- allreduce: buffer = the operand; received = 2·buffer·(n-1)/n (ring: reduce-scatter + allgather)
- all-to-all: buffer = the operand; received = buffer·(n-1)/n (evenly split)

(integer floor, as reshard does).  Modeled time is reshard's α-β law with the same
``CostProfile``: ``α_kind + buffer·f(n)/busbw_kind``, f = (n-1)/n, 2(n-1)/n for allreduce
(``reshard.rules.cost``, computed here in integer picoseconds exactly as the e-graph rules do).

Collectives are recorded by a ``TorchDispatchMode`` that sees the c10d functional ops
DTensor issues (``_c10d_functional.all_gather_into_tensor``, ``reduce_scatter_tensor``,
``all_reduce``, ``all_to_all_single``, ``broadcast``, ``_dtensor.shard_dim_alltoall``);
``CommDebugMode``'s total count is kept beside it as a cross-check.  One CPU detail:
DTensor's ``Shard(i) -> Shard(j)`` calls ``shard_dim_alltoall``, which on a CPU mesh falls
back to allgather + chunk (gloo has no alltoall there).  On GPU it is one all-to-all, so the
wrapper records that call as one all-to-all of its operand (what DTensor does on the
hardware the cost profile describes) and runs the CPU fallback unrecorded; CommDebugMode's
count still sees the fallback's allgather.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch

import reshard as rs
from reshard.cli import random_inputs
from reshard.rules.cost_profile import CostProfile
from reshard.ir.collective_kinds import KIND
from reshard.rules.collectives import TEAM_CTORS

#: the team collectives reshard's plans use (moved-bytes convention and α-β law shared with it)
TEAM_KINDS = frozenset(k.name for k in TEAM_CTORS.values())


@dataclass(frozen=True)
class Coll:
    """One recorded collective: kind (reshard's names), team size, buffer bytes (convention above)."""

    kind: str
    team: int
    buffer: int
    received: int | None = None
    """Bytes received per rank when the kind has no convention above (a point-to-point send)."""

    @property
    def moved_bytes(self) -> int:
        if self.received is not None:
            return self.received
        if self.kind not in TEAM_KINDS:
            raise rs.ReshardError(f"no moved-bytes convention for a {self.kind} collective")
        return KIND[self.kind].moved_bytes(self.buffer, self.team)

    def cost_s(self, prof: CostProfile) -> float:
        return collective_time_s(self.kind, self.buffer, self.team, prof)


def collective_time_s(kind: str, buffer: int, team: int, prof: CostProfile) -> float:
    """reshard's α-β law (rules/cost.py ``_coll``), integer picoseconds -> seconds."""
    if kind not in TEAM_KINDS:
        raise rs.ReshardError(f"no α-β law for a {kind!r} collective (profile {prof.name!r})")
    alpha_us, gbps = prof.collective(kind, team)
    bw = max(1, int(round(gbps)))
    mul = KIND[kind].bus_mul
    return (prof.ps(alpha_us) + (buffer * (mul * ((team - 1) * 1000))) // (team * bw)) * 1e-12


# ---- recording ----------------------------------------------------------------------------------
def _group_size(group_name: Any) -> int:
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(group_name).size()


class CollectiveRecorder:
    """Context manager recording every collective issued inside it (see the module doc)."""

    def __init__(self) -> None:
        self.colls: list[Coll] = []
        self._suspended = 0

    def _record(self, func: Any, args: tuple) -> None:
        if self._suspended:
            return
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        ns = getattr(func, "namespace", "")
        if ns not in ("_c10d_functional", "_dtensor"):
            return
        x = args[0]
        nbytes = x.numel() * x.element_size()
        if name == "all_gather_into_tensor":
            n = int(args[1])
            self.colls.append(Coll("allgather", n, nbytes * n))
        elif name == "reduce_scatter_tensor":
            self.colls.append(Coll("reduce_scatter", int(args[2]), nbytes))
        elif name == "all_reduce":
            self.colls.append(Coll("allreduce", _group_size(args[2]), nbytes))
        elif name == "all_to_all_single":
            self.colls.append(Coll("all_to_all", _group_size(args[3]), nbytes))
        elif name == "shard_dim_alltoall":
            self.colls.append(Coll("all_to_all", _group_size(args[3]), nbytes))
        elif name == "broadcast":
            self.colls.append(Coll("broadcast", _group_size(args[2]), nbytes))
        elif name not in ("wait_tensor", "_wrap_tensor_autograd"):  # not collectives
            self.colls.append(Coll(name, 0, nbytes))

    @contextlib.contextmanager
    def __call__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        import torch.distributed.tensor.placement_types as pt
        rec = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                rec._record(func, args)
                return func(*args, **(kwargs or {}))

        orig = pt.shard_dim_alltoall

        def wrapped(input, gather_dim, shard_dim, mesh, mesh_dim):
            if not rec._suspended:
                rec.colls.append(Coll("all_to_all", mesh.size(mesh_dim), input.numel() * input.element_size()))
            rec._suspended += 1
            try:
                return orig(input, gather_dim, shard_dim, mesh, mesh_dim)
            finally:
                rec._suspended -= 1

        pt.shard_dim_alltoall = wrapped
        try:
            with _Mode():
                yield self
        finally:
            pt.shard_dim_alltoall = orig


# ---- one rank's work ------------------------------------------------------------------------------
def _run_case(rank: int, key: str, k: int, seed: int, meshes: dict) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    from .suite import get, to_dtensor_placements

    case = get(key)
    f = case.fusion(k)
    if case.mesh_shape not in meshes:
        names = ("x",) if len(case.mesh_shape) == 1 else ("x", "y")
        meshes[case.mesh_shape] = init_device_mesh("cpu", case.mesh_shape, mesh_dim_names=names)
    mesh = meshes[case.mesh_shape]
    inputs = random_inputs(f, seed)
    dts: dict[str, Any] = {}
    for i in f.inputs:
        t = f.tensors[i]
        pl = to_dtensor_placements(t.sharding)
        base = [Replicate() if isinstance(p, Partial) else p for p in pl]
        d = distribute_tensor(inputs[t.name], mesh, base, src_data_rank=None)
        if base != pl:
            # a Partial(sum) input: the value on coordinate 0 of each partial axis, zeros elsewhere
            # (DTensor refuses redistribute(..., Partial()) from user code)
            local = d.to_local()
            for a, p in enumerate(pl):
                if isinstance(p, Partial) and mesh.get_local_rank(mesh_dim=a) != 0:
                    local = torch.zeros_like(local)
            d = DTensor.from_local(local, mesh, pl, run_check=False)
        dts[t.name] = d
    want = [to_dtensor_placements(ts) for _, ts in f.outputs]
    rec = CollectiveRecorder()
    cdm = CommDebugMode()
    with rec(), cdm:
        outs = case.dtensor(mesh, **dts)
    got = [list(o.placements) for o in outs]
    fulls = [o.full_tensor() for o in outs]
    res: dict = {"colls": rec.colls, "commdebug_total": cdm.get_total_counts(),
                 "commdebug": {str(kk): v for kk, v in cdm.get_comm_counts().items()},
                 "placements_ok": got == [list(w) for w in want]}
    if rank == 0:
        refs = rs.run_reference(f, inputs)
        errs = []
        for o, r in zip(fulls, refs):
            if tuple(o.shape) != tuple(r.shape):
                errs.append(math.inf)
                continue
            errs.append(((o.double() - r.double()).abs().max() / r.double().abs().max().clamp_min(1e-30)).item())
        res["rel_err"] = max(errs) if errs else 0.0
    return res


def worker(rank: int, keys: list[str], k: int, seed: int) -> dict[str, tuple[str, Any]]:
    """Run every case in ``keys`` (all on meshes of this world size) on this rank."""
    meshes: dict = {}
    out: dict[str, tuple[str, Any]] = {}
    for key in keys:
        try:
            out[key] = ("ok", _run_case(rank, key, k, seed, meshes))
        except Exception as e:  # noqa: BLE001 - reported per case, ranks fail alike
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            out[key] = ("error", f"{type(e).__name__}: {first}")
    return out


def run_dtensor(keys: list[str], k: int, seed: int = 0, timeout_s: float = 300.0) -> dict[str, tuple[str, Any]]:
    """Run the DTensor programs of ``keys`` in gloo processes, one launch per world size.
    Returns {key: ("ok", rank-0 result dict) | ("error", message)}."""
    from .suite import get
    by_world: dict[int, list[str]] = {}
    for key in keys:
        by_world.setdefault(get(key).world, []).append(key)
    results: dict[str, tuple[str, Any]] = {}
    for world, ks in sorted(by_world.items()):
        per_rank = rs.launch(worker, world, ks, k, seed, timeout_s=timeout_s)
        r0 = per_rank[0]
        for key in ks:
            status, val = r0[key]
            if status == "ok":
                # every rank must have recorded the same collectives (SPMD)
                same = all(pr[key][0] == "ok" and pr[key][1]["colls"] == val["colls"] for pr in per_rank)
                val["ranks_agree"] = same
            results[key] = (status, val)
    return results


__all__ = ["Coll", "CollectiveRecorder", "collective_time_s", "run_dtensor", "worker"]
