"""The training frontend's errors and its program: in-place updates of parameters, buffers
and inputs inside the model (``frontend.state_writes``; also without ``train``), dropout in
training, a loss that is not a scalar, and what ``from_torch(..., train=True)`` returns."""

from __future__ import annotations

import pytest
import torch

import reshard as rs

MESH = rs.DeviceMesh([0, 1], ("tp",))
X = torch.randn(4, 8)


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)
        self.register_buffer("count", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.fc2(torch.relu(self.fc1(x))) ** 2).mean()


class ScalesWeight(Mlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.fc1.weight[0].mul_(0.5)  # a view of the parameter, written in a no_grad block
        return super().forward(x)


class CountsCalls(Mlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return super().forward(x) + self.count.sum()


class ScalesWeightData(Mlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # through .data: torch.export fails on it, so the graph check never sees it
        self.fc2.weight.data.mul_(0.9)
        return super().forward(x)


class ScalesInput(Mlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return super().forward(x)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("decompose", [False, True], ids=["exported", "core-aten"])
@pytest.mark.parametrize("cls,what,line", [
    (ScalesWeight, "parameter 'fc1.weight'", "self.fc1.weight[0].mul_(0.5)"),
    (CountsCalls, "buffer 'count'", "self.count.add_(1)"),
    (ScalesInput, "input 'x'", "x.mul_(2)"),
    (ScalesWeightData, "parameter 'fc2.weight'", "self.fc2.weight.data.mul_(0.9)")],
    ids=["parameter", "buffer", "input", "data"])
def test_in_place_update_is_an_error(cls: type, what: str, line: str, decompose: bool, train: bool) -> None:
    """The error names what is written, the op (or the node computing the new value) and the
    source line; before, a write that nothing read afterwards was dropped without a word."""
    with pytest.raises(rs.ReshardError, match="in-place update of") as e:
        rs.from_torch(cls(), (X.clone(),), mesh=MESH, decompose=decompose, train=train)
    msg = str(e.value)
    assert what.split(" '")[0] in msg and what.split(" ")[1] in msg and line in msg and "test_train_frontend.py" in msg
    assert "fake tensor" not in msg


def test_a_write_through_data_is_found_before_it_writes() -> None:
    m = ScalesWeightData()
    before = {n: p.detach().clone() for n, p in m.state_dict().items()}
    with pytest.raises(rs.ReshardError, match=r"in-place update of parameter 'fc2.weight' by mul_ at .*"
                                              r"test_train_frontend.py:\d+ \(self.fc2.weight.data.mul_\(0.9\)\)"):
        rs.from_torch(m, (X.clone(),), mesh=MESH)
    assert all(torch.equal(before[n], p) for n, p in m.state_dict().items())  # nothing written


def test_dropout_in_training_is_an_error() -> None:
    """Dropout with p > 0 in training: the error names the op and its line, and says to set p to 0."""
    class Dropped(Mlp):
        def __init__(self) -> None:
            super().__init__()
            self.drop = torch.nn.Dropout(0.1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(self.fc1(x)).sum()

    with pytest.raises(rs.ReshardError, match=r"dropout.*p=0\.1.*set its probability to 0.*"
                                              r"called from .*test_train_frontend.py:\d+ \(return self.drop"):
        rs.from_torch(Dropped(), (X,), mesh=MESH, train=True)
    rs.from_torch(Dropped().eval(), (X,), mesh=MESH)  # eval: the identity


def test_training_mode_is_restored() -> None:
    m = Mlp().eval()
    m.fc2.train()
    rs.from_torch(m, (X,), mesh=MESH, train=True)
    assert [mod.training for mod in m.modules()] == [False, False, True]


def test_loss_must_be_a_scalar() -> None:
    class NoLoss(Mlp):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc1(x)

    with pytest.raises(rs.ReshardError, match="first output must be its loss, a float scalar"):
        rs.from_torch(NoLoss(), (X,), mesh=MESH, train=True)


# ---- the training program -----------------------------------------------------------------------
MEGATRON = {"fc1.weight": [rs.Shard(0)], "fc1.bias": [rs.Shard(0)], "fc2.weight": [rs.Shard(1)]}


def autograd_grads(module: torch.nn.Module, *args: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = module(*args)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in module.named_parameters() if p.grad is not None}


def test_training_program_matches_autograd() -> None:
    """Outputs: the loss, then ``grad.<FQN>`` of each parameter in order, at the parameter's
    placements; planned on 2 ranks, the simulated values are torch.autograd's."""
    torch.manual_seed(0)
    m = Mlp()
    tp = rs.from_torch(m, (X,), mesh=MESH, param_placements=MEGATRON, train=True)
    names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert tp.grads == {n: f"grad.{n}" for n in names}
    f = tp.fusion
    inputs = {f.tensors[i].name: f.tensors[i].sharding for i in f.inputs}
    assert [(f.tensors[t].name, ts) for t, ts in f.outputs[1:]] == [(f"grad.{n}", inputs[n]) for n in names]
    loss, grads = autograd_grads(m, X)
    got = rs.optimize(f).simulate(tp.inputs(X, state=m))
    torch.testing.assert_close(got[0], loss, rtol=1e-5, atol=1e-6)
    for n, g in zip(names, got[1:]):
        torch.testing.assert_close(g, grads[n], rtol=1e-4, atol=1e-6)


def test_frozen_and_tied_parameters() -> None:
    """A parameter that does not require grad gets no gradient output; a tied one (two names,
    one tensor: one Fusion input) gets one, the sum over its uses."""
    class Tied(Mlp):
        def __init__(self) -> None:
            super().__init__()
            self.fc3 = torch.nn.Linear(16, 8)
            self.fc3.weight = self.fc2.weight  # [8, 16]: read as fc2 and as fc3
            self.fc1.bias.requires_grad_(False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.fc1(x))
            return (self.fc2(h) * self.fc3(h)).mean()

    torch.manual_seed(0)
    m = Tied()
    tp = rs.from_torch(m, (X,), mesh=MESH, param_placements={"fc3.weight": [rs.Shard(1)]}, train=True)
    assert "fc1.bias" in tp.state_inputs and "fc1.bias" not in tp.grads
    (tied,) = [n for n in tp.grads if n in ("fc2.weight", "fc3.weight")]
    _, grads = autograd_grads(m, X)
    got = dict(zip(tp.grads, rs.optimize(tp.fusion).simulate(tp.inputs(X, state=m))[1:]))
    assert set(got) == {tied, "fc1.weight", "fc2.bias", "fc3.bias"}
    torch.testing.assert_close(got[tied], grads["fc2.weight"], rtol=1e-4, atol=1e-6)


def test_op_without_backward_names_op_and_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """An op whose kind has no vjp (here cumsum's, taken away): the error names the op kind and
    the user's source line."""
    from reshard.ir.ops.registry import OPS, OpKind

    class Scan(Mlp):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cumsum(self.fc1(x), dim=1).mean()

    monkeypatch.setattr(type(OPS["cumsum"]), "vjp", OpKind.vjp)
    with pytest.raises(rs.ReshardError, match=r"no backward for op cumsum.*test_train_frontend.py:\d+ "
                                              r"\(return torch.cumsum\(self.fc1\(x\), dim=1\).mean\(\)\)"):
        rs.from_torch(Scan(), (X,), mesh=MESH, train=True)
