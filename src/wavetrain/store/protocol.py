"""The :class:`Store` protocol: what the feature stream needs of a feature store.

A store keeps feature grams keyed by ``(rec_id, spec_key)`` — the recording's content hash and
the feature spec's key — and returns them read-only. :class:`~wavetrain.store.FeatureStore` (a
folder with a SQLite index, for one machine) and :class:`~wavetrain.store.NullStore` (keeps
nothing) implement it; a shared store that every executor of a cluster reads and writes is
another implementation behind the same methods.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Store"]


@runtime_checkable
class Store(Protocol):
    """Feature grams by ``(rec_id, spec_key)``.

    The stream calls only :meth:`get_or_compute`, from its worker threads at once: that method,
    :meth:`get`, :meth:`put` and :meth:`contains` must be safe to call concurrently (also from
    other processes sharing the store). :meth:`info`, :meth:`clear` and :meth:`close` are called
    between runs, from one thread.

    Attributes
    ----------
    max_bytes : int or None
        The bound of what the store keeps (None: unbounded; 0: keeps nothing).
    evicted, not_stored, write_errors : int
        Entries this process evicted to stay within the bound, grams it did not store because they
        do not fit, and writes the storage refused (full, read-only) — reported after a run.
    """

    @property
    def root(self) -> Path | None:
        """Where the store keeps its entries (None: nowhere)."""
        ...

    @property
    def max_bytes(self) -> int | None: ...

    @property
    def evicted(self) -> int: ...

    @property
    def not_stored(self) -> int: ...

    @property
    def write_errors(self) -> int: ...

    def get(self, rec_id: str, spec_key: str) -> np.ndarray | None:
        """The stored gram (read-only), or None."""
        ...

    def put(self, rec_id: str, spec_key: str, array: Any) -> np.ndarray:
        """Store a gram (atomically); returns it read-only."""
        ...

    def get_or_compute(self, rec_id: str, spec_key: str, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """The stored gram, or ``compute()`` stored and returned."""
        ...

    def contains(self, rec_id: str, spec_key: str) -> bool:
        ...

    def info(self) -> dict:
        """Entries, bytes, hits, misses, hit rate, root, bound."""
        ...

    def clear(self) -> int:
        """Remove every entry; returns how many."""
        ...

    def close(self) -> None:
        ...
