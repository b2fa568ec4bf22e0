"""Plans cached on disk, so that ``optimize()`` of a program planned before is instant.

The law: a cached plan is returned only for a key equal to the one it was stored under, and
the key covers everything that decides the plan:

* the Fusion, serialized canonically (``fusion_spec``): every tensor (name, shape, dtype,
  mesh devices and axis names, its sharding when fixed), every op (kind, operands, result,
  attributes in sorted order), the outputs and their shardings;
* the cost profile's content (``CostProfile.to_json``: a profile given by path or name is
  keyed by what it says, not where it lives);
* the options of ``optimize`` that change the plan: ``limits``, ``extractor``,
  ``ilp_time_limit_s``, ``memory_budget``, ``comm_budget``;
* the invalidation stamp (``stamp``): reshard's version and a sha256 of every source file of
  the ``reshard`` package that runs (any code change invalidates every plan), and the versions
  of Python, egglog, scipy and torch.

A part that does not serialize stably (an attribute or profile entry of a type the canonical
form does not know, a Fusion carrying state beyond its tensors, ops, inputs and outputs) makes
the call uncached (``key`` is None): a miss, never a wrong hit.  A plan the clock decided is not
stored: one whose call ran past ``limits.time_limit_s`` (saturation, the sharing search or the
ILP were cut by time) or whose ILP did not prove optimality (HiGHS's own time limit), since an
equal key need not give that plan again.

Where: ``$RESHARD_PLAN_CACHE`` when it is a path; ``off`` or ``0`` there disables the cache;
else ``$XDG_CACHE_HOME/reshard/plans``, else ``~/.cache/reshard/plans``.  One file per key
(``<key>.pkl``: the key and the plan, pickled), written atomically (a temporary file, then
``os.replace``).  A file that does not load, or holds another key, is removed and counts as a
miss, never an error.  Files are pickles, loaded as code is: the directory must be the user's.
A stored plan carries its priced alternatives (they need the e-graph, which is not stored), so
``explain()`` of a cached plan is the fresh plan's; its ``report`` is the fresh plan's with
``cached`` set.  ``optimize(..., cache=False)`` neither reads nor writes; ``cache=True`` caches
even when the environment turns the cache off (in the default directory then).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import pickle
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .codegen.lower import LoweredPlan
from .extract.extract_ilp import ExtractionReport
from .ir.errors import ReshardError
from .ir.fusion import Fusion
from .ir.mesh import DeviceMesh
from .ir.sharding import TensorSharding, sharding_to_spec
from .rules.cost_profile import CostProfile
from .search.saturate import Limits, SaturationReport

#: the environment variable naming the cache directory (or turning the cache off)
ENV = "RESHARD_PLAN_CACHE"
OFF = ("off", "0")
#: the attributes a Fusion has (``Fusion.__init__``); one with more is not keyed
_FUSION_STATE = {"tensors", "ops", "inputs", "outputs", "producer"}


class Unstable(Exception):
    """A value the canonical form does not know (the call is not cached)."""


class CachedPlan(Protocol):
    """What the cache reads of a plan (a ``reshard.Plan``; this module sits under ``plan``)."""

    report: SaturationReport
    extraction: ExtractionReport | None
    lowered: LoweredPlan


P = TypeVar("P", bound=CachedPlan)


def canonical(v: Any) -> Any:
    """``v`` as JSON-able data equal for equal values and different for different ones
    (containers and reshard's values tagged by type); ``Unstable`` for anything else."""
    if v is None or type(v) in (bool, int, float, str):
        return v
    if type(v) in (tuple, list):
        return [type(v).__name__, [canonical(x) for x in v]]
    if type(v) is dict:
        if any(type(k) is not str for k in v):
            raise Unstable(f"a dict key that is not a str in {v!r}")
        return ["dict", [[k, canonical(v[k])] for k in sorted(v)]]
    if type(v) is TensorSharding:
        return ["sharding", canonical(sharding_to_spec(v))]
    if type(v) is DeviceMesh:
        return ["mesh", canonical((v.shape, v.ranks, v.axis_names))]
    raise Unstable(f"{type(v).__name__} {v!r}")


def fusion_spec(fusion: Fusion) -> Any:
    """The canonical form of ``fusion`` (see the module docstring)."""
    if type(fusion) is not Fusion or set(vars(fusion)) != _FUSION_STATE:
        raise Unstable(f"a Fusion with state {sorted(vars(fusion))}")
    tensors = [(t.id, t.name, t.shape, t.dtype, t.mesh, t.sharding) for t in fusion.tensors]
    ops = [(op.index, op.kind, op.inputs, op.output, op.attrs) for op in fusion.ops]
    return canonical({"tensors": tensors, "ops": ops, "inputs": fusion.inputs, "outputs": fusion.outputs})


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


@lru_cache(maxsize=1)
def stamp() -> str:
    """The invalidation stamp (computed once per process): reshard's version, a sha256 over
    every ``.py`` and ``.json`` file of the package that runs (relative path and content),
    and the versions of Python, egglog, scipy and torch."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(q for ext in ("*.py", "*.json") for q in root.rglob(ext)):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    versions = {d: _version(d) for d in ("reshard", "egglog", "scipy", "torch")}
    return json.dumps({"sources": h.hexdigest(), "python": sys.version, **versions}, sort_keys=True)


def key(fusion: Fusion, profile: CostProfile, limits: Limits, options: dict[str, Any]) -> str | None:
    """The sha256 key of one optimize() call (``options``: its other plan-deciding arguments),
    or None when some part does not serialize stably."""
    try:
        body = [stamp(), fusion_spec(fusion), canonical(profile.to_json()), canonical(asdict(limits)),
                canonical(options)]
    except Unstable:
        return None
    return hashlib.sha256(json.dumps(body, separators=(",", ":")).encode()).hexdigest()


def directory(cache: bool | None) -> Path | None:
    """Where plans are cached for ``optimize(..., cache=cache)``; None: not at all."""
    if cache is not None and not isinstance(cache, bool):
        raise ReshardError(f"optimize: cache must be True, False or None (follow ${ENV}), got {cache!r}")
    env = os.environ.get(ENV, "").strip()
    off = env.lower() in OFF
    if cache is False or (cache is None and off):
        return None
    if env and not off:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "reshard" / "plans"


@dataclass
class Slot:
    """One optimize() call's place in the cache: ``path`` is None when it is not cached.
    ``plan`` is the cached plan (None: a miss); ``store`` keeps the plan the call made."""

    path: Path | None
    key: str | None
    started: float
    time_limit_s: float | None
    plan: CachedPlan | None = None

    def store(self, plan: P) -> P:
        """Store ``plan`` unless the clock decided it (module docstring); returns it."""
        if self.path is None or plan.report.cut or (
                self.time_limit_s is not None and time.perf_counter() - self.started > self.time_limit_s):
            return plan
        ex = plan.extraction
        if ex is not None and ex.extractor == "ilp" and not ex.optimal:
            return plan
        for node in plan.lowered.nodes:
            _ = node.alternatives  # priced now: the pricing needs the e-graph, which is not stored
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                pickle.dump((self.key, plan), fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self.path)
        except OSError as e:
            warnings.warn(f"reshard plan cache: could not write {self.path} ({e}); the plan is not cached",
                          stacklevel=3)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)  # (gone after os.replace)
        return plan


def _load(path: Path, want: str) -> CachedPlan | None:
    """The plan stored at ``path`` under key ``want``, or None (a file that does not load or
    holds another key is removed)."""
    try:
        with open(path, "rb") as fh:
            got, plan = pickle.load(fh)
        if got == want:
            plan.report.cached = True
            return plan
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - any unreadable file is a miss
        pass
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def lookup(cache: bool | None, fusion: Fusion, cost_profile: Any, limits: Limits, **options: Any) -> Slot:
    """The cache slot of ``optimize(fusion, cost_profile=..., limits=..., **options, cache=cache)``
    (``options``: the other arguments that decide the plan), with the cached plan if there is
    one.  ``cache`` that is not a bool or None is a ``ReshardError``."""
    started = time.perf_counter()
    where = directory(cache)
    k = None if where is None else key(fusion, CostProfile.load(cost_profile), limits, options)
    if where is None or k is None:
        return Slot(None, None, started, limits.time_limit_s)
    path = where / f"{k}.pkl"
    return Slot(path, k, started, limits.time_limit_s, _load(path, k))
