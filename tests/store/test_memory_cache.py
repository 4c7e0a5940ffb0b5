"""MemoryCache: byte bound, cost-aware (GreedyDual-Size) eviction, statistics, thread safety."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from wavetrain.core.errors import CacheError, ParameterError
from wavetrain.store import MemoryCache


def _arr(nbytes: int, fill=0) -> np.ndarray:
    return np.full(nbytes, fill, np.uint8)


def test_put_get_and_stats():
    cache = MemoryCache(1000)
    a = _arr(100)
    assert cache.put("a", a, cost_s=0.1) is True
    assert cache.get("a") is a                       # stored by reference
    assert cache.get("b") is None
    assert cache.get("b", "default") == "default"
    assert "a" in cache and len(cache) == 1
    assert cache.stats() == {"hits": 1, "misses": 2, "evictions": 0, "bytes": 100, "entries": 1,
                             "max_bytes": 1000, "hit_rate": pytest.approx(1 / 3)}


def test_cheap_item_is_evicted_before_expensive_item_of_same_size():
    for order in (("raw", "feat"), ("feat", "raw")):
        cache = MemoryCache(200)
        costs = {"raw": 0.001, "feat": 2.0}
        for key in order:
            cache.put(key, _arr(100), cost_s=costs[key])
        cache.put("new", _arr(100), cost_s=0.5)
        assert "feat" in cache and "raw" not in cache and "new" in cache
        assert cache.stats()["evictions"] == 1


def test_cost_is_weighed_per_byte():
    cache = MemoryCache(1000)
    cache.put("big_costly", _arr(800), cost_s=1.0)   # 1.25e-3 s per byte
    cache.put("small_cheap", _arr(100), cost_s=0.05)  # 5e-4 s per byte: cheaper per byte
    cache.put("x", _arr(100), cost_s=10.0)            # needs 0 evictions (1000 bytes)
    assert len(cache) == 3
    cache.put("y", _arr(100), cost_s=10.0)            # one must go: the cheapest per byte
    assert "small_cheap" not in cache and "big_costly" in cache


def test_without_costs_it_is_lru():
    cache = MemoryCache(300)
    for k in "abc":
        cache.put(k, _arr(100), cost_s=1.0)
    cache.get("a")                                    # a renewed: b is now the oldest
    cache.put("d", _arr(100), cost_s=1.0)
    assert "b" not in cache and all(k in cache for k in "acd")


def test_expensive_but_unused_items_age_out():
    cache = MemoryCache(200)
    cache.put("old_costly", _arr(100), cost_s=1.0)
    for i in range(50):                               # a stream of cheaper, used items
        cache.put(i, _arr(100), cost_s=0.5)
        cache.get(i)
    assert "old_costly" not in cache


def test_never_holds_more_than_max_bytes():
    cache = MemoryCache(1000)
    rng = np.random.default_rng(0)
    for i in range(500):
        cache.put(i, _arr(int(rng.integers(1, 400))), cost_s=float(rng.random()))
        assert cache.stats()["bytes"] <= 1000
        if i % 3 == 0:
            cache.get(int(rng.integers(0, i + 1)))
    s = cache.stats()
    assert s["bytes"] == sum(cache.get(k).nbytes for k in range(500) if k in cache)


def test_item_larger_than_max_bytes_is_not_cached():
    cache = MemoryCache(100)
    cache.put("small", _arr(50), cost_s=1.0)
    assert cache.put("huge", _arr(101), cost_s=100.0) is False
    assert "huge" not in cache and "small" in cache
    cache.put("small", _arr(500), cost_s=1.0)         # replacing with a too-big value drops it
    assert "small" not in cache and cache.stats()["bytes"] == 0


def test_replace_updates_bytes():
    cache = MemoryCache(1000)
    cache.put("a", _arr(100), cost_s=1.0)
    cache.put("a", _arr(300), cost_s=1.0)
    assert cache.stats()["bytes"] == 300 and len(cache) == 1


def test_value_kinds_and_explicit_nbytes():
    cache = MemoryCache(1000)
    cache.put("b", b"x" * 10, cost_s=0)
    cache.put("ba", bytearray(20), cost_s=0)
    cache.put("mv", memoryview(bytes(30)), cost_s=0)
    cache.put("obj", object(), cost_s=0, nbytes=40)
    assert cache.stats()["bytes"] == 100
    with pytest.raises(CacheError, match="nbytes"):
        cache.put("obj2", object(), cost_s=0)


@pytest.mark.parametrize("cost", [-1.0, float("nan"), float("inf"), "1", None, True])
def test_bad_cost(cost):
    with pytest.raises(ParameterError, match="cost_s"):
        MemoryCache(10).put("a", b"x", cost_s=cost)


@pytest.mark.parametrize("max_bytes", [-1, 1.5, None, True])
def test_bad_max_bytes(max_bytes):
    with pytest.raises(ParameterError, match="max_bytes"):
        MemoryCache(max_bytes)


def test_pop_and_clear():
    cache = MemoryCache(1000)
    cache.put("a", b"x" * 10, cost_s=1)
    assert cache.pop("a") == b"x" * 10 and cache.pop("a") is None
    cache.put("b", b"x" * 10, cost_s=1)
    cache.clear()
    assert len(cache) == 0 and cache.stats()["bytes"] == 0
    cache.put("c", b"x" * 10, cost_s=1)
    assert cache.get("c") == b"x" * 10


def test_heap_stays_bounded_under_many_hits():
    cache = MemoryCache(1000)
    cache.put("a", b"x" * 10, cost_s=1)
    for _ in range(10_000):
        cache.get("a")
    assert len(cache._heap) <= 2 * len(cache) + 65


def test_thread_safety():
    cache = MemoryCache(5000)
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(2000):
                k = int(rng.integers(0, 64))
                if rng.random() < 0.5:
                    cache.put(k, np.full(int(rng.integers(1, 500)), k % 256, np.uint8),
                              cost_s=float(rng.random()))
                else:
                    v = cache.get(k)
                    if v is not None and not np.all(v == k % 256):
                        errors.append(k)
                assert cache.stats()["bytes"] <= 5000
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = cache.stats()
    assert s["bytes"] <= 5000 and s["hits"] + s["misses"] > 0
