"""Step attributes: what each op kind's ``apply`` step in the host program carries beyond
``fop`` (read by its CPU step, ``runtime.cpu_steps``, and GPU step, ``runtime.gpu_steps``), one
module per op family of ``reshard.ir.ops`` (the small ones joined), registered by op kind in
``registry.STEP_ATTRS``; ``codegen.lower`` reads them through ``attrs_of``.

==================  ==============================================================
module              op kinds
==================  ==============================================================
``elementwise``     unary, binary, scale, cast, masked, complex_mul
``views``           reshape, unbucket, permute, movedim, broadcast
``slicing``         slice, pad, cat
``reductions``      reduce, cumsum, along
``lookup``          embedding_grad
``attention``       attention, attention_grad
``linear_loss``     linear_sumexp_grad
==================  ==============================================================

Imports ``ir`` only.
"""

from . import attention, elementwise, linear_loss, lookup, reductions, slicing, views  # noqa: F401  (registers)
from .registry import STEP_ATTRS, StepAttrs, attrs_of, step_attrs

__all__ = ["STEP_ATTRS", "StepAttrs", "attrs_of", "step_attrs"]
