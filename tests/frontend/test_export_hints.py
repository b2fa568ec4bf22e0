"""Hints that lead somewhere (issue 29, ``frontend.export_hints``): a Python ``if`` on a tensor's
values is one short error suggesting ``torch.where``.  (An unsupported op's error:
``tests/frontend/test_from_torch_ops.py``.)"""

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


def test_a_data_dependent_if_suggests_torch_where() -> None:
    with pytest.raises(rs.ReshardError) as ei:
        rs.from_torch(Branches(), (torch.randn(4, 8),), mesh=MESH)
    msg = str(ei.value)
    assert "torch.where(cond, a, b)" in msg and "test_export_hints.py:" in msg and "if x.sum() > 0:" in msg
    assert len(msg) < 400 and "TORCHDYNAMO" not in msg
