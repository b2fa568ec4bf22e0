"""Dim classes (``ir.dim_classes``): the dims that index the data (batch, sequence) found by
following the ops' index maps from the inputs, apart from those a parameter's dims reach."""

from __future__ import annotations

import reshard as rs
from reshard.ir.dim_classes import activation_dims, parameters
from reshard.passes.autodiff import joint

MESH = rs.DeviceMesh([0, 1], ("tp",))


def mlp_step(flatten_tokens: bool = False, mesh: rs.DeviceMesh = MESH) -> rs.Fusion:
    """A residual MLP block's training step on tokens x (batch 4, sequence 6, hidden 8):
    ``h = x + gelu(x @ w1) @ w2``, the mean of tanh(h) its loss; ``flatten_tokens``: the
    matmuls read x with batch and sequence merged into one dim (GPT-2's ``Conv1D``).  On a 2-D
    ``mesh`` (dp x tp) the batch is split along dp and the weights replicated there."""
    f = rs.Fusion()
    dp = [rs.Replicate()] * (mesh.ndim - 1)
    x = f.input("x", (4, 6, 8), "float64", mesh, [rs.Shard(0)] * (mesh.ndim - 1) + [rs.Replicate()])
    w1 = f.input("w1", (8, 12), "float64", mesh, [*dp, rs.Shard(1)])
    w2 = f.input("w2", (12, 8), "float64", mesh, [*dp, rs.Shard(0)])
    rows = f.reshape(x, (24, 8), name="rows") if flatten_tokens else x
    y = f.matmul(f.gelu(f.matmul(rows, w1, name="up")), w2, name="down")
    h = f.add(x, f.reshape(y, (4, 6, 8)) if flatten_tokens else y, name="h")
    loss = f.mean(f.tanh(h), [0, 1, 2], name="loss")
    f.output(loss, [rs.Replicate()] * mesh.ndim)
    return joint(f, loss, wrt=["w1", "w2"]).fusion


def _dims(f: rs.Fusion, name: str) -> set[int]:
    t = next(t for t in f.tensors if t.name == name)
    return {d for tid, d in activation_dims(f) if tid == t.id}


def test_batch_and_sequence_dims_are_activation_dims_hidden_and_ffn_are_not():
    """The tokens' batch and sequence dims, and every dim they index through the block (the
    ffn activation's rows, the residual's, the gradients'), are activation dims; the hidden
    dim (w1's rows, w2's columns) and the ffn dim (w1's columns) are not; the parameters have
    none."""
    f = mlp_step()
    assert {f.tensors[i].name for i in parameters(f)} == {"w1", "w2"}
    assert _dims(f, "x") == {0, 1}
    assert _dims(f, "up") == {0, 1} and _dims(f, "down") == {0, 1} and _dims(f, "h") == {0, 1}
    assert _dims(f, "grad.h") == {0, 1} and _dims(f, "grad.up") == {0, 1}
    assert _dims(f, "w1") == set() and _dims(f, "w2") == set() and _dims(f, "grad.w1") == set()


def test_batch_and_sequence_merged_by_a_reshape_stay_activation_dims():
    """A reshape merging the batch and sequence dims (GPT-2's ``Conv1D`` reads rows of
    ``[batch * seq, hidden]``) gives one activation dim, its rows; the hidden dim stays a model dim."""
    f = mlp_step(flatten_tokens=True)
    assert _dims(f, "rows") == {0}
    assert _dims(f, "up") == {0} and _dims(f, "h") == {0, 1}


def test_a_forward_program_has_no_activation_dims():
    """Without trained parameters nothing tells a model dim from a data dim: none."""
    f = rs.Fusion()
    x = f.input("x", (4, 8), "float64", MESH, [rs.Replicate()])
    w = f.input("w", (8, 2), "float64", MESH, [rs.Shard(1)])
    f.output(f.matmul(x, w), [rs.Replicate()])
    assert parameters(f) == frozenset() and activation_dims(f) == frozenset()
