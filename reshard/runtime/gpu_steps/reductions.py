"""GPU step of ``reduce`` (``ir.ops.reductions``): the reduce kernel over the reduced dims
merged into one (through a permute kernel first when they are not adjacent), computing its
operand by a pointwise prologue where ``codegen.fuse`` gave the step one; a column reduction
of few columns in two kernels, its parts' partials then their reduction (``kernels.reduce_splits``)."""

from __future__ import annotations

import math

import torch

from ...codegen import kernels as K
from ...codegen.pointwise_ops import takes_prologue
from ...codegen.program import Step
from ...ir.ops.reductions import REDUCTIONS, step_dims
from ..kernel_kit import KernelKit
from .registry import GpuStep, gpu_step

Tensor = torch.Tensor


def _operand_shape(step: Step, xs: list[Tensor]) -> tuple[int, ...]:
    """The reduced operand's shape: its input's, or with a prologue reading inputs through a
    broadcast (``codegen.fuse``) the step's ``shape``."""
    return tuple(step.attr("shape") or xs[0].shape)


@gpu_step("reduce")
class Reduce(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        """A float operand, a known fn, some dims, elements to take the max of, a count to take
        the mean over; with a prologue (``kernel_prologue``) its inputs of pointwise dtypes and
        of one shape, and the reduced dims adjacent (no permute of the operand is made)."""
        fn, pro, shape = step.attr("fn"), step.attr("prologue"), _operand_shape(step, xs)
        if pro is not None:
            bcast = step.attr("bcast") or ((),) * len(xs)
            if not (KernelKit.pointwise_values(*xs) and len(bcast) == len(xs)
                    and all(tuple(y.shape) == (tuple(b[0]) if b else shape) for y, b in zip(xs, bcast))
                    and takes_prologue(step, shape) and pro[1] in K.FLOAT_DTYPES
                    and all(o[0] in K.POINTWISE_OPS for o in pro[0])
                    and all(d in K.POINTWISE_DTYPES for _, d in step.attr("extra_values", ()))):
                return False
        elif not KernelKit.floats(xs[0]):
            return False
        if not (len(shape) >= 1 and fn in REDUCTIONS and step_dims(step)):
            return False
        n = math.prod(shape[d % len(shape)] for d in set(step_dims(step)))
        return n > 0 if fn == "max" else fn != "mean" or bool(step.attr("count"))

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor | tuple[Tensor, ...]:
        """The reduce kernel over the reduced dims merged into one (through a permute kernel
        first when they are not adjacent); mean = the sum times 1 / count, in the kernel.  With a prologue
        (instructions, operand dtype) the kernel computes the operand from ``xs`` and writes the
        step's extra outputs (``extra_values``), returned after the result."""
        fn, pro, operand = step.attr("fn"), step.attr("prologue"), _operand_shape(step, xs)
        r = len(operand)
        dims = sorted({d % r for d in step_dims(step)})
        keep = [d for d in range(r) if d not in dims]
        xs = [kit.contig(y) for y in xs]
        x = xs[0]
        n = math.prod(operand[d] for d in dims)
        if dims == list(range(dims[0], dims[-1] + 1)):  # adjacent: merge them in place
            shape, dim = (*operand[:dims[0]], n, *operand[dims[-1] + 1:]), dims[0]
            ys = xs if pro is not None else [x.view(shape)]  # (a prologue reads element i of each input)
        else:  # move them last (one permute kernel), then merge
            y = kit.permute(x, tuple(keep + dims)).view(*[x.shape[d] for d in keep], n)
            shape, dim, ys = tuple(y.shape), len(keep), [y]
        dtype = kit.dt(x) if pro is None else pro[1]
        out = kit.empty([operand[d] for d in keep], getattr(torch, dtype), x)
        extra = tuple(step.attr("extra_values", ()))
        extras = [kit.empty(operand, getattr(torch, d), x) for _, d in extra]
        op = "max" if fn == "max" else "sum"
        args = (shape, dim, op, dtype)
        if pro is not None:
            bcast = tuple(step.attr("bcast") or ())
            args += ((tuple(kit.dt(y) for y in xs), tuple(pro[0]), extra, (operand, bcast) if any(bcast) else ()),)
        scale = {"scale": 1.0 / step.attr("count")} if fn == "mean" else {}
        splits = K.reduce_splits(shape, dim)
        if splits > 1:  # float32 partials of the parts, then their reduction (``reduce_splits``)
            outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
            part = kit.empty((outer, splits, inner), torch.float32, x)
            kit.launch(kit.kernel(K.reduce_kernel, args, None, split=splits), [part, *extras, *ys], part.numel())
            ks = kit.kernel(K.reduce_kernel, ((outer, splits, inner), 1, op, dtype), None, from_partials=True, **scale)
            kit.launch(ks, [out, part], out.numel())
        else:
            kit.launch(kit.kernel(K.reduce_kernel, args, None, **scale), [out, *extras, *ys], out.numel())
        return (out, *extras) if extras else out
