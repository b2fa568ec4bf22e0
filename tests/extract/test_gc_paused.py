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


def _young(objs: list) -> set[int]:
    """The ids of ``objs`` in the collector's young generations (0 and 1)."""
    made = {id(o) for o in objs}
    return {id(o) for g in (0, 1) for o in gc.get_objects(generation=g)} & made


def test_objects_made_while_paused_are_promoted_unwalked_and_still_collected():
    """Law (``promote_unwalked``, run as the collector is turned back on): every tracked object
    moves to the oldest generation, so no young collection walks what the paused function made;
    cyclic garbage among them is still freed by a full collection.  (Not where the interpreter
    froze objects itself, as some sites' start-up does: ``promote_unwalked`` leaves that process
    alone, the next test.)"""
    import weakref

    if gc.get_freeze_count():
        pytest.skip(f"this interpreter froze {gc.get_freeze_count()} objects itself: promote_unwalked leaves them")
    was = gc.isenabled()
    try:
        gc.enable()
        gc.collect()

        @gc_paused
        def make():
            return [_Cycle() for _ in range(1000)]

        made = make()
        assert not _young(made) and gc.get_freeze_count() == 0
        probe = weakref.ref(made[0])
        del made
        gc.collect(0)
        gc.collect(1)
        assert probe() is not None  # in the oldest generation: no young collection frees it
        gc.collect()
        assert probe() is None
    finally:
        (gc.enable if was else gc.disable)()


def test_a_process_that_froze_objects_itself_is_left_alone():
    """Where the process froze objects (its permanent generation is its own), ``gc_paused``
    moves nothing: the frozen count stays and what the function made stays young."""
    was, own = gc.isenabled(), gc.get_freeze_count() == 0
    try:
        gc.enable()
        if own:
            gc.freeze()  # (this process's own frozen objects, for the test)
        frozen = gc.get_freeze_count()

        @gc_paused
        def make():
            return [_Cycle() for _ in range(1000)]

        made = make()
        assert gc.get_freeze_count() == frozen and _young(made) == {id(o) for o in made}
    finally:
        if own:
            gc.unfreeze()
        (gc.enable if was else gc.disable)()
