"""Local steps on CUDA tensors through reshard's generated NVRTC kernels.

:func:`gpu_local_step` has the contract of :func:`reshard.runtime.local_ops.run_local`
(``(step, env, rank) -> tensor``; usable as ``simulate``'s ``local_step``).  What runs where:

=======================  ===========================================================
step                     implementation
=======================  ===========================================================
``view``                 ``run_local`` (a view)
``remap``                ``run_local``: a view, one torch strided copy when the gather
                         index is affine (``remap_fast``), else a gather with a
                         device-cached index.  (A strided-copy kernel measured 2x
                         slower here on the H100: host time per launch,
                         docs/history/gpu-check-2026-11.md.)
apply ``reshape``        ``run_local`` (a view)
apply ``matmul``         ``torch.matmul`` (cuBLAS)
apply ``unary``          pointwise kernel (every fn of ``kernels.POINTWISE_OPS``)
apply ``binary``         pointwise kernel; same-shape operands, output dtype by torch's
                         type promotion (the comparisons: bool)
apply ``scale``          pointwise kernel (``mul_scalar``)
apply ``cast``           pointwise kernel (conversion)
apply ``masked``         pointwise kernel (``masked``)
apply ``embedding``      lookup kernel (``lookup_kernel``: the rows at the ids; the
                         masked local lookup through the rank's row positions)
apply ``pick``           lookup kernel (one element per row at its index, likewise)
apply ``unpick``         unpick kernel (each element of the rank's block once); with a
                         float accumulator (``codegen.scatter_add``) ``unpick_add_kernel``
                         adding g into its rows (in place where the allocation plan
                         writes into it, else into a copy of it)
apply ``embedding_grad`` fill kernel (0), or with an accumulator a pointwise copy of it to
                         float32, then float32 atomics adding g's rows into the rank's
                         block (``embedding_grad_kernel``); a cast kernel to a 16-bit
                         g's dtype
apply ``grad_seed``      fill kernel (1)
apply ``pointwise``      one pointwise kernel for a fused group (``codegen.fuse``),
                         writing its extra outputs too
apply ``set``            strided-copy kernel (a fresh contiguous copy)
apply ``permute``        permute kernel (tiled transpose or coalesced copy); a
                         non-contiguous input: one strided-copy kernel
apply ``slice``          strided-copy kernel reading the input's own strides
apply ``pad``            pad kernel
apply ``cat``            cat kernel
apply ``broadcast``      strided-copy kernel reading the operand with stride 0 along
                         the new and the expanded dims
apply ``reduce``         reduce kernel (sum / max; mean = the sum scaled in the kernel);
                         the reduced dims are merged into one, through a permute
                         kernel first when they are not adjacent; with a ``prologue``
                         (``codegen.fuse``) the kernel computes the operand from the
                         step's inputs and writes its extra outputs
=======================  ===========================================================

Arithmetic kernels (pointwise, reduce) take float32 / bfloat16 / float16
(``kernels.FLOAT_DTYPES``), pointwise kernels bool, int64 and int32 as well
(``kernels.POINTWISE_DTYPES``: a bool is 0 or 1 in float32 registers, an int a 64-bit int);
data-movement kernels (and lookups, fills) take any dtype of ``kernels.ITEMSIZE``.
A step whose result is a view of its contiguous operand (``OpKind.shares_operand``: a
slice of whole outer rows, a permute moving only extent-1 dims, a broadcast expanding
nothing) is that view (``run_local``), no kernel, as the allocation plan counts it.
Every other case (float64 arithmetic, an unknown fn, broadcasting operands, mixed-dtype
cat, an empty reduction, ...) falls back to ``run_local`` by its GPU step's ``supported``;
so do steps whose inputs are not all CUDA tensors.  Each op kind's kernel path is its GPU step,
registered by kind in its family's module of ``runtime.gpu_steps`` (``GPU_STEPS``: ``supported``
/ ``run`` on a :class:`KernelKit`); this module looks them up and runs the fused chains.  Non-contiguous
inputs of kernels are first made contiguous by a strided-copy kernel.  Kernels launch on
torch's current CUDA stream with ``data_ptr()`` arguments (``nvrtc.launch``); outputs are
fresh contiguous tensors.

:func:`step_kernels` lists the kernels a step would launch without launching anything (CPU
tensors are fine), so the kernels of a whole plan can be compiled on a machine with no GPU.
"""

from __future__ import annotations

import torch

from ..codegen import kernels as K
from ..codegen import nvrtc as N
from ..codegen.kernels import KernelSource
from ..codegen.program import Step
from ..ir.fusion import DTYPES
from ..ir.ops import op_kind
from ..ir.tensor_cache import BoundedCache
from .gpu_steps import GPU_STEPS
from .kernel_kit import POINTWISE_VALUES as _POINTWISE_VALUES
from .kernel_kit import KernelKit, in_place_operand
from .local_ops import run_local

__all__ = ["gpu_local_step", "step_kernels", "kernel_path", "run_kernels", "KernelKit", "a_view"]

Tensor = torch.Tensor


# ---- which apply steps run on kernels ---------------------------------------------------

def _pointwise_ok(step: Step, xs: list[Tensor]) -> bool:
    """A fused group: every instruction a kernel op, operands of pointwise-kernel dtypes and of
    the result's shape (a broadcast input: of its recorded shape), every cast, the result and
    the extra outputs to a pointwise-kernel dtype."""
    ops, bcast = step.attr("ops"), step.attr("bcast") or ((),) * len(xs)
    shape = tuple(step.attr("shape") or (xs[0].shape if xs else ()))
    return (bool(xs) and KernelKit.pointwise_values(*xs) and len(bcast) == len(xs)
            and all(tuple(x.shape) == (tuple(b[0]) if b else shape) for x, b in zip(xs, bcast))
            and DTYPES.get(step.attr("dtype")) in _POINTWISE_VALUES
            and all(o[0] in K.POINTWISE_OPS and (o[0] != "cast" or DTYPES.get(o[2]) in _POINTWISE_VALUES)
                    for o in ops)
            and all(DTYPES.get(d) in _POINTWISE_VALUES for _, d in step.attr("extra_values", ())))


def _run_pointwise(kit: KernelKit, step: Step, xs: list[Tensor]) -> Tensor | tuple[Tensor, ...]:
    """A fused group (``codegen.fuse``): one pointwise kernel, writing its result into its
    ``into`` operand where ``in_place_operand`` allows, and its extra outputs."""
    return kit.pointwise(list(step.attr("ops")), xs, DTYPES[step.attr("dtype")], step.attr("shape"),
                         step.attr("bcast") or (), out=in_place_operand(step, xs), extra=step.attr("extra_values", ()))


#: apply kinds that declare a generated kernel (a fused chain does; the registry is complete
#: once ``reshard.ir.ops`` is imported), worked out once rather than per step
_KERNEL_FOPS = frozenset({"pointwise"} | set(GPU_STEPS))


def has_kernel(fop: str) -> bool:
    """Does apply kind ``fop`` declare a generated kernel?"""
    return fop in _KERNEL_FOPS


def run_kernels(kit: KernelKit, step: Step, xs: list[Tensor]) -> Tensor | tuple[Tensor, ...]:
    """``step`` on ``xs`` through ``kit``'s kernels (launched, or with a recording kit only
    listed: ``kit.launched``); the caller checked ``kernel_path``."""
    fop = step.attr("fop")
    if fop == "pointwise":
        return _run_pointwise(kit, step, xs)
    return GPU_STEPS[fop].run(step, xs, kit)


def _inputs(step: Step, env: dict[str, Tensor]) -> list[Tensor]:
    return [env[n] for n in step.ins]


def kernel_path(step: Step, xs: list[Tensor]) -> bool:
    """True when ``step`` on inputs ``xs`` runs through generated kernels (device aside)."""
    if step.attr("op") != "apply" or not has_kernel(fop := step.attr("fop")):
        return False
    if fop != "pointwise" and a_view(step, xs):
        return False
    if fop == "pointwise":
        return _pointwise_ok(step, xs)
    return GPU_STEPS[fop].supported(step, xs)


def a_view(step: Step, xs: list[Tensor]) -> bool:
    """Is the step's result a view of a contiguous operand (``OpKind.shares_operand``: a slice of
    whole outer rows, a permute moving only extent-1 dims, a broadcast expanding nothing, a
    same-dtype cast), which ``run_local`` returns with no copy, as the allocation plan counts it?"""
    i = op_kind(step.attr("fop")).shares_operand(step, [(tuple(x.shape), str(x.dtype)[len("torch."):]) for x in xs])
    return i is not None and xs[i].is_contiguous()


def gpu_local_step(step: Step, env: dict[str, Tensor], rank: int, *, poison: bool = False
                   ) -> Tensor | tuple[Tensor, ...]:
    """Execute one ``local`` step for ``rank`` on CUDA tensors (see the module docstring).

    ``poison``: fill kernel outputs with NaN (all bits set for non-float dtypes) before the
    kernels run, so that elements a kernel fails to write show up in checks.
    """
    if step.attr("op") == "apply" and all(n in env for n in step.ins):
        xs = _inputs(step, env)
        if xs and all(x.is_cuda for x in xs):
            if not has_kernel(step.attr("fop")):  # (matmul: cuBLAS) skip the replay lookup
                return run_local(step, env, rank)
            into = in_place_operand(step, xs)  # (a launch recorded in place replays in place only)
            key = (id(step), rank, into is None, *((x.shape, x.stride(), x.dtype, x.data_ptr() % 16 == 0) for x in xs))
            hit = _ONE_KERNEL.get(key) if not poison else None
            if hit is not None and hit[0] is step:  # seen with inputs like these
                if hit[1] is None:  # not on the kernel path (a view, a torch step): as then
                    return run_local(step, env, rank)
                _, ks, pattern, shape, dtype, n = hit  # one kernel: replay its launch
                out = into if into is not None else torch.empty(shape, dtype=dtype, device=xs[0].device)
                N.launch(ks, [out if w == "out" else xs[v] if w == "in" else v for w, v in pattern],
                         ks.grid_for(n), ks.block, ks.shared_mem)
                return out
            if kernel_path(step, xs):
                ex = KernelKit(poison=poison, rank=rank)
                out = run_kernels(ex, step, xs)
                if not poison:
                    _remember(key, step, ex, xs, out)
                return out
            if not poison:  # ``kernel_path`` reads only what the key holds: the same answer next time
                _ONE_KERNEL[key] = (step, None)
    return run_local(step, env, rank)


#: (step identity, rank (a masked local scatter's launch depends on it), inputs'
#: shape/strides/dtype/16-byte alignment) -> (step, kernel, argument
#: pattern, result shape, dtype, element count) of steps that ran as exactly one kernel into a
#: fresh result, or (step, None) of steps off the kernel path (``kernel_path`` false: a view, a
#: torch step): repeating such a step skips kernel selection (host time per step)
_ONE_KERNEL: BoundedCache[tuple, tuple] = BoundedCache(4096)


def _remember(key: tuple, step: Step, ex: KernelKit, xs: list[Tensor], out: Tensor | tuple[Tensor, ...]) -> None:
    """Record ``step``'s launch for replay when it was one kernel into one fresh result whose
    tensor arguments are the result and the step's inputs themselves (not views or temporaries)."""
    if isinstance(out, tuple) or len(ex.launched) != 1 or not out.numel() or not out.is_contiguous():
        return
    ks, args, n = ex.launched[0]
    pattern = []
    for a in args:
        if a is out:
            pattern.append(("out", None))
        elif isinstance(a, Tensor):
            i = next((i for i, x in enumerate(xs) if a is x), None)
            if i is None:
                return
            pattern.append(("in", i))
        else:
            pattern.append(("val", a))
    _ONE_KERNEL[key] = (step, ks, tuple(pattern), tuple(out.shape), out.dtype, n)


def step_kernels(step: Step, env: dict[str, Tensor], rank: int) -> list[KernelSource]:
    """The kernels :func:`gpu_local_step` would launch for ``step`` on these inputs, without
    launching (inputs may live on any device).  Where pointer alignment picks a vectorized
    or scalar variant, both are listed.  Empty for steps that do not use kernels."""
    xs = _inputs(step, env)
    if not kernel_path(step, xs):
        return []
    record: list[KernelSource] = []
    run_kernels(KernelKit(record=record, rank=rank), step, xs)
    return record
