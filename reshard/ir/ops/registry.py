"""The op registry: ``OpKind``, the one declaration of an op kind every layer reads.

An ``OpKind`` subclass, registered with ``@register("kind")``, declares in its op module:

* ``builders``: the ``Fusion`` methods that build it (validation, shape / dtype inference);
* ``reference``: its semantics on torch tensors (``run_reference``);
* ``index_map`` and ``strategy``: how each operand's root dims read in the result (the
  e-graph's transport facts) and which relation states it (``rules.propagation``'s
  ``"unop"``, ``"binop"``, ``"mm"``; ``rules.lookup``'s ``"lookup"``); ``part_map``:
  images of sub-indices of dims that have none themselves (a slice of whole parts of a dim);
* ``keeps`` / ``reduces``: the Partial ops (``"sum"``, ``"max"``) it maps to themselves, and the
  op a reduction turns a sharded dim into;
* ``cost``: which cost law prices it (``rules.cost``'s ``"view"``, ``"mem"``, ``"matmul"``;
  ``rules.lookup``'s ``"lookup"``);
* ``carries_sharding``: the operand whose ``TensorSharding`` its ``apply`` step in the host
  program carries as ``src`` (None: none); ``carries_result``: the step carries the result's as
  ``dst``;
* ``vjp``: its vector-Jacobian product, built with Fusion builders (``passes.autodiff``);
  ``boundary``: whether it starts the backward pass (``passes.phases``, ``rules.remat``).

How a later layer implements an op is registered there, by op kind: its step attributes
(``codegen.step_attrs``), CUDA source and pointwise-kernel instruction in codegen
(``codegen.kernels``, ``codegen.elementwise_cuda``, ``codegen.pointwise_ops``); its CPU step
(``runtime.cpu_steps``; default: ``reference`` on the step's attributes) and GPU step
(``runtime.gpu_steps``) in the runtime.  Layering: this package is part of ``ir`` and imports
only torch and ``ir`` modules; the hooks that codegen and runtime call take the step as an
argument, so ir -> rules -> search -> extract -> codegen -> runtime keeps one direction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, Union

import torch

from ..errors import ReshardError
from ..ids import ID, Root

if TYPE_CHECKING:
    from ..fusion import Fusion, Op, Tensor

#: an operand dim's image in the result: an ID over the result's roots, ``RED`` (reduced), or None
RED = "red"
Image = Union[ID, str, None]
#: (an ID over an operand's roots, the ID over the result's roots with the same values)
PartImage = tuple[ID, ID]


class StepLike(Protocol):
    """What a local step hook reads of a host-program step (``codegen.program.Step``)."""

    attrs: tuple[tuple[str, Any], ...]

    def attr(self, name: str, default: Any = None) -> Any: ...


def identity_map(shape: Sequence[int], skip: Sequence[int] = ()) -> list[Image]:
    """Every dim reads the result dim of the same number (``skip``: dims with no image)."""
    return [None if d in skip else Root(d, e) for d, e in enumerate(shape)]


def einsum_slots(spec: str, shapes: Sequence[Sequence[int]]) -> list[list[Image]]:
    """The six transport slots of a two-operand op written as an einsum spec (``"Bmk,kn->Bmn"``,
    one letter per dim; ``shapes``: the operands'), in matmul's slot convention: 0/1 each
    operand's dims into the result (a letter of the result: that dim), 2/3 each operand's dims
    into the contraction space (a letter of the operands only: its place among those, in order of
    first appearance), 4/5 the dims of each operand a shard may keep while the other operand is
    whole (a letter of the result that the other operand lacks)."""
    ins, out = spec.split("->")
    a, b = ins.split(",")
    contracted = "".join(c for c in dict.fromkeys(a + b) if c not in out)

    def into(dims: str, shape: Sequence[int], space: str, other: str = "") -> list[Image]:
        return [Root(space.index(c), e) if c in space and c not in other else None for c, e in zip(dims, shape)]

    sa, sb = shapes
    return [into(a, sa, out), into(b, sb, out), into(a, sa, contracted), into(b, sb, contracted),
            into(a, sa, out, b), into(b, sb, out, a)]


class OpKind:
    """Defaults: an elementwise-shaped op (identity index map, ``unop``/``binop`` by arity),
    linear for no Partial, memory-bound."""

    kind = ""
    #: Fusion method name -> builder function ``(fusion, *args, name=None) -> Tensor``
    builders: Mapping[str, Callable[..., Any]] = {}
    #: the propagation relation of its strategy (None: by arity, ``unop`` or ``binop``)
    strategy: str | None = None
    #: cost law: "view" (0), "mem" (launch + bytes / hbm), "matmul" (roofline), "kept" (a saved
    #: value, ``rules.remat``)
    cost = "mem"
    #: does lowering compute its result inside the kernel that reads it, never writing it on its
    #: own (an elementwise op: an instruction of a generated pointwise kernel,
    #: ``codegen.pointwise_ops``; a broadcast: its operand read through its index map,
    #: ``codegen.fuse``)?  Such a value recomputed for the backward pass moves no bytes of its
    #: own, and keeping it costs a write (``rules.remat``, ``passes.recompute``)
    fused_read = False
    #: does lowering compute its operands made by ``fused_read`` ops inside its own kernel (an
    #: elementwise op; a reduction, as its prologue)?  A value whose one reader does never
    #: leaves registers unless it is kept (``rules.remat``)
    fuses_operands = False
    #: operand positions its vjp gives no gradient for although they may carry one (attention's
    #: mask): ``passes.autodiff`` refuses a gradient that would flow there
    grad_free: tuple[int, ...] = ()
    #: does no gradient flow through it (``detach``)?  ``passes.autodiff`` then treats its
    #: result as depending on no trained input, so ops reading only such values need no vjp
    stops_gradient = False
    #: may its local step take a third operand its result is added into (a scatter:
    #: ``codegen.scatter_add``; ``accumulator`` names it)?
    accumulates = False
    #: the operand whose TensorSharding its ``apply`` step carries as ``src`` (None: none)
    carries_sharding: int | None = None
    #: does its ``apply`` step carry the result's TensorSharding as ``dst`` (a scatter writes
    #: the rows of the block that sharding gives the rank)?
    carries_result = False
    #: may a result dim that no operand dim maps to be built at another extent by changing the
    #: ``shape`` attribute (its values do not depend on its index: a broadcast's new dims; or
    #: it is written only at index values below its true extent: a scatter's V, 0 past it)?
    #: ``passes.padding`` widens such a dim to a padded extent instead of zero-padding it
    widens_new_dims = False
    #: the op starts the backward pass (``passes.phases``: every value downstream of one is backward
    #: phase): "saved", the identity that keeps a forward value for the backward pass
    #: (``rules.remat`` may recompute it there instead), or "seed" (the loss's gradient);
    #: None: neither
    boundary: str | None = None
    #: does the result only lay its one operand out again, with no new values (a broadcast,
    #: a view in torch)?  Autodiff then keeps the operand for the backward pass and rebuilds
    #: the result there from it (``passes.autodiff``), never keeping more bytes
    saved_through = False
    #: is its result a gradient read back out of a bucket (``passes.buckets``: ``stands_for`` a
    #: member gradient whose bucket extraction treats apart)?
    bucket = False

    def declares(self, hook: str) -> bool:
        """Does this kind give its own ``hook`` (a method), rather than take ``OpKind``'s default?"""
        return getattr(type(self), hook) is not getattr(OpKind, hook)

    def reference(self, a: Mapping[str, Any], xs: list[torch.Tensor], out_dtype: str) -> torch.Tensor:
        raise NotImplementedError(self.kind)

    def index_map(self, fusion: Fusion, op: Op, slot: int) -> list[Image]:
        return identity_map(fusion.tensors[op.inputs[slot]].shape)

    def part_map(self, fusion: Fusion, op: Op, slot: int) -> list[PartImage]:
        """Images of sub-indices (splits) of operand ``slot``'s dims whose root has no image in
        ``index_map``: pairs ``(x, y)``, x over the operand's roots, y over the result's, with
        ``x(i) = y(i')`` wherever result index i' reads operand index i.  Default: none."""
        return []

    def slots(self, op: Op) -> int:
        """How many transport codes (index maps) the op has: one per operand by default."""
        return len(op.inputs)

    def keeps(self, op: Op) -> tuple[str, ...]:
        """The Partial ops a Partial operand keeps through this op (linearity)."""
        return ()

    def reduces(self, op: Op) -> str | None:
        """The Partial op a reduced (``RED``) dim becomes, for reductions."""
        return None

    def reduced_dims(self, fusion: Fusion, op: Op, slot: int) -> dict[int, tuple[str, int]]:
        """Operand ``slot``'s dims that each result element folds over (it reads every index of
        them), each with its fold (``"sum"``, ``"mean"``, ``"max"``) and the number of the folded
        index (dims of several operands folded together share one: a matmul's contraction).
        Default: the ``RED`` images of the index map, folded by ``reduces``.  ``passes.padding``
        masks padding with the fold's identity before the op."""
        fold = self.reduces(op)
        if fold is None:
            return {}
        return {d: (fold, d) for d, img in enumerate(self.index_map(fusion, op, slot)) if img == RED}

    def ignores_padding(self, fusion: Fusion, op: Op, slot: int) -> tuple[int, ...]:
        """Operand ``slot``'s dims of which the op reads only indices below the true extent
        (a slice's range, a lookup's indices), so their padding is never read: ``passes.padding``
        leaves them padded (neither masked nor sliced back).  Default: none."""
        return ()

    def zeroes_padding(self, fusion: Fusion, op: Op, slot: int) -> tuple[int, ...]:
        """Operand ``slot``'s dims whose padding must hold zeros for the op to run (a lookup's
        indices must lie in ``[0, V)``, and 0 does): ``passes.padding`` masks them to 0 first and
        they keep their padding.  Default: none."""
        return ()

    def expanded_dims(self, fusion: Fusion, op: Op) -> tuple[int, ...]:
        """Result dims along which every block equals every other (no operand dim maps to
        them: a broadcast's new and extent-1-expanded dims), and which the op's local step
        builds at any extent from the whole operand: the result may be sharded there without
        communication (``rules.expand``).  Default: none."""
        return ()

    def scattered_dims(self, fusion: Fusion, op: Op) -> tuple[int, ...]:
        """Result dims that no operand dim maps to and that the op writes only at its index
        values (a scatter's indexed dim V), so that a local step given the whole operands
        builds any block of them by keeping the index values among its rows (a masked local
        scatter): the result may be sharded there without communication (``rules.lookup``).
        Default: none."""
        return ()

    def shares_operand(self, step: StepLike, ins: list[tuple[tuple[int, ...], str]]) -> int | None:
        """The operand whose storage its CPU local step's result shares (a view of that
        contiguous buffer: ``codegen.alloc``), or None: a fresh contiguous buffer; ``ins``: the
        operands' local (shape, dtype).  Default None."""
        return None

    def accumulator(self, step: StepLike) -> int | None:
        """The operand its local step adds its result into, if any (a scatter given an
        accumulator, ``codegen.scatter_add``): the step's result may take that operand's memory
        where it dies there (``codegen.alloc.in_place``).  Default None."""
        return None

    def transpose_view(self, op: Op) -> bool:
        """Can a matmul read the result as a transposed view of the operand (``alias``)?"""
        return False

    def stands_for(self, op: Op) -> int:
        """The value whose e-classes the result joins (``search.encode``): its own, or, for
        an op declared equal to another value (``unbucket``: a gradient read back out of a
        bucket), that value's."""
        return op.output

    def local_work(self, ins: list[tuple[int, ...]], out: tuple[int, ...], itemsize: int) -> tuple[int, int, int]:
        """For an op of ``strategy`` ``"attention"`` (``rules.attention``'s cost law): the
        floating-point operations of its local step on operands of local shapes ``ins`` (result
        ``out``, elements of ``itemsize`` bytes), the bytes it moves beyond reading its operands
        and writing its result once (intermediates round-tripped through memory), and the
        kernels it launches.  Default (0, 0, 1)."""
        return 0, 0, 1

    def operand_strategies(self, fusion: Fusion, op: Op, placement: Any) -> list[list[Any]]:
        """For an op of ``strategy`` ``"attention"`` (several operands, its local strategies
        enumerated, ``rules.attention``): every list of the operands' placements on one mesh
        axis (Replicate, Shard or Partial) that computes its result at ``placement`` there
        (Replicate, Shard or Partial) with no communication.  Default none."""
        return []

    def vjp(self, f: Fusion, op: Op, xs: list[Tensor], out: Tensor, g: Tensor,
            saved: Callable[[Tensor], Tensor]) -> list[Tensor | None]:
        """The gradient of each operand of ``op`` (None: it has none: int / bool operands,
        indices, ``detach``), built in ``f`` (the joint Fusion) from ``g``, the gradient of its
        result ``out``; ``xs`` are its operands.  Forward values are read only through
        ``saved(t)`` (the forward / backward boundary, ``ops.gradient``).  Default: no backward."""
        raise ReshardError(f"no backward for op {self.kind}")


OPS: dict[str, OpKind] = {}
BUILDERS: dict[str, Callable[..., Any]] = {}

V = TypeVar("V")


def enter_by_kind(table: dict[str, V], kinds: Sequence[str], value: V, what: str) -> None:
    """Enter ``value`` in ``table`` (a later layer's registry by op kind: ``what`` each kind
    has) for each op kind in ``kinds``; a kind entered twice is an internal error."""
    for kind in kinds:
        if kind in table:
            raise ReshardError(f"internal: {what} of op kind {kind!r} registered twice")
        table[kind] = value


def register(kind: str) -> Callable[[type[OpKind]], type[OpKind]]:
    """Class decorator: register an instance of the class as op kind ``kind`` and its builders."""
    def deco(cls: type[OpKind]) -> type[OpKind]:
        if kind in OPS:
            raise ReshardError(f"internal: op kind {kind!r} registered twice")
        cls.kind = kind
        OPS[kind] = cls()
        for name, fn in cls.builders.items():
            if name in BUILDERS:
                raise ReshardError(f"internal: builder {name!r} registered twice")
            BUILDERS[name] = fn
        return cls
    return deco


def op_kind(kind: str) -> OpKind:
    """The registered declaration of op kind ``kind``."""
    try:
        return OPS[kind]
    except KeyError:
        raise ReshardError(f"unknown op kind {kind!r}; registered: {sorted(OPS)}") from None
