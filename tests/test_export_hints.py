"""Hints that lead somewhere (issue 29, ``frontend.export_hints``): a Python ``if`` on a tensor's
values is one short error suggesting ``torch.where``; ``decompose=True`` is suggested for an
unsupported op only when the decomposed program converts, and otherwise the op it fails on is named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import reshard as rs

MESH = rs.DeviceMesh([0, 1], ("tp",))


class Branches(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent: export has one path
            return x * 2
        return x


class Calls(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def _error(module: nn.Module, **kw) -> str:
    with pytest.raises(rs.ReshardError) as ei:
        rs.from_torch(module, (torch.randn(4, 8),), mesh=MESH, **kw)
    return str(ei.value)


def test_a_data_dependent_if_suggests_torch_where() -> None:
    msg = _error(Branches())
    assert "torch.where(cond, a, b)" in msg and "test_export_hints.py:" in msg and "if x.sum() > 0:" in msg
    assert len(msg) < 400 and "TORCHDYNAMO" not in msg


@pytest.mark.parametrize("fn,op", [(lambda x: torch.sort(x, dim=-1).values, "aten.sort.default"),
                                   (lambda x: torch.var(x, dim=-1), "aten.var.correction")])
def test_decompose_is_not_suggested_where_it_fails_again(fn, op) -> None:
    msg = _error(Calls(fn))
    assert f"decompose=True does not help (it fails on {op})" in msg and "converts it" not in msg
    assert op in _error(Calls(fn), decompose=True)  # the same failure, as the hint said


def test_decompose_is_suggested_where_it_converts() -> None:
    fn = lambda x: torch.logsumexp(x, -1)  # noqa: E731
    assert "from_torch(..., decompose=True) converts it" in _error(Calls(fn))
    rs.from_torch(Calls(fn), (torch.randn(4, 8),), mesh=MESH, decompose=True)
