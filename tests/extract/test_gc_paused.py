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


class _Cycle:
    """An object in a reference cycle (only the collector frees it)."""

    def __init__(self) -> None:
        self.me = self


def test_objects_made_while_paused_are_promoted_unwalked_and_still_collected():
    """Law (``promote_unwalked``, run as the collector is turned back on): every tracked object
    moves to the oldest generation and the young generation's count is zeroed, so no young
    collection walks what the paused function made; cyclic garbage among them is still freed by
    a full collection.  A process that froze objects itself keeps them frozen (nothing moved)."""
    import weakref

    was = gc.isenabled()
    try:
        gc.enable()
        gc.collect()

        @gc_paused
        def make():
            return [_Cycle() for _ in range(1000)]

        made = make()
        assert gc.get_count()[0] < 1000  # (zeroed, then a few allocations since)
        assert gc.get_freeze_count() == 0
        probe = weakref.ref(made[0])
        del made
        gc.collect(0)
        gc.collect(1)
        assert probe() is not None  # in the oldest generation: no young collection frees it
        gc.collect()
        assert probe() is None

        gc.freeze()  # the process's own frozen objects
        frozen = gc.get_freeze_count()
        make()
        assert gc.get_freeze_count() == frozen
        gc.unfreeze()
    finally:
        (gc.enable if was else gc.disable)()
