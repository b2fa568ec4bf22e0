"""Fixtures of the extraction tests."""

from __future__ import annotations

import os

import pytest

from reshard.extract import second_core


@pytest.fixture
def spare(monkeypatch):
    """A spare CPU, whatever else runs (the tests run beside each other), the second core on
    (the suite turns it off: ``tests/conftest.py``), for an extraction of any size; whether
    this platform forks at all."""
    monkeypatch.setattr(second_core, "spare_cpu", lambda: True)
    monkeypatch.setattr(second_core, "SECOND_CORE", True)
    monkeypatch.setattr(second_core, "FORK_MIN_ENODES", 0)
    return hasattr(os, "fork")
