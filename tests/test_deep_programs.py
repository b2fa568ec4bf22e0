"""Programs deeper than Python's recursion limit (issue 18): a dependency chain of hundreds of
ops optimizes, explains and simulates; no walk over a program, an extracted plan or its
entries recurses once per op (``extract.fold_dag``, ``extract.canonical_plan``)."""

from __future__ import annotations

import sys

import pytest
import torch

import reshard as rs
from reshard.egraph_rules.extract import fold_dag

#: deeper than the default recursion limit allows a recursive walk to go (it failed at ~480)
DEPTH = 600
MESH = rs.DeviceMesh([0, 1], ("tp",))


def _chain(kind: str, depth: int) -> rs.Fusion:
    """``depth`` chained ops on a (4, 6) input sharded on rows; the output is replicated, so
    the plan holds one allgather that extraction must place somewhere along the chain."""
    f = rs.Fusion()
    y = f.input("x", (4, 6), "float64", MESH, [rs.Shard(0)])
    for i in range(depth):
        y = f.tanh(y) if kind == "tanh" else f.reshape(y, (24,) if i % 2 == 0 else (4, 6))
    f.output(y, [rs.Replicate()])
    return f


@pytest.mark.parametrize("kind", ["tanh", "reshape"])
def test_chain_deeper_than_the_recursion_limit(kind):
    assert DEPTH > sys.getrecursionlimit() // 2  # two frames per level used to overflow
    f = _chain(kind, DEPTH)
    plan = rs.optimize(f)
    assert plan.report.saturated
    assert [c.kind for c in plan.communications] == ["allgather"]
    x = {"x": torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))}
    (y,) = plan.simulate(x)
    torch.testing.assert_close(y, rs.run_reference(f, x)[0])
    if kind == "tanh":
        assert "allgather" in plan.explain()  # the explanation walks the same plan


def test_fold_dag_is_the_recursive_postorder():
    """Children first, left to right, each shared object once: the order (and so the plan
    node numbering) the recursive walk had, on a DAG and on a chain far past the limit."""
    a, b = ("a", ()), ("b", ())
    c = ("c", (a, b, a))
    d = ("d", (c, b))
    order: list[str] = []

    def visit(x: tuple, kids: list) -> str:
        order.append(x[0])
        return x[0] + "(" + ",".join(kids) + ")"

    got = fold_dag([d, c], lambda x: x[1], visit)
    assert order == ["a", "b", "c", "d"]
    assert got[id(d)] == "d(c(a(),b(),a()),b())"
    chain: tuple = ("leaf", ())
    for _ in range(5 * sys.getrecursionlimit()):
        chain = ("n", (chain,))
    depth = fold_dag([chain], lambda x: x[1], lambda x, kids: 1 + (kids[0] if kids else 0))
    assert depth[id(chain)] == 5 * sys.getrecursionlimit() + 1
