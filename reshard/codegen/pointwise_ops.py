"""Each elementwise op kind's instruction in a generated pointwise kernel, by op kind: the op
kinds that join fused chains (``codegen.fuse``) and whose GPU step is one pointwise kernel
(``runtime.gpu_steps.elementwise``); and which steps' kernels may compute their operand by a
fused pointwise prologue (``takes_prologue``: a reduction over adjacent dims).

An instruction is ``(op, operand tokens..., constants)`` in ``codegen.kernels``' pointwise
IR (``kernels.POINTWISE_OPS``): a unary or binary function by its name, ``mul_scalar`` for a
scale, ``cast`` to a dtype, ``masked`` keeping where the condition is ``keep``.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.errors import ReshardError
from ..ir.ops.reductions import REDUCTIONS, step_dims
from .program import Step

__all__ = ["INSTRUCTIONS", "instruction", "takes_prologue"]

#: op kind -> its instruction over the tokens of the step's operands
INSTRUCTIONS: dict[str, Callable[[Step, list[str]], tuple]] = {
    "unary": lambda step, x: (step.attr("fn"), x[0]),
    "binary": lambda step, x: (step.attr("fn"), x[0], x[1]),
    "scale": lambda step, x: ("mul_scalar", x[0], step.attr("factor")),
    "cast": lambda step, x: ("cast", x[0], step.attr("dtype")),
    "masked": lambda step, x: ("masked", x[0], x[1], step.attr("keep")),
}


def instruction(step: Step, operands: list[str]) -> tuple:
    """The pointwise-kernel instruction of an elementwise ``apply`` step over ``operands``."""
    build = INSTRUCTIONS.get(step.attr("fop"))
    if build is None:
        raise ReshardError(f"op kind {step.attr('fop')!r} is not elementwise")
    return build(step, operands)


def takes_prologue(step: Step, shape: tuple[int, ...]) -> bool:
    """May the step's generated kernel compute its one operand (of local ``shape``) by a
    pointwise prologue of the step's inputs (step attribute ``prologue``, ``codegen.fuse``)?
    A ``reduce`` over adjacent reduced dims (merged in place, no permute of the operand) of a
    known fn; its GPU step then takes those inputs."""
    if step.attr("fop") != "reduce":
        return False
    dims = sorted({d % len(shape) for d in step_dims(step)}) if shape else []
    return bool(dims) and dims == list(range(dims[0], dims[-1] + 1)) and step.attr("fn") in REDUCTIONS
