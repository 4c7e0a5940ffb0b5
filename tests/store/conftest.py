"""Fixtures of the store tests."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Never touch the user's real cache folder."""
    monkeypatch.setenv("WAVETRAIN_CACHE", str(tmp_path / "default-cache"))


@pytest.fixture
def root(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def entries_only(monkeypatch):
    """Leave the index files out of ``max_bytes``, for tests of eviction order that count whole
    entries (the index files alone take more than the few entries such a bound holds).  The bound
    on everything in the folder is tested in test_disk_bound.py."""
    from wavetrain.store import FeatureStore

    monkeypatch.setattr(FeatureStore, "_index_bytes", lambda self: 0)
