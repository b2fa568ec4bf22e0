"""``reshard.passes.autodiff.joint``: per op family, the joint Fusion's gradients (run by the
reference interpreter) equal torch.autograd's through the ops' torch references (float64,
tight tolerances); the joint's outputs, names and placements; errors."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir import ReshardError
from reshard.passes.autodiff import joint
from reshard.ir.ops import OpKind, op_kind
from reshard.ir.ops.elementwise import BINARY_FNS, UNARY_FNS
from reshard.testing.autodiff_oracle import check_joint, loss_weights, weighted_loss

M2 = rs.DeviceMesh([0, 1], ("tp",))
M2B = rs.DeviceMesh([2, 3], ("tp",))
R = [rs.Replicate()]
DT = "float64"


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _check(f: rs.Fusion, outs: list, values: dict[str, torch.Tensor], wrt=None, **kw):
    """Loss = a weighted sum of ``outs``; joint's gradients vs torch.autograd's."""
    loss = weighted_loss(f, outs)
    return check_joint(f, loss, {**values, **loss_weights(f, 1)}, wrt, **kw)


POSITIVE = {"sqrt", "rsqrt", "log", "log1p", "log2", "log10"}
#: functions of (-1, 1) (asin, acos, atanh) and of (1, inf) (acosh)
UNIT, ABOVE_ONE = {"asin", "acos", "atanh"}, {"acosh"}


@pytest.mark.parametrize("fn", [fn for fn, spec in UNARY_FNS.items() if "float" in spec.kinds])
def test_unary(fn):
    f = rs.Fusion()
    x = f.input("x", (3, 4), DT, M2, R)
    v = _randn(3, 4)
    v = v.abs() + 0.5 if fn in POSITIVE else v.tanh() * 0.9 if fn in UNIT else v.abs() + 1.5 if fn in ABOVE_ONE else v
    _check(f, [f.unary(fn, x)], {"x": v})


@pytest.mark.parametrize("fn", [fn for fn, spec in BINARY_FNS.items() if spec.grad is not None])
def test_binary(fn):
    f = rs.Fusion()
    a, b = f.input("a", (3, 4), DT, M2, R), f.input("b", (3, 4), DT, M2, R)
    va, vb = _randn(3, 4), _randn(3, 4, seed=1)
    vb[0] = va[0]  # ties (maximum splits g evenly there, like torch)
    if fn == "pow":  # a positive base
        va = va.abs() + 0.5
    _check(f, [f.binary(fn, a, b)], {"a": va, "b": vb.abs() + 0.5 if fn in ("div", "fmod") else vb})


def test_every_float_function_has_a_gradient():
    floats = {fn: s for fn, s in {**UNARY_FNS, **BINARY_FNS}.items() if "float" in s.kinds and s.result is None}
    assert all(s.grad is not None for s in floats.values()), [fn for fn, s in floats.items() if s.grad is None]


def test_comparisons_and_where_pass_no_gradient_through_the_condition():
    f = rs.Fusion()
    a, b = f.input("a", (3, 4), DT, M2, R), f.input("b", (3, 4), DT, M2, R)
    c = f.logical_and(f.gt(a, b), f.logical_not(f.eq(a, f.neg(b))))
    _check(f, [f.where(c, f.exp(a), f.mul(a, b))], {"a": _randn(3, 4), "b": _randn(3, 4, seed=1)})


def test_scale_cast_set():
    f = rs.Fusion()
    x = f.input("x", (3, 4), DT, M2, R)
    y = f.set(f.cast(f.scale(f.tanh(x), -1.5), "float32"))
    _check(f, [f.cast(f.exp(y), DT)], {"x": _randn(3, 4)}, rtol=1e-6, atol=1e-6)


def test_cast_to_int_has_no_gradient():
    f = rs.Fusion()
    x = f.input("x", (3, 4), DT, M2, R)
    y = f.add(f.cast(f.cast(x, "int64"), DT), x)  # only the direct term carries a gradient
    _check(f, [y], {"x": _randn(3, 4) * 3})


def test_views():
    f = rs.Fusion()
    x = f.input("x", (2, 3, 4), DT, M2, R)
    a = f.permute(f.reshape(f.tanh(x), (6, 4)), (1, 0))
    b = f.movedim(f.sigmoid(x), (0, 2), (2, 0))
    c = f.broadcast(f.reshape(f.sum(x, (1, 2)), (2, 1)), (5, 2, 3), (1, 2))  # new and expanded dims
    _check(f, [a, b, c], {"x": _randn(2, 3, 4)})


def test_broadcast_of_one_element_sums_every_dim():
    f = rs.Fusion()
    x = f.input("x", (1,), DT, M2, R)
    _check(f, [f.exp(f.broadcast(x, (3, 4), (1,)))], {"x": _randn(1)})


def test_slicing():
    f = rs.Fusion()
    x = f.input("x", (4, 6), DT, M2, R)
    y = f.input("y", (4, 2), DT, M2, R)
    a = f.slice(f.exp(x), 1, 1, 4)
    b = f.pad(f.tanh(y), 0, 1, 2)
    c = f.cat([x, f.mul(y, y), a], 1)
    _check(f, [a, b, c], {"x": _randn(4, 6), "y": _randn(4, 2, seed=1)})


@pytest.mark.parametrize("fn", ["sum", "mean", "max"])
def test_reductions(fn):
    f = rs.Fusion()
    x = f.input("x", (3, 4, 5), DT, M2, R)
    y = f.reduce(fn, f.tanh(x), (0, 2))
    v = torch.round(_randn(3, 4, 5) * 2) / 2  # ties for max (split evenly, torch's amax rule)
    _check(f, [y, f.reduce(fn, x, 1)], {"x": v})


@pytest.mark.parametrize("ashape,bshape", [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5))])
def test_matmul(ashape, bshape):
    f = rs.Fusion()
    a, b = f.input("a", ashape, DT, M2, R), f.input("b", bshape, DT, M2, R)
    _check(f, [f.matmul(f.tanh(a), b)], {"a": _randn(*ashape), "b": _randn(*bshape, seed=1)})


@pytest.mark.parametrize("shape,dim", [((5,), 0), ((3, 4), 1), ((3, 4), 0)])
def test_cumsum(shape, dim):
    f = rs.Fusion()
    x = f.input("x", shape, DT, M2, R)
    _check(f, [f.cumsum(f.tanh(x), dim)], {"x": _randn(*shape)})


def test_redistribute_within_and_across_meshes():
    f = rs.Fusion()
    x = f.input("x", (4, 6), DT, M2, [rs.Shard(0)])
    y = f.redistribute(f.exp(x), [rs.Shard(1)])
    z = f.redistribute(f.tanh(y), [rs.Shard(0)], mesh=M2B)
    _check(f, [f.mul(z, z), y], {"x": _randn(4, 6)})


def test_detach_saved_grad_seed():
    f = rs.Fusion()
    x = f.input("x", (3, 4), DT, M2, R)
    m = f.detach(f.max(x, 1))  # softmax's max: its gradient is zero, softmax's is unchanged
    e = f.exp(f.sub(x, f.broadcast(m, (3, 4), (0,))))
    p = f.div(e, f.broadcast(f.sum(e, 1), (3, 4), (0,)))
    q = f.mul(f.saved(x), f.grad_seed(x))  # the identity, and ones with no gradient
    _check(f, [p, q], {"x": _randn(3, 4)})


def test_an_op_without_a_vjp_reading_only_detached_values_needs_none():
    """No gradient flows through ``detach``: an op with no backward of its own
    (``linear_sumexp_grad``) reading only detached values is not differentiated, and the loss
    that reads the inputs only so has zero gradients (torch.autograd: none)."""
    f = rs.Fusion()
    h, w, r = (f.input(n, s, DT, M2, R) for n, s in (("h", (3, 2)), ("w", (5, 2)), ("r", (3,))))
    d = [f.detach(t) for t in (h, w, r)]
    m = f.detach(f.linear_max(d[0], d[1]))
    y = f.linear_sumexp_grad(d[0], d[1], m, d[2], "input")
    j = _check(f, [y], {"h": _randn(3, 2), "w": _randn(5, 2, seed=1), "r": _randn(3, seed=2)})
    assert not any(op.kind == "linear_sumexp_grad" for op in j.fusion.ops[len(f.ops):])


# ---- the joint Fusion -------------------------------------------------------------------------

def _mlp() -> tuple[rs.Fusion, rs.ir.fusion.Tensor]:
    f = rs.Fusion()
    x = f.input("x", (4, 6), DT, M2, [rs.Partial("sum")])
    w = f.input("w", (6, 8), DT, M2, [rs.Shard(1)])
    f.input("unused", (2, 3), DT, M2, [rs.Shard(0)])
    f.input("ids", (4,), "int64", M2, R)
    h = f.gelu(f.matmul(x, w), name="h")
    f.output(h, [rs.Shard(1)])
    return f, weighted_loss(f, [h])


def test_outputs_names_and_placements():
    f, loss = _mlp()
    j = joint(f, loss, ["w", "x", "unused"], grad_placements={"x": [rs.Shard(0)]})
    assert j.loss == loss.name and j.grads == {"w": "grad.w", "x": "grad.x", "unused": "grad.unused"}
    jf = j.fusion
    assert jf.tensors[:len(f.tensors)] == f.tensors and jf.ops[:len(f.ops)] == f.ops  # the forward, same ids
    assert jf.outputs[:len(f.outputs)] == f.outputs
    got = {jf.tensors[t].name: str(s) for t, s in jf.outputs[len(f.outputs):]}
    assert got == {"grad.w": "[S(1)]", "grad.x": "[S(0)]", "grad.unused": "[S(0)]"}
    kinds = [op.kind for op in jf.ops[len(f.ops):]]
    assert kinds.count("grad_seed") == 1 and "input" not in kinds
    saved = [jf.tensors[op.inputs[0]].name for op in jf.ops if op.kind == "saved"]
    assert len(saved) == len(set(saved))  # one saved op per forward value


def test_default_wrt_is_every_float_input_and_partial_becomes_replicate():
    f, loss = _mlp()
    j = joint(f, loss)
    assert list(j.grads) == ["x", "w", "unused", "_lw0"]
    places = {j.fusion.tensors[t].name: str(s) for t, s in j.fusion.outputs}
    assert places["grad.x"] == "[R]" and places["grad.w"] == "[S(1)]"
    values = {"x": _randn(4, 6), "w": _randn(6, 8, seed=1), "unused": _randn(2, 3), "ids": torch.zeros(4).long(),
              **loss_weights(f, 1)}
    check_joint(f, loss, values)


def test_frozen_weights_build_no_gradient():
    f, loss = _mlp()
    j = joint(f, loss, ["x"])
    assert all(op.kind != "matmul" or j.fusion.tensors[op.output].shape != (6, 8) for op in j.fusion.ops)
    assert "saved.x" not in {t.name for t in j.fusion.tensors}  # only grad.w would read x


def test_one_gradient_shared_by_two_inputs_gets_two_names():
    f = rs.Fusion()
    a, b = f.input("a", (1,), DT, M2, R), f.input("b", (1,), DT, M2, R)
    j = _check(f, [f.add(a, b)], {"a": _randn(1), "b": _randn(1, seed=1)}, ["a", "b"])
    assert j.grads == {"a": "grad.a", "b": "grad.b"}


def test_non_float_loss_raises():
    f = rs.Fusion()
    x = f.input("x", (1,), "int64", M2, R)
    with pytest.raises(ReshardError, match="float"):
        joint(f, f.add(x, x))


@pytest.mark.parametrize("shape", [(2,), (1, 2)])
def test_loss_of_several_elements_raises(shape):
    f = rs.Fusion()
    x = f.input("x", shape, DT, M2, R)
    with pytest.raises(ReshardError, match="one"):
        joint(f, f.exp(x))


def test_loss_of_another_fusion_raises():
    f, _ = _mlp()
    _, other = _mlp()
    with pytest.raises(ReshardError, match="not a tensor of this Fusion"):
        joint(f, other)


@pytest.mark.parametrize("wrt,match", [(["nope"], "'nope'.*not an input"), (["ids"], "not a float"),
                                       ("x", "sequence"), (["x", "x"], "twice")])
def test_bad_wrt_raises(wrt, match):
    f, loss = _mlp()
    with pytest.raises(ReshardError, match=match):
        joint(f, loss, wrt)


def test_grad_placements_of_an_input_not_differentiated_raises():
    f, loss = _mlp()
    with pytest.raises(ReshardError, match="grad_placements"):
        joint(f, loss, ["w"], grad_placements={"x": R})


def test_op_without_vjp_raises_naming_it(monkeypatch):
    monkeypatch.setattr(type(op_kind("cumsum")), "vjp", OpKind.vjp)
    f = rs.Fusion()
    x = f.input("x", (3, 4), DT, M2, R)
    y = f.cumsum(x, 1, name="running")
    with pytest.raises(ReshardError, match=r"no backward for op cumsum.*%running"):
        joint(f, weighted_loss(f, [y]))


def test_unused_input_on_another_mesh_gets_zeros_on_its_own_mesh():
    """Regression (fuzz): the zeros were built on the loss's mesh."""
    f = rs.Fusion()
    f.input("x", (2, 2), DT, M2, R)
    y = f.input("y", (2, 2), DT, M2B, R)
    j = _check(f, [f.tanh(y)], {"x": _randn(2, 2), "y": _randn(2, 2, seed=1)}, ["x", "y"], plan=True)
    assert {t.name: t.mesh for t in j.fusion.tensors}["grad.x"] == M2


def test_every_backward_value_is_downstream_of_the_seed_or_a_saved_value():
    """The phase law H3's lowering reads: forward values are the source's; every backward op
    reads the seed, a saved value, or another backward value, and ``saved`` reads forward ones."""
    f, loss = _mlp()
    jf = joint(f, loss).fusion
    n = len(f.tensors)
    for op in jf.ops[len(f.ops):]:
        if op.kind in ("grad_seed", "saved"):
            assert all(i < n for i in op.inputs), op
        else:
            assert all(i >= n for i in op.inputs), op
