"""``reshard.optimize`` and the ``Plan`` it returns."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .codegen.lower import Communication, LoweredPlan, lower
from .codegen.program import Program, Step
from .egraph_rules.cost import CostProfile
from .egraph_rules.encode import Encoding, encode
from .egraph_rules.extract import PlanNode, Snapshot, extract
from .egraph_rules.saturate import Limits, SaturationReport, saturate
from .ir.errors import ReshardError
from .ir.fusion import DTYPES, Fusion
from .ir.sharding import shard, unshard
from .runtime.local_ops import run_local
from .runtime.simulator import simulate as simulate_program

PS = 1e-12


@dataclass
class Plan:
    """A per-rank program for a Fusion, chosen by equality saturation + extraction.

    ``cost`` is the modeled time in seconds; ``communications`` the collectives in program
    order; ``comm_bytes`` the bytes each rank receives over all of them.
    """

    fusion: Fusion
    lowered: LoweredPlan
    cost: float
    report: SaturationReport
    profile: CostProfile

    @property
    def program(self) -> Program:
        return self.lowered.program

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.lowered.program.steps

    @property
    def communications(self) -> tuple[Communication, ...]:
        return self.lowered.communications

    @property
    def comm_bytes(self) -> int:
        return sum(c.moved_bytes for c in self.communications)

    @property
    def input_shardings(self) -> dict[str, list]:
        out: dict[str, list] = {}
        for _, name, ts in self.lowered.inputs:
            out.setdefault(name, []).append(ts)
        return out

    def digest(self) -> str:
        return self.program.digest()

    # ---- execution ---------------------------------------------------------------------
    def shard_inputs(self, inputs: Mapping[str, torch.Tensor], generator: torch.Generator | None = None
                     ) -> dict[int, dict[str, torch.Tensor]]:
        """Global inputs -> each rank's local program inputs."""
        per_rank: dict[int, dict[str, torch.Tensor]] = {r: {} for r in self.program.mesh_ranks}
        for buf, name, ts in self.lowered.inputs:
            if name not in inputs:
                raise ReshardError(f"Plan: no value for input {name!r} (inputs: {sorted(self.input_shardings)})")
            t = self.fusion.tensors[next(i for i in self.fusion.inputs if self.fusion.tensors[i].name == name)]
            g = inputs[name]
            if tuple(g.shape) != t.shape:
                raise ReshardError(f"Plan: input {name!r} has shape {tuple(g.shape)}, expected {t.shape}")
            for r, local in shard(g.to(DTYPES[t.dtype]), ts, generator=generator).items():
                per_rank[r][buf] = local
        return per_rank

    def simulate(self, inputs: Mapping[str, torch.Tensor], *, generator: torch.Generator | None = None
                 ) -> tuple[torch.Tensor, ...]:
        """Run the plan on simulated ranks: shard the global ``inputs``, execute the host
        program on every rank in-process, unshard the outputs (global tensors)."""
        outs = simulate_program(self.program, self.shard_inputs(inputs, generator), run_local)
        result = []
        for buf, ts in self.lowered.outputs:
            result.append(unshard({r: outs[r][buf] for r in self.program.mesh_ranks}, ts))
        return tuple(result)

    def run(self, local_inputs: Mapping[str, torch.Tensor], **runtime_kwargs: object) -> tuple[torch.Tensor, ...]:
        """Run this rank's part of the plan in a ``torch.distributed`` process group (gloo on
        CPU, NCCL on GPU; see ``reshard.launch`` / ``reshard.init_from_env``).
        ``local_inputs`` maps program input buffers to this rank's shards (``shard_inputs``
        gives them for every rank); returns this rank's local outputs."""
        from .runtime.distributed import run_plan
        return run_plan(self, local_inputs, **runtime_kwargs)

    # ---- explanation -------------------------------------------------------------------
    def explain(self) -> str:
        """A table of the chosen plan: each value's implementation, sharding, cost, and the
        alternatives extraction rejected for it."""
        lines = [f"reshard plan: modeled {self.cost * 1e6:.1f} us, {len(self.communications)} collectives, "
                 f"{self.comm_bytes} bytes received per rank  [{self.report}]"]
        lines.append(f"{'value':<10} {'implementation':<34} {'sharding':<26} {'cost':>10}  rejected alternatives")
        for n in self.lowered.nodes:
            t = self.fusion.tensors[n.value]
            impl = _describe(self.fusion, n)
            alts = ", ".join(f"{k} {c * PS * 1e6:.1f}us" for k, c in n.alternatives[:3])
            lines.append(f"{t.name:<10} {impl:<34} {str(n.sharding):<26} {n.cost_ps * PS * 1e6:>8.1f}us  {alts}")
        for c in self.communications:
            lines.append(f"  comm {c.kind} on axis {c.axis!r} (team {c.team_size}) of {c.tensor}: {c.src} -> {c.dst}, "
                         f"{c.bytes} B buffer, {c.moved_bytes} B received, {c.cost_s * 1e6:.1f} us")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Plan cost={self.cost * 1e6:.1f}us comms={[c.kind for c in self.communications]} steps={len(self.steps)}>"


def _describe(fusion: Fusion, n: PlanNode) -> str:
    if n.kind == "InAt":
        return f"input {n.input_name}"
    if n.kind in ("Loc", "Loc2"):
        op = fusion.ops[n.op]
        fn = op.attrs.get("fn")
        return f"local {op.kind}{'(' + fn + ')' if fn else ''}"
    return f"{n.kind}(axis {fusion.tensors[n.value].mesh.axis_names[n.axis]})"


def optimize(fusion: Fusion, *, cost_profile: CostProfile | dict | str | None = None,
             limits: Limits | None = None,
             progress: Callable[[SaturationReport], None] | None = None) -> Plan:
    """Find the cheapest correct distributed plan for ``fusion``.

    The Fusion is encoded into an egglog e-graph, rewrites saturate within ``limits``,
    and a DAG-aware extractor picks the cheapest implementation under ``cost_profile``.
    """
    if not isinstance(fusion, Fusion):
        raise ReshardError(f"optimize: expected a Fusion, got {type(fusion).__name__}")
    return Saturated.build(fusion, CostProfile.load(cost_profile), limits or Limits(), progress).plan()


@dataclass
class Saturated:
    """A saturated e-graph for a Fusion, from which plans are extracted."""

    fusion: Fusion
    encoding: Encoding
    snapshot: Snapshot
    report: SaturationReport
    profile: CostProfile

    @staticmethod
    def build(fusion: Fusion, profile: CostProfile, limits: Limits,
              progress: Callable[[SaturationReport], None] | None = None) -> "Saturated":
        enc = encode(fusion, profile)
        egraph, report = saturate(enc, limits, progress)
        try:
            snap = Snapshot(egraph)
        except BaseException as e:
            if type(e).__name__ == "PanicException":
                raise ReshardError(f"egglog panicked while reading the e-graph: {e}") from e
            raise
        return Saturated(fusion, enc, snap, report, profile)

    def plan(self, perturb: random.Random | None = None) -> Plan:
        """The cheapest plan (or, with ``perturb``, a random valid one, for soundness tests)."""
        roots, total = extract(self.snapshot, self.fusion, self.encoding.mesh, self.encoding.output_lets, perturb)
        return Plan(self.fusion, lower(self.fusion, roots, PS), total * PS, self.report, self.profile)


__all__ = ["Plan", "optimize", "Limits", "CostProfile"]
