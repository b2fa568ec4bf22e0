"""A per-rank memory budget for saved activations: what a plan keeps, per e-node.

Keeping a forward value for the backward pass (``saved``'s node reading class ``(v, d)``)
holds ``kept(k, t)`` bytes per rank (``remat``'s ``kept-bytes``; 0 for program inputs);
recomputing it instead (``remat``'s twins) costs the op's time.  Without a budget only time
counts, so a plan keeps whatever is cheaper to keep than to recompute.  With a budget ``B``
(``optimize(..., memory_budget=B)``), extraction minimizes ``time(plan) + lambda * kept(plan)``
with a searched multiplier (``budget``: lambda = 0, then lambda_max, then bisection; only
plans on the convex hull of (time, kept bytes) are found).  Which values are kept,
recomputed, or kept sharded and gathered in the backward pass stays the extractor's choice
under those costs.  ``kept(plan)`` is the sum over the distinct kept nodes of the plan (a
shared one once).
"""

from __future__ import annotations

import numpy as np

from ..search.snapshot import Snapshot
from .budget import Budget
from .dag import ENode

#: ``optimize``'s keyword and what it counts
KEYWORD, COUNTS = "memory_budget", "bytes per rank of saved activations"


def kept_bytes(snap: Snapshot, nodes: list[ENode]) -> np.ndarray:
    """Per e-node (by id), the bytes per rank it keeps across the boundary (table ``kept``)."""
    table: dict[tuple, int] = {}
    for r in snap.rows("kept"):  # merged by min, as in each e-graph (segments each hold a row)
        key, b = tuple(r.inputs), snap.i64(r.output)
        table[key] = min(table.get(key, b), b)
    out = np.zeros(len(nodes), dtype=np.int64)
    for n in nodes if table else ():
        if n.ctor == "Loc" and n.args in table:
            out[n.id] = table[n.args]
    return out


def kept_budget(kept: np.ndarray, value: int) -> Budget:
    """The budget of ``value`` bytes per rank on the bytes ``kept`` per e-node (``kept_bytes``)."""
    return Budget(KEYWORD, COUNTS, "the plan keeping the fewest ({bytes} bytes per rank, recomputing what can be "
                  "recomputed from saved operands)", kept, value)
