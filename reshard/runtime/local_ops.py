"""Local steps of a host program, run with torch ops (CPU, or CUDA tensors).

``apply``: a Fusion op on local tensors (attrs carry the op kind and its local shapes; its CPU
step, ``runtime.cpu_steps``, given the rank: a lookup's step reads the rows the rank holds from
the table's sharding it carries, ``src``).
``remap``: the data movement around a collective or a local slice, derived from the
source and destination shardings' element sets (``TensorSharding.local_indices``):

* ``slice``: dst local = the dst elements picked from the src local (R -> S, no comm);
* ``gather``: dst local from the stacked team locals of an allgather;
* ``scatter``: stacks, for each team member j, the src elements member j will own
  (input of a reduce-scatter);
* ``a2a_send`` / ``a2a_recv``: the chunks an all-to-all sends, and reassembly;
* ``pieces``: the send buffer of a cross-mesh scatter from this device (src) to dst's mesh:
  a dummy piece for the root itself (a copy of the first), then every dst rank's local
  elements, in dst mesh rank order.

``partial`` (``make_partial``): axis ``axis`` made Partial(``reduce``) locally, src's
placement there Replicate or an IterDomain (``rules.resharding``'s local partial).

A remap whose index map is the identity (or a contiguous range) returns a view; one whose
index is affine is one strided copy; only the rest gathers, with the index cached on the
device (``reshard.runtime.remap_fast``).  ``remap_index._take(x, remap_index(...), shape)``
is the general gather, kept as the reference the fast path is tested against.
"""

from __future__ import annotations

import torch

from ..codegen.program import Step
from ..ir.errors import ReshardError
from ..ir.fusion import DTYPES
from ..ir.ops.elementwise import BINARY_FNS, UNARY_FNS
from ..ir.ops.select import masked_values
from ..ir.ops.views import broadcast_tensor
from ..ir.sharding import Replicate, TensorSharding
from ..ir.tensor_cache import tensor_lru
from .cpu_steps import run_cpu_step
from .remap_fast import remap_step
from ..codegen.remap_index import _local_indices, positions


def run_local(step: Step, env: dict[str, torch.Tensor], rank: int) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Execute one ``local`` step for ``rank``; returns the output buffer (a step writing
    several, ``Step.outs``: one tensor per buffer, in that order)."""
    op = step.attr("op")
    xs = []
    for name in step.ins:
        if name not in env:
            raise ReshardError(f"local step {op} -> {step.out!r}: rank {rank} has no buffer {name!r}")
        xs.append(env[name])
    if op == "view":
        return xs[0].reshape(step.attr("shape"))
    if op == "remap":
        # strided view / copy when the index is affine, else a device-cached gather (remap_fast)
        return remap_step(step, xs[0], rank)
    if op == "apply":
        out = apply_local(step, xs, rank)
        into = step.attr("into")
        if into is None:
            return out
        if isinstance(out, tuple):
            return (xs[into].copy_(out[0]), *out[1:])
        return xs[into].copy_(out)  # a dying operand's memory (``codegen.alloc``)
    if op == "partial":
        return make_partial(step, xs[0], rank)
    raise ReshardError(f"unknown local op {op!r} in step -> {step.out!r}")


def step_results(out: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A local step's result (``run_local``'s, ``gpu_local_step``'s) as one tensor per buffer
    the step writes, in ``Step.outs``' order."""
    return out if isinstance(out, tuple) else (out,)


def reduce_identity(op: str, dtype: torch.dtype) -> float | int | bool:
    """The identity of reduce op ``op`` in ``dtype``: 0 for sum, the lowest value for max."""
    if op == "sum":
        return 0
    if op != "max":
        raise ReshardError(f"unknown reduce op {op!r} (expected 'sum' or 'max')")
    if dtype == torch.bool:
        return False
    return -float("inf") if dtype.is_floating_point or dtype.is_complex else torch.iinfo(dtype).min


@tensor_lru()
def _embed_index(src: TensorSharding, dst: TensorSharding, coords: tuple[int, ...], device: str) -> torch.Tensor:
    """Positions of the src local elements in the dst local tensor (dst holds them all), on
    torch device ``device`` (made there once: no host copy per step, none in a CUDA graph)."""
    return positions(_local_indices(dst, coords), _local_indices(src, coords)).to(device)


def make_partial(step: Step, x: torch.Tensor, rank: int) -> torch.Tensor:
    """The local tensor of the same value with axis ``a`` Partial(o) (the laws of
    ``resharding``'s ``partial-of-*`` rules; the team's o-reduction gives the value back):

    * src Replicate, o = max: every copy kept (x itself, a view);
    * src Replicate, o = sum: x on coordinate 0 of the axis, zeros elsewhere;
    * src an IterDomain (each element held by one device of the team): x placed in a tensor
      of the dst local shape filled with o's identity.
    """
    s, d = step.attr("src"), step.attr("dst")
    a, op = step.attr("axis"), step.attr("reduce")
    coords = tuple(s.mesh.coords(rank))
    fill = reduce_identity(op, x.dtype)
    if isinstance(s.axes[a], Replicate):
        return x if op == "max" or coords[a] == 0 else torch.full_like(x, fill)
    out = torch.full(d.local_shape, fill, dtype=x.dtype, device=x.device)
    have, want = s.block_ranges(coords), d.block_ranges(coords)
    if have is not None and want is not None:  # a box inside a box: one strided copy
        out[tuple(slice(h0 - w0, h0 - w0 + n) for (h0, n), (w0, _) in zip(have, want))] = x
    else:
        out.view(-1)[_embed_index(s, d, coords, str(x.device))] = x.reshape(-1)
    return out


def apply_local(step: Step, xs: list[torch.Tensor], rank: int) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """A Fusion op on ``rank``'s local tensors (its CPU step, ``cpu_steps.run_cpu_step``; with a
    ``prologue``, (instructions, dtype), on the operand those compute from ``xs``,
    ``pointwise_local``, then its extra outputs), or a fused pointwise group (with extra
    outputs: its results, ``Step.outs``' order)."""
    kind = step.attr("fop")
    bcast = step.attr("bcast") or ((),) * len(xs)  # inputs of a fused group read through a broadcast
    if any(bcast):
        xs = [_read_through(x, tuple(step.attr("shape")), b) if b else x for x, b in zip(xs, bcast)]
    if kind == "pointwise":  # codegen.fuse's chain of elementwise ops, not a Fusion op
        return pointwise_local(step.attr("ops"), xs, DTYPES[step.attr("dtype")], step.attr("extra_values", ()))
    prologue, extra = step.attr("prologue"), step.attr("extra_values", ())
    if prologue is not None:  # codegen.fuse: the one operand (and extra outputs) computed from the step's inputs
        operand, *extras = step_results(pointwise_local(prologue[0], xs, DTYPES[prologue[1]], extra))
        out = run_cpu_step(step, [operand], rank)
        return (out, *extras) if extras else out
    return run_cpu_step(step, xs, rank)


def _read_through(x: torch.Tensor, shape: tuple[int, ...], spec: tuple) -> torch.Tensor:
    """Input ``x`` as a fused step reads it (``kernels.pointwise_kernel``'s ``bcast`` entry):
    broadcast to ``shape`` (its dim i at dim ``dims[i]``, in any order: a permute read through), and along each shifted dim (dim,
    shift) element c the input's element ``min((c + shift) mod extent, n - 1)`` (n: the input's
    extent there, the output's or fewer; ``kernels._bcast_rolls``)."""
    shifts = dict(spec[2]) if len(spec) > 2 else {}
    dims = tuple(spec[1])
    order = sorted(range(len(dims)), key=dims.__getitem__)  # dims not increasing: x permuted first
    x, dims = x.permute(order), tuple(dims[i] for i in order)
    there = list(shape)
    for i, d in enumerate(dims):
        if d in shifts:
            there[d] = x.shape[i]
    t = broadcast_tensor(x, tuple(there), dims)
    for d, shift in shifts.items():
        at = (torch.arange(shape[d], device=x.device) + shift) % shape[d]
        t = t.index_select(d, at.clamp(max=there[d] - 1))
    return t


def _coordinates(a: torch.Tensor, dim: int) -> torch.Tensor:
    """Each element's coordinate along ``dim`` of ``a``, shaped to broadcast against ``a``."""
    return torch.arange(a.shape[dim], device=a.device).reshape([-1 if d == dim else 1 for d in range(a.dim())])


def _in_register(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a pointwise kernel holds it: a 16-bit float widened (exactly) to float32."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def pointwise_local(ops: tuple, xs: list[torch.Tensor], out_dtype: torch.dtype, extra: tuple = ()
                    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """A fused elementwise group (``codegen.fuse``; ``kernels.pointwise_kernel``'s
    instructions) evaluated one torch op per instruction, as the kernel does: a 16-bit float
    (an input, or a ``cast`` to one) held in float32, every other value in its own dtype, so the
    group computes in float32 and rounds where a value is stored: the result (the last
    instruction's value in ``out_dtype``), or with ``extra`` outputs ((token, dtype)) the tuple
    of it and each of them (that value in that dtype, a fresh tensor: never an operand's
    memory).  (Broadcast inputs are expanded by the caller, ``apply_local``, with the broadcast
    step's own code.)"""
    vals: list[torch.Tensor] = []
    xs = [_in_register(x) for x in xs]

    def get(tok: str) -> torch.Tensor:
        return xs[int(tok[2:])] if tok.startswith("in") else vals[int(tok[1:])]

    for ins in ops:
        op = ins[0]
        if op == "cast":
            vals.append(_in_register(get(ins[1]).to(DTYPES[ins[2]])))
        elif op == "mul_scalar":
            vals.append(get(ins[1]) * ins[2])
        elif op == "masked":
            vals.append(masked_values(get(ins[1]), get(ins[2]), ins[3]))
        elif op == "in_range":  # a where coordinate ``dim`` is in [lo, hi), else b (a value or 0)
            a = get(ins[4])
            b = get(ins[5]) if isinstance(ins[5], str) else torch.zeros((), dtype=a.dtype, device=a.device)
            at = _coordinates(a, ins[1])
            vals.append(torch.where((at >= ins[2]) & (at < ins[3]), a, b))
        elif op == "at_index":  # a where coordinate ``dim`` equals the index value, else b
            a = get(ins[3])
            vals.append(torch.where(get(ins[2]) == _coordinates(a, ins[1]), a, get(ins[4])))
        elif op in BINARY_FNS:
            vals.append(BINARY_FNS[op].torch(get(ins[1]), get(ins[2])))
        elif op in UNARY_FNS:
            vals.append(UNARY_FNS[op].torch(get(ins[1])))
        else:
            raise ReshardError(f"pointwise instruction {ins!r}: unknown op {op!r}")
    out = (vals[-1] if vals else xs[0]).to(out_dtype)
    return (out, *(get(tok).to(DTYPES[dtype], copy=True) for tok, dtype in extra)) if extra else out


__all__ = ["run_local", "step_results", "apply_local", "pointwise_local", "positions",
           "make_partial", "reduce_identity", "TensorSharding"]
