"""The store index: entry sizes, LRU recency and hit/miss counters in SQLite, plus the writer lock.

SQLite (stdlib, WAL mode) keeps one row per entry ``(spec, rec, nbytes, used)`` where ``used`` is
a logical clock (the largest ``used`` plus one), so the LRU order is exact and never depends on
clock resolution.  Counters (``hits``, ``misses``) live in the same database, so they are shared
by every process using the store.

Writers (put, eviction, clear, removal of a bad entry) hold an exclusive ``fcntl.flock`` on
``root/.lock`` while they move files into place or delete them, so files and rows change
together.  Readers never take the flock and never write on the hot path: a hit or miss is counted
in memory and only its key is checked with a read query (which WAL never blocks).  Pending
counts and recency touches are written in one transaction every ``FLUSH_EVERY`` reads or
``FLUSH_AFTER_S`` seconds, before every write (so eviction sees this process's recent reads),
before ``counters()``, on close and at process exit (including ``multiprocessing`` children).
A process killed with SIGKILL loses at most its unflushed counts and touches.

A transaction the disk refuses (full, over quota, read-only, failing) is rolled back, also when
its commit fails, and the error goes to the caller: the store counts it and goes on without
storing (it is a cache).  The writer of a put is given an ``undo`` that runs after such a
rollback, still under the lock and in a transaction of its own, so that no row outlives the file
it describes.  A refused statistics flush goes to ``on_write_error`` instead of being raised; its
counts stay pending and it is retried ``FLUSH_AFTER_S`` later.

A checkpoint copies the write-ahead log into the database once the log holds about
``max_wal_bytes`` (between ``MIN_WAL_PAGES`` and SQLite's default ``WAL_PAGES`` pages), and the
next write rewinds it; ``journal_size_limit`` gives back what a checkpoint held up by a reader let
it grow beyond that.  A smaller log is checkpointed (two fsyncs) more often: at SQLite's default
a put pays nothing measurable, at 16 pages about a third of its time.

A connection and the lock file are per process: after ``fork`` both are reopened, because a
flock is shared by every descriptor of the same open file and would not exclude a forked child.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import multiprocessing.util
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import cast

log = logging.getLogger(__name__)

FLUSH_EVERY = 64
FLUSH_AFTER_S = 1.0
#: Pages the write-ahead log holds before a checkpoint (SQLite's default; fewer when the store is
#: given a smaller ``max_wal_bytes``), and the fewest it is ever given.
WAL_PAGES = 1000
MIN_WAL_PAGES = 16
#: Log pages one put's commit adds (3 to 6 measured, up to 12 when the tables grow): room a
#: size bound keeps free for the commit it is about to write.
COMMIT_RESERVE_PAGES = 8

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
-- total entry bytes, kept exact (and shared by every process) by triggers, so that a size bound
-- costs O(1) per put; an index created before the triggers existed is summed once here
INSERT OR IGNORE INTO counters SELECT 'bytes', COALESCE(SUM(nbytes), 0) FROM entries;
CREATE TRIGGER IF NOT EXISTS entries_bytes_insert AFTER INSERT ON entries BEGIN
    UPDATE counters SET value = value + NEW.nbytes WHERE name = 'bytes'; END;
CREATE TRIGGER IF NOT EXISTS entries_bytes_delete AFTER DELETE ON entries BEGIN
    UPDATE counters SET value = value - OLD.nbytes WHERE name = 'bytes'; END;
CREATE TRIGGER IF NOT EXISTS entries_bytes_update AFTER UPDATE OF nbytes ON entries BEGIN
    UPDATE counters SET value = value + NEW.nbytes - OLD.nbytes WHERE name = 'bytes'; END;
"""
_INHERITED: list = []     # handles inherited through fork, deliberately never closed
_NEXT_USED = "(SELECT COALESCE(MAX(used), 0) + 1 FROM entries)"
_EXISTS = "SELECT 1 FROM entries WHERE spec = ? AND rec = ?"


def _rollback(conn) -> None:
    """Roll back the open transaction, if any (SQLite may already have rolled it back after a
    full disk or an I/O error, and then ROLLBACK itself fails)."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:                # pragma: no cover - depends on SQLite's state
            log.debug("feature store: rollback failed (%s)", exc)


def _move_aside(db_path: Path, exc: Exception) -> None:
    """Rename a corrupt index (and its WAL files) out of the way; the caller rebuilds it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log.warning("feature store: index %s is corrupt (%s); moved aside and rebuilt from the "
                "entry files", db_path, exc)
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{db_path}{suffix}")
        if src.exists():
            os.replace(src, Path(f"{db_path}.corrupt-{stamp}{suffix}"))


def _warn_write_error(exc: Exception) -> None:
    log.warning("feature store: could not write the index (%s)", exc)


def _repair(conn, undo) -> None:
    """Run ``undo(conn)`` in a transaction of its own; on failure leave things as they are."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        undo(conn)
        conn.execute("COMMIT")
    except (OSError, sqlite3.Error) as exc:
        log.debug("feature store: could not undo a failed write (%s)", exc)
        _rollback(conn)


class _ProcessState:
    """Handles and pending bookkeeping of one index in one process."""

    #: None until :meth:`_open` connects and after :meth:`close`.  (A class default: after
    #: ``self.conn = None`` in ``__init__`` mypy would keep it None across the ``_open`` call.)
    conn: sqlite3.Connection | None = None

    def __init__(self, db_path: Path, lock_path: Path, max_wal_bytes: int | None, on_write_error):
        self.pid = os.getpid()
        self.on_write_error = on_write_error
        self.hits = self.misses = 0
        self.touched: dict[tuple[str, str], None] = {}   # insertion order = recency order
        self.last_flush = time.monotonic()
        self.deferred = False            # the last flush failed: retry after FLUSH_AFTER_S only
        self.mutex = threading.RLock()
        self.rebuilt = False
        self.lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            self._open(db_path, max_wal_bytes)
        except BaseException:                          # full disk, I/O error: release what we hold
            if self.conn is not None:
                self.conn.close()
            os.close(self.lock_fd)
            raise

    def _open(self, db_path: Path, max_wal_bytes: int | None) -> None:
        self.conn = sqlite3.connect(db_path, timeout=60.0, isolation_level=None,
                                    check_same_thread=False)
        with self.flock():
            try:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.executescript(_SCHEMA)
            except sqlite3.DatabaseError as exc:     # not a database / malformed: start afresh
                if isinstance(exc, sqlite3.OperationalError):
                    raise                             # locked, I/O error: not corruption
                self.conn.close()
                _move_aside(db_path, exc)
                self.conn = sqlite3.connect(db_path, timeout=60.0, isolation_level=None,
                                            check_same_thread=False)
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.executescript(_SCHEMA)
                self.rebuilt = True
        self.conn.execute("PRAGMA synchronous=NORMAL")
        # a log frame is a page plus a 24-byte header
        self.frame_bytes = self.conn.execute("PRAGMA page_size").fetchone()[0] + 24
        pages = WAL_PAGES if max_wal_bytes is None else \
            max(MIN_WAL_PAGES, min(WAL_PAGES, max_wal_bytes // self.frame_bytes))
        self.conn.execute(f"PRAGMA wal_autocheckpoint={pages}")
        # the log is rewound, not shrunk, after a checkpoint: cut it back only when it outgrew
        # its usual size (a checkpoint held up by a reader); trimming it every time costs puts
        limit = (pages + 4 * COMMIT_RESERVE_PAGES) * self.frame_bytes
        self.conn.execute(f"PRAGMA journal_size_limit={limit}")

    @contextlib.contextmanager
    def flock(self):
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def open_conn(self) -> sqlite3.Connection:
        """``conn``, under :attr:`mutex` of a state :meth:`StoreIndex._held` yielded (open)."""
        return cast(sqlite3.Connection, self.conn)

    def pending(self) -> bool:
        return bool(self.hits or self.misses or self.touched)

    def write_pending(self, conn) -> None:
        """Inside a transaction: apply pending counts and touches (forget them once it commits)."""
        if self.hits:
            conn.execute("UPDATE counters SET value = value + ? WHERE name = 'hits'", (self.hits,))
        if self.misses:
            conn.execute("UPDATE counters SET value = value + ? WHERE name = 'misses'",
                         (self.misses,))
        for key in self.touched:
            conn.execute(f"UPDATE entries SET used = {_NEXT_USED} WHERE spec = ? AND rec = ?", key)

    def forget_pending(self) -> None:
        """After the transaction that wrote them committed."""
        self.hits = self.misses = 0
        self.touched.clear()
        self.last_flush = time.monotonic()
        self.deferred = False

    def flush(self) -> None:
        with self.mutex:
            if self.pid != os.getpid() or self.conn is None or not self.pending():
                return
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                self.write_pending(self.conn)
                self.conn.execute("COMMIT")
            except BaseException:
                _rollback(self.conn)
                self.deferred, self.last_flush = True, time.monotonic()
                raise
            self.forget_pending()

    def close(self) -> None:
        """Flush and close (called on close, garbage collection and process exit)."""
        with self.mutex:
            if self.pid != os.getpid() or self.conn is None:
                return
            try:
                self.flush()
            except sqlite3.Error as exc:           # never fail at exit over statistics
                self.on_write_error(exc)
            self.conn.close()
            os.close(self.lock_fd)
            self.conn, self.lock_fd = None, -1


class StoreIndex:
    """SQLite index plus writer lock of one store root (internal).

    Parameters
    ----------
    root : pathlib.Path
        Existing store folder.
    index_name, lock_name : str
        File names inside ``root``.
    max_wal_bytes : int or None, default=None
        Keep the write-ahead log within about this many bytes (at least ``MIN_WAL_PAGES``, at
        most SQLite's default of ``WAL_PAGES`` pages; ``None``: the default).
    on_write_error : callable (exception) -> None, default=None
        Told of writes that failed and were not raised: statistics flushes (also at exit).  The
        default logs a warning.

    Raises
    ------
    sqlite3.OperationalError, OSError
        If the index cannot be opened or created (e.g. the disk is full).
    """

    def __init__(self, root: Path, index_name: str, lock_name: str, *,
                 max_wal_bytes: int | None = None, on_write_error=None):
        self._db_path = root / index_name
        self._lock_path = root / lock_name
        self._max_wal_bytes = max_wal_bytes
        self._on_write_error = on_write_error or _warn_write_error
        self._state: _ProcessState | None = None
        self._guard = threading.Lock()
        #: Bytes of one write-ahead log frame (a page and its header).
        self.frame_bytes = self._ensure_open().frame_bytes

    def _ensure_open(self) -> _ProcessState:
        st = self._state
        if st is not None and st.pid == os.getpid() and st.conn is not None:
            return st
        with self._guard:
            st = self._state
            if st is not None and st.pid == os.getpid() and st.conn is not None:
                return st
            if st is not None and st.pid != os.getpid():
                _INHERITED.append(st)              # the parent's: never close it in the child
            st = _ProcessState(self._db_path, self._lock_path, self._max_wal_bytes,
                               self._on_write_error)
            # flush at garbage collection and at exit (atexit, or multiprocessing child exit)
            multiprocessing.util.Finalize(self, st.close, exitpriority=10)
            self._state = st
            return st

    @contextlib.contextmanager
    def _held(self):
        """This process's state, its mutex held and its connection open: a close() by another
        thread between :meth:`_ensure_open` and taking the mutex makes it open a new one."""
        while True:
            st = self._ensure_open()
            with st.mutex:
                if st.conn is not None:
                    yield st
                    return

    @property
    def rebuilt(self) -> bool:
        """Whether this process found the index corrupt and replaced it with an empty one."""
        return self._ensure_open().rebuilt

    def close(self) -> None:
        """Flush, then close the connection and lock file of this process (reopened on use)."""
        st = self._state
        if st is not None:
            st.close()

    @property
    def commit_reserve(self) -> int:
        """Bytes of log a put's commit adds (``COMMIT_RESERVE_PAGES`` frames)."""
        return COMMIT_RESERVE_PAGES * self.frame_bytes

    def flush(self) -> None:
        """Write pending counts and recency touches now (a refused write is reported to
        ``on_write_error``, not raised; the counts stay pending)."""
        self._flush_or_defer(self._ensure_open())

    def _flush_or_defer(self, st: _ProcessState) -> None:
        """Flush; on failure keep the counts pending and report the failure to ``on_write_error``
        once per run of failures (a retry that fails again is not another refused write), and
        never a busy or locked database (another process is writing: not a fault)."""
        again = st.deferred
        try:
            st.flush()
        except sqlite3.OperationalError as exc:
            busy = "locked" in str(exc) or "busy" in str(exc)
            if busy or again:
                log.debug("feature store: statistics flush deferred (%s)", exc)
            else:
                self._on_write_error(exc)

    @contextlib.contextmanager
    def writer(self, undo=None):
        """Hold the writer lock (thread mutex + flock) and an IMMEDIATE transaction.

        Pending reads are applied first.  Yields the connection; commits on success, rolls back
        on error (also when the commit fails, e.g. on a full disk).

        Parameters
        ----------
        undo : callable (connection) -> None, default=None
            After a rollback, still under the lock: repairs what the transaction's file
            operations did (in a transaction of its own; best effort, its errors are ignored).
        """
        with self._held() as st, st.flock():
            conn = st.open_conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                st.write_pending(conn)
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                if undo is not None:
                    _repair(conn, undo)
                raise
            st.forget_pending()

    def query(self, sql: str, params=()) -> list[tuple]:
        """Run a read-only query and return all rows."""
        with self._held() as st:
            return st.open_conn().execute(sql, params).fetchall()

    def _note(self, st: _ProcessState) -> None:
        if (time.monotonic() - st.last_flush > FLUSH_AFTER_S
                or (st.hits + st.misses >= FLUSH_EVERY and not st.deferred)):
            self._flush_or_defer(st)

    # -- operations ------------------------------------------------------------------------------
    @staticmethod
    def upsert(conn, spec: str, rec: str, nbytes: int) -> None:
        """Insert or replace an entry row as most recently used (inside a transaction)."""
        # an upsert, not INSERT OR REPLACE: REPLACE deletes without firing the delete trigger
        conn.execute(f"INSERT INTO entries (spec, rec, nbytes, used) VALUES (?, ?, ?, {_NEXT_USED}) "
                     "ON CONFLICT (spec, rec) DO UPDATE SET nbytes = excluded.nbytes, "
                     "used = excluded.used", (spec, rec, nbytes))

    @staticmethod
    def total_bytes(conn) -> int:
        """Bytes of all entries (the trigger-maintained counter; O(1))."""
        row = conn.execute("SELECT value FROM counters WHERE name = 'bytes'").fetchone()
        return int(row[0]) if row else 0

    @staticmethod
    def resum_bytes(conn) -> None:
        """Recompute the byte counter from the rows (after a reindex)."""
        conn.execute("UPDATE counters SET value = (SELECT COALESCE(SUM(nbytes), 0) FROM entries) "
                     "WHERE name = 'bytes'")

    @staticmethod
    def delete(conn, spec: str, rec: str) -> None:
        conn.execute("DELETE FROM entries WHERE spec = ? AND rec = ?", (spec, rec))

    def record_hit(self, spec: str, rec: str) -> bool:
        """Count a hit and mark the entry most recently used; False if it has no row."""
        with self._held() as st:
            st.hits += 1
            key = (spec, rec)
            st.touched.pop(key, None)
            st.touched[key] = None
            exists = st.open_conn().execute(_EXISTS, key).fetchone() is not None
            self._note(st)
            return exists

    def record_miss(self, spec: str, rec: str) -> bool:
        """Count a miss; True if a (stale) row for the key exists."""
        with self._held() as st:
            st.misses += 1
            exists = st.open_conn().execute(_EXISTS, (spec, rec)).fetchone() is not None
            self._note(st)
            return exists

    def totals(self) -> tuple[int, int]:
        """``(entries, bytes)`` of all rows."""
        (n, b), = self.query("SELECT COUNT(*), COALESCE(SUM(nbytes), 0) FROM entries")
        return int(n), int(b)

    def counters(self) -> dict[str, int]:
        """Shared counters, after writing this process's pending ones."""
        self.flush()
        return {k: int(v) for k, v in self.query("SELECT name, value FROM counters")}
