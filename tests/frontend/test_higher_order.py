"""torch.export's wrapper higher-order ops (``frontend.higher_order``): a region of ``forward``
under ``torch.autocast(..., enabled=False)``, ``torch.no_grad()`` or ``torch.set_grad_enabled``
is a ``wrap_with_*`` op whose body is a submodule; the converter inlines the body.  Planned on 2
ranks against eager, and in training against autograd (a no-grad region passes no gradient)."""

from __future__ import annotations

import torch

import reshard as rs

MESH = rs.DeviceMesh([0, 1], ("tp",))


class Regions(torch.nn.Module):
    """Hugging Face's rotary embedding computes cos/sin with autocast disabled; a no-grad region
    here scales by a statistic of the activations (no gradient flows through the scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        with torch.autocast("cpu", enabled=False):
            a = torch.tanh(h.float()) * 2
            unused = torch.exp(h)  # an output of the region that nothing reads
        with torch.no_grad():
            s = torch.sigmoid(a)
        with torch.set_grad_enabled(False):
            s = s * 3
        del unused
        return self.fc2(a * s).mean()


def _graph_has_wrappers(m: torch.nn.Module, x: torch.Tensor) -> None:
    nodes = torch.export.export(m, (x,)).graph.nodes
    assert {"wrap_with_autocast", "wrap_with_set_grad_enabled"} <= {str(n.target) for n in nodes}


def test_wrapped_regions_match_eager() -> None:
    torch.manual_seed(0)
    m, x = Regions(), torch.randn(4, 8)
    _graph_has_wrappers(m, x)
    tp = rs.from_torch(m, (x,), [rs.Shard(0)], mesh=MESH, param_placements={"fc1.weight": [rs.Shard(0)]})
    assert not any(op.kind == "unary" and op.attrs["fn"] == "exp" for op in tp.fusion.ops)  # dead output
    (y,) = rs.optimize(tp.fusion).simulate(tp.inputs(x))
    with torch.no_grad():
        torch.testing.assert_close(y, m(x))


def test_no_grad_region_passes_no_gradient() -> None:
    torch.manual_seed(0)
    m, x = Regions(), torch.randn(4, 8)
    tp = rs.from_torch(m, (x,), mesh=MESH, param_placements={"fc1.weight": [rs.Shard(0)]}, train=True)
    loss = m(x)
    loss.backward()
    got = dict(zip(["loss", *tp.grads], rs.optimize(tp.fusion).simulate(tp.inputs(x, state=m))))
    torch.testing.assert_close(got["loss"], loss.detach())
    for n, p in m.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-6)
