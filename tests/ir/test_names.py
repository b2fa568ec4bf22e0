"""``reshard.ir.names``: derived names strip back to the value they derive from, and the
training step's gradients carry ``grad_name`` of their inputs' names."""

from __future__ import annotations

import reshard as rs
from reshard.ir.names import base_name, grad_name, saved_name
from reshard.passes.autodiff import joint


def test_derived_names_strip_back_to_their_base():
    for n in ("w", "model.layers.3.mlp.down_proj.weight", "t12"):
        assert grad_name(n) != n and saved_name(n) != n
        for derived in (grad_name(n), saved_name(n), grad_name(saved_name(n)), saved_name(grad_name(n))):
            assert base_name(derived) == n
    assert base_name("gradient.x") == "gradient.x"  # only the whole prefix is stripped


def test_joint_names_gradients_by_grad_name():
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float32", mesh, [rs.Shard(0)])
    w = f.input("layers.0.w", (8, 8), "float32", mesh, [rs.Replicate()])
    loss = f.sum(f.sum(f.matmul(x, w), 1), 0, name="loss")
    j = joint(f, loss)
    assert j.grads == {"x": grad_name("x"), "layers.0.w": grad_name("layers.0.w")}
    assert {grad_name("x"), grad_name("layers.0.w")} <= {t.name for t in j.fusion.tensors}
