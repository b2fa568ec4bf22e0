"""A hint that leads somewhere, for one way ``from_torch`` fails.

**Data-dependent control flow.**  ``torch.export`` cannot trace a Python ``if`` (or ``bool()``,
``.item()``, a boolean-mask index) on a tensor's values: it raises ``GuardOnDataDependentSymNode``
with some 1.5 kB of advice for torch developers.  ``data_dependent`` makes it one short
``ReshardError`` naming the user's line and the fix: compute both branches and select with
``torch.where`` (``torch.cond`` for branches that must not both run).

(An unsupported op needs no hint: the converter already goes through torch's decomposition of
an op it has no handler for, ``decomposed``, so ``decompose=True`` is no workaround for one.)
"""

from __future__ import annotations

import re

from ..ir.errors import ReshardError

#: torch's "The following call raised this error:" frame: file, line, code
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \w+\n\s+(.+)')


def data_dependent(e: BaseException) -> ReshardError | None:
    """A short error for ``torch.export``'s failure on data-dependent control flow; None for
    another failure."""
    if type(e).__name__ != "GuardOnDataDependentSymNode" and "data-dependent" not in str(e):
        return None
    frames = _FRAME.findall(str(e))
    at = f" at {frames[-1][0]}:{frames[-1][1]} ({frames[-1][2].strip()})" if frames else ""
    return ReshardError(f"from_torch: a branch or a shape depends on a tensor's values{at}; an exported program "
                        "has one path and fixed shapes for all inputs. Compute both branches and select with "
                        "torch.where(cond, a, b) (torch.cond if a branch must not run); mask rather than index by "
                        "a boolean tensor")
