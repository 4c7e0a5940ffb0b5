"""A disk that refuses writes (full, over quota, read-only, failing) never fails a run.

The faults are simulated where a put meets the disk: creating, writing and renaming the temp file,
creating the entry folder, the index rows, the eviction and the commit, and in a statistics flush.
test_disk_full.py fills a real (tmpfs) disk.
"""
from __future__ import annotations

import errno
import logging
import os
import sqlite3

import numpy as np
import pytest

from tests.store.store_helpers import SPEC, SPEC2, gram, rec_id
from wavetrain.core.errors import CacheError
from wavetrain.store import FeatureStore, _format, _index, entry_bytes
from wavetrain.store._index import StoreIndex
from wavetrain.store._paths import entry_path, iter_entry_files

LOGGER = "wavetrain.store"
ENOSPC = OSError(errno.ENOSPC, "No space left on device")
FULL = "database or disk is full"


def _rows(store):
    return set(store._index.query("SELECT spec, rec FROM entries"))


def _files(root):
    return {(spec, rec) for spec, rec, _ in iter_entry_files(root)}


def check_consistent(store, root):
    """Every row has its file and every file its row; no temp file is left; the byte counter
    equals the files' bytes."""
    assert _rows(store) == _files(root)
    assert list((root / "tmp").iterdir()) == []
    assert store.info()["bytes"] == sum(p.stat().st_size for _, _, p in iter_entry_files(root))


def warnings_logged(caplog):
    return [r for r in caplog.records
            if r.levelno >= logging.WARNING and "cannot write" in r.getMessage()]


class FailingCommit:
    """The index connection, except that the disk refuses the commit of any transaction that ran a
    statement starting with ``prefix`` (a put's ``INSERT INTO entries``, a flush's ``UPDATE
    counters``); other transactions (the undo of a failed put) commit."""

    def __init__(self, conn, prefix, error=None):
        self._conn, self._prefix, self._hit = conn, prefix, False
        self._error = error or sqlite3.OperationalError(FULL)

    def execute(self, sql, *args):
        if sql.startswith("BEGIN"):
            self._hit = False
        elif sql.startswith(self._prefix):
            self._hit = True
        elif sql == "COMMIT" and self._hit:
            raise self._error
        return self._conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def _fail_create_tmp(m, store):
    real = os.open
    tmp_dir = str(store.root / "tmp")
    m.setattr(os, "open", lambda path, *a, **k: (_ for _ in ()).throw(ENOSPC)
              if str(path).startswith(tmp_dir) else real(path, *a, **k))


def _fail_write(m, store):
    def write_entry(f, data, **kw):                  # the disk fills up half-way through the data
        f.write(_format.pack_header(data))
        f.write(memoryview(data).cast("B")[: data.nbytes // 2])
        raise OSError(errno.ENOSPC, "No space left on device")
    m.setattr(_format, "write_entry", write_entry)


def _fail_makedirs(m, store):
    def makedirs(*a, **k):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")
    m.setattr(os, "makedirs", makedirs)


def _fail_replace(m, store):
    def replace(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    m.setattr(os, "replace", replace)


def _fail_upsert(m, store):
    def upsert(*a, **k):                             # after the file was moved into place
        raise sqlite3.OperationalError(FULL)
    m.setattr(StoreIndex, "upsert", upsert)


def _fail_commit(m, store):
    st = store._index._ensure_open()
    m.setattr(st, "conn", FailingCommit(st.conn, "INSERT INTO entries"))


FAULTS = {"create_tmp": _fail_create_tmp, "write": _fail_write, "makedirs": _fail_makedirs,
          "replace": _fail_replace, "index_row": _fail_upsert, "commit": _fail_commit}
#: Faults that strike before the new file replaces an older entry of the same key.
BEFORE_RENAME = {"create_tmp", "write", "makedirs", "replace"}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_refused_put_returns_the_gram_and_leaves_nothing(root, caplog, monkeypatch, fault):
    store = FeatureStore(root)
    store.put(rec_id(1), SPEC, gram(1))                # stored before the disk filled up
    store.put(rec_id(2), SPEC2, gram(2))               # to be replaced while the disk is full
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with monkeypatch.context() as m:
        FAULTS[fault](m, store)
        for i in (3, 4, 5):                            # new keys in a new spec folder
            a = gram(i)
            g = store.put(rec_id(i), SPEC2, a)
            np.testing.assert_array_equal(g, a)
            assert g.dtype == np.float32 and not g.flags.writeable and a.flags.writeable
            assert not np.shares_memory(g, a)
            assert not entry_path(root, rec_id(i), SPEC2).exists()
            assert (SPEC2, rec_id(i)) not in _rows(store)
            assert list((root / "tmp").iterdir()) == []
        np.testing.assert_array_equal(store.put(rec_id(2), SPEC2, gram(20)), gram(20))
        # reads keep working while writes fail
        np.testing.assert_array_equal(store.get(rec_id(1), SPEC), gram(1))
        assert store.get(rec_id(3), SPEC2) is None
    assert store.write_errors == 4
    assert len(warnings_logged(caplog)) == 1
    message = warnings_logged(caplog)[0].getMessage()
    assert str(root) in message and "store root" in message and "WAVETRAIN_CACHE" in message
    assert "--cache" not in message and "\n" not in message
    if fault in BEFORE_RENAME:
        assert "No space" in message or "quota" in message
    else:
        assert FULL in message
    # the replaced key: its old entry where the fault struck before the rename, else gone
    old = store.get(rec_id(2), SPEC2)
    if fault in BEFORE_RENAME:
        np.testing.assert_array_equal(old, gram(2))
    else:
        assert old is None
    check_consistent(store, root)
    # the disk has room again: puts store as before
    store.put(rec_id(6), SPEC2, gram(6))
    np.testing.assert_array_equal(store.get(rec_id(6), SPEC2), gram(6))
    np.testing.assert_array_equal(FeatureStore(root).get(rec_id(6), SPEC2), gram(6))
    check_consistent(store, root)
    assert store.write_errors == 4 and len(warnings_logged(caplog)) == 1


def test_large_gram_comes_back_in_memory(root, monkeypatch):
    store = FeatureStore(root, mmap_min_bytes=0)
    with monkeypatch.context() as m:
        _fail_commit(m, store)
        g = store.put(rec_id(1), SPEC, gram(1))
    assert not isinstance(g, np.memmap) and not g.flags.writeable
    np.testing.assert_array_equal(g, gram(1))
    assert isinstance(store.put(rec_id(1), SPEC, gram(1)), np.memmap)


def test_refused_eviction_leaves_no_row_without_its_file(root, monkeypatch, entries_only):
    """The index refuses a write half-way through an eviction: the put is rolled back, and the rows
    of the files already deleted are dropped (in a transaction of their own)."""
    e = entry_bytes(100, 64)
    store = FeatureStore(root, max_bytes=3 * e)
    for i in range(3):
        store.put(rec_id(i), SPEC, gram(i))
    calls = []
    real = StoreIndex.delete

    def delete(conn, spec, rec):
        calls.append(rec)
        if len(calls) == 2:                            # the second victim: the disk is full
            raise sqlite3.OperationalError(FULL)
        real(conn, spec, rec)

    with monkeypatch.context() as m:
        m.setattr(StoreIndex, "delete", staticmethod(delete))
        big = gram(9, (250, 64))
        np.testing.assert_array_equal(store.put(rec_id(9), SPEC, big), big)
    assert store.write_errors == 1
    assert not store.contains(rec_id(9), SPEC)
    check_consistent(store, root)
    # the files of victims 0 and 1 were deleted before the index refused the row of victim 1
    assert _rows(store) == {(SPEC, rec_id(2))}
    store.put(rec_id(9), SPEC, gram(9, (250, 64)))      # and later evictions work
    assert store.contains(rec_id(9), SPEC) and store.info()["bytes"] <= 3 * e
    check_consistent(store, root)


def test_refused_statistics_flush_is_counted_once_and_retried(root, caplog, monkeypatch):
    store = FeatureStore(root)
    store.put(rec_id(1), SPEC, gram(1, (4, 4)))
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with monkeypatch.context() as m:
        m.setattr(_index, "FLUSH_AFTER_S", 0.0)        # a flush is due on every read
        st = store._index._ensure_open()
        m.setattr(st, "conn", FailingCommit(st.conn, "UPDATE counters"))
        for _ in range(200):
            np.testing.assert_array_equal(store.get(rec_id(1), SPEC), gram(1, (4, 4)))
        assert store.get(rec_id(2), SPEC) is None
        info = store.info()                            # flushes first: refused, not raised
        assert (info["hits"], info["misses"]) == (0, 0)
    assert store.write_errors == 1 and len(warnings_logged(caplog)) == 1   # retries are not new refusals
    info = store.info()                                # nothing was lost: written when possible
    assert (info["hits"], info["misses"]) == (200, 1)
    store.get(rec_id(1), SPEC)                         # an exit-time flush that fails is counted
    st = store._index._ensure_open()
    st.conn = FailingCommit(st.conn, "UPDATE counters")
    errors = store.write_errors
    store.close()
    assert store.write_errors == errors + 1 and len(warnings_logged(caplog)) == 1


def test_refused_removal_of_a_corrupt_entry_is_still_a_miss(root, monkeypatch):
    store = FeatureStore(root)
    store.put(rec_id(1), SPEC, gram(1))
    entry_path(root, rec_id(1), SPEC).write_bytes(b"garbage")
    with monkeypatch.context() as m:
        st = store._index._ensure_open()
        m.setattr(st, "conn", FailingCommit(st.conn, "DELETE FROM entries"))
        assert store.get(rec_id(1), SPEC) is None      # the file is removed, its row stays
        assert store.get(rec_id(1), SPEC) is None
    assert store.write_errors >= 1
    assert store.get(rec_id(1), SPEC) is None          # and the row goes once writes work
    check_consistent(store, root)


@pytest.mark.parametrize("error", [sqlite3.OperationalError(FULL),
                                   sqlite3.OperationalError("disk I/O error"),
                                   OSError(errno.ENOSPC, "No space left on device")])
def test_index_that_cannot_be_created_is_a_cache_error(root, monkeypatch, error):
    def refuse(self, *args):
        raise error
    monkeypatch.setattr(_index._ProcessState, "_open", refuse)
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(CacheError) as exc:
        FeatureStore(root)
    message = str(exc.value)
    assert "\n" not in message and str(root) in message and "free space" in message
    assert (error.strerror if isinstance(error, OSError) else str(error)) in message
    assert len(os.listdir("/proc/self/fd")) == fds      # the lock file was closed again


def test_a_busy_database_is_not_a_refused_write(root, monkeypatch):
    """Another process holding the index (SQLite 'database is locked') defers the statistics
    flush without counting a write error or warning."""
    store = FeatureStore(root)
    store.put(rec_id(1), SPEC, gram(1, (4, 4)))
    with monkeypatch.context() as m:
        m.setattr(_index, "FLUSH_AFTER_S", 0.0)
        st = store._index._ensure_open()
        m.setattr(st, "conn", FailingCommit(st.conn, "UPDATE counters",
                                            sqlite3.OperationalError("database is locked")))
        for _ in range(5):
            store.get(rec_id(1), SPEC)
    assert store.write_errors == 0
    assert store.info()["hits"] == 5
