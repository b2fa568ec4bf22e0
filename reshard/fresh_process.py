"""The fresh interpreter's side of ``forksafe``: run ``optimize()`` on the call read from
stdin, and send its progress reports and its plan (or its exception) back, pickled.  Its own
module because it imports ``plan``, which imports ``forksafe``.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
import traceback
from typing import Any

from .ir.errors import ReshardError


def serve() -> None:
    """The fresh process: read the call, run it, send progress reports and the plan (or the
    exception) to stdout, pickled; anything else printed goes to stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)

    def send(kind: str, value: Any) -> None:
        pickle.dump((kind, value), out)
        out.flush()

    try:
        import dataclasses

        from .plan import optimize
        fusion, kwargs, ends_at, relay = pickle.load(sys.stdin.buffer)
        if ends_at is not None:
            kwargs["limits"] = dataclasses.replace(kwargs["limits"], time_limit_s=max(1e-6, ends_at - time.time()))
        plan = optimize(fusion, **kwargs, progress=(lambda r: send("progress", r)) if relay else None)
        for node in plan.lowered.nodes:
            _ = node.alternatives  # priced here: the pricing needs the e-graph, which stays here
        send("plan", plan)
    except Exception as e:
        try:
            pickle.dumps(e)
        except Exception:
            e = ReshardError(f"optimize (in a fresh process): {''.join(traceback.format_exception(e))}")
        send("error", e)
