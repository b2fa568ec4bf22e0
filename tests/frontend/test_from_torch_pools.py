"""Max pools through ``from_torch`` (``frontend.aten_windows``' own ``max_pool{2,3}d_with_indices``
handler: torch 2.11 has no decomposition of them, issue 30): values and indices equal eager's
exactly (ties: the first maximum; padding never wins; dilation; unbatched), with the batch
sharded on 2 ranks; the values train like autograd."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import reshard as rs

MESH = rs.DeviceMesh([0, 1], ("tp",))
G = torch.Generator().manual_seed(0)
IMG = torch.randn(2, 3, 7, 6, generator=G)
IMG[0, 0, :2, :2] = 1.0  # a tie inside one window
VOL = torch.randn(2, 2, 4, 5, 4, generator=G)

CASES: dict[str, tuple[Callable[[torch.Tensor], object], torch.Tensor]] = {
    "2d": (lambda x: F.max_pool2d(x, 2, return_indices=True), IMG),
    "2d_padded": (lambda x: F.max_pool2d(-x.abs(), 3, stride=2, padding=1, return_indices=True), IMG),
    "2d_dilated": (lambda x: F.max_pool2d(x, (2, 3), stride=1, dilation=2, return_indices=True), IMG),
    "2d_values": (lambda x: F.max_pool2d(x, 3, 2, 1), IMG),
    "2d_unbatched": (lambda x: F.max_pool2d(x[0], 2, return_indices=True), IMG),
    "3d_padded": (lambda x: F.max_pool3d(x, 2, padding=1, return_indices=True), VOL),
}


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_indices_equal_eager(name: str) -> None:
    fn, x = CASES[name]
    tp = rs.from_torch(fn, (x,), [rs.Shard(0)], mesh=MESH)
    got = rs.optimize(tp.fusion).simulate(tp.inputs(x))
    want = fn(x)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g, w), name


class _Pooled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(IMG.shape, generator=torch.Generator().manual_seed(1)) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(x * self.w, 3, stride=2, padding=1)
        return (y * torch.linspace(0.5, 1.5, y.numel()).reshape(y.shape)).sum()


def test_values_train_like_autograd() -> None:
    m = _Pooled()
    tp = rs.from_torch(m, (IMG,), [rs.Shard(0)], mesh=MESH, train=True)
    loss, gw = rs.optimize(tp.fusion).simulate(tp.inputs(IMG, state=m))
    want = m(IMG)
    want.backward()
    torch.testing.assert_close(loss, want.detach().reshape(loss.shape))
    torch.testing.assert_close(gw, m.w.grad)
