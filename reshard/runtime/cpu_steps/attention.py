"""CPU steps of the fused attention ops (``ir.ops.attention``): torch's SDPA on the local
tensors (flash / memory-efficient / cuDNN kernels on CUDA tensors), the causal kernels where
the step holds every q row (``causal_kernel``); the gradient by ``torch.autograd.grad`` of it
(torch's fused backward kernels), the forward recomputed.  A q-sequence block's gradient
(``attention_grad``'s ``Partial("sum")`` strategy of a split L) is placed in its rows of zeros
over all of L (``run_on``, reading q's sharding the step carries)."""

from __future__ import annotations

import torch

from ...ir.errors import ReshardError
from ...ir.ops.attention import grad_parts, is_gqa, stack_grads, stacked_grads
from ...ir.ops.registry import StepLike
from .registry import CpuStep, cpu_step

Tensor = torch.Tensor


#: dtypes of torch's flash kernels: the only fused SDPA kernels that read k and v with fewer
#: heads than q (``enable_gqa``); others (float32) fall back to the math path there
_FLASH_DTYPES = (torch.float16, torch.bfloat16)


def sdpa(step: StepLike, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal_kernel: bool = True) -> Tensor:
    """torch's SDPA on local tensors (flash / memory-efficient / cuDNN kernels on a GPU): the
    causal kernels when the step's q rows are all of L (``causal_kernel``, unless the caller
    says they are not), else the mask; a ``safe`` op's fully masked rows are 0; k and v with
    fewer heads read as they are (``enable_gqa``), but on a GPU in a dtype flash does not take
    (float32) with their heads repeated (as the model's own ``repeat_kv`` does: the
    memory-efficient kernels then run, not the math path; a Llama float32 step's attention on
    an H100 took 6 ms that way, 3.5 ms in the fused kernels)."""
    causal = causal_kernel and bool(step.attr("causal_kernel", False))
    gqa = is_gqa(q, k)
    if gqa and q.is_cuda and q.dtype not in _FLASH_DTYPES:
        groups = q.shape[-3] // k.shape[-3]
        k, v, gqa = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3), False
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=None if causal else mask, is_causal=causal, scale=step.attr("scale"),
        enable_gqa=gqa)
    if step.attr("safe") and mask is not None:
        out = out.masked_fill(torch.isneginf(mask.amax(-1, keepdim=True)), 0.0)
    return out


def viewed(step: StepLike, xs: list[Tensor]) -> list[Tensor]:
    """The operands as the op reads them: each buffer that lowering gave in place of a
    permuted copy of it (``codegen.transposes``: the step's ``views``, a permutation or
    ``()`` per operand) read through that permutation (a view, no copy)."""
    views = step.attr("views") or ()
    return [x.permute(v) if v else x for x, v in zip(xs, views)] + list(xs[len(views):])


class _Fused(CpuStep):
    """``arity`` operands before an optional mask; ``fused`` computes the result from them."""

    arity = 3

    def fused(self, step: StepLike, xs: list[Tensor], mask: Tensor | None) -> Tensor:
        raise NotImplementedError

    def run(self, step: StepLike, xs: list[Tensor]) -> Tensor:
        """The step on the operands as viewed (``viewed``), its result permuted where
        lowering asked (``out_perm``: contiguous, a view of SDPA's memory where that is its layout)."""
        xs = viewed(step, xs)
        out = self.fused(step, xs[:self.arity], xs[self.arity] if len(xs) > self.arity else None)
        perm = step.attr("out_perm")
        return out if perm is None else out.permute(perm).contiguous()


@cpu_step("attention")
class Attention(_Fused):
    def fused(self, step: StepLike, xs: list[Tensor], mask: Tensor | None) -> Tensor:
        return sdpa(step, xs[0], xs[1], xs[2], mask)


@cpu_step("attention_grad")
class AttentionGrad(_Fused):
    arity = 4

    def fused(self, step: StepLike, xs: list[Tensor], mask: Tensor | None) -> Tensor:
        return stacked_grads(lambda q, k, v, m: sdpa(step, q, k, v, m), *xs, mask)

    def run_on(self, step: StepLike, xs: list[Tensor], rank: int) -> Tensor:
        """With q (and g) a block of q's sequence and k, v whole (the ``Partial("sum")``
        strategy of a split L): the block's dq in its rows of zeros over all of L, and the
        block's summands of dk and dv (the mask, never the causal kernels: the rows start
        mid-sequence); else the gradient of the operands as viewed."""
        xs = viewed(step, xs)
        q, k = xs[0], xs[1]
        if q.shape[-2] == k.shape[-2]:
            return self.fused(step, xs[:4], xs[4] if len(xs) > 4 else None)
        ts = step.attr("src")
        ranges = ts.block_ranges(ts.mesh.coords(rank))
        if ranges is None:
            raise ReshardError(f"attention_grad: q's sharding {ts} is not a block of its sequence")
        start, rows = ranges[q.dim() - 2]
        mask = xs[4] if len(xs) > 4 else None
        dq, dk, dv = grad_parts(lambda a, b, c, m: sdpa(step, a, b, c, m, causal_kernel=False), q, k, xs[2],
                                xs[3], mask)
        whole = q.new_zeros(q.shape[:-2] + k.shape[-2:])
        whole[..., start:start + rows, :] = dq
        return stack_grads(whole, dk, dv)
