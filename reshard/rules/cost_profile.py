"""The machine figures the cost model reads (``CostProfile``): collective latency and bus
bandwidth per kind (and, optionally, per team size), HBM bandwidth, kernel launch overhead and
peak FLOP rates.  JSON on disk; built-in profiles in ``reshard/profiles`` (the default: 2xH200),
``reshard tune`` measures one.  The cost rules (``rules.cost``) turn a profile into e-graph
costs; ``tune`` and ``plan`` read it too.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..ir.collective_kinds import KIND, KIND_NAMES, KINDS
from ..ir.collective_kinds import kind as collective_kind
from ..ir.errors import ReshardError

_ENTRY_KEYS = ("alpha_us", "busbw_gbps")


def bus_factor(kind: str, n: int) -> float:
    """f(n) of the α-β law ``t = α + bytes·f(n)/busbw`` of the collective kind ``kind``
    (``CollectiveKind.bus_factor``, nccl-tests' bus-bandwidth factor)."""
    return collective_kind(kind).bus_factor(n)


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped in ``reshard/profiles`` (``CostProfile.load(name)``)."""
    root = resources.files("reshard") / "profiles"
    return sorted(e.name[:-5] for e in root.iterdir() if e.name.endswith(".json"))


def _number(where: str, v: Any, *, positive: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ReshardError(f"cost profile: {where} must be a finite number, got {v!r}")
    if positive and v <= 0:
        raise ReshardError(f"cost profile: {where} must be positive, got {v}")
    if v < 0:
        raise ReshardError(f"cost profile: {where} must be >= 0, got {v}")
    return float(v)


@dataclass(frozen=True)
class CostProfile:
    """Machine figures.  alpha_us / busbw_gbps: per-collective-kind latency and bus bandwidth
    (every kind of ``KINDS``); collectives: optional per-team-size figures,
    ``{kind: {"<n>": {"alpha_us": .., "busbw_gbps": ..}}}`` (an entry may give one of the two;
    the other comes from the per-kind figure); hbm_gbps: device copy bandwidth (bytes read +
    written); launch_us: per-kernel overhead; peak_tflops per dtype width in bytes; meta:
    free-form provenance (``reshard tune`` records the machine and its fit quality there)."""

    name: str = "2xH200 NVLink (built-in)"
    alpha_us: dict[str, float] = field(default_factory=lambda: {k.name: k.default_alpha_us for k in KINDS})
    busbw_gbps: dict[str, float] = field(default_factory=lambda: {k.name: k.default_busbw_gbps for k in KINDS})
    hbm_gbps: float = 4200.0
    launch_us: float = 2.0
    peak_tflops: dict[str, float] = field(default_factory=lambda: {"2": 700.0, "4": 50.0, "8": 1.0})
    collectives: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def load(spec: "CostProfile | dict[str, Any] | str | Path | None") -> "CostProfile":
        """A profile from None (default), a dict, a JSON file path, or the name of a built-in
        profile (``builtin_profiles()``, e.g. "h200x2").  A dict/JSON gives only what differs
        from the default: dict-valued keys are merged per entry; unknown keys, unknown
        collective kinds and non-positive bandwidths are rejected."""
        if spec is None:
            return CostProfile()
        if isinstance(spec, CostProfile):
            return spec
        if isinstance(spec, (str, Path)):
            spec = _read_profile(spec)
        if not isinstance(spec, dict):
            raise ReshardError(f"cost profile must be a dict, a JSON path or a built-in profile name "
                               f"{builtin_profiles()}, got {type(spec).__name__}")
        base = asdict(CostProfile())
        unknown = set(spec) - set(base)
        if unknown:
            raise ReshardError(f"cost profile: unknown keys {sorted(unknown)}; known: {sorted(base)}")
        for k, v in spec.items():
            if isinstance(base[k], dict):
                if not isinstance(v, dict):
                    raise ReshardError(f"cost profile: {k} must be a JSON object, got {v!r}")
                base[k] = v if k == "meta" else {**base[k], **v}
            else:
                base[k] = v
        if not isinstance(base["name"], str):
            raise ReshardError(f"cost profile: name must be a string, got {base['name']!r}")
        for key, positive in (("alpha_us", False), ("busbw_gbps", True)):
            bad = sorted(set(base[key]) - set(KIND_NAMES))
            if bad:
                raise ReshardError(f"cost profile: {key} has unknown collective kinds {bad}; known: {list(KIND_NAMES)}")
            base[key] = {k: _number(f"{key}[{k!r}]", v, positive=positive) for k, v in base[key].items()}
        base["collectives"] = _check_collectives(base["collectives"])
        base["hbm_gbps"] = _number("hbm_gbps", base["hbm_gbps"], positive=True)
        base["launch_us"] = _number("launch_us", base["launch_us"], positive=False)
        base["peak_tflops"] = {str(k): _number(f"peak_tflops[{k!r}]", v, positive=True)
                               for k, v in base["peak_tflops"].items()}
        return CostProfile(**base)

    def collective(self, kind: str, n: int) -> tuple[float, float]:
        """(alpha_us, busbw_gbps) of ``kind`` on a team of ``n``: the entry for ``n`` in
        ``collectives[kind]``, else the nearest listed team size (ties: the smaller), else the
        per-kind figures; a field an entry leaves out comes from the per-kind figure."""
        if kind not in KIND:
            raise ReshardError(f"unknown collective kind {kind!r} (expected one of {list(KIND_NAMES)})")
        alpha, bw = self.alpha_us[kind], self.busbw_gbps[kind]
        table = self.collectives.get(kind) or {}
        if table:
            best = min(table, key=lambda s: (abs(int(s) - n), int(s)))
            alpha = table[best].get("alpha_us", alpha)
            bw = table[best].get("busbw_gbps", bw)
        return alpha, bw

    def to_json(self) -> dict[str, Any]:
        """The profile as a JSON-able dict that ``CostProfile.load`` reads back equal."""
        return asdict(self)

    def save(self, path: str | Path) -> Path:
        """Write ``to_json()`` to ``path`` (indented JSON); return the path."""
        p = Path(path)
        p.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return p

    def reorder_copy_s(self, nbytes: int) -> float:
        """Seconds of one local reorder copy of ``nbytes`` (launch + read and write at hbm)."""
        return self.launch_us * 1e-6 + 2 * nbytes / (self.hbm_gbps * 1e9)

    def ps(self, us: float) -> int:
        return int(round(us * 1e6))


def _read_profile(spec: str | Path) -> Any:
    """JSON of a profile file, or of the built-in profile named ``spec``."""
    p = Path(spec)
    if not p.is_file() and isinstance(spec, str) and spec in builtin_profiles():
        text = (resources.files("reshard") / "profiles" / f"{spec}.json").read_text()
        return json.loads(text)
    if not p.is_file():
        raise ReshardError(f"cost profile {str(spec)!r}: no such file, and not a built-in profile "
                           f"(built-in: {builtin_profiles()})")
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ReshardError(f"cost profile {spec}: cannot read JSON ({e})") from e


def _check_collectives(table: Any) -> dict[str, dict[str, dict[str, float]]]:
    """Validate and normalize ``collectives``: team sizes become decimal strings."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind, sizes in table.items():
        if kind not in KIND:
            raise ReshardError(f"cost profile: collectives has unknown collective kind {kind!r}; known: {list(KIND_NAMES)}")
        if not isinstance(sizes, dict):
            raise ReshardError(f"cost profile: collectives[{kind!r}] must map team sizes to "
                               f'{{"alpha_us": .., "busbw_gbps": ..}}, got {sizes!r}')
        out[kind] = {}
        for n, entry in sizes.items():
            try:
                size = int(n)
            except (TypeError, ValueError):
                size = 0
            if isinstance(n, bool) or size < 1 or str(n).strip() != str(size):
                raise ReshardError(f"cost profile: collectives[{kind!r}] team size {n!r} is not a positive integer")
            if not isinstance(entry, dict) or not entry or set(entry) - set(_ENTRY_KEYS):
                raise ReshardError(f"cost profile: collectives[{kind!r}][{n!r}] must be an object with keys "
                                   f"from {list(_ENTRY_KEYS)}, got {entry!r}")
            out[kind][str(size)] = {k: _number(f"collectives[{kind!r}][{n!r}].{k}", v, positive=k == "busbw_gbps")
                                    for k, v in entry.items()}
    return out
