"""``extract.gc_paused``: the collector is off while the function runs and as it was after."""

import gc

import pytest

from reshard.extract.extract import gc_paused


def test_gc_paused_restores_the_collector_state():
    seen = []

    @gc_paused
    def f(x):
        """Record whether the collector is on; fail on request."""
        seen.append(gc.isenabled())
        if x:
            raise ValueError(x)
        return 1

    was = gc.isenabled()
    try:
        gc.enable()
        assert f(0) == 1 and gc.isenabled()
        with pytest.raises(ValueError):
            f(1)
        assert gc.isenabled()
        gc.disable()
        f(0)
        assert not gc.isenabled()  # (left off when it was off)
        assert seen == [False, False, False]
    finally:
        (gc.enable if was else gc.disable)()
