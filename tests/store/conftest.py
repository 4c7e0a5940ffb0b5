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
