"""Simple candidates: the unnested Replicate / Shard(d) dists every value made in the e-graph may take.

A value's simple candidates (``encode.unnested_shardings``) are every combination, over the
mesh axes, of Replicate or a block split of one dim that the axis divides, no dim split along
two axes: each device then holds a product of per-dim index sets (one block of each split
dim), so each is a sharding of the value, and ``resharding`` may target it.  The encoder states
a value's dims (``cdim``: value, dim, extent) once, with the value's ``made`` fact, instead of
every such dist as a fact of its own (an egglog command per fact took about as long as the
rest of a segment's facts together); these rules build the same ``D`` terms:

* ``candidate-placement``: axis a may hold Replicate (``cpl`` dim ``-1 - a``, so that Replicate
  on two axes is no shared dim) or ``Bind(Outer(Root(v, j, e), n))`` for a dim j of extent e
  that n, the axis's size (> 1), divides and that the axis may split (``axdim``: every dim,
  but only the leading one on a data axis, ``encode.data_axes``; a mesh axis of size 1 holds
  Replicate only: ``resharding``, no step on a team of one);
* ``simple-candidate``: one placement per axis, no two on the same dim, is a candidate.

Fixed shardings' steps (an input's, an output's, a redistribute's, with some axes replicated
or Partial) stay facts of the encoder (``encode.fixed_candidates``).
"""

from __future__ import annotations

import itertools

from .rule import Rule

A = "analysis"


def rules(m: int) -> list[Rule]:
    """``candidate-placement`` per mesh axis (variants ``rep-<a>``, ``shard-<a>``) and
    ``simple-candidate``."""
    out: list[Rule] = []
    for a in range(m):
        out.append(Rule("candidate-placement", f"Replicate is a placement of every value made here on axis {a}",
                        "(made v)", f"(cpl v {a} (Rep) {-1 - a})", A, variant=f"rep-{a}"))
        out.append(Rule("candidate-placement", f"a block split of dim j on axis {a}, whose size n > 1 divides the "
                        "dim's extent e and which the axis may split (axdim), is a placement of the value on that "
                        "axis",
                        f"(cdim v j e) (axdim {a} j) (= n (axsize {a})) (> n 1) (= 0 (% e n))",
                        f"(cpl v {a} (Bind (Outer (Root v j e) n)) j)", A, variant=f"shard-{a}"))
    places = " ".join(f"(cpl v {a} p{a} j{a})" for a in range(m))
    distinct = " ".join(f"(!= j{a} j{b})" for a, b in itertools.combinations(range(m), 2))
    dist = "(D " + " ".join(f"p{a}" for a in range(m)) + ")"
    out.append(Rule("simple-candidate", "one candidate placement per mesh axis, no dim split on two axes, is a "
                    "sharding of the value (each device holds one block of each split dim): a candidate",
                    f"{places} {distinct}".strip(), f"(cand v {dist})", A))
    return out
