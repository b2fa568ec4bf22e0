"""Communication-aware cost model, attached to e-nodes by egglog rules.

Times are integer picoseconds.  Collectives follow α-β with nccl-tests' bus bandwidth:
``t = α + bytes * f(n) / busbw`` with f(n) = (n-1)/n for allgather (bytes = result),
reduce-scatter (bytes = operand) and all-to-all, 2(n-1)/n for allreduce.  Kernels are
rooflines: ``launch + max(bytes_moved / hbm, flops / peak)``.  Views (reshape of a
contiguous local tensor, redistribute to the dist it already has, slicing the outermost
dim) cost 0.  Figures come from a ``CostProfile`` (JSON); the default is 2xH200.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..ir.errors import ReshardError
from .rule import Rule

C = "cost"


@dataclass(frozen=True)
class CostProfile:
    """Machine figures.  alpha_us: per-collective latency; busbw_gbps: bus bandwidth;
    hbm_gbps: device copy bandwidth (bytes read + written); peak_tflops per dtype width."""

    name: str = "2xH200 NVLink (built-in)"
    alpha_us: dict[str, float] = field(default_factory=lambda: {
        "allgather": 8.0, "reduce_scatter": 8.0, "allreduce": 10.0, "all_to_all": 10.0})
    busbw_gbps: dict[str, float] = field(default_factory=lambda: {
        "allgather": 265.0, "reduce_scatter": 256.0, "allreduce": 328.0, "all_to_all": 330.0})
    hbm_gbps: float = 4200.0
    launch_us: float = 2.0
    peak_tflops: dict[str, float] = field(default_factory=lambda: {"2": 700.0, "4": 50.0, "8": 1.0})

    @staticmethod
    def load(spec: "CostProfile | dict[str, Any] | str | Path | None") -> "CostProfile":
        """A profile from None (default), a dict, or a JSON file path."""
        if spec is None:
            return CostProfile()
        if isinstance(spec, CostProfile):
            return spec
        if isinstance(spec, (str, Path)):
            try:
                spec = json.loads(Path(spec).read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ReshardError(f"cost profile {spec}: cannot read JSON ({e})") from e
        if not isinstance(spec, dict):
            raise ReshardError(f"cost profile must be a dict or a JSON path, got {type(spec).__name__}")
        base = asdict(CostProfile())
        unknown = set(spec) - set(base)
        if unknown:
            raise ReshardError(f"cost profile: unknown keys {sorted(unknown)}; known: {sorted(base)}")
        for k, v in spec.items():
            base[k] = {**base[k], **v} if isinstance(base[k], dict) else v
        prof = CostProfile(**base)
        for k, v in prof.busbw_gbps.items():
            if v <= 0:
                raise ReshardError(f"cost profile: busbw_gbps[{k!r}] must be positive, got {v}")
        if prof.hbm_gbps <= 0:
            raise ReshardError(f"cost profile: hbm_gbps must be positive, got {prof.hbm_gbps}")
        return prof

    def ps(self, us: float) -> int:
        return int(round(us * 1e6))


def _coll(kind: str, node: str, key: str, bytes_query: str, factor: tuple[int, int], prof: CostProfile) -> Rule:
    """t = α + bytes * num(n)/den(n) / busbw, in ps (1 GB/s = 1 byte/ns)."""
    alpha = prof.ps(prof.alpha_us[kind])
    bw = max(1, int(round(prof.busbw_gbps[kind])))
    num_mul, den_mul = factor
    return Rule(f"cost-{kind}", f"cost({node}) = α_{kind} + bytes·{num_mul}(n-1)/({den_mul}n) / busbw_{kind}",
                f"(= g {node}) {bytes_query} (= n (axsize a))",
                f"(set ({key}) (+ {alpha} (/ (* b (* {num_mul} (* (- n 1) 1000))) (* {den_mul} (* n {bw})))))", C)


def rules(prof: CostProfile) -> list[Rule]:
    launch = prof.ps(prof.launch_us)
    hbm = max(1, int(round(prof.hbm_gbps)))
    out_bytes = "(= g (real v d)) (= b (lb v d))"
    in_bytes = "(= t (real u di)) (= b (lb u di))"
    return [
        _coll("allgather", "(AllGather t a)", "cost_AllGather t a", out_bytes, (1, 1), prof),
        _coll("reduce_scatter", "(ReduceScatter t a p)", "cost_ReduceScatter t a p", in_bytes, (1, 1), prof),
        _coll("allreduce", "(AllReduce t a)", "cost_AllReduce t a", in_bytes, (2, 1), prof),
        _coll("all_to_all", "(AllToAll t a p)", "cost_AllToAll t a p", in_bytes, (1, 1), prof),
        Rule("cost-local-slice", "a local slice copies its result: launch + 2·bytes / hbm",
             f"(= g (LocalSlice t a p)) {out_bytes}",
             f"(set (cost_LocalSlice t a p) (+ {launch} (/ (* 2 (* b 1000)) {hbm})))", C),
        Rule("cost-slice-outermost-view", "slicing dim 0 of a contiguous tensor is a view: cost 0",
             "(= g (LocalSlice t a (Bind (Outer (Root s 0 e) n))))", "(set (cost_LocalSlice t a (Bind (Outer (Root s 0 e) n))) 0)", C),
    ]


def local_cost_facts(k: int, kind: str, prof: CostProfile, *, contraction: int = 0, itemsize: int = 4) -> list[str]:
    """Facts that select the cost law of Fusion op ``k``'s Loc/Loc2 nodes (the laws are the
    generic rules of ``local_rules``): views (reshape, redistribute) cost 0; matmuls are
    rooflines of their K and peak rate; every other op is memory-bound."""
    if kind in ("reshape", "redistribute"):
        return [f"(viewop {k})"]
    if kind != "matmul":
        return [f"(memop {k})"]
    peak = max(1, int(round(prof.peak_tflops.get(str(itemsize), 100.0))))
    return [f"(set (mmK {k}) {contraction})", f"(set (mmitem {k}) {itemsize})", f"(set (mmpeak {k}) {peak})"]


def local_rules(prof: CostProfile, mesh_ndim: int) -> list[Rule]:
    """Costs of Loc/Loc2 nodes.  views: 0.  memory-bound ops: launch + (in + out bytes) / hbm.
    matmul: launch + max(memory, 2·out_local·K_local / peak) with K_local = K / Π kf."""
    launch = prof.ps(prof.launch_us)
    hbm = max(1, int(round(prof.hbm_gbps)))
    q1 = "(= g (real o do)) (= bo (lb o do)) (= t (real u di)) (= bi (lb u di))"
    q2 = "(= g (real o do)) (= bo (lb o do)) (= ta (real a da)) (= ba (lb a da)) (= tb (real b db)) (= bb (lb b db))"

    def mem(moved: str) -> str:
        return f"(+ {launch} (/ (* {moved} 1000) {hbm}))"

    pa = " ".join(f"pa{i}" for i in range(mesh_ndim))
    po = " ".join(f"po{i}" for i in range(mesh_ndim))
    kprod = "1"
    for i in range(mesh_ndim):
        kprod = f"(* {kprod} kf{i})"
    q_mm = (f"(= g (Loc2 k ta tb)) (= K (mmK k)) (= isz (mmitem k)) (= peak (mmpeak k)) {q2} "
            f"(= da (D {pa})) (= do (D {po}))")
    flops = f"(/ (* 2 (* (/ bo isz) K)) {kprod})"
    return [
        Rule("cost-view", "a view op (reshape of a contiguous local tensor, redistribute to the dist it "
             "already has) costs 0", "(= g (Loc k t)) (viewop k)", "(set (cost_Loc k t) 0)", C),
        Rule("cost-mem-1", "cost(unary op) = launch + (in + out bytes) / hbm",
             f"(= g (Loc k t)) (memop k) {q1}", f"(set (cost_Loc k t) {mem('(+ bi bo)')})", C),
        Rule("cost-mem-2", "cost(binary op) = launch + (in + in + out bytes) / hbm",
             f"(= g (Loc2 k ta tb)) (memop k) {q2}", f"(set (cost_Loc2 k ta tb) {mem('(+ ba (+ bb bo))')})", C),
        Rule("cost-matmul-axes", "matmul: record (lhs, result) placement pairs for kf",
             q_mm, " ".join(f"(mmaxis pa{i} po{i})" for i in range(mesh_ndim)), C),
        Rule("cost-matmul", "cost(matmul) = launch + max(bytes / hbm, flops_local / peak)",
             f"{q_mm} " + " ".join(f"(= kf{i} (kf pa{i} po{i}))" for i in range(mesh_ndim)),
             f"(set (cost_Loc2 k ta tb) (max {mem('(+ ba (+ bb bo))')} (+ {launch} (/ {flops} peak))))", C),
    ]


def kf_rules() -> list[Rule]:
    """kf(lhs placement, result placement): the contraction split factor on one axis."""
    return [
        Rule("kf-default", "kf = 1 unless the lhs contraction index is split on this axis",
             "(mmaxis pa po)", "(set (kf pa po) 1)", C),
        Rule("kf-contract", "kf(S(x), P) = e(x): the contraction dim is split e(x) ways",
             '(mmaxis pa po) (= pa (Bind x)) (= e (ext x)) (= po (Part "sum"))', "(set (kf pa po) e)", C),
    ]
