"""``f.complex_mul(a, b, conj=...)`` (issue 30): the product of complex tensors held as pairs of
reals.  Plans simulate like torch's complex product; the pair dim has no image (sharded, it is
gathered first) while the other dims stay sharded; the gradients are torch.autograd's through
the reference (``reshard/testing/autodiff_oracle``) and torch's complex ones."""

from __future__ import annotations

import pytest
import torch

import reshard as rs
from reshard.ir.ops import op_kind
from reshard.ir.ops.registry import identity_map
from reshard.testing.autodiff_oracle import check_joint, loss_weights, weighted_loss

from reshard.testing.op_oracle import MESH1, MESH2, check_plan


def _complex(x: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(x.contiguous())


@pytest.mark.parametrize("conj", [False, True])
def test_reference_is_torchs_complex_product(conj):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(3, 4, 2, generator=g, dtype=torch.float64) for _ in range(2))
    got = op_kind("complex_mul").reference({"conj": conj}, [a, b], "float64")
    zb = _complex(b).conj() if conj else _complex(b)
    torch.testing.assert_close(got, torch.view_as_real(_complex(a) * zb))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("mesh,pa,pb,out", [
    (MESH1, [rs.Shard(0)], [rs.Shard(0)], [rs.Shard(0)]),
    (MESH1, [rs.Shard(1)], [rs.Replicate()], [rs.Shard(1)]),
    (MESH1, [rs.Shard(2)], [rs.Shard(2)], [rs.Replicate()]),  # the pair dim sharded: gathered
    (MESH2, [rs.Shard(0), rs.Shard(1)], [rs.Replicate(), rs.Shard(1)], [rs.Shard(0), rs.Replicate()]),
])
def test_complex_mul_matches_the_reference(dtype, mesh, pa, pb, out):
    for conj in (False, True):
        f = rs.Fusion()
        a, b = f.input("a", (4, 6, 2), dtype, mesh, pa), f.input("b", (4, 6, 2), dtype, mesh, pb)
        y = f.complex_mul(a, b, conj=conj)
        assert (y.shape, y.dtype) == ((4, 6, 2), dtype)
        f.output(y, out)
        check_plan(f, seeds=(0,))


def test_pair_dim_has_no_image_and_other_dims_stay_sharded():
    """Heads-sharded operands multiply locally; a sharded pair dim is gathered first."""
    f = rs.Fusion()
    a, b = f.input("a", (4, 6, 2), "float32", MESH1, [rs.Shard(1)]), f.input("b", (4, 6, 2), "float32", MESH1,
                                                                             [rs.Shard(1)])
    y = f.complex_mul(a, b)
    f.output(y, [rs.Shard(1)])
    assert op_kind("complex_mul").index_map(f, f.ops[f.producer[y.id]], 0) == identity_map((4, 6, 2), (2,))
    assert check_plan(f).communications == ()
    g = rs.Fusion()
    a, b = g.input("a", (4, 6, 2), "float32", MESH1, [rs.Shard(2)]), g.input("b", (4, 6, 2), "float32", MESH1)
    g.output(g.complex_mul(a, b), [rs.Shard(2)])
    assert check_plan(g).communications


@pytest.mark.parametrize("build,message", [
    (lambda f, a, b, x: f.complex_mul(a, x), "complex_mul: operand shapes differ"),
    (lambda f, a, b, x: f.complex_mul(x, x), r"complex_mul: operands must end in a pair dim of extent 2"),
    (lambda f, a, b, x: f.complex_mul(a, b), "complex_mul: operand dtypes differ"),
    (lambda f, a, b, x: f.complex_mul(f.cast(a, "int64"), f.cast(a, "int64")), "complex_mul.*int64"),
])
def test_bad_operands_are_errors_naming_complex_mul(build, message):
    f = rs.Fusion()
    a, b = f.input("a", (4, 2), "float32", MESH1), f.input("b", (4, 2), "float64", MESH1)
    x = f.input("x", (4, 3), "float32", MESH1)
    with pytest.raises(rs.ReshardError, match=message):
        build(f, a, b, x)


@pytest.mark.parametrize("conj", [False, True])
def test_gradients_match_autograd(conj):
    """Through the reference (real arithmetic), and torch's own complex gradients of the same
    real loss ``sum(pairs(a * b) w)``."""
    f = rs.Fusion()
    a, b = f.input("a", (3, 4, 2), "float64", MESH1), f.input("b", (3, 4, 2), "float64", MESH1)
    loss = weighted_loss(f, [f.complex_mul(a, b, conj=conj)])
    values = {"a": torch.randn(3, 4, 2, dtype=torch.float64), "b": torch.randn(3, 4, 2, dtype=torch.float64),
              **loss_weights(f, 1)}
    j = check_joint(f, loss, values, ["a", "b"], plan=True)
    got = dict(zip(j.grads, rs.run_reference(j.fusion, values)[-2:]))
    za, zb = (_complex(values[n]).requires_grad_() for n in ("a", "b"))
    (torch.view_as_real(za * (zb.conj() if conj else zb)) * values["_lw0"]).sum().backward()
    torch.testing.assert_close(got["a"], torch.view_as_real(za.grad.resolve_conj()))
    torch.testing.assert_close(got["b"], torch.view_as_real(zb.grad.resolve_conj()))
