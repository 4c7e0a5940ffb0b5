"""A real full disk: a 1 MiB tmpfs filled by the store itself, or by another file.

Mounting needs root (and a container that allows it); elsewhere these tests are skipped.
"""
from __future__ import annotations

import gc
import logging
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.store.store_helpers import SPEC, rec_id
from tests.store.test_write_errors import check_consistent, warnings_logged
from wavetrain.core.errors import CacheError
from wavetrain.store import FeatureStore

SHAPE = (64, 16)                          # 4 KiB of data: a 1 MiB disk holds a few hundred


def _gram(i):
    return np.full(SHAPE, float(i), np.float32)


@pytest.fixture
def small_disk(tmp_path):
    """A folder on a fresh 1 MiB tmpfs, unmounted after the test."""
    where = tmp_path / "disk"
    where.mkdir()
    if not sys.platform.startswith("linux") or shutil.which("mount") is None:
        pytest.skip("needs Linux mount(8) to make a small tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs (needs root and a container that allows "
                    f"mounts): {done.stderr.strip()}")
    try:
        yield where
    finally:
        gc.collect()                      # close stores the test left open
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)


def _fill(path):
    """Write zeros to ``path`` until the disk is full."""
    with open(path, "wb", buffering=0) as f:
        block = bytes(4096)
        try:
            while True:
                f.write(block)
        except OSError:
            pass


def test_store_filling_the_disk_goes_on_without_storing(small_disk, caplog):
    ballast = small_disk / "ballast"
    ballast.write_bytes(bytes(128 << 10))            # freed at the end: room again
    root = small_disk / "store"
    store = FeatureStore(root)                         # no size bound: the disk is the limit
    caplog.set_level(logging.DEBUG, logger="wavetrain.store")
    stored, refused = [], []
    for i in range(400):                               # 1.6 MiB of entries for a 1 MiB disk
        errors = store.write_errors
        g = store.put(rec_id(i), SPEC, _gram(i))       # never raises
        np.testing.assert_array_equal(g, _gram(i))
        assert not g.flags.writeable
        (refused if store.write_errors > errors else stored).append(i)
    assert len(stored) > 20 and len(refused) > 100, (len(stored), len(refused))
    assert len(warnings_logged(caplog)) == 1
    assert "No space left on device" in warnings_logged(caplog)[0].getMessage() \
        or "database or disk is full" in warnings_logged(caplog)[0].getMessage()
    for i in stored:                                   # everything stored reads back
        np.testing.assert_array_equal(store.get(rec_id(i), SPEC), _gram(i))
    for i in refused:
        assert store.get(rec_id(i), SPEC) is None
    check_consistent(store, root)
    ballast.unlink()                                   # space freed: puts store again
    store.put(rec_id(1000), SPEC, _gram(1000))
    np.testing.assert_array_equal(store.get(rec_id(1000), SPEC), _gram(1000))
    assert len(warnings_logged(caplog)) == 1
    store.close()


@pytest.mark.parametrize("before", ["nothing", "folder", "closed_store"])
def test_store_opened_on_a_full_disk_is_a_cache_error(small_disk, before):
    root = small_disk / "store"
    if before == "folder":                             # folder and tag made, index not yet
        (root / "tmp").mkdir(parents=True)
        (root / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    elif before == "closed_store":                     # its -wal and -shm were removed on close
        with FeatureStore(root) as store:
            store.put(rec_id(1), SPEC, _gram(1))
    _fill(small_disk / "filler")
    with pytest.raises(CacheError) as exc:
        FeatureStore(root)
    message = str(exc.value)
    assert "\n" not in message and str(root) in message and "free space" in message
    if before == "nothing":
        assert not (root / "CACHEDIR.TAG").exists()    # no empty tag left behind
