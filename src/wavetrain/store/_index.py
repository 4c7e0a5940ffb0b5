"""The store index: entry sizes, LRU recency and hit/miss counters in SQLite, plus the writer lock.

SQLite (stdlib, WAL mode) keeps one row per entry ``(spec, rec, nbytes, used)`` where ``used`` is
a logical clock (the largest ``used`` plus one on every put or hit), so the LRU order is exact and
never depends on clock resolution.  Counters (``hits``, ``misses``) live in the same database, so
they are shared by every process using the store.

Writers (put, eviction, clear, repair of a bad entry) additionally hold an exclusive
``fcntl.flock`` on ``root/.lock`` while they move files into place or delete them, so the files
and the rows change together.  Readers never take the flock; they only run one short SQLite
transaction to count the hit or miss and refresh recency.

A connection and the lock file are per process: after ``fork`` both are reopened, because a
flock is shared by every descriptor of the same open file and would not exclude a forked child.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    spec   TEXT    NOT NULL,
    rec    TEXT    NOT NULL,
    nbytes INTEGER NOT NULL,
    used   INTEGER NOT NULL,
    PRIMARY KEY (spec, rec)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_used ON entries (used);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters VALUES ('hits', 0), ('misses', 0);
"""
_INHERITED: list = []     # connections inherited through fork, deliberately never closed
_NEXT_USED = "(SELECT COALESCE(MAX(used), 0) + 1 FROM entries)"


class StoreIndex:
    """SQLite index plus writer lock of one store root (internal).

    Parameters
    ----------
    root : pathlib.Path
        Existing store folder.
    index_name, lock_name : str
        File names inside ``root``.
    """

    def __init__(self, root: Path, index_name: str, lock_name: str):
        self._db_path = root / index_name
        self._lock_path = root / lock_name
        self._mutex = threading.RLock()     # serialises threads of this process
        self._pid = -1
        self._conn: sqlite3.Connection | None = None
        self._lock_fd = -1
        self._ensure_open()

    # -- connection management -----------------------------------------------------------------
    def _ensure_open(self) -> sqlite3.Connection:
        if self._pid == os.getpid() and self._conn is not None:
            return self._conn
        # First use, or first use in a forked child: never reuse (or close) the parent's handles;
        # keep them referenced so that garbage collection in the child does not close them.
        if self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None
        self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._pid = os.getpid()
        conn = sqlite3.connect(self._db_path, timeout=60.0, isolation_level=None,
                               check_same_thread=False)
        with self._flock():
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
        conn.execute("PRAGMA synchronous=NORMAL")
        self._conn = conn
        return conn

    def close(self) -> None:
        """Close the connection and the lock file of this process (reopened on next use)."""
        with self._mutex:
            if self._pid == os.getpid():
                if self._conn is not None:
                    self._conn.close()
                if self._lock_fd >= 0:
                    os.close(self._lock_fd)
            self._conn, self._lock_fd, self._pid = None, -1, -1

    @contextlib.contextmanager
    def _flock(self):
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def writer(self):
        """Hold the writer lock (thread mutex + flock) and an IMMEDIATE transaction.

        Yields the connection; commits on success, rolls back on error.
        """
        with self._mutex:
            conn = self._ensure_open()
            with self._flock():
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")

    @contextlib.contextmanager
    def transaction(self):
        """A short IMMEDIATE transaction without the flock (for readers' bookkeeping)."""
        with self._mutex:
            conn = self._ensure_open()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def query(self, sql: str, params=()) -> list[tuple]:
        """Run a read-only query and return all rows."""
        with self._mutex:
            return self._ensure_open().execute(sql, params).fetchall()

    # -- operations ------------------------------------------------------------------------------
    @staticmethod
    def upsert(conn, spec: str, rec: str, nbytes: int) -> None:
        """Insert or replace an entry row as most recently used (inside a transaction)."""
        conn.execute(f"INSERT OR REPLACE INTO entries (spec, rec, nbytes, used) "
                     f"VALUES (?, ?, ?, {_NEXT_USED})", (spec, rec, nbytes))

    @staticmethod
    def delete(conn, spec: str, rec: str) -> None:
        conn.execute("DELETE FROM entries WHERE spec = ? AND rec = ?", (spec, rec))

    def record_hit(self, spec: str, rec: str) -> bool:
        """Count a hit and mark the entry most recently used; False if it has no row."""
        with self.transaction() as conn:
            cur = conn.execute(f"UPDATE entries SET used = {_NEXT_USED} WHERE spec = ? AND rec = ?",
                               (spec, rec))
            conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'hits'")
            return cur.rowcount > 0

    def record_miss(self, spec: str, rec: str) -> bool:
        """Count a miss; True if a (stale) row for the key exists."""
        with self.transaction() as conn:
            conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'misses'")
            row = conn.execute("SELECT 1 FROM entries WHERE spec = ? AND rec = ?",
                               (spec, rec)).fetchone()
            return row is not None

    def totals(self) -> tuple[int, int]:
        """``(entries, bytes)`` of all rows."""
        (n, b), = self.query("SELECT COUNT(*), COALESCE(SUM(nbytes), 0) FROM entries")
        return int(n), int(b)

    def counters(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.query("SELECT name, value FROM counters")}
