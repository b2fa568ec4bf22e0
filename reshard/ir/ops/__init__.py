"""The op registry: one module per op family, each op declared once (``registry.OpKind``).

======================  ==========================================================
module                  op kinds
======================  ==========================================================
``elementwise``         unary (``UNARY_FNS``), binary (``BINARY_FNS``), scale, cast, set
``views``               reshape, permute, broadcast
``slicing``             slice, pad, cat
``reductions``          reduce (sum, mean, max)
``matmul``              matmul
``select``              masked (and ``where``, built from it)
``scan``                cumsum
``along``               along (flip, cumprod, sort, argsort, topk, topk_indices, prod, argmax, argmin,
                        is_max)
``complex_pairs``       complex_mul (complex tensors held as pairs of reals)
``lookup``              embedding, pick
``sources``             input, redistribute
``gradient``            detach, saved, grad_seed (autodiff's boundary ops)
``bucket``              unbucket (a gradient read back out of a bucket, ``passes.buckets``)
``attention``           attention, attention_grad (scaled dot-product attention, fused)
``linear_loss``         linear_max, linear_sumexp, linear_sumexp_grad (a linear's rows reduced
                        without its result: fused linear cross entropy)
``alternative``         alternative (a value computed another way, ``rules.attention``)
======================  ==========================================================

The rule: everything one op kind means lives in its family module (builders, reference,
index map, linearity, padding hooks, cost law, vjp); every layer reads it through
``op_kind(kind)``.  How a later layer implements an op is registered in that layer by op kind
(its step attributes: ``codegen.step_attrs``; CUDA source: ``codegen``; its CPU step:
``runtime.cpu_steps``; its GPU step: ``runtime.gpu_steps``).  This package is part of ``ir``: it imports torch and ``ir`` modules only, and
the hooks that codegen and runtime call take the step as an argument.  Adding an op: docs/design.md,
"Adding an op".
"""

from . import (along, alternative, attention, bucket, complex_pairs, elementwise, gradient, linear_loss,  # noqa: F401
               lookup, matmul, reductions, scan, select, slicing, sources, views)  # (registers)
from .registry import BUILDERS, OPS, RED, Image, OpKind, PartImage, op_kind, register

__all__ = ["BUILDERS", "OPS", "RED", "Image", "OpKind", "PartImage", "op_kind", "register"]
