"""``collector.rarely_collected``: the young threshold raised for the block, restored after."""

from __future__ import annotations

import gc

import pytest

from reshard.collector import PLANNING_THRESHOLD, rarely_collected


@pytest.fixture
def default_threshold():
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_the_block_raises_the_young_threshold_and_restores_it(default_threshold):
    with rarely_collected():
        assert gc.get_threshold() == (PLANNING_THRESHOLD, 10, 10)
        with rarely_collected():  # nested: the outer block restores
            pass
        assert gc.get_threshold() == (PLANNING_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_an_error_in_the_block_restores_the_threshold(default_threshold):
    with pytest.raises(KeyError):
        with rarely_collected():
            raise KeyError("x")
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_is_kept(default_threshold):
    gc.set_threshold(10 * PLANNING_THRESHOLD, 5, 5)
    with rarely_collected():
        assert gc.get_threshold() == (10 * PLANNING_THRESHOLD, 5, 5)
    assert gc.get_threshold() == (10 * PLANNING_THRESHOLD, 5, 5)


def test_optimize_plans_with_the_raised_threshold(default_threshold):
    import reshard as rs
    from reshard.examples import transformer_block

    seen = []
    rs.optimize(transformer_block(rs.DeviceMesh([0, 1], ("tp",))), cache=False,
                progress=lambda report: seen.append(gc.get_threshold()[0]))
    assert seen and set(seen) == {PLANNING_THRESHOLD}
    assert gc.get_threshold() == (700, 10, 10)
