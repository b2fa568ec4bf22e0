"""Cross-mesh transfers: a value on mesh A needed on mesh B (seed 001's options).

``f.redistribute(t, placements, mesh=B)`` with ``t`` on mesh A is encoded as the fact
``(xfer k u o c)``: Fusion op ``k`` moves value ``u`` (on A) to value ``o`` (on B) through the
identity transport code ``c`` (like a unary op: every placement, Partial sums and maxes
included, reads the same on B), plus ``(xsrc k i)`` for every device index i of A and
``(xdev k) = |B|``.  A and B have the same shape and disjoint devices, so every per-mesh
rule (resharding, strategies, costs) is unchanged and runs on each value's own mesh.

Implementations of a transfer (all in the e-graph; extraction chooses by cost):

====================================  ===========================================================
``SendRecv(k, t)``                    u at d -> o at TrD(d, c): A's device i sends its local
                                      tensor to B's device i, all pairs in parallel (keeps any
                                      placement, Partial included)
``Bcast(k, t, i)``                    u at D(R..R) -> o at D(R..R): A's device i broadcasts the
                                      whole value to every device of B
``Scatter(k, t, i, d')``              u at D(R..R) -> o at d' (no Partial, > 1 shard): A's device
                                      i sends every device of B its local piece at d'
====================================  ===========================================================

The compositions come for free: scatter then allgather on B (resharding rules run on o's
dists), sharded send/recv then allgather on B, allgather on A then send/recv or broadcast.

Costs (α-β, bytes in the units of ``cost``; α/busbw per kind and, through
``CostProfile.collective``, per team size: 2 for send/recv, |B|+1 for broadcast and scatter,
whose team is the source plus B):

* send/recv: ``α_send_recv + lb(u, d) / bw_send_recv`` (one local tensor per pair, pairs in
  parallel);
* broadcast: ``α_broadcast + nbytes / bw_broadcast`` (f(n) = 1, as nccl-tests);
* scatter: ``α_scatter + |B| · lb(o, d') / bw_scatter`` (the root's buffer holds |B|+1 pieces,
  one a dummy for itself, and f(n) = (n-1)/n of it crosses the links).
"""

from __future__ import annotations

from .cost_laws import PRICING, Quantities, Term
from .cost_profile import CostProfile
from .rule import Rule

S = "strategy"
C = "cost"


def _all_rep(m: int) -> str:
    return "(D " + " ".join(["(Rep)"] * m) + ")"


def facts(k: int, u: int, o: int, c: int, src_devices: int, dst_devices: int) -> list[str]:
    """The facts of cross-mesh transfer op ``k`` (value ``u`` on A -> ``o`` on B, code ``c``)."""
    return ([f"(xfer {k} {u} {o} {c})"] + [f"(xsrc {k} {i})" for i in range(src_devices)]
            + [f"(set (xdev {k}) {dst_devices})"])


def rules(m: int) -> list[Rule]:
    """The transfer rules for meshes of ``m`` axes."""
    rep = _all_rep(m)
    ps = " ".join(f"q{i}" for i in range(m))
    nopart = " ".join(f"(nopart q{i})" for i in range(m))
    return [
        Rule("nopart-rep", "Rep is not a Partial placement", "(= p (Rep))", "(nopart p)", "analysis"),
        Rule("nopart-bind", "Bind(x) is not a Partial placement", "(= p (Bind x))", "(nopart p)", "analysis"),
        Rule("xfer-demand", "a transfer's result may take the transported dist of any operand dist",
             "(xfer k u o c) (= t (real u d))", "(trdw d c)", S),
        Rule("xfer-send-recv", "u at d on A = o at TrD(d, c) on B by parallel send/recv A[i] -> B[i] "
             "(device i of B has device i of A's mesh coordinates, so it holds the same local tensor)",
             "(xfer k u o c) (= t (real u d)) (= od (TrD d c)) (okD od)", "(union (real o od) (SendRecv k t))", S),
        Rule("xfer-broadcast", "u replicated on A = o replicated on B by a broadcast from any device i of A "
             "(every device of A holds the whole value)",
             f"(xfer k u o c) (= t (real u {rep})) (xsrc k i)", f"(union (real o {rep}) (Bcast k t i))", S),
        Rule("xfer-scatter", "u replicated on A = o at d' on B (d' without Partial, > 1 shard) by a scatter "
             "from device i of A: B's device j receives the elements d' gives it, all of which A[i] holds",
             f"(xfer k u o c) (= t (real u {rep})) (xsrc k i) (cand o d2) (= d2 (D {ps})) {nopart} (okD d2) "
             "(= s (shards d2)) (> s 1)",
             "(union (real o d2) (Scatter k t i d2))", S),
    ]


def cost_rules(prof: CostProfile, dst_devices: int) -> list[Rule]:
    """Costs of the transfer nodes (module docstring), in ps; bandwidths in MB/s."""
    b = Term("b")

    def cost(rule: str, ctor: str) -> str:
        return PRICING[rule].render(prof, Quantities(b, (b,), dst_devices, ctor, facts={"xdev": Term("n")}))
    return [
        Rule("cost-send-recv", "cost(SendRecv) = α_send_recv + local bytes / bw_send_recv",
             "(= g (SendRecv k t)) (= t (real u d)) (= b (lb u d))",
             f"(set (cost_SendRecv k t) {cost('cost-send-recv', 'SendRecv')})", C),
        Rule("cost-broadcast-xfer", "cost(Bcast) = α_broadcast + bytes / bw_broadcast",
             "(= g (Bcast k t i)) (= t (real u d)) (= b (lb u d))",
             f"(set (cost_Bcast k t i) {cost('cost-broadcast-xfer', 'Bcast')})", C),
        Rule("cost-scatter-xfer", "cost(Scatter) = α_scatter + |B| · piece bytes / bw_scatter",
             "(= g (Scatter k t i d2)) (= g (real o d2)) (= b (lb o d2)) (= n (xdev k))",
             f"(set (cost_Scatter k t i d2) {cost('cost-scatter-xfer', 'Scatter')})", C),
    ]
