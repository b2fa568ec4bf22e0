"""The step attributes' registry: what an op kind's ``apply`` step carries beyond ``fop``, by op kind.

The op registry (``reshard.ir.ops``) says what an op means; what its step in the host program
carries (the attributes its CPU and GPU steps read: a function's name, a local range, a local
shape) is lowering's, registered here with ``@step_attrs("kind", ...)`` on a function
``(fusion, op, local_shape) -> dict`` (``local_shape``: the result's) in the module of its op
family.  An op kind with none carries no attributes beyond ``fop`` (``attrs_of``: ``{}``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...ir.fusion import Fusion, Op
from ...ir.ops.registry import enter_by_kind

#: an op kind's step attributes: ``(fusion, op, local_shape) -> attributes``
StepAttrs = Callable[[Fusion, Op, tuple[int, ...]], dict[str, Any]]

#: op kind -> its step attributes
STEP_ATTRS: dict[str, StepAttrs] = {}


def step_attrs(*kinds: str) -> Callable[[StepAttrs], StepAttrs]:
    """Decorator: the function gives the step attributes of each op kind in ``kinds``."""
    def deco(fn: StepAttrs) -> StepAttrs:
        enter_by_kind(STEP_ATTRS, kinds, fn, "step attributes")
        return fn
    return deco


def attrs_of(fusion: Fusion, op: Op, local_shape: tuple[int, ...]) -> dict[str, Any]:
    """The attributes of ``op``'s ``apply`` step beyond ``fop`` (``local_shape``: its result's):
    its kind's registered ones, ``{}`` for a kind with none."""
    fn = STEP_ATTRS.get(op.kind)
    return {} if fn is None else fn(fusion, op, local_shape)
