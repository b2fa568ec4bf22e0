"""egglog's thread pool: one worker, and whether it survived ``fork()`` in this process.

egglog 13.2 runs on rayon's global thread pool, which starts on first use; ``fork()``
copies the pool's state but none of its threads, so a child forked after its parent used
egglog waits forever on the first job sent to the pool (``forksafe`` says when, and what
``optimize()`` does there).  Saturation notes each use before it makes an e-graph.
``run_egglog`` runs a program with egglog's errors and panics as ``ReshardError``.
"""

from __future__ import annotations

import gc
import os
import sys
from types import ModuleType

from ..ir.errors import ReshardError

#: the size of egglog's pool: plans must not depend on the machine.  rayon reads
#: ``RAYON_NUM_THREADS`` once, when the pool starts, which is when egglog's extension is
#: imported; its workers match rules in an order that depends on their number (the tiny
#: Llama's tp 2 training plan differed at 2 and 16 workers from 1, 3, 4 and 8).
WORKERS = "1"


def _import_with_one_pool_size() -> ModuleType:
    """``egglog.bindings``, imported with ``RAYON_NUM_THREADS`` at ``WORKERS`` and the
    caller's value put back (other rayon libraries, a tokenizer's, keep theirs).  Law: when
    reshard imports egglog first, egglog's pool has ``WORKERS`` workers whatever the
    environment or the core count; imported before reshard, it has what it got then."""
    if "egglog.bindings" in sys.modules:
        return sys.modules["egglog.bindings"]
    before = os.environ.get("RAYON_NUM_THREADS")
    os.environ["RAYON_NUM_THREADS"] = WORKERS
    try:
        import egglog.bindings
    finally:
        if before is None:
            del os.environ["RAYON_NUM_THREADS"]
        else:
            os.environ["RAYON_NUM_THREADS"] = before
    return egglog.bindings


#: egglog's bindings (every reshard module reads egglog through this name)
eb = _import_with_one_pool_size()

_state = {"used": False, "lost": False}


def _after_fork_in_child() -> None:
    """Mark the pool lost, and keep the cyclic garbage collector away from every object
    inherited from the parent (``gc.freeze``): an e-graph the parent had dropped into a
    reference cycle (a caught exception's frames, say) but not yet collected would otherwise
    be freed here, and freeing an e-graph sends a job to the pool the child lacks."""
    _state["lost"] = _state["used"]
    if _state["lost"]:
        gc.freeze()


os.register_at_fork(after_in_child=_after_fork_in_child)


def note_egglog_used() -> None:
    """Called before an e-graph is made: from now on a forked child has no egglog pool."""
    _state["used"] = True


def pool_lost() -> bool:
    """Is this a child forked after its parent used egglog (whose thread pool it lacks)?"""
    return _state["lost"]


def _is_panic(e: BaseException) -> bool:
    return type(e).__name__ == "PanicException"


def top_level_forms(text: str) -> list[str]:
    """The top-level s-expressions of egglog program ``text``, in order (a string literal's
    parentheses and a ``;`` comment's text are not counted).  ``ReshardError`` on unbalanced
    parentheses."""
    forms: list[str] = []
    depth, start, i, n = 0, 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == ";":
            while i < n and text[i] != "\n":
                i += 1
        elif ch == "(":
            if depth == 0:
                start = i
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                break
            if depth == 0:
                forms.append(text[start:i + 1])
        i += 1
    if depth != 0:
        raise ReshardError("internal: an egglog program with unbalanced parentheses")
    return forms


def run_forms(egraph: eb.EGraph, text: str, what: str) -> None:
    """Run egglog program ``text`` one top-level command at a time (``run_egglog``): the same
    commands in the same order, so the same e-graph, but egglog runs one long program text
    more than linearly slower (reshard's declarations, 255 commands: 0.16-0.27 s as one text,
    0.05 s one by one)."""
    for form in top_level_forms(text):
        run_egglog(egraph, form, what)


def run_egglog(egraph: eb.EGraph, text: str | list, what: str) -> list:
    """Run egglog program ``text`` (or commands already parsed from it) on ``egraph``; egglog
    errors and panics become ``ReshardError``."""
    try:
        return egraph.run_program(*(egraph.parse_program(text) if isinstance(text, str) else text))
    except eb.EggSmolError as e:
        raise ReshardError(f"egglog rejected the {what}: {e}") from e
    except BaseException as e:  # pyo3 PanicException derives from BaseException
        if _is_panic(e):
            raise ReshardError(f"egglog panicked during {what}: {e}") from e
        raise
