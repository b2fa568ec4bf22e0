"""Python's cyclic garbage collector while planning (``rarely_collected``).

Planning allocates millions of small objects the collector tracks (the e-graph's rows read
back, e-nodes, extraction's entries, export's graph nodes) and keeps most of them until it
ends, while making almost no cyclic garbage.  With Python's default threshold (a young
collection every 700 net allocations, an old one every 10 of those once the old generation
has grown by a quarter) the collector walks those objects again and again and frees next to
nothing: measured on the training tests' tiny Llama at tp 2 (870 ops), 0.75 s of a 4 s plan
in collections, and 3.2 s of the Llama-2-7B dp 2 x tp 4 step's planning process, all outside
extraction, which runs with the collector off (``extract.extract.gc_paused``); this covers the
rest of planning: the export, saturation (reading the e-graph back) and lowering.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: net allocations between two young collections while planning (Python's default: 700).  Each
#: young collection also counts towards the older ones, so they run as much less often.
PLANNING_THRESHOLD = 50_000

_LOCK = threading.Lock()
_DEPTH = 0
_SAVED: tuple[int, int, int] | None = None


@contextmanager
def rarely_collected() -> Iterator[None]:
    """The block with the collector's young threshold at ``PLANNING_THRESHOLD`` (never lowered:
    a process that set a higher one keeps it), the process's own restored when the outermost
    such block (in any thread) ends.

    Law: the collector still runs, so cyclic garbage is still freed, later; nothing planning
    computes depends on when objects are collected, so a plan is the same either way (the plan
    digests are).  A process forked inside the block (``extract.second_core``) inherits the
    threshold."""
    global _DEPTH, _SAVED
    with _LOCK:
        if _DEPTH == 0:
            _SAVED = gc.get_threshold()
            gc.set_threshold(max(_SAVED[0], PLANNING_THRESHOLD), *_SAVED[1:])
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _SAVED is not None:
                gc.set_threshold(*_SAVED)
                _SAVED = None
