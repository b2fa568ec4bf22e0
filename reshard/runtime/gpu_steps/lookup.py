"""GPU steps of the lookups (``ir.ops.lookup``): ``embedding`` and ``pick`` as the lookup
kernel, ``embedding_grad`` as float32 atomics into a filled block, ``unpick`` as its kernel
(with a float accumulator of g's dtype, ``codegen.scatter_add``: ``unpick_add_kernel`` adding
into it).  Each reads the rows of the indexed dim the rank holds (``kernel_rows``: the masked
local lookup or scatter of a table or result split along it)."""

from __future__ import annotations

import torch

from ...codegen import kernels as K
from ...codegen.program import Step
from ...ir.ops import op_kind
from ...ir.ops.lookup import row_positions
from ...ir.sharding import TensorSharding
from ..kernel_kit import KernelKit, in_place_operand
from .registry import GpuStep, gpu_step

Tensor = torch.Tensor


def kernel_rows(step: Step, ts: TensorSharding, rank: int, local_extent: int, device: torch.device
                ) -> tuple[int, tuple[Tensor, ...]]:
    """How a kernel finds the rows of the indexed dim of ``ts`` (the table's or the result's
    sharding) that ``rank`` holds (``kernels._local_row``): the extent of valid indices and
    the kernel's row-positions argument, ``row_positions`` cached on ``device`` (none when the
    rank holds every row, ``local_extent`` of them, at the indices themselves)."""
    indexed = op_kind(step.attr("fop")).indexed
    pos = row_positions(ts, tuple(ts.mesh.coords(rank)), len(ts.shape) + indexed, str(device))
    return (local_extent, ()) if pos is None else (len(pos), (pos,))


class _Lookup(GpuStep):
    """A gather: ``kernels.lookup_kernel`` reading ``width`` elements per index, at the index's
    row plus ``base`` times its position."""

    def fits(self, table: Tensor, index: Tensor) -> bool:
        """Do local blocks of these shapes make a lookup (``gather`` applies)?"""
        raise NotImplementedError

    def gather(self, table: Tensor, index: Tensor) -> tuple[tuple[int, ...], int, int]:
        """The result's shape, and the row ``width`` and per-index ``base`` of
        ``kernels.lookup_kernel`` reading ``table`` at ``index``."""
        raise NotImplementedError

    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        table, index = xs
        return KernelKit.movable(table) and index.dtype == torch.int64 and self.fits(table, index)

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        """``kernels.lookup_kernel`` on the rank's block (``kit.rank``; ``kernel_rows``): the
        masked local lookup when the table is split along its indexed dim, else the rows at the
        indices themselves."""
        table, index = kit.contig(xs[0]), kit.contig(xs[1])
        indexed = op_kind(step.attr("fop")).indexed
        extent, pos = kernel_rows(step, step.attr("src"), kit.rank, table.shape[indexed], index.device)
        shape, width, base = self.gather(table, index)
        out = kit.empty(shape, table.dtype, table)
        ks = kit.kernel(K.lookup_kernel, (index.numel(), width, base, extent, kit.dt(table), bool(pos)),
                        True, out, table)
        kit.launch(ks, [out, table, index, *pos], out.numel())
        return out


@gpu_step("embedding")
class Embedding(_Lookup):
    def fits(self, table: Tensor, index: Tensor) -> bool:
        return table.dim() == 2

    def gather(self, table: Tensor, index: Tensor) -> tuple[tuple[int, ...], int, int]:
        """A row of ``table`` (``[V, H]``) per index."""
        return (*index.shape, table.shape[1]), table.shape[1], 0


@gpu_step("pick")
class Pick(_Lookup):
    def fits(self, table: Tensor, index: Tensor) -> bool:
        return table.dim() >= 2 and tuple(table.shape[:-1]) == tuple(index.shape)

    def gather(self, table: Tensor, index: Tensor) -> tuple[tuple[int, ...], int, int]:
        """One element per index, of the row of ``x`` (``[*B, V]``) at the index's own position."""
        return tuple(index.shape), 1, table.shape[-1]


def _accumulator_fits(step: Step, xs: list[Tensor]) -> bool:
    return op_kind(step.attr("fop")).accumulator_fits(step, xs)


@gpu_step("embedding_grad")
class EmbeddingGrad(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        g, index = xs[:2]
        return (KernelKit.floats(g) and index.dtype == torch.int64 and tuple(g.shape) == (*index.shape, g.shape[-1])
                and g.shape[-1] == step.attr("dst").local_shape[-1] > 0 and _accumulator_fits(step, xs))

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        """A float32 block, zeroed or a copy of the accumulator (``accumulator``), g's rows added
        into the rows of ``kit.rank``'s block their ids name (``kernel_rows``; rows other ranks
        hold, and the ``padding_idx`` tokens, add nothing), rounded to g's dtype."""
        ts: TensorSharding = step.attr("dst")
        g, index = kit.contig(xs[0]), kit.contig(xs[1])
        extent, pos = kernel_rows(step, ts, kit.rank, ts.local_shape[0], index.device)
        if len(xs) == 3:  # acc + scatter: the accumulator copied to float32 (a pointwise kernel)
            acc = kit.pointwise([], [xs[2]], torch.float32)
        else:
            acc = kit.empty(ts.local_shape, torch.float32, g)
            kit.launch(kit.kernel(K.fill_kernel, (acc.numel(), "float32"), None), [acc], acc.numel())
        ks = kit.kernel(K.embedding_grad_kernel, (index.numel(), g.shape[-1], extent, kit.dt(g), bool(pos),
                                                  step.attr("padding_idx")), None)
        kit.launch(ks, [acc, g, index, *pos], g.numel())
        return acc if g.dtype == torch.float32 else kit.pointwise([], [acc], g.dtype)


@gpu_step("unpick")
class Unpick(GpuStep):
    def supported(self, step: Step, xs: list[Tensor]) -> bool:
        g, index = xs[:2]
        return (KernelKit.movable(g) and index.dtype == torch.int64 and index.shape == g.shape
                and _accumulator_fits(step, xs) and (len(xs) == 2 or KernelKit.pointwise_values(g)))

    def run(self, step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        """``kernels.unpick_kernel`` on the rank's block (``kit.rank``; ``kernel_rows``): each
        element once; with a float accumulator of g's dtype (``codegen.scatter_add``)
        ``_add_into``, else with an accumulator added to it by a pointwise kernel."""
        if len(xs) == 3 and KernelKit.floats(xs[0], xs[2]) and xs[0].dtype == xs[2].dtype:
            return self._add_into(step, xs, kit)
        ts: TensorSharding = step.attr("dst")
        g, index = kit.contig(xs[0]), kit.contig(xs[1])
        width = ts.local_shape[-1]
        extent, pos = kernel_rows(step, ts, kit.rank, width, index.device)
        out = kit.empty(ts.local_shape, g.dtype, g)
        ks = kit.kernel(K.unpick_kernel, (g.numel(), width, extent, kit.dt(g), bool(pos)), None)
        kit.launch(ks, [out, g, index, *pos], out.numel())
        return out if len(xs) == 2 else kit.pointwise([("add", "in0", "in1")], [xs[2], out], g.dtype, out=out)

    @staticmethod
    def _add_into(step: Step, xs: list[Tensor], kit: KernelKit) -> Tensor:
        """An ``unpick`` added to its accumulator (``codegen.scatter_add``): the accumulator itself
        where the allocation plan writes the result into it (``in_place_operand``), else a copy of
        it, then ``unpick_add_kernel``: one thread per row adds g there, the rest of the block
        untouched (a float ``acc + 0`` is acc: only a -0.0 stays -0.0 where the pointwise add of the
        scattered block would give +0.0)."""
        g, index, acc = kit.contig(xs[0]), kit.contig(xs[1]), xs[2]
        out = in_place_operand(step, xs)
        if out is None:
            out = kit.copy(acc)
        ts = step.attr("dst")
        width = ts.local_shape[-1]
        extent, pos = kernel_rows(step, ts, kit.rank, width, index.device)
        ks = kit.kernel(K.unpick_add_kernel, (g.numel(), width, extent, kit.dt(g), bool(pos)), None)
        kit.launch(ks, [out, g, index, *pos], g.numel())
        return out
