"""An in-process, byte-bounded cache that keeps what is expensive to recompute.

Eviction follows GreedyDual-Size (Cao & Irani, 1997): every item has the priority
``H = L + cost_s / nbytes`` where ``L`` is a clock that rises to the priority of each evicted item.
The item with the lowest ``H`` goes first, so per byte, cheap items (raw audio that takes
milliseconds to reload) are evicted before expensive ones (features that took seconds), and items
not used for a while age out as ``L`` rises.  A hit renews the item's priority from the current
``L``.  Among equal priorities the least recently used item goes first.
"""
from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Hashable
from typing import Any

import numpy as np

from wavetrain.core.errors import CacheError, ParameterError


def _sizeof(value: Any) -> int:
    if isinstance(value, (np.ndarray, memoryview)):
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, (int, np.integer)):
        return int(nbytes)
    raise CacheError(f"MemoryCache cannot size a value of type {type(value).__name__}; "
                     f"pass nbytes= to put")


class MemoryCache:
    """Byte-bounded, thread-safe, cost-aware in-process cache.

    Parameters
    ----------
    max_bytes : int >= 0
        The cache never holds more than this many bytes of values.  A value larger than
        ``max_bytes`` is not cached.

    Examples
    --------
    >>> import numpy as np
    >>> cache = MemoryCache(1_000_000)
    >>> cache.put("features/a", np.zeros((100, 64), np.float32), cost_s=0.5)
    True
    >>> cache.get("features/a").shape
    (100, 64)
    >>> cache.stats()["entries"]
    1
    """

    def __init__(self, max_bytes: int):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)) \
                or max_bytes < 0:
            raise ParameterError(f"parameter max_bytes of MemoryCache must be an int >= 0; "
                                 f"got {max_bytes!r}")
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._items: dict[Hashable, list] = {}   # key -> [priority, seq, value, nbytes, cost_s]
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self._clock = 0.0
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0

    # -- internals (caller holds the lock) -----------------------------------------------------
    def _push(self, key: Hashable, item: list) -> None:
        item[0] = self._clock + item[4] / max(item[3], 1)
        item[1] = next(self._seq)
        heapq.heappush(self._heap, (item[0], item[1], key))
        if len(self._heap) > 2 * len(self._items) + 64:     # drop stale heap records
            self._heap = [(it[0], it[1], k) for k, it in self._items.items()]
            heapq.heapify(self._heap)

    def _remove(self, key: Hashable) -> None:
        item = self._items.pop(key)
        self._bytes -= item[3]

    def _evict_one(self) -> None:
        while True:
            prio, seq, key = heapq.heappop(self._heap)
            item = self._items.get(key)
            if item is not None and item[1] == seq:
                break
        self._clock = prio
        self._remove(key)
        self._evictions += 1

    # -- public API ------------------------------------------------------------------------------
    def get(self, key: Hashable, default=None):
        """Return the cached value (renewing its priority) or ``default``; counts a hit or miss."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self._misses += 1
                return default
            self._hits += 1
            self._push(key, item)
            return item[2]

    def put(self, key: Hashable, value, *, cost_s: float, nbytes: int | None = None) -> bool:
        """Cache ``value`` under ``key``, replacing any previous value.

        Parameters
        ----------
        key : hashable
            Cache key.
        value : np.ndarray, bytes-like or object with an ``nbytes`` attribute
            The value; it is stored by reference, not copied.
        cost_s : float >= 0
            Seconds it took to produce ``value`` (its recompute cost).
        nbytes : int >= 0, default=None
            Bytes to charge for ``value``; default ``value.nbytes`` (or ``len`` of bytes).  Pass
            it for objects that cannot be sized, or 0-charge memory maps deliberately.

        Returns
        -------
        cached : bool
            False when the value is larger than ``max_bytes`` (any previous value of ``key`` is
            dropped then too).
        """
        if isinstance(cost_s, bool) or not isinstance(cost_s, (int, float, np.number)) \
                or not cost_s >= 0 or cost_s == float("inf"):
            raise ParameterError(f"parameter cost_s of MemoryCache.put must be a finite number "
                                 f">= 0 (seconds); got {cost_s!r}")
        size = _sizeof(value) if nbytes is None else int(nbytes)
        if size < 0:
            raise ParameterError(f"parameter nbytes of MemoryCache.put must be >= 0; got {nbytes}")
        with self._lock:
            if key in self._items:
                self._remove(key)
            if size > self.max_bytes:
                return False
            while self._bytes + size > self.max_bytes:
                self._evict_one()
            item = [0.0, 0, value, size, float(cost_s)]
            self._items[key] = item
            self._bytes += size
            self._push(key, item)
            return True

    def pop(self, key: Hashable, default=None):
        """Remove and return the value of ``key`` (no hit/miss counted)."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return default
            self._remove(key)
            return item[2]

    def clear(self) -> None:
        """Drop every value (statistics are kept)."""
        with self._lock:
            self._items.clear()
            self._heap.clear()
            self._bytes = 0

    def stats(self) -> dict:
        """Counters and sizes.

        Returns
        -------
        stats : dict
            ``hits``, ``misses``, ``evictions``, ``bytes``, ``entries``, ``max_bytes`` (int) and
            ``hit_rate`` (float in [0, 1]).
        """
        with self._lock:
            total = self._hits + self._misses
            return {"hits": self._hits, "misses": self._misses, "evictions": self._evictions,
                    "bytes": self._bytes, "entries": len(self._items), "max_bytes": self.max_bytes,
                    "hit_rate": self._hits / total if total else 0.0}

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __repr__(self) -> str:
        return f"MemoryCache(max_bytes={self.max_bytes})"
