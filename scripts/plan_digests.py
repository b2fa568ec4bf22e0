"""Plan digests and modeled costs of every program in ``benchmarks/suite.py`` and ``reshard/testing/programs.py``.

A refactor that must not change behaviour is checked by running this before and after it:

    python scripts/plan_digests.py --out before.json      # on the old commit
    python scripts/plan_digests.py --compare before.json  # on the new one

``--compare`` prints, for every program whose digest changed, the modeled cost before and after
and the collectives of both plans, and exits with status 1 when a plan got dearer (a plan whose
digest changed at equal or lower cost is listed, not an error: say why in the change's note).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import reshard as rs  # noqa: E402


def programs() -> dict[str, rs.Fusion]:
    """Every named program: suite cases at their tiny instance (``k = 1``) and ``reshard.testing.programs.ALL``."""
    import suite
    from reshard.testing import programs as P

    out: dict[str, rs.Fusion] = {}
    for case in suite.SUITE:
        out[f"suite:{case.key}"] = case.fusion(1)
    for i, build in enumerate(P.ALL):
        out[f"programs:{i:02d}:{getattr(build, '__name__', 'redistribute')}"] = build()
    return out


def record(name: str, f: rs.Fusion) -> dict:
    """Digest, modeled cost (us) and collectives of ``f``'s plan, or the error that stopped it."""
    try:
        plan = rs.optimize(f, cache=False)  # (a stored plan would hide the change being checked)
    except rs.ReshardError as e:
        return {"name": name, "error": str(e).splitlines()[0]}
    return {"name": name, "digest": plan.digest()[:16], "cost_us": round(plan.cost * 1e6, 3),
            "comms": [f"{c.kind}@{c.axis}" for c in plan.communications]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the records as JSON to this file")
    ap.add_argument("--compare", help="compare with records written earlier by --out")
    args = ap.parse_args()
    rows = [record(n, f) for n, f in programs().items()]
    for r in rows:
        print(f"{r['name']:<48} " + (f"error: {r['error']}" if "error" in r else
                                     f"{r['digest']}  {r['cost_us']:>10.3f} us  {' '.join(r['comms'])}"))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    if not args.compare:
        return 0
    before = {r["name"]: r for r in json.loads(Path(args.compare).read_text())}
    dearer = 0
    print("\nchanged:")
    for r in rows:
        b = before.get(r["name"])
        if b is None:
            print(f"  {r['name']}: new")
        elif b.get("digest") != r.get("digest"):
            worse = "cost_us" in r and "cost_us" in b and r["cost_us"] > b["cost_us"] * (1 + 1e-9)
            lost = "error" in r and "error" not in b
            dearer += worse or lost
            print(f"  {r['name']}: {b.get('cost_us', b.get('error'))} -> {r.get('cost_us', r.get('error'))}"
                  f"{'  DEARER' if worse or lost else ''}\n      before {b.get('comms')}\n      after  {r.get('comms')}")
    print(f"{dearer} dearer of {len(rows)}")
    return 1 if dearer else 0


if __name__ == "__main__":
    sys.exit(main())
