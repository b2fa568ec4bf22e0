"""``reshard.optimize`` and the ``Plan`` it returns."""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .alternatives import defer_pricing
from .codegen.lower import Communication, LoweredPlan, lower
from .codegen.program import Program, Step
from .collector import rarely_collected
from .extract.dag import ENode
from .extract.extract import Extracted, check_budgets, extract
from .extract.extract_ilp import ExtractionReport, check_extractor
from .extract.layer_reuse import Shift, expand, layer_nodes, template_closed
from .extract.plan_node import PlanNode
from .forksafe import optimize_in_fresh_process
from .ir.errors import ReshardError
from .ir.fusion import Fusion
from .ir.inputs import check_inputs
from .ir.layers import Reduced, Stack, find_stack, reduce_stack
from .ir.sharding import shard, unshard
from .passes.padding import Padding
from .passes.prepare import Options, prepare
from .plan_cache import lookup
from .rules.cost_profile import CostProfile
from .runtime.local_ops import run_local
from .runtime.simulator import simulate as simulate_program
from .search.egglog_pool import pool_lost
from .search.encode import Encoding, encode
from .search.saturate import Deadline, Limits, SaturationReport, check_limits, extraction_steps
from .search.segments import MergedSnapshot, saturate_program
from .search.snapshot import Snapshot

if TYPE_CHECKING:
    from .plan_graph import GraphedPlan

PS = 1e-12


@dataclass
class Plan:
    """A per-rank program for a Fusion, chosen by equality saturation + extraction.

    ``cost`` is the modeled time in seconds; ``communications`` the collectives in program
    order; ``comm_bytes`` the bytes each rank receives over all of them.

    ``fusion`` is the Fusion the plan runs: the user's, or, when some requested sharding is
    uneven, the padded one (``passes.padding``), and then ``padding`` holds the user's Fusion
    (``padding.source``) and the boundary: ``simulate``, ``shard_inputs`` and ``run`` take and
    give DTensor's tensors (``torch.chunk`` pieces), and pad and clip them to the plan's blocks.
    """

    fusion: Fusion
    lowered: LoweredPlan
    cost: float
    report: SaturationReport
    profile: CostProfile
    #: which extractor chose the plan and whether it proved it optimal
    extraction: ExtractionReport | None = None
    #: the boundary of a plan for uneven shardings (None: the plan runs the user's Fusion)
    padding: Padding | None = None

    @property
    def source(self) -> Fusion:
        """The user's Fusion (``fusion`` unless the plan runs a padded one)."""
        return self.fusion if self.padding is None else self.padding.source

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
    def saved_bytes(self) -> int:
        """Bytes per rank of the saved activations: forward buffers the backward pass reads,
        alive together at the boundary (``LoweredPlan.saved_bytes``; 0 for programs without a
        backward pass).  ``optimize(..., memory_budget=B)`` keeps them within ``B``."""
        return self.lowered.saved_bytes

    @property
    def peak_bytes(self) -> int:
        """The most bytes a rank holds at once, its inputs included: the peak of its allocation
        plan (``LoweredPlan.peak_bytes``, ``codegen.alloc``), the largest over the ranks; the
        simulator measures the same (``simulate(..., stats=)``'s ``"peak_bytes"``)."""
        return self.lowered.peak_bytes

    @property
    def input_shardings(self) -> dict[str, list]:
        out: dict[str, list] = {}
        for _, name, ts in self.lowered.inputs:
            out.setdefault(name, []).append(ts)
        return out

    def digest(self) -> str:
        return self.program.digest()

    # ---- execution ---------------------------------------------------------------------
    def validate_inputs(self, inputs: Mapping[str, torch.Tensor], where: str = "Plan") -> None:
        """Global ``inputs`` must map every Fusion input the plan reads (by name) to a
        ``torch.Tensor`` of exactly its shape and dtype (nothing is cast; a NumPy array is an
        error: pass ``torch.from_numpy(a)``); an unknown name is reported with the input it
        likely means.  Inputs the plan does not read may be given (they are checked too).
        The same check (``reshard.ir.inputs.check_inputs``) guards each rank's local inputs
        in ``run``."""
        f = self.source
        expected = {f.tensors[i].name: (f.tensors[i].shape, f.tensors[i].dtype) for i in f.inputs}
        constants = self.padding.constants if self.padding is not None else {}
        check_inputs(inputs, expected, where, required=[n for n in self.input_shardings if n not in constants])

    def shard_inputs(self, inputs: Mapping[str, torch.Tensor], generator: torch.Generator | None = None
                     ) -> dict[int, dict[str, torch.Tensor]]:
        """Global inputs -> each rank's local program inputs (each input sharded on its own
        mesh; a rank of another mesh gets nothing for it), by ``reshard.shard``: Partial
        inputs get summands that vary only along their Partial axes (random with
        ``generator``), Replicate axes identical copies.  ``inputs`` are checked first
        (``validate_inputs``).  An uneven input gets DTensor's local tensors (``torch.chunk``
        pieces); ``run`` pads them to the plan's blocks and adds the constant inputs."""
        return self._shard_inputs(inputs, generator, "Plan.shard_inputs")

    def _shard_inputs(self, inputs: Mapping[str, torch.Tensor], generator: torch.Generator | None,
                      where: str) -> dict[int, dict[str, torch.Tensor]]:
        self.validate_inputs(inputs, where)
        per_rank: dict[int, dict[str, torch.Tensor]] = {r: {} for r in self.program.mesh_ranks}
        for buf, name, ts in self.lowered.inputs:
            if self.padding is not None:
                if name in self.padding.constants:
                    continue
                ts = self.padding.user_sharding(name, ts)
            for r, local in shard(inputs[name], ts, generator=generator).items():
                per_rank[r][buf] = local
        return per_rank

    def plan_locals(self, rank: int, local_inputs: Mapping[str, torch.Tensor],
                    where: str = "Plan.run") -> Mapping[str, torch.Tensor]:
        """Rank ``rank``'s program inputs from the local inputs a user gives (``shard_inputs``):
        the same, except for a padded plan (uneven inputs padded to their blocks, constant
        inputs added; ``Padding.plan_locals``)."""
        if self.padding is None:
            return local_inputs
        return self.padding.plan_locals(rank, self.lowered.inputs, local_inputs, where)

    def simulate(self, inputs: Mapping[str, torch.Tensor], *, generator: torch.Generator | None = None,
                 device: str | torch.device | None = None, stats: dict[str, dict[int, int]] | None = None
                 ) -> tuple[torch.Tensor, ...]:
        """Run the plan on simulated ranks: shard the global ``inputs`` (``shard_inputs``; by
        input name, each a ``torch.Tensor`` of the input's exact shape and dtype, never cast,
        see ``validate_inputs``; a NumPy array is a ``ReshardError``: pass
        ``torch.from_numpy(a)``), execute the host program on every rank in-process, unshard the outputs (global tensors on the CPU; each from the
        ranks of its own mesh; replicas along Replicate axes must agree, NaN equal to NaN).
        ``device="cuda"``: every rank's local steps run on that GPU as reshard's NVRTC kernels
        (``runtime.gpu_local``), collectives simulated; without a CUDA device it is a
        ``ReshardError``.  ``stats``, when given, gets the simulator's measurements
        (``runtime.simulator.simulate``: ``"saved_peak_bytes"`` per rank, the saved activations
        a training plan held at once, ``saved_bytes`` the plan's own figure; ``"peak_bytes"``
        per rank, all it held at once, ``peak_bytes`` the plan's own figure)."""
        kind = _simulation_device(device)
        per_rank = self._shard_inputs(inputs, generator, "Plan.simulate")
        local_step = run_local
        if kind == "cuda":
            from .runtime.gpu_local import gpu_local_step
            per_rank = {r: {k: v.to(device) for k, v in bufs.items()} for r, bufs in per_rank.items()}
            local_step = gpu_local_step
        per_rank = {r: dict(self.plan_locals(r, bufs, "Plan.simulate")) for r, bufs in per_rank.items()}
        outs = simulate_program(self.program, per_rank, local_step, stats)
        result = []
        for k, (buf, ts) in enumerate(self.lowered.outputs):
            locals_ = {r: outs[r][buf].cpu() for r in ts.mesh.ranks}
            if self.padding is not None:
                ts = self.padding.outputs[k]
                locals_ = {r: self.padding.user_output(k, r, x) for r, x in locals_.items()}
            result.append(unshard(locals_, ts))
        return tuple(result)

    def graphed(self, inputs: Mapping[str, torch.Tensor], *, device: str | torch.device = "cuda",
                generator: torch.Generator | None = None, clone: bool = False) -> "GraphedPlan":
        """The plan's step on one GPU (every rank simulated there, as ``simulate(device="cuda")``)
        captured once as a CUDA graph: the result's call replays it with no Python per step
        (``plan_graph.GraphedPlan``, ``runtime.cuda_graph``).  ``inputs``: global tensors by name
        (checked as ``validate_inputs``); those every rank holds whole (replicated; all of a
        1-rank plan's) are read in place, so an optimizer's in-place updates need no copy.
        ``graphed(...)(new_inputs)`` returns the outputs as global GPU tensors, the graph's own
        (overwritten by the next call) unless ``clone``.  No CUDA device, a step that cannot be
        captured (a host sync, a CPU tensor) or a padded plan: ``ReshardError``."""
        from .plan_graph import GraphedPlan
        if _simulation_device(device, "Plan.graphed") != "cuda":
            raise ReshardError(f"Plan.graphed: device={device!r}: a CUDA graph runs on a CUDA device")
        return GraphedPlan(self, inputs, device=torch.device(device), generator=generator, clone=clone)

    def run(self, local_inputs: Mapping[str, torch.Tensor], **runtime_kwargs: object) -> tuple[torch.Tensor, ...]:
        """Run this rank's part of the plan in a ``torch.distributed`` process group (gloo on
        CPU, NCCL on GPU; see ``reshard.launch`` / ``reshard.init_from_env``).
        ``local_inputs`` maps program input buffers to this rank's shards (``shard_inputs``
        gives them for every rank), checked like ``validate_inputs`` (exact local shape and
        dtype; an unknown buffer name is reported) on every rank before any communication;
        returns this rank's local outputs.  Uneven inputs and outputs are DTensor's local
        tensors (``torch.chunk`` pieces, possibly empty; one of another shape, the padded block
        included, fails on every rank, naming the shape that rank must give).
        ``runtime=DistRuntime.from_plan(plan)``
        reuses a runtime across calls (``runtime.distributed.run_plan``)."""
        import torch.distributed as dist

        from .runtime.distributed import run_plan
        if self.padding is None:
            return run_plan(self, local_inputs, **runtime_kwargs)
        rank = dist.get_rank()
        try:
            plan_inputs, problem = self.plan_locals(rank, local_inputs), None
        except ReshardError as e:  # raised by every rank together (input_problem)
            plan_inputs, problem = local_inputs, str(e)
        outs = run_plan(self, plan_inputs, input_problem=problem, **runtime_kwargs)
        return self.padding.user_outputs(rank, outs) if outs else outs

    # ---- explanation -------------------------------------------------------------------
    def explain(self, full: bool | None = None) -> str:
        """The chosen plan as a table (per step: value, op, sharding in -> out, collective
        and team, bytes received, modeled time; totals; a training plan's in a forward and a
        backward section, each with its totals), then each collective with the
        cheapest rejected way to get the same value at the same sharding, each op with
        its cheapest rejected strategy, priced by sub-plan and whole-plan cost, and each fed
        input the plan reshards, with why (``reshard.explain``; ``print_explanation`` renders
        it with ``rich`` on a terminal).  A plan of more than a few dozen steps is explained
        in brief unless ``full=True`` (``reshard.summary``: totals, a line per layer with
        repeated layers folded, the collectives, the changed placements); ``full=False``
        asks for the brief form of any plan."""
        from .explain import explain_text
        return explain_text(self, full=full)

    def draw(self, path: str | Path, full: bool | None = None) -> Path:
        """Draw the plan as a left-to-right DAG to ``path`` (``.png`` or ``.svg``; a training
        plan's forward and backward passes as two clusters; see ``reshard.draw``); returns the path.
        A box per step, repeated layers one box; a large plan a box per layer or module, unless
        ``full=True`` (every step); ``full=False``: a box per layer or module.  A PNG is at most
        4000 pixels a side."""
        from .draw import draw_plan
        return draw_plan(self, path, full=full)

    def __repr__(self) -> str:
        return f"<Plan cost={self.cost * 1e6:.1f}us comms={[c.kind for c in self.communications]} steps={len(self.steps)}>"


def _simulation_device(device: str | torch.device | None, where: str = "Plan.simulate") -> str:
    """"cpu" or "cuda" for ``Plan.simulate``'s (``where``'s) ``device``; a CUDA device this
    torch does not have is a ``ReshardError``."""
    if device is None:
        return "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ReshardError(f"{where}: device must be 'cpu' or a CUDA device, got {device!r} ({e})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ReshardError(f"{where}: device must be 'cpu' or a CUDA device, got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ReshardError(f"{where}: device={device!r}, but this torch ({torch.__version__}) sees no "
                               "CUDA device (a CPU-only build or no GPU); simulate on the CPU (device=None)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ReshardError(f"{where}: device={device!r}, but there are only "
                               f"{torch.cuda.device_count()} CUDA devices")
    return dev.type


def optimize(fusion: Fusion, *, cost_profile: CostProfile | dict | str | None = None,
             limits: Limits | None = None,
             progress: Callable[[SaturationReport], None] | None = None,
             extractor: str = "greedy", ilp_time_limit_s: float | None = 30.0,
             memory_budget: int | None = None, comm_budget: int | None = None,
             cache: bool | None = None) -> Plan:
    """Find the cheapest correct distributed plan for ``fusion``.

    The Fusion is encoded into an egglog e-graph, rewrites saturate within ``limits``,
    and a DAG-aware extractor picks the cheapest implementation under ``cost_profile``:
    ``extractor="greedy"`` (default, fast), ``"windows"`` (greedy, then the ILP on windows
    of 30 ops: slower, closer to the optimum on deep programs) or ``"ilp"`` (exact, scipy HiGHS; for small
    e-graphs; if it cannot prove optimality within ``ilp_time_limit_s`` it warns and keeps
    the cheaper of its incumbent and the greedy extractor's plan, see ``Plan.extraction``).
    ``limits.time_limit_s`` bounds the whole call (``Limits``); ``plan.report.cut`` names
    the phases it cut short.  ``progress`` is called with the ``SaturationReport`` after each
    growth round (``phase`` "saturation": segment, iterations, e-nodes, seconds), once
    when saturation has ended and the plan's extraction starts (``phase`` "extraction",
    ``step`` ""), and as each step of extraction and lowering starts (``step``: "greedy",
    "sharing search 12/154 re-extractions", "exact windows 40/205", ..., "lowering";
    ``SaturationReport.step``); ``reshard demo`` prints them.

    ``memory_budget``: for a training step (a Fusion with ``saved`` ops, the forward / backward
    boundary), the bytes per rank the plan may keep alive for the backward pass (program
    inputs and parameters count 0).  Keeping a value or recomputing it in the backward pass
    from saved operands are alternatives in the e-graph (``rules.remat``); without a
    budget extraction counts time only, with one it also prices kept bytes, with a multiplier
    searched until the plan fits (``extract.memory``), and every forward value a recompute
    reads gets a saved twin first (``passes.recompute``: whole chains may be recomputed from what
    is kept; ``plan.fusion`` is then that Fusion).  ``ReshardError`` when even the plan
    keeping the fewest bytes does not fit (it says that minimum).  ``plan.saved_bytes``: what
    the plan keeps.

    ``comm_budget``: the bytes each rank may receive over the plan's communications
    (``plan.comm_bytes``, the convention of ``CollectiveKind.moved_bytes``), e.g. for a shared
    network.  Extraction then prices received bytes with a multiplier searched the same way
    (``extract.budget``; the e-graph is not saturated again): the fastest plan found whose
    ``comm_bytes`` is within the budget, the time-only plan itself when it fits.
    ``ReshardError`` when even the plan receiving the fewest bytes found exceeds it (it says
    that minimum).  With both budgets, the communication multiplier is searched outermost and
    each of its extractions searches the memory multiplier: the plan returned meets both (the
    fastest such plan the nested search finds), or ``ReshardError``.  The search finds plans on
    the convex hull of (time, bytes) only: a budget between two of them gets the one below.

    ``cache``: plans are cached on disk by the Fusion, the cost profile, these options and
    reshard's code (``plan_cache``: ``$RESHARD_PLAN_CACHE``, ``off`` disables it), so the
    second call for the same program returns the stored plan (``plan.report.cached``; no
    ``progress`` reports then).  None: follow the environment; False: neither read nor write.
    """
    if not isinstance(fusion, Fusion):
        raise ReshardError(f"optimize: expected a Fusion, got {type(fusion).__name__}")
    check_extractor(extractor)
    limits = limits or Limits()
    check_limits(limits)
    check_budgets(memory_budget, comm_budget)  # (before saturating)
    slot = lookup(cache, fusion, cost_profile, limits, extractor=extractor, ilp_time_limit_s=ilp_time_limit_s,
                  memory_budget=memory_budget, comm_budget=comm_budget)
    if slot.plan is not None:
        return slot.plan  # type: ignore[return-value]
    if pool_lost():  # forked after egglog ran here: egglog's thread pool did not survive
        return slot.store(optimize_in_fresh_process(  # stored under this call's key (the child's limits differ)
            fusion, dict(cost_profile=cost_profile, limits=limits, extractor=extractor,
                         ilp_time_limit_s=ilp_time_limit_s, memory_budget=memory_budget, comm_budget=comm_budget,
                         cache=False), progress))
    deadline = Deadline(limits.time_limit_s)
    profile = CostProfile.load(cost_profile)
    plan = None
    with rarely_collected():
        if extractor != "ilp" and memory_budget is None and comm_budget is None and limits.reuse_layers:
            plan = _plan_stack(fusion, profile, limits, progress, deadline, ilp_time_limit_s)
        if plan is None:
            sat = Saturated.build(fusion, profile, limits, progress, deadline, recompute=memory_budget is not None)
            plan = sat.plan(extractor=extractor, ilp_time_limit_s=ilp_time_limit_s, deadline=deadline,
                            memory_budget=memory_budget, comm_budget=comm_budget)
    _warn_cut(plan, limits)
    return slot.store(plan)


def _warn_cut(plan: "Plan", limits: Limits) -> None:
    """Warn when a limit stopped saturation (``max_iterations``, ``max_enodes``: the plan is
    the best of what was grown, the same on any machine) or ``limits.time_limit_s`` cut a phase
    short: what was cut and what the plan costs against the plan the extraction started from
    (the greedy one: the search only keeps cheaper plans), and that the plan now depends on the
    machine's speed and load."""
    report = plan.report
    if report.limit_hit is not None and not report.cut:
        warnings.warn(f"reshard: saturation stopped at {report.limit_hit} before every rewrite had run "
                      f"({report}): the plan is the best among the alternatives grown so far; raise the limit "
                      "in rs.Limits for a plan from the whole e-graph", stacklevel=3)
    if not report.cut:
        return
    ex = plan.extraction
    base = "" if ex is None or ex.greedy_cost is None or ex.cost is None else (
        f"; the plan models {ex.cost / 1e6:.1f} us against the greedy plan's {ex.greedy_cost / 1e6:.1f} us "
        "(the baseline it never exceeds)")
    warnings.warn(f"reshard: time_limit_s={limits.time_limit_s} cut short: {', '.join(report.cut)} "
                  f"({report}){base}; this plan depends on the machine's speed and load, and is not "
                  "cached (without a time limit, planning is bounded by work and gives the same plan anywhere)",
                  stacklevel=3)


#: the layers of a stack planned together (``_plan_stack``): the first three and the last
KEEP_LAYERS = 4


def _plan_stack(fusion: Fusion, profile: CostProfile, limits: Limits,
                progress: Callable[[SaturationReport], None] | None, deadline: Deadline,
                ilp_time_limit_s: float | None) -> "Plan | None":
    """The plan of a program with a regular stack of ``KEEP_LAYERS`` layers or more
    (``ir.layers``), its layers planned once (``StackProgram``).  None when the program has no
    such stack, or no middle layer's plan can be repeated (the whole program is planned then)."""
    stack = StackProgram.of(fusion)
    if stack is None:
        return None
    return stack.plan(stack.saturate(profile, limits, progress, deadline), ilp_time_limit_s, deadline)


@dataclass
class StackProgram:
    """A program with a regular stack of ``KEEP_LAYERS`` layers or more (``ir.layers``),
    prepared for planning its layers once: ``reduced``, the program cut down to its first
    ``KEEP_LAYERS - 1`` layers and its last, is saturated and extracted, and the middle layer's
    plan whose repetition costs least is repeated for the layers between
    (``extract.layer_reuse``; gradient buckets within one layer each).  ``program``: the whole
    program as prepared (``passes.prepare``: buckets, padding), the one the plan runs."""

    program: Fusion
    stack: Stack
    reduced: Reduced
    padding: Padding | None
    #: ``expansions`` computed, by the reduced plan's identity (with the plan, which it keeps
    #: alive): extraction ranks its candidates by them and ``plan`` lowers the chosen one's
    _expanded: dict[int, tuple[list[PlanNode], dict[int, tuple[list[PlanNode], int, Shift]]]] = field(
        default_factory=dict, repr=False, compare=False)

    @staticmethod
    def of(fusion: Fusion) -> "StackProgram | None":
        """``fusion``'s stack, or None when it has none of ``KEEP_LAYERS`` layers or more."""
        prep = prepare(fusion, Options(stack_depth=KEEP_LAYERS))
        if prep.stack is None:
            return None
        full = find_stack(prep.fusion, min_depth=KEEP_LAYERS) if prep.bucketed else prep.stack
        red = None if full is None else reduce_stack(prep.fusion, full, KEEP_LAYERS)
        return None if red is None else StackProgram(prep.fusion, full, red, prep.padding)

    def saturate(self, profile: CostProfile, limits: Limits,
                 progress: Callable[[SaturationReport], None] | None = None,
                 deadline: Deadline | None = None) -> "Saturated":
        """The saturated e-graph of the reduced program."""
        enc = encode(self.reduced.fusion, profile)
        snap, report = saturate_program(enc, limits, progress, deadline)
        return Saturated(self.reduced.fusion, enc, snap, report, profile, progress=progress,
                         model_parallel=limits.model_parallel)

    def plan(self, sat: "Saturated", ilp_time_limit_s: float | None = 30.0,
             deadline: Deadline | None = None) -> "Plan | None":
        """The whole program's plan from ``sat``, the reduced program's e-graph (``saturate``):
        the reduced program extracted with exact windows (a few layers; a repeated layer repeats
        what its plan misses), the middle layer's plan repeated whose repetition costs least
        (``expansions``; of equal ones the later layer).  None when no middle layer's plan can be
        repeated."""
        red = self.reduced
        got, info = sat.extracted(extractor="windows", ilp_time_limit_s=ilp_time_limit_s, deadline=deadline,
                                  rank=self.expanded_cost)
        options = self.expansions(got.roots)
        if not options:
            return None
        t = min(options, key=lambda t: (options[t][1], -t))
        roots, cost, shift = options[t]
        sat.step(f"lowering (layer {red.kept[t]}'s plan repeated for {self.stack.depth - KEEP_LAYERS + 1} layers)")
        report = replace(sat.report, layers=(self.stack.depth, red.kept, t))
        info.cost, info.greedy_cost = cost, None
        plan = Plan(self.program, lower(self.program, roots, PS), cost * PS, report, sat.profile, info,
                    self.padding)
        shift.bytes = plan.comm_bytes - got.received
        return plan

    def expanded_cost(self, roots: list[PlanNode]) -> int | None:
        """The cost (ps) of the whole program's plan from the reduced plan ``roots``, its
        cheapest repetition (``expansions``); None where no middle layer's plan can be repeated.
        Extraction chooses among its finished candidates by it (``extract.extract``'s ``rank``):
        the candidate cheapest on the reduced program may repeat a dearer middle layer (Mixtral-8x7B
        at dp 2 x tp 4, 32 layers: the model-parallel candidate's plan, cheaper on the 4 layers,
        714.54 ms against the plain one's 713.18)."""
        return min((cost for _, cost, _ in self.expansions(roots).values()), default=None)

    def expansions(self, roots: list[PlanNode]) -> dict[int, tuple[list[PlanNode], int, Shift]]:
        """The whole program's plan for each middle layer ``t`` of the reduced plan ``roots``
        whose plan can be repeated (``template_closed``): t -> ``expand``'s (the outputs' nodes,
        the cost in ps, the ``Shift``).  The middle layers' plans may differ where the reduced
        program's choices cost alike, and their repetitions then do not (``plan`` takes the
        cheapest: the 32-layer Llama-2-7B training step at dp 2 x tp 4, layer 1's 156,498 us
        against layer 2's 156,890).  Computed once per plan (``_expanded``)."""
        known = self._expanded.get(id(roots))
        if known is not None and known[0] is roots:
            return known[1]
        red = self.reduced
        nodes = layer_nodes(red, roots)
        got = {t: expand(self.program, self.stack, red, roots, nodes, t)
               for t in range(1, KEEP_LAYERS - 1) if template_closed(red, nodes, t)}
        self._expanded[id(roots)] = (roots, got)
        return got


@dataclass
class Saturated:
    """A saturated e-graph for a Fusion, from which plans are extracted."""

    fusion: Fusion
    encoding: Encoding
    snapshot: Snapshot | MergedSnapshot
    report: SaturationReport
    profile: CostProfile
    #: the boundary when ``fusion`` is the padded Fusion of an uneven one (``build``)
    padding: Padding | None = None
    #: the nodes' costs when the e-graph is read at other mesh sizes (``extract.repricing``)
    reprice: Callable[[list[ENode]], list[int]] | None = None
    #: optimize()'s ``progress``, told each step of every extraction from this e-graph
    #: (``search.saturate.extraction_steps``) and of lowering its plan
    progress: Callable[[SaturationReport], None] | None = None
    #: extraction's model-parallel candidate (``Limits.model_parallel``)
    model_parallel: bool = True

    def step(self, step: str) -> None:
        """Report extraction step ``step`` to ``progress`` (if any)."""
        say = extraction_steps(self.report, self.progress)
        if say is not None:
            say(step)

    @staticmethod
    def build(fusion: Fusion, profile: CostProfile, limits: Limits,
              progress: Callable[[SaturationReport], None] | None = None,
              deadline: Deadline | None = None, recompute: bool = False) -> "Saturated":
        """Saturate the e-graph of ``fusion`` made ready by ``passes.prepare`` (padded when some
        requested sharding is uneven, the decomposed form of each fused attention value and its
        gradients' buckets as alternatives).  ``recompute``: a
        training Fusion gets saved twins of every forward value a recompute reads
        (``passes.recompute``), so that a memory budget may recompute whole chains."""
        prep = prepare(fusion, Options(recompute=recompute))
        enc = encode(prep.fusion, profile)
        snap, report = saturate_program(enc, limits, progress, deadline)
        return Saturated(prep.fusion, enc, snap, report, profile, prep.padding, progress=progress,
                         model_parallel=limits.model_parallel)

    def plan(self, perturb: random.Random | None = None, *, extractor: str = "greedy",
             ilp_time_limit_s: float | None = 30.0, deadline: Deadline | None = None,
             memory_budget: int | None = None, comm_budget: int | None = None) -> Plan:
        """The cheapest plan by ``extractor`` (see ``optimize``), or, with ``perturb``, a random
        valid one, for soundness tests.  Past ``deadline``, the sharing search stops and the
        ILP gets no more time (the greedy plan stands); ``report.cut`` says so.
        ``memory_budget``, ``comm_budget``: see ``optimize`` (each call extracts again from this
        e-graph).  The communication budget is checked on the lowered plan too: its
        ``comm_bytes`` must be the bytes extraction priced (``extract.received``)."""
        got, info = self.extracted(perturb, extractor=extractor, ilp_time_limit_s=ilp_time_limit_s,
                                   deadline=deadline, memory_budget=memory_budget, comm_budget=comm_budget)
        self.step("lowering")
        plan = Plan(self.fusion, lower(self.fusion, got.roots, PS), got.cost * PS, self.report, self.profile, info,
                    self.padding)
        if comm_budget is not None and plan.comm_bytes != got.received:
            raise ReshardError(f"internal: the plan extracted for comm_budget={comm_budget} was priced at "
                               f"{got.received} bytes received per rank, but its lowered communications move "
                               f"{plan.comm_bytes}")
        return plan

    def extracted(self, perturb: random.Random | None = None, *, extractor: str = "greedy",
                  ilp_time_limit_s: float | None = 30.0, deadline: Deadline | None = None,
                  memory_budget: int | None = None, comm_budget: int | None = None,
                  rank: Callable[[list[PlanNode]], int | None] | None = None
                  ) -> tuple[Extracted, ExtractionReport]:
        """The extracted plan (see ``plan``) and the report of its extraction, before lowering;
        ``rank``: see ``extract.extract``."""
        info = ExtractionReport(extractor)
        stop = None
        if deadline is not None:
            stop = lambda: deadline.check("sharing search")  # noqa: E731
            if extractor == "ilp":
                left = max(0.0, deadline.left())
                ilp_time_limit_s = left if ilp_time_limit_s is None else min(ilp_time_limit_s, left)
        got = extract(self.snapshot, self.fusion, self.encoding.mesh, self.encoding.output_lets, perturb,
                      extractor=extractor, time_limit_s=ilp_time_limit_s, report=info, stop=stop,
                      memory_budget=memory_budget, comm_budget=comm_budget, reprice=self.reprice,
                      progress=extraction_steps(self.report, self.progress), rank=rank,
                      model_parallel=self.model_parallel)
        defer_pricing(got.pricing)
        info.cost, info.kept_bytes, info.multiplier = got.cost, got.kept, got.multiplier
        info.comm_bytes, info.comm_multiplier = got.received, got.comm_multiplier
        if got.multiplier or got.comm_multiplier:  # the last search priced bytes: its greedy cost is no time
            info.greedy_cost = None
        if deadline is not None:
            if extractor == "ilp" and not info.optimal and deadline.passed():
                deadline.check("ILP extraction")
            self.report.cut += [c for c in deadline.cut if c not in self.report.cut]
        return got, info


__all__ = ["Plan", "optimize", "Limits", "CostProfile"]
