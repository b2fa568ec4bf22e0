"""The ``reshard`` command line: ``reshard demo``, ``reshard explain FILE``, ``reshard tune``
(see ``DESCRIPTION``, which ``reshard --help`` prints).

Nothing heavy is imported at module level (torch, egglog, the optimizer): ``reshard --help``
and argument errors answer at once; a command imports what it runs.
"""

from __future__ import annotations

import argparse
import re
import runpy
import sys
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .rules.cost_profile import CostProfile
    from .search.saturate import Limits, SaturationReport
    from .ir.fusion import Fusion
    from .plan import Plan

DESCRIPTION = """\
Plan the communication of a distributed tensor program and check the plan.

commands:
  reshard demo          optimize a built-in Llama-style layer (RMSNorm, causal softmax
                        attention with rope, SwiGLU; Megatron's placements) at Llama-2-7B's
                        sizes (--block simplified: a simplified transformer block instead),
                        explain the plan, run the same plan on a small instance on
                        CPU-simulated ranks and check it against the unsharded reference
  reshard explain FILE  optimize and explain the program a Python file defines (fusion, a
                        reshard.Fusion, or build() returning a Fusion or a reshard.from_torch
                        program), run it on CPU-simulated ranks and check it
  reshard rules         print the e-graph's rewrite rules with their laws, by family, and
                        its tables with their meanings
  reshard tune          measure collectives, copy bandwidth, matmul peak and launch overhead
                        on this machine and write a cost profile

Run 'reshard COMMAND --help' for a command's options.
"""

#: ``reshard.Limits``' defaults, stated here so that ``--help`` needs no egglog import
#: (tests/e2e/test_cli.py checks that they agree)
#: ``Limits().time_limit_s``: no wall-clock limit (planning is bounded by work)
TIME_LIMIT_S = None
SEGMENT_OPS = 64


def _profile_names() -> list[str]:
    """The cost profiles shipped in reshard/profiles, read as ``rules.cost_profile.builtin_profiles``
    reads them (without importing it: it imports torch)."""
    root = resources.files("reshard") / "profiles"
    return sorted(e.name[:-5] for e in root.iterdir() if e.name.endswith(".json"))


class _Progress:
    """Planning progress on stderr: saturation's iterations, e-nodes and elapsed time, every
    ``every`` iterations or after ``seconds`` without a line, whichever comes first; one line
    when saturation ends and the plan's extraction starts; then each step of extraction as it
    starts (a counted step, "sharing search 12/154 re-extractions", again after ``seconds``
    without a line)."""

    def __init__(self, every: int = 3, seconds: float = 2.0) -> None:
        self.every, self.seconds, self.last = every, seconds, 0.0
        self.start, self.said, self.said_at = time.perf_counter(), "", 0.0

    def __call__(self, report: "SaturationReport") -> None:
        if report.phase == "extraction":
            self._extraction(report)
            return
        if report.iterations % self.every and report.seconds - self.last < self.seconds:
            return
        self.last = report.seconds
        where = f"segment {report.segment}/{report.segments}, " if report.segments > 1 else ""
        print(f"  saturation: {where}iteration {report.iterations}, {report.enodes} e-nodes, "
              f"{report.seconds:.2f} s elapsed", file=sys.stderr, flush=True)

    def _extraction(self, report: "SaturationReport") -> None:
        now = time.perf_counter() - self.start
        if not report.step:
            print(f"  saturation done: {report.iterations} iterations, {report.enodes} e-nodes, "
                  f"{report.seconds:.2f} s; extracting the plan ...", file=sys.stderr, flush=True)
            return
        what = re.sub(r"\d+", "#", report.step)
        if what == self.said and now - self.said_at < self.seconds:
            return
        self.said, self.said_at = what, now
        print(f"  extraction: {report.step} ({now:.1f} s elapsed)", file=sys.stderr, flush=True)


def random_inputs(fusion: "Fusion", seed: int = 0, fixed: Mapping[str, "torch.Tensor"] | None = None
                  ) -> dict[str, "torch.Tensor"]:
    """Random global inputs for ``fusion`` (scaled so that deep blocks stay well conditioned);
    the inputs named in ``fixed`` (e.g. a traced module's constants) take those values."""
    import torch

    from .ir.fusion import DTYPES
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i in fusion.inputs:
        t = fusion.tensors[i]
        scale = t.shape[0] ** -0.5 if len(t.shape) == 2 and t.name != "x" else 1.0
        out[t.name] = (torch.randn(t.shape, generator=gen) * scale).to(DTYPES[t.dtype])
    out.update(fixed or {})
    return out


#: largest relative error accepted by ``check`` per output dtype
CHECK_TOLERANCE = {"bfloat16": 3e-2, "float16": 4e-3, "float32": 1e-4, "float64": 1e-10}


def check(plan: "Plan", fusion: "Fusion", seed: int = 0, device: str | None = None,
          fixed: Mapping[str, "torch.Tensor"] | None = None) -> float:
    """Simulate ``plan`` on random inputs (``fixed`` ones as given; local steps on ``device``:
    the CPU, or a GPU's NVRTC kernels); return the largest error relative to each output's
    magnitude; raise ReshardError on a mismatch."""
    import torch

    from .ir.errors import ReshardError
    from .ir.interpreter import run_reference
    inputs = random_inputs(fusion, seed, fixed)
    outs = plan.simulate(inputs, generator=torch.Generator().manual_seed(seed), device=device)
    refs = run_reference(fusion, inputs)
    worst = 0.0
    for k, (o, r) in enumerate(zip(outs, refs)):
        if o.shape != r.shape:
            raise ReshardError(f"output {k}: plan produced shape {tuple(o.shape)}, reference {tuple(r.shape)}")
        err = ((o.double() - r.double()).abs().max() / r.double().abs().max().clamp_min(1e-30)).item()
        worst = max(worst, err)
    dtypes = {str(r.dtype).removeprefix("torch.") for r in refs}
    # a different summation order (partial sums, then a reduction) rounds differently
    tolerance = max(CHECK_TOLERANCE.get(d, 1e-4) for d in dtypes)
    if not worst <= tolerance:  # NaN fails too
        raise ReshardError(f"plan does not match the reference: relative error {worst:.3g} "
                           f"(tolerance {tolerance:g} for {', '.join(sorted(dtypes))})")
    return worst


def plan_placements(plan: "Plan") -> dict[str, list]:
    """Per value name, the shardings ``plan`` gives it in program order: the one its op
    computes it at, then each one a collective or local step reshards it to.  Only values
    computed at one sharding, all of whose shardings DTensor placements express
    (``passes.pins.placements_of``), so that they mean the same on another instance of the
    program at other sizes."""
    from .passes.pins import placements_of
    chains: dict[str, list] = {}
    computed: dict[str, int] = {}
    for node in plan.lowered.nodes:  # in program order: a value's op comes before its reshardings
        name = plan.fusion.tensors[node.value].name
        computed[name] = computed.get(name, 0) + (node.head.op is not None)
        chain = chains.setdefault(name, [])
        if node.sharding not in chain:
            chain.append(node.sharding)
    out = {}
    for name, chain in chains.items():
        placements = [placements_of(ts) for ts in chain]
        if computed[name] == 1 and all(p is not None for p in placements):
            out[name] = placements
    return out


def _collectives(plan: "Plan") -> list[tuple[str, str, str, str, str]]:
    return [(c.kind, c.axis, c.tensor, c.src, c.dst) for c in plan.communications]


def bandwidth_only(profile: "CostProfile") -> dict:
    """``profile`` without its latency terms (collective alphas, kernel launch cost): every
    cost left is bytes over a bandwidth, so the cheapest way to move one value between two
    shardings is the same at any size of the program (a small instance replaying a plan's
    pinned shardings picks the collectives the plan picked at real size)."""
    from dataclasses import asdict
    d = asdict(profile)
    return {**d, "name": f"{profile.name}, bandwidth only", "alpha_us": dict.fromkeys(d["alpha_us"], 0.0),
            "launch_us": 0.0, "collectives": {k: {n: {**e, "alpha_us": 0.0} for n, e in teams.items()}
                                              for k, teams in d["collectives"].items()}}


def replay_small(plan: "Plan", small: "Fusion", args: argparse.Namespace, limits: "Limits", what: str
                 ) -> tuple["Plan", "Fusion"]:
    """``small``, an instance of ``plan``'s program at small sizes, with every value pinned at
    the shardings ``plan`` gives it (``plan_placements``), and its plan: the same plan,
    small enough to simulate.  Says whether its collectives are the same."""
    from .passes.pins import pin_values
    from .plan import optimize
    replay = pin_values(small, plan_placements(plan))
    small_plan = optimize(replay, cost_profile=bandwidth_only(plan.profile), limits=limits, extractor=args.extractor)
    big, got = _collectives(plan), _collectives(small_plan)
    print(f"\nrun: {what}, every value pinned at the shardings the plan above gives it (collectives priced "
          "by bandwidth alone, so that each is chosen as at the planned size)")
    if got == big:
        print(f"  the same {len(got)} collectives on the same values and shardings as the plan above")
    else:
        print(f"  its plan differs from the one above: {len(got)} collectives "
              f"({', '.join(f'{k} of {t} {s} -> {d}' for k, _, t, s, d in got)})")
    return small_plan, replay


def _run(fusion: "Fusion", title: str, args: argparse.Namespace,
         fixed: Mapping[str, "torch.Tensor"] | None = None, small: tuple["Fusion", str] | None = None) -> int:
    """Optimize, explain (and draw) ``fusion``, then check the plan on simulated ranks: the
    plan itself, or (``small``: a small instance of the program and its description) the
    same plan replayed on the small instance (``replay_small``)."""
    import torch

    from .draw import check_path, draw_plan
    from .search.saturate import Limits
    from .explain import print_explanation
    from .plan import optimize
    quiet, draw = args.quiet, args.draw
    if draw is not None:
        check_path(draw)  # a bad path fails before the optimization, not after
    limits = Limits(time_limit_s=args.time_limit, segment_ops=args.segment_ops)
    print(f"== {title}: {len(fusion.ops)} ops on mesh {fusion.tensors[fusion.inputs[0]].mesh}")
    t0 = time.perf_counter()
    plan = optimize(fusion, cost_profile=args.profile, limits=limits, extractor=args.extractor,
                    progress=None if quiet else _Progress())
    print(f"optimized in {time.perf_counter() - t0:.2f} s ({plan.report})")
    print(f"cost profile: {plan.profile.name}; {plan.extraction}\n")
    print_explanation(plan, full=args.full or None, summarize=not args.full)
    if draw is not None:
        print(f"\nplan drawn to {draw_plan(plan, draw, full=args.full or None)}")
    if small is not None:
        plan, fusion = replay_small(plan, small[0], args, limits, small[1])
    err = check(plan, fusion, fixed=fixed)
    lead = "" if small is not None else "\n"
    print(f"{lead}check: simulated {len(plan.program.mesh_ranks)} ranks on CPU, outputs match the unsharded "
          f"reference (max relative error {err:.2e}); plan digest {plan.digest()[:16]}")
    if torch.cuda.is_available():
        err = check(plan, fusion, device="cuda", fixed=fixed)
        print(f"check: the same ranks with their local steps as NVRTC kernels on {torch.cuda.get_device_name()}: "
              f"outputs match the reference (max relative error {err:.2e})")
    return 0


#: what ``reshard explain FILE`` needs the file to define
EXPLAIN_CONTRACT = ("a variable fusion holding a reshard.Fusion, or a function build() taking no arguments and "
                    "returning a Fusion or a reshard.from_torch program (a TorchProgram)")


def load_fusion(path: str) -> tuple["Fusion", dict[str, "torch.Tensor"]]:
    """The Fusion a Python file defines (run as a script that is not ``__main__``) and the
    input values it fixes (a from_torch program's constants); ReshardError saying what the
    file must define when it defines neither."""
    from .ir.errors import ReshardError
    from .ir.fusion import Fusion
    p = Path(path)
    if not p.is_file():
        raise ReshardError(f"reshard explain: no such file {path!r}")
    ns = runpy.run_path(str(p))
    found = ns.get("fusion")
    if found is None and callable(ns.get("build")):
        found = ns["build"]()
    torch_export = sys.modules.get("reshard.frontend.torch_export")  # imported if the file used from_torch
    if torch_export is not None and isinstance(found, torch_export.TorchProgram):
        return found.fusion, {n: found.values[n] for n in found.constant_inputs}
    if not isinstance(found, Fusion):
        got = "" if found is None else f" (got {type(found).__name__})"
        raise ReshardError(f"reshard explain: {path} must define {EXPLAIN_CONTRACT}{got}")
    return found, {}


def rules_text(family: str | None, mesh_shape: str = "2x2", profile: str | None = None) -> str:
    """``reshard rules``: every rule (of ``family`` only, when given) as its reported name,
    ruleset, law and egglog text, grouped by family (``search.encode.rule_families``), then the
    e-graph's tables (``rules.schema.tables``; ``family`` "tables": only them), each with its
    signature and meaning."""
    from .rules.cost_profile import CostProfile
    from .rules.schema import tables
    from .search.encode import rule_families
    from .ir.errors import ReshardError

    try:
        shape = tuple(int(n) for n in mesh_shape.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ReshardError(f"reshard rules: --mesh-shape must look like 2x2 (positive sizes), got {mesh_shape!r}")
    families = rule_families(shape, CostProfile.load(profile), transfers=True, lookups=True, expands=True,
                             remats=True, attentions=True)
    if family is not None and family not in families and family != "tables":
        raise ReshardError(f"reshard rules: unknown family {family!r}; families: {', '.join(families)}, tables")
    lines = []
    for name, rules in families.items():
        if family is not None and name != family:
            continue
        lines.append(f"== {name} ({len(rules)} rules)")
        for r in rules:
            lines += [f"{r.reported_name}  [{r.ruleset}]", f"  law: {r.law}", f"  {r.render()}"]
        lines.append("")
    if family in (None, "tables"):
        decls = tables(len(shape))
        lines.append(f"== tables ({len(decls)} tables)")
        for t in decls:
            lines += [t.signature() + (f"  (only with {t.when})" if t.when else ""), f"  {t.meaning}"]
        lines.append("")
    return "\n".join(lines)


def _command(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def parser(argv: list[str]) -> argparse.ArgumentParser:
    """The argument parser; ``reshard tune``'s options (and their imports) only when ``argv``
    runs ``tune``."""
    ap = argparse.ArgumentParser(prog="reshard", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{demo,explain,rules,tune}")
    demo = sub.add_parser("demo", help="optimize, explain and check a built-in Llama-style layer",
                          description="Optimize and explain a built-in layer at a Llama-2-7B layer's sizes (--block: "
                                      "a Llama-style layer, or a simplified transformer block; sequence-parallel "
                                      "activations in and out), then run "
                                      "the same plan (its shardings pinned) on a small instance on CPU-simulated ranks "
                                      "and check it against the unsharded reference.")
    demo.add_argument("--ranks", type=int, default=2, help="devices in the 1-D mesh (default 2)")
    demo.add_argument("--seq", type=int, default=4096, help="sequence length planned (default 4096)")
    demo.add_argument("--hidden", type=int, default=4096, help="hidden size planned (default 4096)")
    demo.add_argument("--heads", type=int, default=32, help="attention heads planned (default 32)")
    demo.add_argument("--dtype", default="bfloat16", help="dtype planned (default bfloat16)")
    demo.add_argument("--layers", type=int, default=1, help="blocks in sequence (default 1)")
    demo.add_argument("--block", choices=("llama", "simplified"), default="llama",
                      help="llama: a Llama-style layer (the default; reshard.examples.llama_layers: RMSNorm, causal "
                           "softmax attention with rope, SwiGLU; Megatron's placements, q/k/v/gate/up "
                           "column-parallel, o/down row-parallel); simplified: reshard.examples.transformer_block, "
                           "a planner workload (a replicated fused QKV weight split into heads by the plan, tanh "
                           "scores, no softmax, mask, rope or norms, a GELU MLP)")
    demo.add_argument("--run-size", type=int, nargs=3, metavar=("SEQ", "HIDDEN", "HEADS"),
                      help="the small float32 instance run on simulated ranks with the planned shardings "
                           "(default: seq 16 or 2x the ranks, 8 per head, 4 heads or 2 per rank)")
    ex = sub.add_parser("explain", help="optimize, explain and check the Fusion a Python file builds",
                        description=f"Optimize, explain and check the program FILE defines: {EXPLAIN_CONTRACT}.")
    ex.add_argument("file", help="a Python file (run as a module, not as __main__)")
    for p in (demo, ex):
        p.add_argument("-q", "--quiet", action="store_true", help="no saturation progress")
        p.add_argument("--draw", metavar="PATH", help="also draw the plan to PATH (.png or .svg)")
        p.add_argument("--full", action="store_true",
                       help="explain every step of every layer (default: a plan of more than a few dozen steps in "
                            "brief; a layer whose plan repeats an earlier one's is one line)")
        p.add_argument("--profile", metavar="NAME|PATH", help="cost profile: a built-in name "
                       f"({', '.join(_profile_names())}) or a JSON file (default: the built-in H200 figures)")
        p.add_argument("--extractor", choices=("greedy", "windows", "ilp"), default="greedy",
                       help="greedy DAG extraction + sharing search (default), that plus the ILP on 30-op windows, "
                       "or the exact ILP")
        p.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, metavar="S",
                       help="wall-clock limit of the planning in seconds (default none: planning is bounded by "
                            "work, so the plan does not depend on the machine's load)")
        p.add_argument("--segment-ops", type=int, default=SEGMENT_OPS, metavar="N",
                       help=f"saturate programs over N ops in segments of N (default {SEGMENT_OPS})")
    rules = sub.add_parser("rules", help="print the rewrite rules with their laws, grouped by family",
                           description="Print every rewrite rule the e-graph gets for a program on a mesh of "
                                       "--mesh-shape (with cross-mesh transfers), grouped by family (the module "
                                       "that states it): the name the e-graph reports, its ruleset, its law and "
                                       "its egglog text.  A name is the literal in the source, then -<variant> "
                                       "for a generated rule (a mesh axis, a view, a collective kind and team "
                                       "size).  Then the e-graph's tables: each constructor, function and relation "
                                       "with its argument sorts and meaning.")
    rules.add_argument("--family", metavar="F", help="only this family (e.g. resharding, cost, crossmesh; tables: "
                                                     "only the e-graph's tables)")
    rules.add_argument("--mesh-shape", default="2x2", metavar="AxB",
                       help="mesh shape the per-axis and per-team-size rules are generated for (default 2x2)")
    rules.add_argument("--profile", metavar="NAME|PATH", help="cost profile of the cost rules (default built-in)")
    tune = sub.add_parser("tune", help="measure this machine and write a calibrated cost profile (JSON)",
                          description="Measure collectives, copy bandwidth, matmul peak and launch overhead on "
                                      "this machine; fit the alpha-beta cost model and write a cost profile.")
    if _command(argv) == "tune":
        from . import tune as _tune
        _tune.add_arguments(tune)
    return ap


def _demo(args: argparse.Namespace) -> int:
    """``reshard demo``: the chosen block (``--block``) planned at ``--seq/--hidden/--heads``,
    replayed at ``--run-size`` (the Llama layer's constants, its rotary tables, causal mask
    and epsilon, at their values there)."""
    from .examples import llama_constants, llama_layers, transformer_block, transformer_stack
    from .ir.errors import ReshardError
    from .ir.mesh import DeviceMesh
    if args.layers < 1:
        raise ReshardError(f"reshard demo: --layers must be at least 1, got {args.layers}")
    mesh = DeviceMesh(list(range(args.ranks)), ("tp",))
    heads = max(4, 2 * args.ranks)
    run = args.run_size or (max(16, 2 * args.ranks), 8 * heads, heads)
    llama = args.block == "llama"

    def build(seq: int, hidden: int, heads: int, dtype: str) -> "Fusion":
        if llama:
            return llama_layers(args.layers, mesh, seq, hidden, heads, dtype)
        if args.layers == 1:
            return transformer_block(mesh, seq, hidden, heads, dtype)
        return transformer_stack(args.layers, mesh, seq, hidden, heads, dtype)

    if llama:
        what = "Llama-style layer" if args.layers == 1 else f"{args.layers} Llama-style layers"
        kind = "RMSNorm, causal softmax attention with rope, SwiGLU; Megatron placements"
    else:
        what = "transformer block" if args.layers == 1 else f"{args.layers} transformer blocks"
        kind = "simplified: tanh attention, replicated QKV weight, GELU MLP, no norms"
    title = f"{what} ({kind}) at seq {args.seq}, hidden {args.hidden}, {args.heads} heads, {args.dtype}"
    small = (build(*run, "float32"), f"the same program at seq {run[0]}, hidden {run[1]}, {run[2]} heads, float32")
    fixed = llama_constants(*run, "float32") if llama else None
    return _run(build(args.seq, args.hidden, args.heads, args.dtype), title, args, fixed, small=small)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser(argv).parse_args(argv)
    from .ir.errors import ReshardError
    try:
        if args.cmd == "tune":
            from . import tune as _tune
            return _tune.run_from_args(args)
        if args.cmd == "rules":
            print(rules_text(args.family, args.mesh_shape, args.profile), end="")
            return 0
        if args.cmd == "demo":
            return _demo(args)
        fusion, fixed = load_fusion(args.file)
        return _run(fusion, args.file, args, fixed)
    except ReshardError as e:
        print(f"reshard: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
