"""End to end as users run it: every process optimizes the Fusion itself (separate
interpreters, different hash seeds), the runtime checks that the plans are byte-identical
before the first collective, runs its shard, and the gathered result matches the reference."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.sharding import unshard
from reshard.testing import programs as P


def _rank_main(rank: int, seed: int, segment_ops: int = 64) -> tuple[str, dict[str, torch.Tensor]]:
    f = P.transformer_like()
    plan = rs.optimize(f, limits=rs.Limits(segment_ops=segment_ops))
    inputs = P.random_inputs(f, seed)
    local = plan.shard_inputs(inputs, generator=torch.Generator().manual_seed(seed))[rank]
    outs = plan.run(local)
    return plan.digest(), {buf: t for (buf, _), t in zip(plan.lowered.outputs, outs)}


def _rank_runs(rank: int) -> dict[str, tuple[str, dict[str, torch.Tensor]]]:
    """Both runs on one process group: one e-graph (inputs of seed 3), segments of 8 ops (seed 5)."""
    return {"whole": _rank_main(rank, 3), "segmented": _rank_main(rank, 5, 8)}


@pytest.fixture(scope="module")
def runs() -> list[dict[str, tuple[str, dict[str, torch.Tensor]]]]:
    """Each rank's ``_rank_runs``, from one launch."""
    return rs.launch(_rank_runs, 2, timeout_s=120)


@pytest.mark.multiproc
@pytest.mark.slow
def test_each_rank_plans_independently_and_the_run_matches_the_reference(runs):
    results = [r["whole"] for r in runs]
    digests = {d for d, _ in results}
    assert len(digests) == 1
    f = P.transformer_like()
    plan = rs.optimize(f)
    assert digests == {plan.digest()}
    inputs = P.random_inputs(f, 3)
    for k, ((buf, ts), ref) in enumerate(zip(plan.lowered.outputs, rs.run_reference(f, inputs))):
        got = unshard({r: results[r][1][buf] for r in range(2)}, ts)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.multiproc
def test_segmented_plans_are_identical_across_processes(runs):
    """Segmented saturation (merged snapshots, seam keys) is as deterministic as one e-graph:
    each spawned process (its own hash seed) plans the same bytes, and the run is correct."""
    results = [r["segmented"] for r in runs]
    plan = rs.optimize(P.transformer_like(), limits=rs.Limits(segment_ops=8))
    assert plan.report.segments > 1
    assert {d for d, _ in results} == {plan.digest()}
    f = P.transformer_like()
    inputs = P.random_inputs(f, 5)
    for (buf, ts), ref in zip(plan.lowered.outputs, rs.run_reference(f, inputs)):
        got = unshard({r: results[r][1][buf] for r in range(2)}, ts)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_simulate_rejects_an_unknown_device():
    from reshard.examples import transformer_block
    f = transformer_block()
    plan = rs.optimize(f)
    with pytest.raises(rs.ReshardError, match="device must be"):
        plan.simulate({}, device="meta")


def test_the_program_carries_one_sharding_table():
    """Remap and partial steps carry the TensorSharding objects lowering chose (the runtime
    reads them as they are); the canonical JSON writes the table once, steps by index."""
    import json

    from reshard.ir.sharding import TensorSharding, sharding_to_spec

    program = rs.optimize(P.mlp()).program
    carried = [v for s in program.steps for _, v in s.attrs if isinstance(v, TensorSharding)]
    assert carried and set(carried) == set(program.shardings)
    assert len(set(program.shardings)) == len(program.shardings)
    body = json.loads(program.to_json())
    assert body["shardings"] == json.loads(json.dumps([sharding_to_spec(ts) for ts in program.shardings]))
    table = {ts: i for i, ts in enumerate(program.shardings)}
    for step, (_, _, _, attrs) in zip(program.steps, body["steps"]):
        for (k, v), (jk, jv) in zip(step.attrs, attrs):
            assert jk == k
            if isinstance(v, TensorSharding):
                assert jv == table[v]


def test_a_sharding_pickles_without_its_cached_hash():
    """Programs cross processes pickled (``launch``, the fresh planning interpreter); string
    hashes differ between processes, so a sharding's cached hash must not travel."""
    import pickle

    ts = rs.optimize(P.mlp()).program.shardings[0]
    back = pickle.loads(pickle.dumps(ts))
    assert hash(ts) and "_hash" not in back.__dict__ and back == ts and hash(back) == hash(ts)
