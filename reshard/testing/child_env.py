"""The environment of a child Python process that must import this checkout's ``reshard``."""

from __future__ import annotations

import os
from pathlib import Path


def child_env(root: Path | str, **extra: str) -> dict[str, str]:
    """This process's environment with ``root`` first on ``PYTHONPATH`` and the caller's own
    entries kept after it (a stack that installs packages with ``pip --target`` and finds them
    through ``PYTHONPATH``, as the GPU machine's, still imports them in the child), and the
    variables ``extra`` set."""
    path = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, **extra}
