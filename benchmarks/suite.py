"""The plan-quality suite: named programs, each written twice, side by side.

Every case is a reshard ``Fusion`` with fixed input and output shardings (``build(mesh,
k)``) and the same computation written as a DTensor program (``dtensor(mesh, **inputs)``,
a function on ``torch.distributed.tensor.DTensor`` values that ends with ``.redistribute``
to the fixed output placements).  ``k`` scales the free dims: ``k = 1`` is a tiny instance
for tests, ``BENCH_K`` the benchmark instance, where collectives move 0.1-4 MB per rank so
that bandwidth, not latency, decides the plan.

Cases (seed 000's reshapes and slice, seed 001's 2-D-mesh and cross-mesh transfers, the
Megatron blocks of reshard/examples.py, and pytorch issue #179502):

- ``split_heads``: ``[b, s, h] -> [b, s, a, h/a]``, the sharded dim split, shard on the outer factor (local).
- ``split_three``: ``[b, s, h] -> [b, s, n, a/n, h/a]`` (seed: ``[h] => [d, a/d, h/a]``; local).
- ``merge_heads``: ``[b, s, a, h/a] -> [b, s, h]`` with ``a`` sharded (local).
- ``merge_then_split``: ``[b, s, a, h/a] -> [b, s, h] -> [b, s, n, h/n]`` (local).
- ``qkv_slice``: ``[b, s, 3nh] -> [b, s, nh]``, a slice of a sharded fused dim (not local).
- ``qkv_heads``: ``x @ Wqkv`` (column-parallel), per-head reshape, q/k/v slices, heads-sharded outputs.
- ``view_second_factor``: pytorch #179502: ``x [12, 8]`` sharded on dim 1, ``view(16, 6)`` to ``Shard(0)``.
- ``mlp_tp`` / ``mlp_sp``: Megatron MLP without / with sequence parallelism.
- ``attention_tp`` / ``attention_sp``: examples.attention_block, replicated / sequence-sharded activations.
- ``mlp_2d``: data x tensor parallel MLP on a 2-D mesh.
- ``redist2d_gather_y``, ``redist2d_a2a_y``, ``redist2d_allreduce_x``: resharding along one axis of a 2-D mesh.
- ``cross_mesh``: a transfer to another mesh (seed 001); "not supported" in the table when the optimizer raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import reshard as rs
from reshard.examples import attention_block, mlp_block
from reshard.ir import Merge, Root
from reshard.ir.sharding import TensorSharding

BENCH_K = 64
"""Scale of the benchmark instances (``k`` of every builder)."""

MESHES_1D = ((2,), (4,), (8,))
MESHES_2D = ((2, 2), (2, 4))


def make_mesh(shape: tuple[int, ...]) -> rs.DeviceMesh:
    """Ranks 0..N-1 in row-major order (the layout ``torch.distributed.init_device_mesh`` uses)."""
    if len(shape) == 1:
        return rs.DeviceMesh(list(range(shape[0])))
    rows, cols = shape
    return rs.DeviceMesh([[r * cols + c for c in range(cols)] for r in range(rows)], ("x", "y"))


def _t():
    """DTensor placement classes (imported lazily: the suite's reshard side needs no torch.distributed)."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    return Shard, Replicate, Partial


@dataclass(frozen=True)
class Case:
    """One suite program on one mesh."""

    name: str
    mesh_shape: tuple[int, ...]
    build: Callable[[rs.DeviceMesh, int], rs.Fusion]
    dtensor: Callable[..., list] | None
    note: str = ""

    @property
    def world(self) -> int:
        return math.prod(self.mesh_shape)

    @property
    def mesh_label(self) -> str:
        return "x".join(map(str, self.mesh_shape))

    @property
    def key(self) -> str:
        return f"{self.name}@{self.mesh_label}"

    def fusion(self, k: int = BENCH_K) -> rs.Fusion:
        return self.build(make_mesh(self.mesh_shape), k)


# ==== the programs: reshard Fusion on the left, DTensor on the right ==========================
# (B, S, A, E): batch, sequence, heads, head dim; H = A * E.
B, A, E = 2, 8, 16
H = A * E


# -- seed 000: reshapes of a sharded dim ----------------------------------------------------------
def split_heads(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (B, 32 * k, H), "float32", mesh, [rs.Shard(2)])
    f.output(f.reshape(x, (B, 32 * k, A, E)), [rs.Shard(2)])
    return f


def split_heads_dt(mesh, x):
    Shard, _, _ = _t()
    return [x.view(B, x.shape[1], A, E).redistribute(mesh, [Shard(2)])]


def split_three(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    n = mesh.size
    f = rs.Fusion()
    x = f.input("x", (B, 32 * k, H), "float32", mesh, [rs.Shard(2)])
    f.output(f.reshape(x, (B, 32 * k, n, A // n, E)), [rs.Shard(2)])
    return f


def split_three_dt(mesh, x):
    Shard, _, _ = _t()
    n = mesh.size()
    return [x.view(B, x.shape[1], n, A // n, E).redistribute(mesh, [Shard(2)])]


def merge_heads(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    f = rs.Fusion()
    x = f.input("x", (B, 32 * k, A, E), "float32", mesh, [rs.Shard(2)])
    f.output(f.reshape(x, (B, 32 * k, H)), [rs.Shard(2)])
    return f


def merge_heads_dt(mesh, x):
    Shard, _, _ = _t()
    return [x.view(B, x.shape[1], H).redistribute(mesh, [Shard(2)])]


def merge_then_split(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    n = mesh.size
    f = rs.Fusion()
    x = f.input("x", (B, 32 * k, A, E), "float32", mesh, [rs.Shard(2)])
    y = f.reshape(x, (B, 32 * k, H))
    f.output(f.reshape(y, (B, 32 * k, n, H // n)), [rs.Shard(2)])
    return f


def merge_then_split_dt(mesh, x):
    Shard, _, _ = _t()
    n = mesh.size()
    y = x.view(B, x.shape[1], H)
    return [y.view(B, x.shape[1], n, H // n).redistribute(mesh, [Shard(2)])]


def qkv_slice(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    """Seed 000: ``[b, s, 3dh] -> [b, s, dh]``, the q third of a fused dim sharded d ways."""
    n = mesh.size
    f = rs.Fusion()
    x = f.input("x", (B, 16 * k, 3 * n * 32), "float32", mesh, [rs.Shard(2)])
    f.output(f.slice(x, 2, 0, n * 32), [rs.Shard(2)])
    return f


def qkv_slice_dt(mesh, x):
    Shard, _, _ = _t()
    return [x[:, :, : x.shape[2] // 3].redistribute(mesh, [Shard(2)])]


def qkv_heads(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    """Fused QKV projection (column-parallel ``Wqkv``), per-head reshape ``[s, 3, a, e]``, the
    q/k/v slices, each ``[s, a, e]`` heads-sharded."""
    s = 32 * k
    f = rs.Fusion()
    x = f.input("x", (s, H), "float32", mesh, [rs.Replicate()])
    w = f.input("wqkv", (H, 3 * H), "float32", mesh, [rs.Shard(1)])
    qkv = f.reshape(f.matmul(x, w), (s, 3, A, E))
    for i in range(3):
        f.output(f.reshape(f.slice(qkv, 1, i, i + 1), (s, A, E)), [rs.Shard(1)])
    return f


def qkv_heads_dt(mesh, x, wqkv):
    # DTensor refuses the per-head reshape of the column-sharded [s, 3h] ("Cannot unflatten
    # unevenly sharded tensor ... Please redistribute the tensor before this operation"):
    # the 3h dim's shard boundaries cut through q/k/v.  The fix its message asks for:
    # redistribute to Replicate first.
    Shard, Replicate, _ = _t()
    s = x.shape[0]
    qkv = (x @ wqkv).redistribute(mesh, [Replicate()]).reshape(s, 3, A, E)
    return [qkv[:, i: i + 1].reshape(s, A, E).redistribute(mesh, [Shard(1)]) for i in range(3)]


# -- pytorch issue #179502: a view whose sharded dim is the second factor of a merge -----------------
def view_second_factor(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    """``x [12k², 8]`` ``Shard(1)`` viewed as ``[16k², 6]`` with ``Shard(0)`` (the issue's case at k=1,
    4 ranks): the merged dim's sharded index is its inner factor, so the view is not local."""
    f = rs.Fusion()
    x = f.input("x", (12 * k * k, 8), "float32", mesh, [rs.Shard(1)])
    f.output(f.reshape(x, (16 * k * k, 6)), [rs.Shard(0)])
    return f


def view_second_factor_dt(mesh, x):
    Shard, _, _ = _t()
    return [x.view(-1, 6).redistribute(mesh, [Shard(0)])]


# -- Megatron blocks (reshard/examples.py) -----------------------------------------------------------
def mlp_dims(k: int) -> tuple[int, int, int]:
    """(seq, hidden, ffn) of the MLP cases: hidden 256 at benchmark scale, 32 for tiny instances."""
    h = 256 if k >= 16 else 32
    return 32 * k, h, 4 * h


def mlp_tp(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    """MLP with replicated activations in and out (tensor parallel, no sequence parallelism)."""
    s, h, ffn = mlp_dims(k)
    f = rs.Fusion()
    x = f.input("x", (s, h), "float32", mesh, [rs.Replicate()])
    f.output(mlp_block(f, x, mesh, h, ffn), [rs.Replicate()])
    return f


def mlp_sp(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    """MLP with sequence-sharded activations in and out (sequence parallelism)."""
    s, h, ffn = mlp_dims(k)
    f = rs.Fusion()
    x = f.input("x", (s, h), "float32", mesh, [rs.Shard(0)])
    f.output(mlp_block(f, x, mesh, h, ffn), [rs.Shard(0)])
    return f


def _mlp_dt(mesh, x, w1, w2, out):
    import torch.nn.functional as F
    return [(F.gelu(x @ w1) @ w2).redistribute(mesh, out)]


def mlp_tp_dt(mesh, x, w1, w2):
    _, Replicate, _ = _t()
    return _mlp_dt(mesh, x, w1, w2, [Replicate()])


def mlp_sp_dt(mesh, x, w1, w2):
    Shard, _, _ = _t()
    return _mlp_dt(mesh, x, w1, w2, [Shard(0)])


def mlp_2d(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    """Data (axis x) x tensor (axis y) parallel MLP on a 2-D mesh."""
    s, h, ffn = mlp_dims(k)
    f = rs.Fusion()
    x = f.input("x", (s, h), "float32", mesh, [rs.Shard(0), rs.Replicate()])
    w1 = f.input("w1", (h, ffn), "float32", mesh, [rs.Replicate(), rs.Shard(1)])
    w2 = f.input("w2", (ffn, h), "float32", mesh, [rs.Replicate(), rs.Shard(0)])
    f.output(f.matmul(f.gelu(f.matmul(x, w1)), w2), [rs.Shard(0), rs.Replicate()])
    return f


def mlp_2d_dt(mesh, x, w1, w2):
    Shard, Replicate, _ = _t()
    return _mlp_dt(mesh, x, w1, w2, [Shard(0), Replicate()])


ATT_S, ATT_H, ATT_A = 8, 128, 8


def attention_tp(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    """examples.attention_block (fused QKV, per-head reshape, q/k/v slices, heads-sharded
    output projection) with replicated activations in and out."""
    f = rs.Fusion()
    x = f.input("x", (ATT_S * k, ATT_H), "float32", mesh, [rs.Replicate()])
    f.output(attention_block(f, x, mesh, ATT_A), [rs.Replicate()])
    return f


def attention_sp(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    """examples.attention_block with sequence-sharded activations in and out."""
    f = rs.Fusion()
    x = f.input("x", (ATT_S * k, ATT_H), "float32", mesh, [rs.Shard(0)])
    f.output(attention_block(f, x, mesh, ATT_A), [rs.Shard(0)])
    return f


def _attention_dt(mesh, x, wqkv, wo, out):
    s, h = x.shape
    hd = h // ATT_A
    qkv = (x @ wqkv).reshape(s, 3, ATT_A, hd)
    q, k, v = (qkv[:, i: i + 1].reshape(s, ATT_A, hd).permute(1, 0, 2) for i in range(3))
    scores = ((q @ k.permute(0, 2, 1)) * hd ** -0.5).tanh()
    ctx = (scores @ v).permute(1, 0, 2)
    return [(ctx.reshape(s, h) @ wo).redistribute(mesh, out)]


def attention_tp_dt(mesh, x, wqkv, wo):
    _, Replicate, _ = _t()
    return _attention_dt(mesh, x, wqkv, wo, [Replicate()])


def attention_sp_dt(mesh, x, wqkv, wo):
    Shard, _, _ = _t()
    return _attention_dt(mesh, x, wqkv, wo, [Shard(0)])


# -- seed 001: resharding along one axis of a 2-D mesh -------------------------------------------
def _redist(src: list, dst: list, shape=(32, 96)) -> Callable[[rs.DeviceMesh, int], rs.Fusion]:
    def build(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
        f = rs.Fusion()
        x = f.input("x", (shape[0] * k, shape[1]), "float32", mesh, src)
        f.output(f.redistribute(x, dst), dst)
        return f
    return build


def _redist_dt(dst_fn: Callable[[], list]) -> Callable[..., list]:
    def prog(mesh, x):
        return [x.redistribute(mesh, dst_fn())]
    return prog


def _pl(*names: str) -> Callable[[], list]:
    """DTensor placements by short name: 'S0', 'S1', 'R', 'P'."""
    def mk() -> list:
        Shard, Replicate, Partial = _t()
        return [Replicate() if n == "R" else Partial() if n == "P" else Shard(int(n[1])) for n in names]
    return mk


# -- seed 001: a transfer to another mesh -----------------------------------------------------------
def cross_mesh(mesh: rs.DeviceMesh, k: int) -> rs.Fusion:
    """``x`` on the first half of the ranks, sent to the second half.  Listed as "not
    supported" when the optimizer raises ``ReshardError`` for it (cross-mesh transfers
    were not supported when the suite was written).  DTensor's ``redistribute`` works
    within one mesh only, so this case has no DTensor program."""
    n = mesh.size // 2
    src = rs.DeviceMesh(list(range(n)))
    dst = rs.DeviceMesh(list(range(n, 2 * n)))
    f = rs.Fusion()
    x = f.input("x", (32 * k, 96), "float32", src, [rs.Shard(0)])
    f.output(f.redistribute(x, [rs.Shard(0)], mesh=dst), [rs.Shard(0)])
    return f


# ==== the registry ==================================================================================
def _cases() -> list[Case]:
    cases: list[Case] = []

    def add(name: str, build, dt, meshes, note: str = "") -> None:
        for m in meshes:
            cases.append(Case(name, m, build, dt, note))

    add("split_heads", split_heads, split_heads_dt, MESHES_1D, "seed 000 split [h]->[a, h/a]")
    add("split_three", split_three, split_three_dt, MESHES_1D, "seed 000 split [h]->[d, a/d, h/a]")
    add("merge_heads", merge_heads, merge_heads_dt, MESHES_1D, "seed 000 merge [a, h/a]->[h]")
    add("merge_then_split", merge_then_split, merge_then_split_dt, MESHES_1D, "seed 000 [a, h/a]->[h]->[d, h/d]")
    add("qkv_slice", qkv_slice, qkv_slice_dt, MESHES_1D, "seed 000 slice of a sharded fused dim")
    add("qkv_heads", qkv_heads, qkv_heads_dt, MESHES_1D, "fused QKV, per-head reshape, q/k/v slices")
    add("view_second_factor", view_second_factor, view_second_factor_dt, ((2,), (4,)), "pytorch #179502")
    add("mlp_tp", mlp_tp, mlp_tp_dt, MESHES_1D, "Megatron MLP")
    add("mlp_sp", mlp_sp, mlp_sp_dt, MESHES_1D, "Megatron MLP, sequence parallel")
    add("attention_tp", attention_tp, attention_tp_dt, MESHES_1D, "attention block, heads sharded")
    add("attention_sp", attention_sp, attention_sp_dt, MESHES_1D, "attention block, sequence parallel")
    add("mlp_2d", mlp_2d, mlp_2d_dt, MESHES_2D, "data x tensor parallel MLP")
    add("redist2d_gather_y", _redist([rs.Shard(0), rs.Shard(1)], [rs.Shard(0), rs.Replicate()]),
        _redist_dt(_pl("S0", "R")), MESHES_2D, "seed 001 [S0,S1]->[S0,R]")
    add("redist2d_a2a_y", _redist([rs.Replicate(), rs.Shard(1)], [rs.Replicate(), rs.Shard(0)]),
        _redist_dt(_pl("R", "S0")), MESHES_2D, "seed 001 [R,S1]->[R,S0]")
    add("redist2d_allreduce_x", _redist([rs.Partial(), rs.Shard(1)], [rs.Replicate(), rs.Shard(1)]),
        _redist_dt(_pl("R", "S1")), MESHES_2D, "seed 001 [P,S1]->[R,S1]")
    add("cross_mesh", cross_mesh, None, ((4,), (8,)), "seed 001 mesh->mesh transfer (no DTensor equivalent)")
    return cases


SUITE: tuple[Case, ...] = tuple(_cases())
"""Every case, in table order."""


def get(key: str) -> Case:
    """A case by ``name@mesh`` (e.g. ``"mlp_sp@4"``)."""
    for c in SUITE:
        if c.key == key:
            return c
    raise KeyError(f"no suite case {key!r}; known: {[c.key for c in SUITE]}")


def to_dtensor_placements(ts: TensorSharding) -> list:
    """reshard TensorSharding -> DTensor placements; ``ReshardError`` when the sharding is not
    expressible with placements (a loop-domain sharding)."""
    Shard, Replicate, Partial = _t()
    out: list = []
    rs_pl: list = []
    for p in ts.axes:
        if isinstance(p, rs.Replicate):
            out.append(Replicate())
            rs_pl.append(p)
        elif isinstance(p, rs.Partial):
            out.append(Partial(p.op))
            rs_pl.append(p)
        else:
            x = p
            while not isinstance(x, Root):
                if isinstance(x, Merge):
                    raise rs.ReshardError(f"sharding {ts}: a merged IterDomain has no DTensor placement")
                x = x.x
            out.append(Shard(x.dim))
            rs_pl.append(rs.Shard(x.dim))
    if TensorSharding.from_placements(ts.shape, rs_pl, ts.mesh) != ts:
        raise rs.ReshardError(f"sharding {ts} is not expressible with DTensor placements")
    return out


__all__ = ["Case", "SUITE", "BENCH_K", "get", "make_mesh", "to_dtensor_placements"]
