"""CPU steps of the lookups (``ir.ops.lookup``): the masked local lookup of ``embedding`` and
``pick`` (the rows of the table the rank holds, read from the ``src`` sharding the step
carries; an index of a row held elsewhere gives 0) and the masked local scatter of
``embedding_grad`` and ``unpick`` (into the rows of the result's block, from the ``dst``
sharding; index values held elsewhere dropped), each through its op's ``take`` / ``put``."""

from __future__ import annotations

from typing import cast

import torch

from ...ir.ops import op_kind
from ...ir.ops.lookup import Lookup, Scatter, row_positions, zero_unless
from ...ir.ops.registry import StepLike
from ...ir.sharding import TensorSharding
from .registry import CpuStep, cpu_step

Tensor = torch.Tensor


def held_rows(ts: TensorSharding, dim: int, index: Tensor, rank: int) -> tuple[Tensor, Tensor] | None:
    """The positions of ``index``'s values among the rows of dim ``dim`` that ``ts`` gives
    ``rank`` (0 where another rank holds the row) and where this rank holds them, shaped like
    ``index``; None when the rank holds every row."""
    pos = row_positions(ts, tuple(ts.mesh.coords(rank)), dim, str(index.device))
    if pos is None:
        return None
    local = pos[index]
    return local.clamp(min=0), local >= 0


@cpu_step("embedding", "pick")
class MaskedLookup(CpuStep):
    def run_on(self, step: StepLike, xs: list[Tensor], rank: int) -> Tensor:
        """The masked local lookup: the table's rows held here (``held_rows`` of the step's
        ``src`` sharding at this rank); an index of a row held elsewhere gives 0."""
        spec = cast(Lookup, op_kind(step.attr("fop")))
        ts: TensorSharding = step.attr("src")
        table, index = xs
        held = held_rows(ts, len(ts.shape) + spec.indexed, index, rank)
        if held is None:
            return spec.take(table, index)
        local, hit = held
        return zero_unless(hit, spec.take(table, local))


@cpu_step("embedding_grad", "unpick")
class MaskedScatter(CpuStep):
    def run_on(self, step: StepLike, xs: list[Tensor], rank: int) -> Tensor:
        """The masked local scatter: the result block of the step's ``dst`` sharding at this rank,
        holding the index values among its rows (``held_rows``; the others are dropped); added
        into the block of a third operand when the step has one (``Scatter.accumulator``)."""
        spec = cast(Scatter, op_kind(step.attr("fop")))
        ts: TensorSharding = step.attr("dst")
        index = xs[1]
        g = spec.written(dict(step.attrs), xs[0], index)
        # into zeros, or into a copy of the accumulator (``codegen.scatter_add``: acc + scatter)
        out = xs[2].clone() if len(xs) == 3 else torch.zeros(ts.local_shape, dtype=g.dtype, device=g.device)
        held = held_rows(ts, len(ts.shape) + spec.indexed, index, rank)
        if held is None:
            spec.put(out, g, index)
        else:
            local, hit = held
            spec.put(out, zero_unless(hit, g), local)
        return out
