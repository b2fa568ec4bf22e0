"""Cold one-time host cost of a transformer block's remap forms (``remap_form``) on 2 ranks.

For each seq = hidden = S: optimize ``transformer_block``, collect every remap step's key
(mode, src, dst, axis, coords) for both ranks (as scripts/gpu_check.py does), clear the
caches and time ``remap_form`` over all keys.  ``--check`` also compares each form's index
with the index path (``strided_form(remap_index(...))``).
"""

from __future__ import annotations

import argparse
import time

import reshard as rs
from reshard.examples import transformer_block
from reshard.codegen.remap_index import _local_indices, remap_index
from reshard.codegen.remap_form import remap_form, strided_form


def remap_keys(program) -> list[tuple]:
    jobs: list[tuple] = []
    for s in program.steps:
        if s.kind == "local" and s.attr("op") == "remap":
            mesh = s.attr("src").mesh
            for r in program.mesh_ranks:
                k = (s.attr("mode"), s.attr("src"), s.attr("dst"), s.attr("axis", -1), mesh.coords(r))
                if k not in jobs:
                    jobs.append(k)
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[1024, 2048, 4096])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    mesh = rs.DeviceMesh([0, 1], ("tp",))
    for S in args.sizes:
        f = transformer_block(mesh, seq=S, hidden=S, heads=32, dtype="bfloat16")
        plan = rs.optimize(f)
        keys = remap_keys(plan.program)
        remap_form.cache_clear(); remap_index.cache_clear(); _local_indices.cache_clear()
        t0 = time.perf_counter()
        forms = [remap_form(*k) for k in keys]
        dt = time.perf_counter() - t0
        views = sum(sm is not None and sm.is_range for sm in forms)
        strided = sum(sm is not None and not sm.is_range for sm in forms)
        modes = sorted({k[0] for k in keys})
        print(f"S={S}: {len(keys)} remap keys (modes {modes}), cold remap_form total {dt:.3f} s; "
              f"{views} views, {strided} strided, {len(forms) - views - strided} gathers", flush=True)
        if args.check:
            for k, sm in zip(keys, forms):
                ref = strided_form(remap_index(*k))
                assert (sm is None) == (ref is None), k
                if sm is not None:
                    assert sm.index().equal(ref.index()), k
            print(f"S={S}: all {len(keys)} forms equal the index path", flush=True)


if __name__ == "__main__":
    main()
