"""Non-accumulating scatters through ``from_torch`` (``frontend.aten_indexing``, issue 30):
``scatter`` (src / value) and ``index_put`` whose indices name one place several times write
the last of them in order, as torch's CPU kernels do (``last_writes``), not their sum; the
accumulating ones sum; ``index_put`` takes several index tensors (adjacent, apart, after
``None``).  Each on 2 ranks, inputs replicated and row-sharded, simulated against eager."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import reshard as rs

MESH = rs.DeviceMesh([0, 1], ("tp",))
G = torch.Generator().manual_seed(0)
X, SRC = torch.randn(4, 6, generator=G), torch.randn(4, 5, generator=G)
X3 = torch.randn(4, 3, 5, generator=G)
#: along dim 1, every row repeats a column (row 0: column 2 three times)
DUP = torch.tensor([[2, 0, 2, 5, 2], [1, 1, 1, 1, 1], [0, 1, 2, 3, 4], [5, 3, 5, 3, 0]])
ROWS = torch.tensor([3, 1, 3, 0, 3, 1])  # index_put rows, 3 and 1 repeated
COLS = torch.tensor([4, 0, 4, 2, 4, 0])
VALS = torch.randn(6, 6, generator=G)



def _setitem(key: Callable[[torch.Tensor], tuple], x: torch.Tensor, v: torch.Tensor | float) -> torch.Tensor:
    """``x`` with ``x[key] = v`` (on a copy: torch.export records ``index_put``)."""
    y = x.clone()
    y[key(y)] = v
    return y


CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]] = {
    "scatter_src": (lambda x, s: x.scatter(1, DUP, s), (X, SRC)),
    "scatter_value": (lambda x: x.scatter(1, DUP, 2.5), (X,)),
    "scatter_dim0": (lambda x, s: x.scatter(0, DUP[:, :4] % 4, s[:, :4]), (X, SRC)),
    "scatter_add": (lambda x, s: x.scatter_add(1, DUP, s), (X, SRC)),
    "index_put_rows": (lambda x, v: torch.index_put(x, (ROWS,), v), (X, VALS)),
    "index_put_rows_accumulate": (lambda x, v: torch.index_put(x, (ROWS,), v, accumulate=True), (X, VALS)),
    "index_put_two": (lambda x, v: torch.index_put(x, (ROWS, COLS), v[:, 0]), (X, VALS)),
    "setitem_after_none": (lambda x, v: _setitem(lambda y: (slice(None), COLS[:4] % 3), x, v[:4, :4, None]),
                           (X3, VALS)),
    "setitem_apart": (lambda x, v: _setitem(lambda y: (ROWS[:4], slice(None), COLS[:4]), x, v[:4, :3]), (X3, VALS)),
    "setitem_scalar": (lambda x: _setitem(lambda y: (ROWS, COLS), x, 7.0), (X,)),
}


@pytest.mark.parametrize("sharded", [False, True], ids=["replicated", "rows"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_on_the_cpu(name: str, sharded: bool) -> None:
    fn, args = CASES[name]
    spec = [rs.Shard(0) if sharded else rs.Replicate() for _ in args]
    tp = rs.from_torch(fn, args, spec, mesh=MESH)
    (got,) = rs.optimize(tp.fusion).simulate(tp.inputs(*args))
    torch.testing.assert_close(got, fn(*args), rtol=1e-6, atol=1e-6)


class _Put(torch.nn.Module):
    """``index_put(x * w, (ROWS,), v)`` weighted by a ramp and summed (``w``, ``v`` trained)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(4, 6, generator=torch.Generator().manual_seed(1)) + 0.5)
        self.v = torch.nn.Parameter(VALS.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.index_put(x * self.w, (ROWS,), self.v)
        return (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum()


def test_training_gives_an_overwritten_value_no_gradient() -> None:
    """The gradients of the function computed: ``x``'s rows that are written take none (as
    autograd's); a value that a later one overwrites takes none either (it does not reach the
    result), where torch's autograd gives it its place's gradient; the last write takes it."""
    m = _Put()
    tp = rs.from_torch(m, (X,), [rs.Shard(0)], mesh=MESH, train=True)
    loss, gw, gv = rs.optimize(tp.fusion).simulate(tp.inputs(X, state=m))
    want = m(X)
    want.backward()
    torch.testing.assert_close(loss, want.detach().reshape(loss.shape))
    torch.testing.assert_close(gw, m.w.grad)
    last = torch.tensor([all(ROWS[j] != ROWS[k] for k in range(j + 1, len(ROWS))) for j in range(len(ROWS))])
    torch.testing.assert_close(gv, m.v.grad * last[:, None])
    assert (gv[~last] == 0).all() and (m.v.grad[~last] != 0).all()
