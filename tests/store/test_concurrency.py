"""Several processes share one store, with a bound small enough to force constant eviction."""
from __future__ import annotations

import multiprocessing as mp
import random
import traceback

import numpy as np
import pytest

from tests.store.store_helpers import SPEC, SPEC2, gram, rec_id
from wavetrain.store import FeatureStore, entry_bytes

SHAPE = (50, 32)
N_KEYS = 16
MAX_BYTES = 5 * entry_bytes(*SHAPE)

fork = mp.get_context("fork")
# bounds here count whole entries; the index files are left out (see conftest.entries_only)
pytestmark = pytest.mark.usefixtures("entries_only")


def _worker(root, seed, n_ops, inherited, queue):
    """Random gets/puts/get_or_computes over overlapping keys; report errors, never raise."""
    errors = []
    try:
        store = inherited if inherited is not None else FeatureStore(root, max_bytes=MAX_BYTES)
        rnd = random.Random(seed)
        for _ in range(n_ops):
            k = rnd.randrange(N_KEYS)
            spec = SPEC if k % 3 else SPEC2
            expected = gram(k, SHAPE)
            op = rnd.random()
            if op < 0.4:
                got = store.get(rec_id(k), spec)
            elif op < 0.7:
                got = store.put(rec_id(k), spec, expected)
            else:
                got = store.get_or_compute(rec_id(k), spec, lambda expected=expected: expected)
            if got is not None and not np.array_equal(got, expected):
                errors.append(f"key {k}: wrong content")
        info = store.info()
        if info["bytes"] > MAX_BYTES:
            errors.append(f"bytes {info['bytes']} > {MAX_BYTES}")
    except Exception:                                     # pragma: no cover - reported below
        errors.append(traceback.format_exc())
    queue.put(errors)


def _files_bytes(root):
    return sum(p.stat().st_size for p in root.rglob("*.gram"))


@pytest.mark.parametrize("n_procs", [2, 4])
def test_processes_share_a_bounded_store(root, n_procs):
    parent_store = FeatureStore(root, max_bytes=MAX_BYTES)
    parent_store.put(rec_id(0), SPEC2, gram(0, SHAPE))         # parent used it before the fork
    queue = fork.Queue()
    procs = [fork.Process(target=_worker,
                          args=(str(root), seed, 150, parent_store if seed == 0 else None, queue))
             for seed in range(n_procs)]
    for p in procs:
        p.start()
    errors = [e for _ in procs for e in queue.get(timeout=300)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert errors == []

    store = FeatureStore(root, max_bytes=MAX_BYTES)
    for k in range(N_KEYS):                                      # every survivor is intact
        spec = SPEC if k % 3 else SPEC2
        got = store.get(rec_id(k), spec)
        assert got is None or np.array_equal(got, gram(k, SHAPE))
    info = store.info()
    assert 0 < info["bytes"] <= MAX_BYTES
    assert info["bytes"] == _files_bytes(root)                 # index matches the disk
    assert info["hits"] + info["misses"] >= n_procs * 150 * 0.4 * 0.5
    assert list((root / "tmp").iterdir()) == []
    # the parent's handle still works after its children used forks of it
    parent_store.put(rec_id(1), SPEC, gram(1, SHAPE))
    np.testing.assert_array_equal(parent_store.get(rec_id(1), SPEC), gram(1, SHAPE))


def _hold_map(root, held, evicted, result):
    store = FeatureStore(root, mmap_min_bytes=0)
    g = store.get(rec_id(1), SPEC)
    assert isinstance(g, np.memmap)
    held.set()
    evicted.wait(60)
    result.put(bool(g is not None and np.array_equal(g, gram(1))))


def test_reader_keeps_its_map_when_another_process_evicts(root):
    store = FeatureStore(root, max_bytes=entry_bytes(100, 64))
    store.put(rec_id(1), SPEC, gram(1))
    held, evicted, result = fork.Event(), fork.Event(), fork.Queue()
    p = fork.Process(target=_hold_map, args=(str(root), held, evicted, result))
    p.start()
    assert held.wait(60)
    store.put(rec_id(2), SPEC, gram(2))                          # evicts entry 1 under the reader
    assert not store.contains(rec_id(1), SPEC)
    evicted.set()
    assert result.get(timeout=60) is True
    p.join(60)
    assert p.exitcode == 0


def _count(root, n, queue):
    store = FeatureStore(root)
    for i in range(n):
        store.get(rec_id(i % 2), SPEC)
    queue.put(True)


def test_counters_are_shared_between_processes(root):
    store = FeatureStore(root)
    store.put(rec_id(0), SPEC, gram(0))
    queue = fork.Queue()
    procs = [fork.Process(target=_count, args=(str(root), 50, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        assert queue.get(timeout=120)
        p.join(60)
    info = store.info()
    assert (info["hits"], info["misses"]) == (75, 75)


def test_reads_of_a_plain_subprocess_are_saved_at_exit(root):
    import subprocess
    import sys

    store = FeatureStore(root, max_bytes=2 * entry_bytes(100, 64))
    store.put(rec_id(0), SPEC, gram(0))
    store.put(rec_id(1), SPEC, gram(1))                          # order: 0 (oldest), 1
    code = ("import sys; from wavetrain.store import FeatureStore; s = FeatureStore(sys.argv[1]); "
            f"[s.get({rec_id(0)!r}, {SPEC!r}) for _ in range(3)]; s.get({rec_id(7)!r}, {SPEC!r})")
    subprocess.run([sys.executable, "-c", code, str(root)], check=True)
    info = store.info()
    assert (info["hits"], info["misses"]) == (3, 1)
    store.put(rec_id(2), SPEC, gram(2))      # the child's reads made 0 recent: 1 is evicted
    assert store.contains(rec_id(0), SPEC) and not store.contains(rec_id(1), SPEC)


def test_reads_are_saved_when_the_store_is_collected(root):
    import gc

    store = FeatureStore(root)
    store.put(rec_id(0), SPEC, gram(0))
    store.get(rec_id(0), SPEC)
    del store
    gc.collect()
    info = FeatureStore(root).info()
    assert (info["hits"], info["misses"]) == (1, 0)


def test_a_close_from_another_thread_between_check_and_lock_reopens_the_index(tmp_path):
    """A thread that found the index open and then lost it to a close() opens it again instead
    of failing on a closed connection."""
    from wavetrain.store._index import StoreIndex

    idx = StoreIndex(tmp_path, "index.sqlite", "lock")
    stale = idx._ensure_open()
    real = idx._ensure_open
    handed = iter([stale])
    idx._ensure_open = lambda: next(handed, None) or real()    # the state seen before the close
    stale.close()                                              # ... then closed by another thread
    assert idx.totals() == (0, 0)
    assert idx.record_miss(SPEC, rec_id(0)) is False
    with idx.writer() as conn:
        idx.upsert(conn, SPEC, rec_id(0), 10)
    assert idx.totals() == (1, 10)
    idx.close()
