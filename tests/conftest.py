"""Suite hygiene: the whole suite runs in one process on CI's small machine, so after each test
module the e-graphs and plans its module-level caches hold are dropped and the freed memory goes
back to the operating system (glibc keeps freed arenas otherwise).

The plan cache (``reshard.plan_cache``) is a fresh directory per session (set at import, before
any test module plans at collection, and inherited by the subprocesses tests start; pytest-xdist's
workers share their controller's), so no user's cache decides a test.  A test marked ``gpu`` is skipped where torch sees no CUDA device.  A test that uses ``monkeypatch`` may patch the planner, which the
cache key does not see: its plans are neither read from the cache nor written to it.

Extraction's second core (``reshard.extract.second_core``) is off in the suite's process: two
workers on CI's 2 cores leave none spare, and finding that out (``spare_cpu``'s looks, 50 ms of
measured idle time) or forking the worker for a tiny plan cost more than the candidate it
finishes ahead (the rule sweeps and the ATen sweep ran 1.5-2x longer).  The plan is the same
either way (``extract.extract.choose``'s law); ``tests/extract/test_second_core.py`` and
``tests/search/test_determinism.py`` turn it on where they check that."""

from __future__ import annotations

import ctypes
import gc
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
import torch

from reshard.extract import second_core
from reshard.ir.tensor_cache import clear_tensor_caches
from reshard.plan_cache import ENV as PLAN_CACHE_ENV
from reshard.runtime.distributed import START_METHOD_ENV

_PREFIX = "reshard-test-plans-"
#: pytest-xdist's worker id (set before the worker reads this file), None outside a worker
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_INHERITED = os.environ.get(PLAN_CACHE_ENV, "")
#: this session's plan cache: under pytest-xdist the controller's, which its workers inherit, so
#: a plan one worker made is read by the other (writes are atomic: ``plan_cache``); only the
#: process that made the directory removes it
OWN_CACHE = not (WORKER and os.path.basename(_INHERITED).startswith(_PREFIX) and os.path.isdir(_INHERITED))
PLAN_CACHE = tempfile.mkdtemp(prefix=_PREFIX) if OWN_CACHE else _INHERITED
os.environ[PLAN_CACHE_ENV] = PLAN_CACHE
#: ``reshard.launch`` forks its ranks from a server that imported torch once (``forkserver``)
#: instead of starting an interpreter per rank: seconds saved per multi-process test; the tests of
#: ``launch`` itself name their start method
os.environ.setdefault(START_METHOD_ENV, "forkserver")
second_core.SECOND_CORE = False  # see the module docstring

#: module-level caches of saturated e-graphs (``_SAT``) and plans (``_PLANS``) that tests share within their module
MODULE_CACHES = ("_SAT", "_PLANS")


@pytest.fixture(autouse=True, scope="module")
def _release_module_memory(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    for name in MODULE_CACHES:
        cache = getattr(request.module, name, None)
        if isinstance(cache, dict):
            cache.clear()
    clear_tensor_caches()  # index tensors of the module's plans
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@pytest.fixture(autouse=True)
def _no_plan_cache_under_monkeypatch(request: pytest.FixtureRequest) -> None:
    """A test using ``monkeypatch`` plans without the cache (an autouse fixture runs before the
    test's own fixtures, so a test may still set ``RESHARD_PLAN_CACHE`` itself)."""
    if "monkeypatch" in request.fixturenames:
        request.getfixturevalue("monkeypatch").setenv(PLAN_CACHE_ENV, "off")


#: the files of longest running time, longest first (the whole suite's ``--durations=0`` summed by
#: file, two workers on 2 shared cores, extraction's second core off: training on gloo processes,
#: Hugging Face models, fuzzing, exact extraction, the ATen sweep and planning training stacks)
LONGEST_FILES = (
    "tests/train/test_train.py",
    "tests/frontend/test_hf_models.py",
    "tests/fuzz/test_fuzz.py",
    "tests/extract/test_extract_ilp.py",
    "tests/frontend/test_aten_core.py",
    "tests/extract/test_layer_reuse.py",
    "tests/frontend/test_from_torch_ops.py",
    "tests/runtime/test_launch_liveness.py",
    "tests/lower/test_fuse.py",
    "tests/runtime/test_gpu_multi.py",
    "tests/rules/test_propagation.py",
    "tests/train/test_train_hf.py",
    "tests/train/test_train_torchrun.py",
    "tests/lower/test_memory_plan.py",
    "tests/runtime/test_distributed_gloo.py",
    "tests/rules/test_attention.py",
    "tests/search/test_segments.py",
    "tests/ops/test_op_sweep.py",
    "tests/search/test_determinism.py",
    "tests/ir/test_grad_buckets.py",
    "tests/search/test_limits.py",
    "tests/ir/test_nested_uneven.py",
    "tests/train/test_gpu_train_multi.py",
    "tests/rules/test_lookup_scatter.py",
)
#: a test's expected work by its markers (``slow``: 5 s or more on CI's 2 cores; ``multiproc``:
#: starts processes; ``hf``: builds Hugging Face models), any other test's 1
MARKER_WEIGHTS = {"slow": 10, "multiproc": 10, "hf": 3}


def _weight(item: pytest.Item, gpu: bool) -> int:
    if not gpu and item.get_closest_marker("gpu"):
        return 0  # skipped
    return max([w for m, w in MARKER_WEIGHTS.items() if item.get_closest_marker(m)], default=1)


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist hands out the files in collection order (``_longest_files_first``), not by
    its own count of tests per file."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _longest_files_first(items: list[pytest.Item], gpu: bool) -> None:
    """``LONGEST_FILES`` first, then the files with the most expected work (``MARKER_WEIGHTS``),
    each file's tests in their order: pytest-xdist's ``--dist loadfile`` gives a worker the next
    file when it is done with one, so a long file handed out last is the run's tail, one worker
    busy and the other idle (pytest-xdist's own order, the files with most tests first, put the
    long files of few tests last)."""
    weight: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        weight[path] = weight.get(path, 0) + _weight(item, gpu)
        first.setdefault(path, i)
    rank = {path: i for i, path in enumerate(LONGEST_FILES)}

    def key(item: pytest.Item) -> tuple[int, int, int]:
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(rank)), -weight[path], first[path]

    items.sort(key=key)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``gpu`` is skipped where torch sees no CUDA device; the longest files run
    first."""
    gpu = torch.cuda.is_available()
    _longest_files_first(items, gpu)
    if gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if OWN_CACHE:
        shutil.rmtree(PLAN_CACHE, ignore_errors=True)
