"""``alloc.alike_ranks``: one rank per class of ranks whose allocation plans are equal.

Law checked: every rank's allocation plan (``allocate``: storages, live ranges, bytes held
after each step, peak) equals that of the representative ``alike_ranks`` picks for it, on an
even SPMD program (one rank stands for the mesh), an uneven one, a 2-D mesh and a cross-mesh
transfer (ranks of the other mesh bind other inputs and run other steps)."""

from __future__ import annotations

from typing import Any

import pytest

import reshard as rs
import reshard.codegen.lower as lower_module
from reshard.codegen.alloc import allocate, alike_ranks
from reshard.testing import programs as P


def _cross_mesh() -> rs.Fusion:
    a, b = rs.DeviceMesh([0, 1], ("tp",)), rs.DeviceMesh([2, 3], ("tp",))
    f = rs.Fusion()
    x = f.input("x", (16, 32), "float32", a, [rs.Shard(0)])
    f.output(f.tanh(f.redistribute(f.exp(x), [rs.Replicate()], mesh=b)), [rs.Replicate()])
    return f


def _uneven() -> rs.Fusion:
    m = rs.DeviceMesh([0, 1, 2], ("tp",))
    f = rs.Fusion()
    x = f.input("x", (7, 5), "float32", m, [rs.Shard(0)])
    f.output(f.exp(f.redistribute(f.tanh(x), [rs.Shard(1)])), [rs.Shard(1)])
    return f


CASES = {"mlp": P.mlp, "mesh2d_block": P.mesh2d_block, "training_block": P.training_block,
         "uneven": _uneven, "cross_mesh": _cross_mesh}


def _lowered(build: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """The lowered program and its buffers' (local shape, dtype), as lowering allocates them."""
    seen = []

    def spy(program, meta):
        seen.append((program, meta))
        return alike_ranks(program, meta)

    monkeypatch.setattr(lower_module, "alike_ranks", spy)
    rs.optimize(build(), cache=False)
    return seen[-1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_rank_allocates_as_its_representative(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    program, meta = _lowered(CASES[name], monkeypatch)
    reps = alike_ranks(program, meta)
    assert reps and set(reps) <= set(program.mesh_ranks)
    plans = {r: allocate(program, meta, r) for r in program.mesh_ranks}
    for r, a in plans.items():
        assert any(a == plans[q] for q in reps), r
    if name in ("mlp", "mesh2d_block", "training_block"):
        assert len(reps) == 1  # even shards, one mesh: one rank stands for all
    if name == "cross_mesh":
        assert len({plans[q].held for q in reps}) == len(reps) > 1
