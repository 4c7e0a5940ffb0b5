"""``max_bytes`` bounds everything the store keeps on disk, not just its entries.

With SQLite's default checkpoint the write-ahead log alone reached 4.1 MB, and a store bounded to
1 MiB grew to 5.3 MB (what the trial's ``--cache-limit 1M`` did to a 2 MB disk).
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tests.store.store_helpers import SPEC, rec_id
from wavetrain.store import FeatureStore, entry_bytes
from wavetrain.store._index import COMMIT_RESERVE_PAGES
from wavetrain.store._paths import FILE_FACTS_NAME, INDEX_NAME

SHAPE = (64, 16)


def _gram(i):
    return np.full(SHAPE, float(i), np.float32)


def folder_bytes(root) -> int:
    """Bytes of every file under ``root`` (entries, tmp/, .lock, CACHEDIR.TAG, SQLite files)."""
    total = 0
    for where, _dirs, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(where, name)).st_size
    return total


@pytest.fixture
def file_facts_memo(root):
    """The file facts memo in the store folder, as the CLI keeps it (open, with its log)."""
    from wavetrain.data import file_facts

    root.mkdir(parents=True)
    sample = root.parent / "sample.wav"
    sample.write_bytes(b"RIFF")
    st = os.stat(sample)
    file_facts.use(root / FILE_FACTS_NAME)
    try:
        for i in range(1000):
            file_facts.put(f"/data/recording-{i:05d}.wav", st, "sha1", f"{i:040x}",
                           seen_ns=time.time_ns() + 10**10)
        file_facts.flush()
        yield root / FILE_FACTS_NAME
    finally:
        file_facts.use(None)


def test_folder_stays_within_max_bytes(root, file_facts_memo):
    max_bytes = 1 << 20
    store = FeatureStore(root, max_bytes=max_bytes)
    assert os.path.getsize(file_facts_memo) + os.path.getsize(f"{file_facts_memo}-wal") > 100_000
    # Not counted: the empty .lock, and the log frames a commit writes beyond the reserved
    # COMMIT_RESERVE_PAGES (up to 12 measured when a table grows a level): four frames.
    allowance = 4 * store._index.frame_bytes
    worst = wal = 0
    for i in range(3000):
        store.put(rec_id(i), SPEC, _gram(i))
        if i % 100 == 99:
            worst = max(worst, folder_bytes(root))
            wal = max(wal, os.path.getsize(root / f"{INDEX_NAME}-wal"))
            assert worst <= max_bytes + allowance, (i, worst)
    assert store.evicted > 2000
    assert store.info()["entries"] * entry_bytes(*SHAPE) > max_bytes // 2   # still a cache
    # the log is checkpointed at 16 pages (64 KiB) here, not SQLite's default 1000 (4 MB)
    assert wal <= (16 + 2 * COMMIT_RESERVE_PAGES) * store._index.frame_bytes, wal


def test_index_files_alone_over_the_bound_store_nothing(root, caplog):
    """When the index files alone exceed max_bytes, every entry goes and nothing is stored."""
    store = FeatureStore(root, max_bytes=1 << 20)
    for i in range(20):
        store.put(rec_id(i), SPEC, _gram(i))
    assert store.info()["entries"] == 20
    (root / FILE_FACTS_NAME).write_bytes(bytes(1 << 20))   # e.g. a memo of a huge data set
    caplog.set_level("INFO", logger="wavetrain.store")
    for i in range(20, 25):
        g = store.put(rec_id(i), SPEC, _gram(i))
        np.testing.assert_array_equal(g, _gram(i))
        assert not g.flags.writeable
    assert store.info()["entries"] == 0 and store.not_stored == 5 and store.evicted == 20
    assert not list(root.rglob("*.gram"))
    assert "does not fit" in caplog.text
    (root / FILE_FACTS_NAME).unlink()
    store.put(rec_id(30), SPEC, _gram(30))
    assert store.contains(rec_id(30), SPEC)


def test_gram_that_fits_alone_but_not_beside_the_index_files(root):
    store = FeatureStore(root, max_bytes=1 << 20)
    store.put(rec_id(1), SPEC, _gram(1))
    big = np.zeros(((1 << 20) // 256 - 1, 64), np.float32)    # just under 1 MiB with its header
    assert entry_bytes(*big.shape) <= 1 << 20
    np.testing.assert_array_equal(store.put(rec_id(2), SPEC, big), big)
    assert not store.contains(rec_id(2), SPEC) and store.not_stored == 1
    assert store.contains(rec_id(1), SPEC)                 # the cache was not wiped for it


def test_unbounded_store_counts_nothing(root, monkeypatch):
    """Without max_bytes no file is measured on put."""
    store = FeatureStore(root)
    calls = []
    monkeypatch.setattr(FeatureStore, "_index_bytes", lambda self: calls.append(1) or 0)
    store.put(rec_id(1), SPEC, _gram(1))
    assert calls == []
