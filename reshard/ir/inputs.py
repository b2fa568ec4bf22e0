"""Validation of the tensors a plan is given, shared by every entry point.

``Plan.shard_inputs`` / ``Plan.simulate`` check global inputs (by Fusion input name) and the
multi-process runtime (``Plan.run``, ``DistRuntime.run``) checks each rank's local inputs
(by program buffer) with the same ``check_inputs``: a mapping whose keys are exactly the
expected names (an unknown key is named, with the likely intended name; a missing one too),
each value a ``torch.Tensor`` (not a NumPy array) of exactly the expected shape and dtype.
Nothing is cast: a float32 tensor for a float64 input is an error, not a silent copy.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping

import torch

from .errors import ReshardError
from .fusion import DTYPES

#: expected (shape, dtype) of one input; None: any tensor
Spec = tuple[tuple[int, ...], "str | torch.dtype"] | None


def _label(name: str, labels: Mapping[str, str] | None) -> str:
    other = (labels or {}).get(name)
    return f"{name!r} (input {other!r})" if other is not None and other != name else repr(name)


def _value_problem(what: str, label: str, value: object, spec: Spec) -> str | None:
    if type(value).__module__ == "numpy" or type(value).__name__ == "ndarray":
        return (f"{what} {label} is a NumPy array; pass a torch.Tensor (torch.from_numpy(a), with the "
                "expected dtype)")
    if not isinstance(value, torch.Tensor):
        return f"{what} {label} is {type(value).__name__}, not a torch.Tensor"
    if spec is None:
        return None
    shape, dtype = spec
    want = DTYPES[dtype] if isinstance(dtype, str) else dtype
    if value.dtype != want:
        return (f"{what} {label} has dtype {value.dtype}, the plan expects {want} (inputs are not cast; "
                f"convert it with .to({want}))")
    if tuple(value.shape) != tuple(shape):
        return f"{what} {label} has shape {tuple(value.shape)}, the plan expects {tuple(shape)}"
    return None


def _suggest(key: str, names: list[str]) -> str | None:
    """The name ``key`` most likely misspells (case-insensitive ``difflib`` match), if any."""
    lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(key.lower(), list(lower), n=1, cutoff=0.5)
    return lower[close[0]] if close else None


def check_inputs(given: object, expected: Mapping[str, Spec], where: str, *, what: str = "input",
                 required: Collection[str] | None = None, labels: Mapping[str, str] | None = None,
                 allow_unknown: bool = False) -> None:
    """Raise one ``ReshardError`` (prefixed ``where``) listing every problem with ``given``.

    ``given`` must be a mapping name -> ``torch.Tensor``.  Its keys must be names of
    ``expected``; an unknown key is named with the closest expected name (``difflib``) as a
    suggestion (with ``allow_unknown``, for a bare ``Program``, which may be given extra
    buffers, such keys only have to be tensors).  Every name of ``required`` (default: all
    of ``expected``) must be present.  Each value must be a tensor, of exactly the expected
    shape and dtype for an expected name (``expected[name]`` = ``(shape, dtype)``; None
    accepts any tensor).  ``what`` names
    the kind of input in messages ("input", "local input"); ``labels`` adds a second name
    (a buffer's Fusion input name)."""
    if not isinstance(given, Mapping):
        raise ReshardError(f"{where}: {what}s must be a dict name -> torch.Tensor, got {type(given).__name__}")
    required = list(expected) if required is None else list(required)
    missing = [n for n in required if n not in given]
    problems: list[str] = []
    for k in given:
        if k in expected or allow_unknown:
            continue
        close = _suggest(str(k), missing or list(expected))
        problems.append(f"unknown {what} {k!r}" + (f" (did you mean {close!r}?)" if close else ""))
    problems += [f"missing {what} {_label(n, labels)}" for n in missing]
    for k, v in given.items():
        p = _value_problem(what, _label(k, labels), v, expected.get(k))
        if p is not None:
            problems.append(p)
    if problems:
        names = sorted(required)
        shown = ", ".join(repr(n) for n in names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
        names_given = missing or (not allow_unknown and any(k not in expected for k in given))
        raise ReshardError(f"{where}: " + "; ".join(problems) + (f" (the plan takes {what}s [{shown}])"
                                                                 if names_given else ""))
