"""``nesting``'s ``nest-candidate``: a nested dist (one dim split along two mesh axes) is offered
to a value realized one step from it whose dim is ``nestable`` (a fixed sharding nests it, or a
consumer reads it as several: a reshape splitting a flattened dim, or an op mapping it onto such
a one), so the plan reaches it with one step on the inner axis (a local slice from R, a
reduce-scatter from P, an all-to-all from S(k)) instead of going through a dist that no operand
needs."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.fusion import Fusion
from reshard.ir.sharding import TensorSharding
from reshard.search.encode import unnested_shardings

M2x2 = rs.DeviceMesh([[0, 1], [2, 3]], ("dp", "tp"))
M2x3 = rs.DeviceMesh([[0, 1, 2], [3, 4, 5]], ("dp", "tp"))
M2x2x2 = rs.DeviceMesh([[[0, 1], [2, 3]], [[4, 5], [6, 7]]], ("a", "b", "c"))

S0, S1, R, P = rs.Shard(0), rs.Shard(1), rs.Replicate(), rs.Partial()

#: (mesh, shape, the placements of b, the nested ones of x and x + b, the step expected on the last axis)
CASES = [
    (M2x2, (8, 6), [S0, R], [S0, S0], None),
    (M2x3, (12, 4), [S0, R], [S0, S0], None),
    (M2x2, (4, 8), [S1, P], [S1, S1], "reduce_scatter"),
    (M2x3, (6, 12), [S1, P], [S1, S1], "reduce_scatter"),
    (M2x2, (1024, 1024), [S0, S1], [S0, S0], "all_to_all"),
    (M2x2x2, (8, 4), [S0, S1, R], [S0, S1, S0], None),
    (M2x2x2, (8, 4), [S0, R, P], [S0, R, S0], "reduce_scatter"),
]


def _split(shape: tuple[int, ...], at: list, j: int, mesh: rs.DeviceMesh) -> tuple[tuple[int, ...], list]:
    """``shape`` with dim j split into (n, rest), n the size of the first axis splitting it, and
    the placements ``at`` (j nested along two axes) become there: the outer axis splits the
    new dim j, the inner one dim j + 1, every later dim moves up one."""
    outer = next(a for a, p in enumerate(at) if p == rs.Shard(j))
    n = mesh.shape[outer]
    moved = [p if not isinstance(p, rs.Shard) or p.dim < j else
             rs.Shard(p.dim + (0 if p.dim == j and a == outer else 1)) for a, p in enumerate(at)]
    return shape[:j] + (n, shape[j] // n) + shape[j + 1:], moved


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].shape}-{c[1]}-{c[2]}")
def test_nest_candidate_law_oracle(case):
    """Law (``nest-candidate``): ``b`` realized with an axis splitting dim j into blocks and the
    last axis holding no index of j (R, P or S(k)) is, after one step on the last axis, the same
    value at the nested dist (each block split again there).  ``reshape(x + b)``, splitting dim
    j, with ``x`` nested and the result at the reshaped nested dist: ``b`` takes that one step (no
    communication from R, a reduce-scatter from P, an all-to-all from S(k)) and nothing else
    moves; the plan simulates to the reference on random tensors.  The nested dist is no
    candidate of ``b`` otherwise (``unnested_shardings``)."""
    mesh, shape, at_b, at_x, step = case
    j = next(p.dim for p in at_x if isinstance(p, rs.Shard) and at_x.count(p) > 1)
    nested = TensorSharding.from_placements(shape, at_x, mesh)
    bound = TensorSharding.from_placements(shape, at_b, mesh)
    assert nested not in unnested_shardings(shape, mesh)
    split, at_y = _split(shape, at_x, j, mesh)
    f = Fusion()
    b = f.input("b", shape, "float32", mesh, bound)
    x = f.input("x", shape, "float32", mesh, nested)
    f.output(f.reshape(f.add(x, b), split), TensorSharding.from_placements(split, at_y, mesh))
    plan = rs.optimize(f, cache=False)
    assert [(c.kind, c.axis) for c in plan.communications] == ([] if step is None else [(step, mesh.axis_names[-1])]), \
        plan.explain()
    g = torch.Generator().manual_seed(len(shape))
    inputs = {"b": torch.randn(shape, generator=g), "x": torch.randn(shape, generator=g)}
    (y,) = plan.simulate(inputs)
    torch.testing.assert_close(y, rs.run_reference(f, inputs)[0], rtol=1e-5, atol=1e-6)
