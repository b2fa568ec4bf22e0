"""PyTorch's core ATen operator set through ``from_torch``: one tiny module per op.

The set: every overload in ``torch.ops.aten`` tagged ``torch.Tag.core`` (torch 2.13: 189
overloads of 160 ops; ``core_aten_decompositions()`` is the other direction, the 900-odd ops
torch decomposes *into* that set).  ``SAMPLES`` holds, per overload, a ``Case``: a function
calling the overload itself (``torch.ops.aten.<op>.<overload>``) on small inputs, so the
exported graph holds that overload; inputs that an op needs in a range (acos, log, indices,
windows) are made for it.  ``sweep`` traces each on 2 ranks, simulates the plan against eager
and, where autograd gives the first input a gradient, trains it (``train=True``) against
autograd.

An overload that does not plan must fail with a ``ReshardError`` that names it and says it is
unsupported (``Outcome.refused``); any other failure, or a result unlike eager's, is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

import reshard as rs

a = torch.ops.aten
MESH = rs.DeviceMesh([0, 1], ("tp",))


def core_overloads() -> list[str]:
    """The names (``aten.add.Tensor``) of the overloads tagged ``torch.Tag.core``, sorted (every
    schema torch knows, not only the packets ``torch.ops.aten`` has loaded)."""
    out = set()
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("aten::"):
            packet = getattr(torch.ops.aten, schema.name[len("aten::"):])
            ov = getattr(packet, schema.overload_name or "default")
            if torch.Tag.core in ov.tags:
                out.add(str(ov))
    return sorted(out)


_G = torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_G)


def _uniform(lo: float, hi: float, *shape: int) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(*shape, generator=_G)


X, Y = _randn(4, 6), _randn(4, 6)
U = _uniform(-0.9, 0.9, 4, 6)  # inside (-1, 1): acos, asin, atanh
P = _uniform(0.5, 2.0, 4, 6)  # positive: log, sqrt, pow
NZ = torch.where(Y.abs() < 0.3, Y.sign() * 0.3 + 0.3 * (Y == 0), Y)  # away from 0: divisors
IDS = torch.tensor([1, 0, 5, 3])
I64 = torch.randint(-8, 8, (4, 6), generator=_G)
J64 = torch.randint(-8, 8, (4, 6), generator=_G)
B, C = X > 0, Y > 0
IMG, VOL = _randn(2, 3, 4, 4), _randn(1, 2, 4, 4, 4)
IDX2 = torch.tensor([[0, 5, 2], [1, 1, 3], [4, 0, 0], [5, 2, 3]])  # gather
PERM2 = torch.tensor([[0, 5, 2], [1, 4, 3], [4, 0, 1], [5, 2, 3]])  # scatter: no repeats in a row


@dataclass(frozen=True)
class Case:
    """``fn(*args, **buffers)`` calls the overload; ``values``: compare values with eager (False:
    shapes and dtypes only: ``empty``, random ops); ``train``: check the gradient of the first
    argument where autograd gives one; ``buffers``: module buffers (batch norm's running stats)."""

    fn: Callable[..., object]
    args: tuple[torch.Tensor, ...]
    values: bool = True
    train: bool = True
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


def _c(fn: Callable[..., object], *args: torch.Tensor, **kw: object) -> Case:
    return Case(fn, tuple(args), **kw)  # type: ignore[arg-type]


def _first(fn: Callable[..., Sequence[torch.Tensor]]) -> Callable[..., torch.Tensor]:
    """The first result of a multi-output op."""
    return lambda *xs, **kw: fn(*xs, **kw)[0]


_BN = {"rm": torch.zeros(3), "rv": torch.ones(3)}
_W3, _B3 = _uniform(0.5, 1.5, 3), _randn(3)
_W6, _B6 = _uniform(0.5, 1.5, 6), _randn(6)
_CONV_W, _CONV_B = _randn(4, 3, 3, 3) * 0.3, _randn(4)
_GRID = _uniform(-1.0, 1.0, 1, 3, 3, 2)

#: overload name -> its case, or why it is not expressible as a module's forward
SAMPLES: dict[str, Case | str] = {
    "aten._adaptive_avg_pool2d.default": _c(lambda x: a._adaptive_avg_pool2d(x, [2, 2]), IMG),
    "aten._adaptive_avg_pool2d_backward.default": _c(lambda g, x: a._adaptive_avg_pool2d_backward(g, x),
                                                     _randn(2, 3, 2, 2), IMG),
    "aten._adaptive_avg_pool3d.default": _c(lambda x: a._adaptive_avg_pool3d(x, [2, 2, 2]), VOL),
    "aten.adaptive_avg_pool1d.default": _c(lambda x: a.adaptive_avg_pool1d(x, [3]), _randn(2, 3, 6)),
    "aten.avg_pool1d.default": _c(lambda x: a.avg_pool1d(x, [2], [2]), _randn(2, 3, 6)),
    "aten.resize_.default": _c(lambda x: a.resize_(x.clone(), [3, 4]) * 2, X),
    "aten.sym_is_contiguous.default": _c(lambda x: x * a.sym_is_contiguous(x), X),
    "aten._cdist_forward.default": _c(lambda x, y: a._cdist_forward(x, y, 2.0, None), _randn(4, 3), _randn(5, 3)),
    "aten._embedding_bag.default": _c(lambda w, i, o: a._embedding_bag(w, i, o)[0], _randn(6, 3),
                                      torch.tensor([1, 2, 4, 5, 4, 3, 2, 0]), torch.tensor([0, 4])),
    "aten._fft_c2r.default": _c(lambda x: a._fft_c2r(torch.view_as_complex(x), [1], 0, 6), _randn(4, 4, 2)),
    "aten._fft_r2c.default": _c(lambda x: torch.view_as_real(a._fft_r2c(x, [1], 0, True)), X),
    "aten._local_scalar_dense.default": _c(lambda x: x * a._local_scalar_dense(x[0, 0]), X),
    "aten._log_softmax.default": _c(lambda x: a._log_softmax(x, 1, False), X),
    "aten._native_batch_norm_legit.default": _c(
        lambda x, rm, rv: a._native_batch_norm_legit(x, _W3, _B3, rm, rv, True, 0.1, 1e-5)[0],
        _randn(4, 3, 2), buffers=_BN),
    "aten._native_batch_norm_legit.no_stats": _c(
        lambda x: a._native_batch_norm_legit.no_stats(x, _W3, _B3, True, 0.1, 1e-5)[0], _randn(4, 3, 2)),
    "aten._native_batch_norm_legit_no_training.default": _c(
        lambda x, rm, rv: a._native_batch_norm_legit_no_training(x, _W3, _B3, rm, rv, 0.1, 1e-5)[0],
        _randn(4, 3, 2), buffers={"rm": _randn(3), "rv": _uniform(0.5, 2.0, 3)}),
    "aten._pdist_forward.default": _c(lambda x: a._pdist_forward(x, 2.0), _randn(4, 3)),
    "aten._softmax.default": _c(lambda x: a._softmax(x, 1, False), X),
    "aten._to_copy.default": _c(lambda x: a._to_copy(x, dtype=torch.float64), X),
    "aten.abs.default": _c(a.abs, X),
    "aten.acos.default": _c(a.acos, U),
    "aten.acosh.default": _c(a.acosh, P + 1),
    "aten.add.Scalar": _c(lambda x: a.add.Scalar(x, 2.5), X),
    "aten.add.Tensor": _c(lambda x, y: a.add.Tensor(x, y, alpha=2), X, Y),
    "aten.addmm.default": _c(lambda m, w, b: a.addmm(b, m, w, beta=0.5, alpha=2.0), X, _randn(6, 5), _randn(5)),
    "aten.alias.default": _c(lambda x: a.alias(x) * 2, X),
    "aten.amax.default": _c(lambda x: a.amax(x, [1], True), X),
    "aten.amin.default": _c(lambda x: a.amin(x, [0]), X),
    "aten.any.default": _c(lambda x: a.any(x > 1.0), X),
    "aten.any.dim": _c(lambda x: a.any.dim(x > 1.0, 1), X),
    "aten.any.dims": _c(lambda x: a.any.dims(x > 1.0, [0], True), X),
    "aten.arange.start_step": _c(lambda x: x + a.arange.start_step(1, 13, 2, dtype=torch.float32), X),
    "aten.argmax.default": _c(lambda x: a.argmax(x, 1), X),
    "aten.argmin.default": _c(lambda x: a.argmin(x), X),
    "aten.as_strided.default": _c(lambda x: a.as_strided(x, [3, 4], [6, 1], 1), X),
    "aten.asin.default": _c(a.asin, U),
    "aten.asinh.default": _c(a.asinh, X),
    "aten.atan.default": _c(a.atan, X),
    "aten.atan2.default": _c(a.atan2, X, Y),
    "aten.atan2.out": _c(lambda x, y: a.atan2.out(x, y, out=torch.empty_like(x)), X, Y),
    "aten.atanh.default": _c(a.atanh, U),
    "aten.avg_pool2d.default": _c(lambda x: a.avg_pool2d(x, [2, 2], [2, 2]), IMG),
    "aten.avg_pool2d_backward.default": _c(
        lambda g, x: a.avg_pool2d_backward(g, x, [2, 2], [2, 2], [0, 0], False, True, None), _randn(2, 3, 2, 2), IMG),
    "aten.avg_pool3d.default": _c(lambda x: a.avg_pool3d(x, [2, 2, 2], [2, 2, 2]), VOL),
    "aten.bitwise_and.Scalar": _c(lambda i: a.bitwise_and.Scalar(i, 5), I64),
    "aten.bitwise_and.Tensor": _c(a.bitwise_and.Tensor, I64, J64),
    "aten.bitwise_not.default": _c(a.bitwise_not, I64),
    "aten.bitwise_or.Scalar": _c(lambda i: a.bitwise_or.Scalar(i, 5), I64),
    "aten.bitwise_or.Tensor": _c(a.bitwise_or.Tensor, I64, J64),
    "aten.bitwise_xor.Scalar": _c(lambda i: a.bitwise_xor.Scalar(i, 5), I64),
    "aten.bitwise_xor.Tensor": _c(a.bitwise_xor.Tensor, I64, J64),
    "aten.bmm.default": _c(a.bmm, _randn(2, 4, 3), _randn(2, 3, 5)),
    "aten.cat.default": _c(lambda x, y: a.cat([x, y[:, :2]], 1), X, Y),
    "aten.ceil.default": _c(lambda x: a.ceil(x * 3), X),
    "aten.clamp.Tensor": _c(lambda x, y: a.clamp.Tensor(x, y, y + 1), X, Y),
    "aten.clamp.default": _c(lambda x: a.clamp(x, -0.5, 0.5), X),
    "aten.clone.default": _c(lambda x: a.clone(x) * 2, X),
    "aten.col2im.default": _c(lambda x: a.col2im(x, [4, 4], [2, 2], [1, 1], [0, 0], [2, 2]), _randn(1, 12, 4)),
    "aten.constant_pad_nd.default": _c(lambda x: a.constant_pad_nd(x, [1, 2], 0.5), X),
    "aten.convolution.default": _c(
        lambda x: a.convolution(x, _CONV_W, _CONV_B, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), IMG),
    "aten.convolution_backward.default": _c(
        lambda g, x: a.convolution_backward(g, x, _CONV_W, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                            [True, True, True])[0], _randn(2, 4, 4, 4), IMG),
    "aten.copy.default": _c(lambda x, y: a.copy(x, y[:1]), X, Y),
    "aten.cos.default": _c(a.cos, X),
    "aten.cosh.default": _c(a.cosh, X),
    "aten.cumsum.default": _c(lambda x: a.cumsum(x, 1), X),
    "aten.diagonal.default": _c(lambda x: a.diagonal(x, 1) * 2, X),
    "aten.div.Scalar": _c(lambda x: a.div.Scalar(x, 4.0), X),
    "aten.div.Scalar_mode": _c(lambda x: a.div.Scalar_mode(x * 4, 1.5, rounding_mode="floor"), X, train=False),
    "aten.div.Tensor": _c(a.div.Tensor, X, NZ),
    "aten.div.Tensor_mode": _c(lambda x, y: a.div.Tensor_mode(x * 4, y, rounding_mode="trunc"), X, NZ, train=False),
    "aten.elu.default": _c(lambda x: a.elu(x, 0.5), X),
    "aten.embedding.default": _c(a.embedding, _randn(6, 3), IDS),
    "aten.embedding_dense_backward.default": _c(lambda g, i: a.embedding_dense_backward(g, i, 6, -1, False),
                                                _randn(4, 3), IDS),
    "aten.empty.memory_format": _c(lambda x: a.empty.memory_format([4, 6]), X, values=False),
    "aten.empty_strided.default": _c(lambda x: a.empty_strided([4, 6], [6, 1]), X, values=False),
    "aten.eq.Scalar": _c(lambda i: a.eq.Scalar(i, 2), I64),
    "aten.eq.Tensor": _c(a.eq.Tensor, I64, J64),
    "aten.erf.default": _c(a.erf, X),
    "aten.exp.default": _c(a.exp, X),
    "aten.expand.default": _c(lambda x: a.expand(x[:, :1], [4, 6]), X),
    "aten.expm1.default": _c(a.expm1, X),
    "aten.fill.Scalar": _c(lambda x: a.fill.Scalar(x, 2.0) + x, X),
    "aten.flip.default": _c(lambda x: a.flip(x, [0, 1]), X),
    "aten.floor.default": _c(lambda x: a.floor(x * 3), X),
    "aten.fmod.Scalar": _c(lambda x: a.fmod.Scalar(x * 3, 1.5), X),
    "aten.fmod.Tensor": _c(lambda x, y: a.fmod.Tensor(x * 3, y), X, NZ),
    "aten.full.default": _c(lambda x: x + a.full.default([4, 6], 2.0), X),
    "aten.full_like.default": _c(lambda x: a.full_like(x, 2.0), X),
    "aten.gather.default": _c(lambda x, i: a.gather(x, 1, i), X, IDX2),
    "aten.ge.Scalar": _c(lambda x: a.ge.Scalar(x, 0.1), X),
    "aten.ge.Tensor": _c(a.ge.Tensor, X, Y),
    "aten.gelu.default": _c(a.gelu, X),
    "aten.grid_sampler_2d.default": _c(lambda x, g: a.grid_sampler_2d(x, g, 0, 0, False), IMG[:1], _GRID),
    "aten.gt.Scalar": _c(lambda x: a.gt.Scalar(x, 0.1), X),
    "aten.gt.Tensor": _c(a.gt.Tensor, X, Y),
    "aten.hardtanh.default": _c(lambda x: a.hardtanh(x, -0.5, 0.5), X),
    "aten.index.Tensor": _c(lambda x, i: a.index.Tensor(x, [None, i]), X, IDS),
    "aten.index_put.default": _c(lambda x, v, i: a.index_put(x, [i], v, True), X, _randn(4, 6), IDS % 4),
    "aten.index_select.default": _c(lambda x, i: a.index_select(x, 1, i), X, IDS),
    "aten.isinf.default": _c(lambda x: a.isinf(1.0 / (x > 0).float()), X),
    "aten.isnan.default": _c(lambda x: a.isnan(x.log()), X),
    "aten.le.Scalar": _c(lambda x: a.le.Scalar(x, 0.1), X),
    "aten.le.Tensor": _c(a.le.Tensor, X, Y),
    "aten.leaky_relu.default": _c(lambda x: a.leaky_relu(x, 0.1), X),
    "aten.log.default": _c(a.log, P),
    "aten.log10.default": _c(a.log10, P),
    "aten.log1p.default": _c(a.log1p, P),
    "aten.log2.default": _c(a.log2, P),
    "aten.logical_and.default": _c(a.logical_and, B, C),
    "aten.logical_not.default": _c(a.logical_not, B),
    "aten.logical_or.default": _c(a.logical_or, B, C),
    "aten.logical_xor.default": _c(a.logical_xor, B, C),
    "aten.lt.Scalar": _c(lambda x: a.lt.Scalar(x, 0.1), X),
    "aten.lt.Tensor": _c(a.lt.Tensor, X, Y),
    "aten.masked_scatter.default": _c(lambda x, y: a.masked_scatter(x, x > 0, y), X, Y),
    "aten.max.dim": _c(lambda x: a.max.dim(x, 1), X),
    "aten.max_pool2d_with_indices.default": _c(lambda x: a.max_pool2d_with_indices(x, [2, 2], [2, 2])[0], IMG),
    "aten.max_pool2d_with_indices_backward.default": _c(
        lambda g, x: a.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False,
                                                        a.max_pool2d_with_indices(x, [2, 2], [2, 2])[1]),
        _randn(2, 3, 2, 2), IMG),
    "aten.max_pool3d_with_indices.default": _c(lambda x: a.max_pool3d_with_indices(x, [2, 2, 2], [2, 2, 2])[0], VOL),
    "aten.maximum.default": _c(a.maximum, X, Y),
    "aten.mean.default": _c(a.mean, X),
    "aten.mean.dim": _c(lambda x: a.mean.dim(x, [1], True), X),
    "aten.min.dim": _c(lambda x: a.min.dim(x, 0, True), X),
    "aten.minimum.default": _c(a.minimum, X, Y),
    "aten.mm.default": _c(lambda x, w: a.mm(x, w), X, _randn(6, 5)),
    "aten.mul.Scalar": _c(lambda x: a.mul.Scalar(x, 3.0), X),
    "aten.mul.Tensor": _c(a.mul.Tensor, X, Y),
    "aten.native_dropout.default": _c(lambda x: a.native_dropout(x, 0.5, False)[0], X),
    "aten.native_group_norm.default": _c(lambda x: a.native_group_norm(x, _W6, _B6, 2, 6, 3, 3, 1e-5)[0],
                                         _randn(2, 6, 3)),
    "aten.native_group_norm_backward.default": _c(
        lambda g, x: a.native_group_norm_backward(g, x, *a.native_group_norm(x, _W6, _B6, 2, 6, 3, 3, 1e-5)[1:],
                                                  _W6, 2, 6, 3, 3, [True, True, True])[0],
        _randn(2, 6, 3), _randn(2, 6, 3)),
    "aten.native_layer_norm.default": _c(lambda x: a.native_layer_norm(x, [6], _W6, _B6, 1e-5)[0], X),
    "aten.native_layer_norm_backward.default": _c(
        lambda g, x: a.native_layer_norm_backward(g, x, [6], *a.native_layer_norm(x, [6], _W6, _B6, 1e-5)[1:],
                                                  _W6, _B6, [True, True, True])[0], Y, X),
    "aten.ne.Scalar": _c(lambda i: a.ne.Scalar(i, 2), I64),
    "aten.ne.Tensor": _c(a.ne.Tensor, X, Y),
    "aten.neg.default": _c(a.neg, X),
    "aten.nonzero.default": _c(a.nonzero, X),
    "aten.permute.default": _c(lambda x: a.permute(x, [1, 0]) * 2, X),
    "aten.pow.Scalar": _c(lambda x: a.pow.Scalar(2.0, x), X),
    "aten.pow.Tensor_Scalar": _c(lambda x: a.pow.Tensor_Scalar(x, 1.5), P),
    "aten.pow.Tensor_Tensor": _c(a.pow.Tensor_Tensor, P, Y),
    "aten.prod.default": _c(a.prod, P),
    "aten.prod.dim_int": _c(lambda x: a.prod.dim_int(x, 1), P),
    "aten.rand.default": _c(lambda x: a.rand([4, 6]) + x, X, values=False),
    "aten.randn.default": _c(lambda x: a.randn([4, 6]) + x, X, values=False),
    "aten.randperm.default": _c(lambda x: a.randperm(4), X, values=False),
    "aten.reciprocal.default": _c(a.reciprocal, NZ),
    "aten.reflection_pad1d.default": _c(lambda x: a.reflection_pad1d(x, [2, 1]), _randn(2, 3, 5)),
    "aten.reflection_pad2d.default": _c(lambda x: a.reflection_pad2d(x, [2, 1, 1, 2]), IMG),
    "aten.reflection_pad3d.default": _c(lambda x: a.reflection_pad3d(x, [1, 1, 2, 1, 1, 2]), VOL),
    "aten.relu.default": _c(a.relu, X),
    "aten.remainder.Scalar": _c(lambda x: a.remainder.Scalar(x * 3, 1.5), X),
    "aten.remainder.Tensor": _c(lambda x, y: a.remainder.Tensor(x * 3, y), X, NZ),
    "aten.repeat.default": _c(lambda x: a.repeat(x, [2, 1, 3]), X),
    "aten.replication_pad2d.default": _c(lambda x: a.replication_pad2d(x, [2, 1, 1, 2]), IMG),
    "aten.replication_pad3d.default": _c(lambda x: a.replication_pad3d(x, [1, 1, 2, 1, 1, 2]), VOL),
    "aten.round.default": _c(lambda x: a.round(x * 3), X),
    "aten.rsqrt.default": _c(a.rsqrt, P),
    "aten.scalar_tensor.default": _c(lambda x: x + a.scalar_tensor(2.0), X),
    "aten.scatter.src": _c(lambda x, y, i: a.scatter.src(x, 1, i, y[:, :3]), X, Y, PERM2),
    "aten.scatter.value": _c(lambda x, i: a.scatter.value(x, 1, i, 2.0), X, PERM2),
    "aten.scatter_add.default": _c(lambda x, y, i: a.scatter_add(x, 1, i, y[:, :3]), X, Y, IDX2),
    "aten.scatter_reduce.two": _c(lambda x, y, i: a.scatter_reduce.two(x, 1, i, y[:, :3], "sum"), X, Y, IDX2),
    "aten.select.int": _c(lambda x: a.select.int(x, 1, 2) * 2, X),
    "aten.select_scatter.default": _c(lambda x, y: a.select_scatter(x, y[0], 0, 1), X, Y),
    "aten.sigmoid.default": _c(a.sigmoid, X),
    "aten.sign.default": _c(a.sign, X),
    "aten.sin.default": _c(a.sin, X),
    "aten.sinh.default": _c(a.sinh, X),
    "aten.slice.Tensor": _c(lambda x: a.slice.Tensor(x, 1, 1, 5, 2) * 2, X),
    "aten.slice_scatter.default": _c(lambda x, y: a.slice_scatter(x, y[:, :2], 1, 1, 5, 2), X, Y),
    "aten.sort.default": _c(lambda x: a.sort(x, 1, True), X),
    "aten.split_with_sizes.default": _c(lambda x: [t * 2 for t in a.split_with_sizes(x, [2, 4], 1)], X),
    "aten.sqrt.default": _c(a.sqrt, P),
    "aten.squeeze.dim": _c(lambda x: a.squeeze.dim(x[:, None], 1) * 2, X),
    "aten.squeeze.dims": _c(lambda x: a.squeeze.dims(x[:, None, :, None], [1, 3]) * 2, X),
    "aten.sub.Scalar": _c(lambda x: a.sub.Scalar(x, 2.5), X),
    "aten.sub.Tensor": _c(lambda x, y: a.sub.Tensor(x, y, alpha=2), X, Y),
    "aten.sum.dim_IntList": _c(lambda x: a.sum.dim_IntList(x, [0]), X),
    "aten.sym_numel.default": _c(lambda x: x * a.sym_numel(x), X),
    "aten.sym_size.int": _c(lambda x: x * a.sym_size.int(x, 1), X),
    "aten.sym_storage_offset.default": _c(lambda x: x + a.sym_storage_offset(x), X),
    "aten.sym_stride.int": _c(lambda x: x * a.sym_stride.int(x, 0), X),
    "aten.tan.default": _c(a.tan, U),
    "aten.tanh.default": _c(a.tanh, X),
    "aten.topk.default": _c(lambda x: a.topk(x, 3, 1), X),
    "aten.trunc.default": _c(lambda x: a.trunc(x * 3), X),
    "aten.unsqueeze.default": _c(lambda x: a.unsqueeze(x, 1) * 2, X),
    "aten.upsample_bilinear2d.vec": _c(lambda x: a.upsample_bilinear2d.vec(x, [6, 6], False, None), IMG),
    "aten.upsample_nearest2d.vec": _c(lambda x: a.upsample_nearest2d.vec(x, [8, 8], None), IMG),
    "aten.var.correction": _c(lambda x: a.var.correction(x, [1], correction=0), X),
    "aten.var.dim": _c(lambda x: a.var.dim(x, [0], True, True), X),
    "aten.view.default": _c(lambda x: a.view(x, [6, 4]) * 2, X),
    "aten.where.self": _c(lambda x, y: a.where.self(x > 0, x, y), X, Y),
}


class Module(torch.nn.Module):
    """``fn(*args, **buffers)``; ``train``: ``fn(args[0] * w, *args[1:])`` weighted by a ramp
    and summed (each output element's gradient differs), for a float first output."""

    def __init__(self, case: Case, train: bool = False) -> None:
        super().__init__()
        self.fn = case.fn
        for k, v in case.buffers.items():
            self.register_buffer(k, v.clone())
        w = 0.9 + 0.2 * torch.rand(case.args[0].shape, generator=torch.Generator().manual_seed(1))
        self.w = torch.nn.Parameter(w, requires_grad=train)
        self.train_ = train

    def forward(self, *args: torch.Tensor) -> object:
        buffers = dict(self.named_buffers())
        if not self.train_:
            return self.fn(*args, **buffers)
        out = self.fn(args[0] * self.w, *args[1:], **buffers)
        out = out[0] if isinstance(out, (tuple, list)) else out
        ramp = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) / out.numel() + 0.5
        return (out * ramp).sum()


@dataclass
class Outcome:
    """One overload's sweep: ``forward`` / ``backward`` are "ok", "unsupported" (a ``ReshardError``
    naming the overload and saying so: ``why``), "n/a" (no backward to check: an int input or
    result, no gradient in autograd), "skipped", or "wrong: ..." (anything else); ``kinds``: the
    Fusion op kinds (``unary:exp``) the forward plan holds."""

    op: str
    forward: str = "skipped"
    backward: str = "n/a"
    why: str = ""
    kinds: tuple[str, ...] = ()


def _flat(v: object) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for x in v for t in _flat(x)]
    return []


def _refused(name: str, e: Exception) -> str | None:
    """Why ``e`` refuses overload ``name`` (its message), if it is a ``ReshardError`` naming the
    op (``aten.add.Tensor`` or ``add``) and saying it is unsupported; else None."""
    msg = str(e)
    op = name.split(".")[1]
    says = "unsupported" in msg or "in-place update of buffer" in msg  # batch norm's running stats
    if isinstance(e, rs.ReshardError) and says and (name in msg or f"aten.{op}" in msg or f"by {op} " in msg):
        return msg.split(" (node ")[0].removeprefix("from_torch: ")
    return None


def _kinds(fusion: rs.Fusion) -> tuple[str, ...]:
    out = []
    for o in fusion.ops:
        fn = o.attrs.get("fn")
        k = f"{o.kind}:{fn}" if isinstance(fn, str) else o.kind
        if k not in out and o.kind != "input":
            out.append(k)
    return tuple(out)


def check_forward(name: str, case: Case, sharded: bool = False) -> Outcome:
    """Trace ``case`` on 2 ranks (the first input sharded along dim 0 if ``sharded``), simulate
    it and compare with eager."""
    res = Outcome(name)
    m = Module(case)
    want = _flat(m(*case.args))
    spec = [rs.Shard(0) if sharded and i == 0 else rs.Replicate() for i in range(len(case.args))]
    try:
        tp = rs.from_torch(m, case.args, spec, mesh=MESH)
        got = rs.optimize(tp.fusion).simulate(tp.inputs(*case.args, state=m))
    except Exception as e:  # noqa: BLE001 - every failure is an outcome
        why = _refused(name, e)
        res.forward, res.why = ("unsupported", why) if why else (f"wrong: {type(e).__name__}: {e}"[:300], "")
        return res
    res.kinds = _kinds(tp.fusion)
    if len(got) != len(want):
        res.forward = f"wrong: {len(got)} outputs, eager {len(want)}"
        return res
    for g, w in zip(got, want):
        w = w.reshape(tuple(g.shape)) if w.dim() == 0 else w
        if g.shape != w.shape or g.dtype != w.dtype:
            res.forward = f"wrong: {tuple(g.shape)} {g.dtype}, eager {tuple(w.shape)} {w.dtype}"
            return res
        if case.values and not torch.allclose(g, w, rtol=1e-4, atol=1e-5, equal_nan=True):
            res.forward = f"wrong: values differ by {(g.double() - w.double()).abs().max().item():.3g}"
            return res
    res.forward = "ok"
    return res


def differentiable(case: Case) -> bool:
    """Does autograd give the first input a finite gradient (zeros too: a step function) through
    the case (a float first input and output, a derivative formula)?"""
    if not (case.train and case.values and case.args[0].is_floating_point()):
        return False
    m = Module(case, train=True)
    try:
        loss = m(*case.args)
        if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
            return False
        loss.backward()
    except RuntimeError:  # "derivative for ... is not implemented"
        return False
    return m.w.grad is not None and bool(m.w.grad.isfinite().all())


def check_backward(name: str, case: Case) -> tuple[str, str]:
    """(outcome, why) of training the case on 2 ranks against autograd."""
    if not differentiable(case):
        return "n/a", ""
    m = Module(case, train=True)
    loss = m(*case.args)
    loss.backward()
    try:
        tp = rs.from_torch(m, case.args, mesh=MESH, train=True)
        got_loss, got_w = rs.optimize(tp.fusion).simulate(tp.inputs(*case.args, state=m))
    except Exception as e:  # noqa: BLE001
        why = _refused(name, e) or (str(e).split(" (node ")[0] if "no backward for op" in str(e) else None)
        return ("unsupported", why) if why else (f"wrong: {type(e).__name__}: {e}"[:300], "")
    if not torch.allclose(got_loss, loss.detach().reshape(1), rtol=1e-4, atol=1e-4):
        return "wrong: the loss differs", ""
    if not torch.allclose(got_w, m.w.grad, rtol=1e-3, atol=1e-4):
        return f"wrong: the gradient differs by {(got_w - m.w.grad).abs().max().item():.3g}", ""
    return "ok", ""


def sweep(names: Sequence[str], backward: bool = True) -> list[Outcome]:
    """Each overload's outcome: forward on replicated inputs, then (if ``backward`` and it
    planned) training against autograd."""
    out = []
    for name in names:
        case = SAMPLES.get(name)
        if not isinstance(case, Case):
            out.append(Outcome(name, "skipped", why=case or "no sample"))
            continue
        res = check_forward(name, case)
        if backward and res.forward == "ok":
            res.backward, bwhy = check_backward(name, case)
            res.why = res.why or bwhy
        out.append(res)
    return out


def share(outcomes: Sequence[Outcome], what: str = "forward") -> float:
    """The share of the outcomes whose ``what`` is "ok"."""
    return sum(getattr(o, what) == "ok" for o in outcomes) / max(1, len(outcomes))


def main() -> None:  # a quick look: python -m reshard.testing.aten_core [names...]
    import sys
    import time
    names = sys.argv[1:] or core_overloads()
    t = time.time()
    outs = sweep(names)
    for o in outs:
        print(f"{o.op:52s} {o.forward[:60]:60s} {o.backward[:40]:40s} {o.why[:120]}")
    print(f"forward {share(outs):.1%}, backward ok {sum(o.backward == 'ok' for o in outs)}, {time.time() - t:.1f}s",
          f"(no sample: {sorted(set(core_overloads()) - set(SAMPLES))})")


if __name__ == "__main__":
    main()
