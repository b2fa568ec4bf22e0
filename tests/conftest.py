"""Suite hygiene: the whole suite runs in one process on CI's small machine, so after each test
module the e-graphs and plans its module-level caches hold are dropped and the freed memory goes
back to the operating system (glibc keeps freed arenas otherwise).

The plan cache (``reshard.plan_cache``) is a fresh directory per session (set at import, before
any test module plans at collection, and inherited by the subprocesses tests start; pytest-xdist's
workers share their controller's), so no user's cache decides a test.  A test marked ``gpu`` is skipped where torch sees no CUDA device.  A test that uses ``monkeypatch`` may patch the planner, which the
cache key does not see: its plans are neither read from the cache nor written to it."""

from __future__ import annotations

import ctypes
import gc
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
import torch

from reshard.ir.tensor_cache import clear_tensor_caches
from reshard.plan_cache import ENV as PLAN_CACHE_ENV

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``gpu`` is skipped where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if OWN_CACHE:
        shutil.rmtree(PLAN_CACHE, ignore_errors=True)
