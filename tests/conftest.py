import logging
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("WAVETRAIN_PROGRESS", "0")

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
SPOKEN = SHARED / "spoken-words"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Never touch the user's feature store from tests."""
    monkeypatch.setenv("WAVETRAIN_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(autouse=True)
def _logging_restored():
    """Undo what a test's ``wavetrain`` command did to the root logger: ``main`` configures it with
    ``force=True``, binding a handler to that test's captured stderr, which is closed once the test
    ends; a later test's log record would then reach a closed stream (and py4j's DEBUG records,
    formatted through the JVM, recurse through ``handleError`` for minutes)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in root.handlers:
        if h not in handlers:
            root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)


@pytest.fixture(scope="session")
def demo_csv(tmp_path_factory):
    """A small synthetic machine-sound data set (3 states x 2 speeds x 2 noise levels x 2 machines)."""
    from wavetrain.data.demo import make_demo_dataset

    return make_demo_dataset(tmp_path_factory.mktemp("demo"), per_combo=2, speeds=(15.0, 30.0),
                             snrs=(10.0, 20.0), seconds=1.0)


def tone(freq=440.0, rate=16000, seconds=1.0, amp=0.5):
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)
