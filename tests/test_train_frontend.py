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


class ScalesInput(Mlp):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return super().forward(x)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("decompose", [False, True], ids=["exported", "core-aten"])
@pytest.mark.parametrize("cls,what,line", [
    (ScalesWeight, "parameter 'fc1.weight'", "self.fc1.weight[0].mul_(0.5)"),
    (CountsCalls, "buffer 'count'", "self.count.add_(1)"),
    (ScalesInput, "input 'x'", "x.mul_(2)")], ids=["parameter", "buffer", "input"])
def test_in_place_update_is_an_error(cls: type, what: str, line: str, decompose: bool, train: bool) -> None:
    """The error names what is written, the op (or the node computing the new value) and the
    source line; before, a write that nothing read afterwards was dropped without a word."""
    with pytest.raises(rs.ReshardError, match="in-place update of") as e:
        rs.from_torch(cls(), (X.clone(),), mesh=MESH, decompose=decompose, train=train)
    msg = str(e.value)
    assert what.split(" '")[0] in msg and what.split(" ")[1] in msg and line in msg and "test_train_frontend.py" in msg


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
