"""FeatureStore and NullStore: round trips, dtypes, counters, eviction, corruption, layout."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from tests.store.store_helpers import SPEC, SPEC2, gram, rec_id
from wavetrain.core.errors import CacheError, ParameterError, UserError
from wavetrain.store import (
    HEADER_BYTES,
    FeatureStore,
    NullStore,
    default_root,
    entry_bytes,
)
from wavetrain.store._paths import entry_path


@pytest.mark.parametrize("mmap_min_bytes, mapped", [(0, True), (None, False)])
def test_put_get_round_trip_is_read_only(root, mmap_min_bytes, mapped):
    kw = {} if mmap_min_bytes is None else {"mmap_min_bytes": mmap_min_bytes}
    store = FeatureStore(root, **kw)
    a = gram(1)
    stored = store.put(rec_id(1), SPEC, a)
    got = store.get(rec_id(1), SPEC)
    for g in (stored, got):
        assert isinstance(g, np.memmap) is mapped
        assert g.dtype == np.float32 and g.shape == (100, 64)
        np.testing.assert_array_equal(g, a)
        assert not g.flags.writeable
        with pytest.raises(ValueError):
            g[0, 0] = 1.0
    assert a.flags.writeable and not np.shares_memory(a, stored)


def test_large_grams_are_memory_mapped_by_default(root):
    store = FeatureStore(root)
    big = gram(1, (4096, 64))                        # 1 MiB of data
    assert isinstance(store.put(rec_id(1), SPEC, big), np.memmap)
    got = store.get(rec_id(1), SPEC)
    assert isinstance(got, np.memmap) and not got.flags.writeable
    np.testing.assert_array_equal(got, big)
    just_below = store.put(rec_id(2), SPEC, gram(2, (4095, 64)))
    assert not isinstance(just_below, np.memmap) and not just_below.flags.writeable


def test_holding_many_small_grams_holds_no_file_descriptors(root):
    store = FeatureStore(root)
    for i in range(300):
        store.put(rec_id(i), SPEC, gram(i, (20, 8)))
    before = len(os.listdir("/proc/self/fd"))
    held = [store.get(rec_id(i), SPEC) for i in range(300)]
    assert all(g is not None for g in held)
    assert len(os.listdir("/proc/self/fd")) - before < 10


def test_get_miss_returns_none_and_keys_are_separate(root):
    store = FeatureStore(root)
    store.put(rec_id(1), SPEC, gram(1))
    assert store.get(rec_id(2), SPEC) is None
    assert store.get(rec_id(1), SPEC2) is None
    np.testing.assert_array_equal(store.get(rec_id(1), SPEC), gram(1))


def test_entry_layout_under_spec_and_prefix_folders(root):
    store = FeatureStore(root)
    rid = "ab" + "0" * 38
    store.put(rid, SPEC, gram(1))
    path = root / SPEC / "ab" / (rid + ".gram")
    assert path.is_file()
    assert path.stat().st_size == entry_bytes(100, 64)
    assert (root / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")


def test_upper_case_keys_are_normalised(root):
    store = FeatureStore(root)
    store.put(rec_id(0xABC).upper(), SPEC.upper(), gram(1))
    assert store.contains(rec_id(0xabc), SPEC)


def test_float16_store(root):
    store = FeatureStore(root, dtype="float16")
    a = gram(3)
    g = store.put(rec_id(3), SPEC, a)
    got = store.get(rec_id(3), SPEC)
    assert g.dtype == np.float16 and got.dtype == np.float16
    np.testing.assert_allclose(got, a, rtol=1e-3, atol=1e-3)
    assert (got.astype(np.float32) * 2).dtype == np.float32      # usable as float32
    assert store.info()["bytes"] == entry_bytes(100, 64, "float16")
    # a float32 store reads float16 entries as they were stored
    assert FeatureStore(root).get(rec_id(3), SPEC).dtype == np.float16


def test_float16_overflow_warns(root):
    store = FeatureStore(root, dtype="float16")
    with pytest.warns(RuntimeWarning, match="float16"):
        g = store.put(rec_id(1), SPEC, np.full((2, 2), 1e6, np.float32))
    assert np.isinf(g).all()


def test_input_dtypes_are_converted(root):
    store = FeatureStore(root)
    g = store.put(rec_id(1), SPEC, np.arange(12, dtype=np.int64).reshape(3, 4))
    assert g.dtype == np.float32
    np.testing.assert_array_equal(g, np.arange(12).reshape(3, 4))
    f = np.asfortranarray(gram(2, (7, 5)).astype(np.float64))
    np.testing.assert_allclose(store.put(rec_id(2), SPEC, f), f, rtol=1e-6)


def test_empty_gram(root):
    store = FeatureStore(root)
    g = store.put(rec_id(1), SPEC, np.zeros((0, 64), np.float32))
    assert g.shape == (0, 64)
    assert store.get(rec_id(1), SPEC).shape == (0, 64)


@pytest.mark.parametrize("bad", [np.zeros(5), np.zeros((2, 2, 2)), np.zeros((2, 2), complex),
                                 np.array([["a"]])])
def test_put_rejects_non_grams(root, bad):
    with pytest.raises(CacheError, match="feature gram"):
        FeatureStore(root).put(rec_id(1), SPEC, bad)


@pytest.mark.parametrize("rid, spec", [("xyz" * 10, SPEC), ("abc", SPEC), (rec_id(1), "0123"),
                                       (rec_id(1), "g" * 16), (rec_id(1), None),
                                       ("../" + "a" * 20, SPEC)])
def test_bad_keys_are_rejected(root, rid, spec):
    store = FeatureStore(root)
    with pytest.raises(CacheError, match="hex"):
        store.get(rid, spec)
    with pytest.raises(CacheError, match="hex"):
        store.put(rid, spec, gram(1))


@pytest.mark.parametrize("kwargs", [{"dtype": "float64"}, {"dtype": "int8"}, {"max_bytes": -1},
                                    {"max_bytes": 1.5}, {"max_bytes": True},
                                    {"mmap_min_bytes": -1}])
def test_bad_parameters(root, kwargs):
    with pytest.raises(ParameterError, match="FeatureStore"):
        FeatureStore(root, **kwargs)


def test_root_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(CacheError, match="not a folder") as exc:
        FeatureStore(f)
    assert isinstance(exc.value, UserError)


def test_default_root_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("WAVETRAIN_CACHE", str(tmp_path / "w"))
    assert default_root() == tmp_path / "w"
    assert FeatureStore().root == tmp_path / "w"
    monkeypatch.delenv("WAVETRAIN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_root() == tmp_path / "xdg" / "wavetrain"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_root() == tmp_path / "home" / ".cache" / "wavetrain"


def test_counters_info_and_persistence(root):
    store = FeatureStore(root)
    assert store.info() == {"entries": 0, "bytes": 0, "hits": 0, "misses": 0, "hit_rate": 0.0,
                            "root": str(root), "max_bytes": None}
    store.get(rec_id(1), SPEC)                     # miss
    store.put(rec_id(1), SPEC, gram(1))
    store.get(rec_id(1), SPEC)                     # hit
    store.get(rec_id(1), SPEC)                     # hit
    assert store.contains(rec_id(1), SPEC)         # counts nothing
    info = store.info()
    assert (info["hits"], info["misses"], info["entries"]) == (2, 1, 1)
    assert info["hit_rate"] == pytest.approx(2 / 3)
    assert info["bytes"] == entry_bytes(100, 64)
    store.close()
    again = FeatureStore(root, max_bytes=10**6)      # a new instance (as in a new process)
    info2 = again.info()
    assert (info2["hits"], info2["misses"], info2["max_bytes"]) == (2, 1, 10**6)


def test_get_or_compute_calls_compute_once(root):
    store = FeatureStore(root)
    calls = []

    def compute():
        calls.append(1)
        return gram(5)

    a = store.get_or_compute(rec_id(5), SPEC, compute)
    b = store.get_or_compute(rec_id(5), SPEC, compute)
    assert len(calls) == 1
    np.testing.assert_array_equal(a, gram(5))
    np.testing.assert_array_equal(b, gram(5))
    assert (store.info()["hits"], store.info()["misses"]) == (1, 1)


def test_put_replaces_existing_entry(root):
    store = FeatureStore(root)
    old = store.put(rec_id(1), SPEC, gram(1))
    store.put(rec_id(1), SPEC, gram(2))
    np.testing.assert_array_equal(store.get(rec_id(1), SPEC), gram(2))
    np.testing.assert_array_equal(old, gram(1))     # an old map keeps the old content
    assert store.info()["entries"] == 1


def test_clear(root):
    store = FeatureStore(root)
    for i in range(5):
        store.put(rec_id(i), SPEC if i % 2 else SPEC2, gram(i))
    (root / "keep.txt").write_text("not an entry")
    assert store.clear() == 5
    assert store.info()["entries"] == 0 and store.info()["bytes"] == 0
    assert all(store.get(rec_id(i), SPEC) is None for i in range(5))
    assert (root / "keep.txt").exists()
    assert not (root / SPEC).exists()
    store.put(rec_id(1), SPEC, gram(1))              # usable after clear
    assert store.contains(rec_id(1), SPEC)


@pytest.mark.usefixtures("entries_only")
def test_lru_eviction_order(root):
    e = entry_bytes(100, 64)
    store = FeatureStore(root, max_bytes=3 * e)
    for i in range(3):
        store.put(rec_id(i), SPEC, gram(i))
    assert store.get(rec_id(0), SPEC) is not None    # 0 becomes most recent: order 1, 2, 0
    store.put(rec_id(3), SPEC, gram(3))              # evicts 1
    assert not store.contains(rec_id(1), SPEC)
    assert all(store.contains(rec_id(i), SPEC) for i in (0, 2, 3))
    store.put(rec_id(4), SPEC, gram(4))              # evicts 2
    assert not store.contains(rec_id(2), SPEC)
    assert store.info()["bytes"] == 3 * e
    assert sum(p.stat().st_size for p in root.rglob("*.gram")) <= 3 * e


@pytest.mark.usefixtures("entries_only")
def test_eviction_of_several_small_entries_for_one_big(root):
    small, big = entry_bytes(10, 64), entry_bytes(100, 64)
    store = FeatureStore(root, max_bytes=big + 2 * small)
    for i in range(5):
        store.put(rec_id(i), SPEC, gram(i, (10, 64)))
    store.put(rec_id(99), SPEC, gram(99))
    info = store.info()
    assert info["bytes"] <= big + 2 * small
    assert store.contains(rec_id(99), SPEC)
    assert [store.contains(rec_id(i), SPEC) for i in range(5)] == [False] * 3 + [True] * 2


@pytest.mark.usefixtures("entries_only")
def test_gram_larger_than_max_bytes_is_not_stored(root):
    store = FeatureStore(root, max_bytes=entry_bytes(10, 64))
    store.put(rec_id(1), SPEC, gram(1, (10, 64)))
    a = gram(2)
    g = store.put(rec_id(2), SPEC, a)
    np.testing.assert_array_equal(g, a)
    assert not g.flags.writeable and a.flags.writeable
    assert not store.contains(rec_id(2), SPEC)
    assert store.contains(rec_id(1), SPEC)           # the cache was not wiped for it


@pytest.mark.usefixtures("entries_only")
def test_memmap_survives_eviction(root):
    store = FeatureStore(root, max_bytes=entry_bytes(100, 64), mmap_min_bytes=0)
    held = store.get_or_compute(rec_id(1), SPEC, lambda: gram(1))
    assert isinstance(held, np.memmap)
    store.put(rec_id(2), SPEC, gram(2))              # evicts entry 1 (file unlinked)
    assert not entry_path(root, rec_id(1), SPEC).exists()
    np.testing.assert_array_equal(held, gram(1))


# -- corruption ------------------------------------------------------------------------------


def _entry(root, i):
    return entry_path(root, rec_id(i), SPEC)


@pytest.mark.parametrize("damage", ["truncate_data", "truncate_header", "empty", "flip_data",
                                    "flip_header", "garbage", "extra_bytes", "zeroed_data", "zeroed_file"])
def test_corrupt_entry_is_a_miss_and_removed(root, damage):
    store = FeatureStore(root)
    store.put(rec_id(1), SPEC, gram(1))
    path = _entry(root, 1)
    raw = bytearray(path.read_bytes())
    if damage == "truncate_data":
        raw = raw[:-100]
    elif damage == "truncate_header":
        raw = raw[:30]
    elif damage == "empty":
        raw = bytearray()
    elif damage == "flip_data":
        raw[HEADER_BYTES + 1234] ^= 0x40
    elif damage == "flip_header":
        raw[17] ^= 0x01                              # n_frames
    elif damage == "garbage":
        raw = bytearray(os.urandom(len(raw)))
    elif damage == "extra_bytes":
        raw += b"\0" * 16
    elif damage == "zeroed_data":                    # what a power cut can leave without fsync
        raw[HEADER_BYTES + 4096:] = bytes(len(raw) - HEADER_BYTES - 4096)
    elif damage == "zeroed_file":
        raw = bytearray(len(raw))
    path.write_bytes(bytes(raw))
    assert store.get(rec_id(1), SPEC) is None
    assert not path.exists()
    assert store.info()["entries"] == 0 and store.info()["misses"] == 1
    store.put(rec_id(1), SPEC, gram(1))              # and the key can be stored again
    np.testing.assert_array_equal(store.get(rec_id(1), SPEC), gram(1))


@pytest.mark.parametrize("kwargs, fsyncs", [({}, 0), ({"verify": False}, 3), ({"sync": True}, 3),
                                             ({"verify": False, "sync": False}, 0)])
def test_entries_are_fsynced_only_when_reads_do_not_check_them(root, monkeypatch, kwargs, fsyncs):
    """CRC-checked reads make an entry damaged by a power cut a miss, so by default puts skip
    the fsync; without the check (verify=False) every entry is fsynced before its rename."""
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    store = FeatureStore(root, **kwargs)
    for i in range(3):
        store.put(rec_id(i), SPEC, gram(i))
    assert len(calls) == fsyncs
    assert pickle.loads(pickle.dumps(store)).sync == store.sync


@pytest.mark.parametrize("writer, reader_verify, served", [({}, False, False), ({}, True, False),
                                                          ({"sync": True}, True, False),
                                                          ({"sync": True}, False, True)])
def test_entry_zeroed_by_a_power_cut_is_never_served_unless_synced_and_unverified(
        root, writer, reader_verify, served):
    """An entry written without fsync is flagged: any reader, also one with verify=False in
    another process, checks its CRC. Only fsynced entries may skip the check."""
    FeatureStore(root, **writer).put(rec_id(1), SPEC, gram(1))
    path = _entry(root, 1)
    raw = bytearray(path.read_bytes())
    raw[HEADER_BYTES + 4096:] = bytes(len(raw) - HEADER_BYTES - 4096)
    path.write_bytes(bytes(raw))
    got = FeatureStore(root, verify=reader_verify).get(rec_id(1), SPEC)
    assert (got is not None) == served
    assert path.exists() == served


def test_corrupt_entries_are_reported_a_few_at_a_time(root, caplog):
    store = FeatureStore(root)
    for i in range(12):
        store.put(rec_id(i), SPEC, gram(i))
        _entry(root, i).write_bytes(b"garbage")
    with caplog.at_level("WARNING", logger="wavetrain.store.feature_store"):
        assert all(store.get(rec_id(i), SPEC) is None for i in range(12))
    assert store.corrupt_removed == 12
    assert len([r for r in caplog.records if "corrupt entry" in r.getMessage()]) == 5
    assert "without a warning" in caplog.records[-1].getMessage()


def test_contains_is_false_for_truncated_entry(root):
    store = FeatureStore(root)
    store.put(rec_id(1), SPEC, gram(1))
    path = _entry(root, 1)
    path.write_bytes(path.read_bytes()[:-4])
    assert not store.contains(rec_id(1), SPEC)


def test_verify_false_still_checks_size(root):
    store = FeatureStore(root, verify=False)
    store.put(rec_id(1), SPEC, gram(1))
    path = _entry(root, 1)
    path.write_bytes(path.read_bytes()[:-4])
    assert store.get(rec_id(1), SPEC) is None


# -- index consistency -----------------------------------------------------------------------


def test_file_deleted_by_hand_is_a_miss_and_row_dropped(root):
    store = FeatureStore(root)
    store.put(rec_id(1), SPEC, gram(1))
    _entry(root, 1).unlink()
    assert store.get(rec_id(1), SPEC) is None
    assert store.info()["entries"] == 0


def test_unindexed_file_is_adopted_on_hit(root):
    store = FeatureStore(root)
    store.put(rec_id(1), SPEC, gram(1))
    with store._index.writer() as conn:              # simulate a crash between rename and commit
        conn.execute("DELETE FROM entries")
    assert store.info()["entries"] == 0
    np.testing.assert_array_equal(store.get(rec_id(1), SPEC), gram(1))
    assert store.info()["entries"] == 1


def test_lost_index_is_rebuilt_from_disk(root):
    store = FeatureStore(root)
    for i in range(3):
        store.put(rec_id(i), SPEC, gram(i))
    store.close()
    for name in ("index.sqlite", "index.sqlite-wal", "index.sqlite-shm"):
        (root / name).unlink(missing_ok=True)
    again = FeatureStore(root)
    assert again.info()["entries"] == 3
    assert again.info()["bytes"] == 3 * entry_bytes(100, 64)


def test_reindex_drops_rows_of_missing_files(root):
    store = FeatureStore(root)
    for i in range(3):
        store.put(rec_id(i), SPEC, gram(i))
    _entry(root, 0).unlink()
    assert store.reindex() == (0, 1)
    assert store.info()["entries"] == 2


def test_pickle_reopens_store(root):
    store = FeatureStore(root, max_bytes=10**7, dtype="float16", mmap_min_bytes=0)
    store.put(rec_id(1), SPEC, gram(1))
    clone = pickle.loads(pickle.dumps(store))
    assert clone.root == store.root and clone.max_bytes == 10**7 and clone.dtype == np.float16
    assert clone.mmap_min_bytes == 0
    assert clone.contains(rec_id(1), SPEC)


@pytest.mark.usefixtures("entries_only")
def test_threads_share_one_store(root):
    from concurrent.futures import ThreadPoolExecutor

    store = FeatureStore(root, max_bytes=5 * entry_bytes(20, 8))

    def work(i):
        k = i % 12
        g = store.get_or_compute(rec_id(k), SPEC, lambda: gram(k, (20, 8)))
        np.testing.assert_array_equal(g, gram(k, (20, 8)))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(200)))
    assert store.info()["bytes"] <= 5 * entry_bytes(20, 8)


# -- NullStore ---------------------------------------------------------------------------------


def test_null_store_stores_nothing():
    store = NullStore()
    calls = []
    a = gram(1)
    g = store.get_or_compute(rec_id(1), SPEC, lambda: calls.append(1) or a)
    g2 = store.get_or_compute(rec_id(1), SPEC, lambda: calls.append(1) or a)
    assert len(calls) == 2
    np.testing.assert_array_equal(g, a)
    assert g.dtype == np.float32 and not g.flags.writeable and a.flags.writeable
    assert g2 is not a
    assert store.get(rec_id(1), SPEC) is None
    assert not store.contains(rec_id(1), SPEC)
    info = store.info()
    assert set(info) == {"entries", "bytes", "hits", "misses", "hit_rate", "root", "max_bytes"}
    assert info["entries"] == 0 and info["misses"] == 3 and info["hits"] == 0
    assert store.clear() == 0
    assert NullStore(dtype="float16").put(rec_id(1), SPEC, a).dtype == np.float16
    with pytest.raises(CacheError):
        store.get("nothex", SPEC)


def test_null_store_has_the_feature_store_api():
    public = {n for n in dir(FeatureStore) if not n.startswith("_")} - {"reindex"}
    assert public <= set(dir(NullStore))


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_index_is_moved_aside_and_rebuilt(root, damage):
    store = FeatureStore(root)
    for i in range(3):
        store.put(rec_id(i), SPEC, gram(i))
    store.close()
    db = root / "index.sqlite"
    for name in ("index.sqlite-wal", "index.sqlite-shm"):
        (root / name).unlink(missing_ok=True)
    if damage == "garbage":
        db.write_bytes(b"this is not a database" * 100)
    else:
        db.write_bytes(db.read_bytes()[:100])
    again = FeatureStore(root)
    assert again.info()["entries"] == 3
    np.testing.assert_array_equal(again.get(rec_id(1), SPEC), gram(1))
    assert list(root.glob("index.sqlite.corrupt-*"))


@pytest.mark.usefixtures("entries_only")
def test_size_bound_holds_after_every_put_with_several_writers(root):
    """Every writer checks its bound against the bytes of all entries (a counter kept exact by
    the index), so writers sharing a folder never push it over their bound."""
    one = entry_bytes(10, 8)
    writers = [FeatureStore(root, max_bytes=10 * one) for _ in range(3)]  # e.g. three processes
    for i in range(90):
        writers[i % 3].put(rec_id(i), SPEC, gram(i, (10, 8)))
        assert writers[0].info()["bytes"] <= 10 * one
    assert writers[0].info()["entries"] == 10 and sum(w.evicted for w in writers) == 80


def test_byte_counter_stays_equal_to_the_rows(root):
    import sqlite3

    from wavetrain.store._paths import INDEX_NAME

    store = FeatureStore(root)

    def check():
        store._index.flush()
        conn = sqlite3.connect(root / INDEX_NAME)
        (counter,), = conn.execute("SELECT value FROM counters WHERE name = 'bytes'").fetchall()
        (rows,), = conn.execute("SELECT COALESCE(SUM(nbytes), 0) FROM entries").fetchall()
        conn.close()
        assert counter == rows == store.info()["bytes"]

    for i in range(5):
        store.put(rec_id(i), SPEC, gram(i, (10, 8)))
    check()
    store.put(rec_id(0), SPEC, gram(0, (20, 8)))     # replace with a bigger gram
    check()
    entry_path(root, rec_id(1), SPEC).unlink()         # a file deleted by hand ...
    assert store.get(rec_id(1), SPEC) is None          # ... drops its row on the next read
    check()
    store.reindex()
    check()
    store.clear()
    check()
