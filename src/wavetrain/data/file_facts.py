"""Facts about a file that cost a read to learn — its content hash and audio header — kept
across runs.

A recording's identity in the feature store is the SHA-1 of its bytes, so without a memo every
run reads every byte of the data set just to find its features again (a warm run over 8 hours of
44.1 kHz audio would re-read 2.5 GB), and the data set check opens every header.  With a memo,
a file is hashed and its header parsed once; later runs trust the remembered facts while the
file's ``(device, inode, size, mtime_ns, ctime_ns)`` are unchanged — the test git, ccache and
make rely on.  A file modified less than :data:`RACY_S` seconds before it was examined is not
remembered across runs (a write in progress could keep its size and mtime), only within the run.

The in-process memo is always on.  The persistent one lives in a small SQLite file next to the
feature store (``<cache>/files.sqlite``), switched on by :func:`use` — the CLI does this whenever
a feature store is in use (not with ``--no-cache``).  It is only an accelerator: if it cannot be
opened, read or written (read-only folder, corrupt file, lock timeout) it is ignored and facts
are recomputed; nothing is ever trusted from it without the stat match.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["use", "get", "put", "flush", "count", "forget", "stat_key", "RACY_S"]

log = logging.getLogger(__name__)

#: Files modified this recently (seconds) are remembered only within the run.
RACY_S = 2.0
#: Unsaved rows are written in a transaction whenever this many have accumulated.
FLUSH_ROWS = 2000

_lock = threading.RLock()
_memo: dict[str, tuple[tuple, dict[str, Any]]] = {}
_db: _FactsDB | None = None


def stat_key(st: os.stat_result) -> tuple:
    """What must be unchanged for remembered facts to hold."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _FactsDB:
    """The SQLite file: one row per absolute path, rows written in one transaction per flush."""

    def __init__(self, path: Path):
        import sqlite3

        self.path = path
        self.pid = os.getpid()
        self.conn = sqlite3.connect(str(path), timeout=5.0, check_same_thread=False,
                                    isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        # a small log, cut back after each checkpoint: the file counts against the store's bound
        self.conn.execute("PRAGMA wal_autocheckpoint=256")
        self.conn.execute(f"PRAGMA journal_size_limit={1 << 20}")
        self.conn.execute("CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, "
                          "stat TEXT NOT NULL, facts TEXT NOT NULL)")
        self.dirty: dict[str, tuple[tuple, dict]] = {}

    def load(self, path: str) -> tuple[tuple, dict] | None:
        row = self.conn.execute("SELECT stat, facts FROM files WHERE path = ?", (path,)).fetchone()
        if row is None:
            return None
        return tuple(json.loads(row[0])), json.loads(row[1])

    def flush(self) -> None:
        if not self.dirty:
            return
        rows = [(p, json.dumps(list(k)), json.dumps(f)) for p, (k, f) in self.dirty.items()]
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            self.conn.executemany("INSERT OR REPLACE INTO files (path, stat, facts) VALUES (?, ?, ?)",
                                  rows)
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.dirty.clear()

    def close(self) -> None:
        self.conn.close()


def use(path: str | os.PathLike | None) -> None:
    """Remember facts across runs in the SQLite file ``path`` (``None``: within this run only).

    Typically ``use(Path(cache_dir) / "files.sqlite")``, next to a feature store.
    """
    global _db
    with _lock:
        if _db is not None:
            if path is not None and Path(path) == _db.path:
                return
            _flush_quietly()
            _db.close()
            _db = None
        if path is None:
            return
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            _db = _FactsDB(Path(path))
        except Exception as e:  # sqlite3.Error, OSError: run without the persistent memo
            log.warning("file facts memo %s unusable (%s); hashing files afresh", path, e)
            _db = None


def _after_fork() -> None:
    """In a forked child: leave the parent's connection and unsaved rows alone (they are the
    parent's to write) and open a connection of our own."""
    global _db
    if _db is not None and _db.pid != os.getpid():
        path, _db = _db.path, None
        try:
            _db = _FactsDB(path)
        except Exception as e:
            log.warning("file facts memo %s unusable in a child process (%s)", path, e)


def get(path: str, st: os.stat_result, fact: str) -> Any | None:
    """The remembered ``fact`` of the file at absolute ``path`` with stat ``st``, or None
    (callers validate the value: the memo is a file on disk)."""
    key = stat_key(st)
    with _lock:
        _after_fork()
        hit = _memo.get(path)
        if (hit is None or fact not in hit[1]) and _db is not None:   # (facts learnt before use())
            try:
                stored = _db.load(path)
            except Exception as e:
                log.warning("file facts memo unreadable (%s); hashing files afresh", e)
                _disable()
                stored = None
            if stored is not None and (hit is None or stored[0] == hit[0]):
                hit = _memo[path] = (stored[0], {**stored[1], **(hit[1] if hit else {})})
        if hit is None or hit[0] != key:
            return None
        return hit[1].get(fact)


def put(path: str, st: os.stat_result, fact: str, value: Any, *, seen_ns: int | None = None) -> None:
    """Remember ``fact`` (JSON-serialisable) of the file at absolute ``path`` with stat ``st``,
    taken at ``seen_ns`` (``time.time_ns()``; default now): a file modified less than
    :data:`RACY_S` before its stat is remembered only within this run."""
    key = stat_key(st)
    seen = time.time_ns() if seen_ns is None else seen_ns
    with _lock:
        _after_fork()
        hit = _memo.get(path)
        facts = dict(hit[1]) if hit is not None and hit[0] == key else {}
        facts[fact] = value
        _memo[path] = (key, facts)
        if _db is not None and st.st_mtime_ns < seen - RACY_S * 1e9:
            _db.dirty[path] = (key, facts)
            if len(_db.dirty) >= FLUSH_ROWS:  # bound what waits in memory to be written
                _flush_quietly()


def flush() -> None:
    """Write the facts learnt since the last flush to the persistent memo (if any)."""
    with _lock:
        if _db is not None and _db.pid != os.getpid():
            return  # a forked child that never used the memo: nothing of its own to write
        _flush_quietly()


def _flush_quietly() -> None:
    if _db is None:
        return
    try:
        _db.flush()
    except Exception as e:  # locked too long, read-only, disk full: the memo is optional
        log.warning("could not save file facts to %s (%s)", _db.path, e)
        _db.dirty.clear()


def _disable() -> None:
    global _db
    if _db is not None:
        try:
            _db.close()
        except Exception:
            pass
    _db = None


def count(path: str | os.PathLike) -> int:
    """Files remembered in the SQLite file ``path`` (0 when absent or unreadable; read-only)."""
    import sqlite3

    if not Path(path).exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM files").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def forget(path: str | os.PathLike) -> None:
    """Delete the SQLite file ``path`` (and its WAL files); stop using it if it is in use."""
    with _lock:
        if _db is not None and _db.path == Path(path):
            use(None)
    for suffix in ("", "-wal", "-shm"):
        try:
            Path(f"{path}{suffix}").unlink()
        except FileNotFoundError:
            pass


atexit.register(flush)
