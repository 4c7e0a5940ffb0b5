"""The persistent, content-addressed feature store and its no-op twin.

A feature gram (2-D array, frames x features) is stored once per ``(rec_id, spec_key)``: the
recording's content hash and the FeatureSpec key.  A second training run, a k-fold evaluation or
another model with the same spec reads the gram (memory-mapped when large) instead of
recomputing it.

Guarantees
----------
* Atomic writes: an entry is written to ``root/tmp``, flushed, then moved into place with
  ``os.replace`` (same file system, so the rename is atomic).  A crash or ``kill -9`` at any
  point leaves either no entry or the complete entry; stale temporary files are removed the next
  time a store is opened on the folder.
* Corruption is never returned: each entry has a 64-byte header (magic, shape, dtype, sizes,
  CRC-32 of header and data).  A file that fails a check counts as a miss and is removed.
* Power loss: an entry renamed into place before the kernel wrote its data can come back empty
  or partly zero after a power cut.  Entries are therefore not fsynced by default but flagged as
  such in their header, and every read of a flagged entry checks its data CRC (even with
  ``verify=False``, in any process): a damaged one is a miss, removed and recomputed.  A cache
  needs no fsync for correctness, and skipping it makes a put about 2x cheaper (0.35 ms of
  0.75 ms here).  ``sync=True`` fsyncs each entry before the rename instead (and reads of it
  with ``verify=False`` then skip the CRC).
* Several processes may use one store at once.  Writers (put, eviction, clear) hold an
  ``fcntl.flock`` on ``root/.lock`` only while they move or delete files and update the index;
  readers never take it.  A memory map stays valid on Linux when another process evicts its entry.
* ``max_bytes`` bounds everything the store keeps on disk: its entries (``entry_bytes`` each)
  plus ``index.sqlite`` and ``files.sqlite`` (the file facts memo) with their ``-wal`` and
  ``-shm`` files and ``CACHEDIR.TAG``, with room for the log frames of the commit in progress.
  A put evicts the least recently used entries (recency is refreshed by every hit) until the store
  fits; not counted are the empty ``.lock``, folders, block rounding and the temporary file of a
  put in progress.  The index's write-ahead log is checkpointed once it holds 1/16 of
  ``max_bytes`` (at least 16 pages, at most SQLite's default of 1000 pages, about 4 MB).  When
  the index files alone exceed ``max_bytes``, every entry is evicted and nothing is stored.
* A full disk never fails a run: a put the disk refuses (no space, quota, read-only, I/O error,
  in the entry file or the index) leaves no temporary file, no row without its file and no file
  without its row, and returns the gram in memory.  The first failure is logged as a warning,
  later ones are only counted (``write_errors``).  Reads keep working.

The store folder must be on a local file system (SQLite WAL and flock are unreliable on NFS).
"""
from __future__ import annotations

import errno
import logging
import os
import secrets
import socket
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np

from wavetrain.core.errors import CacheError, ParameterError
from wavetrain.core.outputs import pid_alive
from wavetrain.store import _format
from wavetrain.store._format import HEADER_BYTES, CorruptEntry
from wavetrain.store._index import StoreIndex
from wavetrain.store._paths import (
    FILE_FACTS_NAME,
    INDEX_NAME,
    LOCK_NAME,
    TAG_NAME,
    TAG_TEXT,
    TMP_DIR,
    check_keys,
    default_root,
    entry_file,
    is_spec_dir_name,
    iter_entry_files,
)

log = logging.getLogger(__name__)
#: Corrupt entries reported one by one (after a power cut there may be thousands).
_CORRUPT_WARNINGS = 5

_STORE_DTYPES: dict[str, np.dtype] = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}
_TMP_MAX_AGE_S = 3600.0          # temp files older than this are stale even if their pid lives
_HOST = socket.gethostname().replace("/", "_") or "host"
#: What a write the disk refuses raises: a cache goes on without storing (see _WriteFailures).
_WRITE_ERRORS = (OSError, sqlite3.OperationalError)
#: The write-ahead log is kept within this fraction of ``max_bytes`` (at most SQLite's default).
_WAL_SHARE = 16


def _reason(exc: Exception) -> str:
    """``No space left on device`` for an OSError, SQLite's message otherwise."""
    return (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)


class _WriteFailures:
    """Counts the writes a disk refused (full, over quota, read-only, failing) and warns once.

    The store is a cache: a run goes on without storing, and later writes keep trying (space may
    be freed) but are only counted.  Holds no reference to the store, so the index may keep it
    for its exit-time flush.
    """

    def __init__(self, root: Path):
        self.root = root
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, exc: Exception) -> None:
        with self._lock:
            self.count += 1
            first = self.count == 1
        if first:
            log.warning("feature store %s: cannot write (%s); continuing without storing "
                        "features: free space, or give another folder as the store root or set "
                        "WAVETRAIN_CACHE", self.root, _reason(exc))
        else:
            log.debug("feature store %s: cannot write (%s)", self.root, _reason(exc))


def _check_dtype(dtype, owner: str) -> np.dtype:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    if name not in _STORE_DTYPES:
        raise ParameterError(f"parameter dtype of {owner} must be one of 'float32', 'float16'; "
                             f"got {dtype!r}")
    return _STORE_DTYPES[name]


def _as_gram(array, dtype: np.dtype, what: str) -> np.ndarray:
    """``array`` as a C-contiguous little-endian 2-D array of ``dtype`` (may be ``array`` itself)."""
    a = np.asarray(array)
    if a.ndim != 2:
        raise CacheError(f"feature gram for {what} must be 2-D (frames x features); "
                         f"got shape {a.shape}")
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)
            or a.dtype == np.bool_):
        raise CacheError(f"feature gram for {what} must be real-valued; got dtype {a.dtype}")
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(a, dtype=dtype)
    if dtype.itemsize == 2 and out.size and np.isinf(out).sum() > np.isinf(a).sum():
        warnings.warn(f"feature gram for {what} has values beyond the float16 range (±65504) "
                      f"that are stored as inf; use a float32 store or log-scaled features",
                      RuntimeWarning, stacklevel=3)
    return out


def _readonly_copy(data: np.ndarray, src) -> np.ndarray:
    out = data.copy() if np.may_share_memory(data, np.asarray(src)) else data
    out.flags.writeable = False
    return out



class FeatureStore:
    """Persistent, content-addressed store of feature grams on local disk.

    Parameters
    ----------
    root : str or os.PathLike, default=None
        Store folder, created if missing.  ``None`` uses :func:`default_root`
        (``$WAVETRAIN_CACHE``, else ``$XDG_CACHE_HOME/wavetrain``, else ``~/.cache/wavetrain``).
    max_bytes : int >= 0, default=None
        Upper bound of the bytes the store folder holds: all entries (header included, see
        :func:`entry_bytes`) plus the index and file-facts SQLite files with their logs (see
        Guarantees in the module docstring); ``None`` means unbounded.  Each put evicts
        least-recently-used entries until the store fits.  A gram that does not fit beside the
        index files is not stored (``put`` returns it in memory).  A bound below about 1 MB
        leaves little room for entries (the index files take 100 to 200 KB) and makes puts up
        to 1.5x slower (a smaller write-ahead log is checkpointed more often).  Processes sharing
        a folder may use different bounds; each enforces its own on put (against the bytes of
        all processes' entries and the index files as they are).
    dtype : {"float32", "float16"}, default="float32"
        Dtype in which new entries are written.  float16 halves disk and page-cache use; values
        beyond ±65504 become inf (with a warning).  Reads return each entry in the dtype it was
        written in.
    verify : bool, default=True
        Check the CRC-32 of an entry's data on every read (reads the entry once).  Size and header
        are always checked.
    mmap_min_bytes : int >= 0, default=1048576
        Grams with at least this many data bytes are returned as read-only ``np.memmap`` views of
        the entry file; smaller ones are read into read-only in-memory arrays.  Reading a small
        gram is faster than mapping it, and a live map holds an open file descriptor (Python's
        ``mmap`` keeps a duplicate), so thousands of live maps would hit the open-files limit.
        ``0`` maps every gram.
    sync : bool, default=None
        fsync each entry before it is renamed into place.  ``None``: only when ``verify`` is
        False.  Entries written without fsync are flagged, and their CRC is checked on every read
        whatever the reader's ``verify``, so a power cut never returns damaged data.

    Attributes
    ----------
    root : pathlib.Path
        The store folder.
    write_errors : int
        Writes this instance could not make (disk full, read-only, I/O error); the run went on
        without storing.

    Raises
    ------
    CacheError
        If ``root`` exists but is not a folder, or cannot be written, or its index cannot be
        opened or created (e.g. the disk is full).
    ParameterError
        If ``max_bytes`` or ``dtype`` is invalid.

    Notes
    -----
    Arrays returned by :meth:`get` and :meth:`put` are read-only, dtype float32 or float16:
    ``np.memmap`` views of the entry file for grams of at least ``mmap_min_bytes`` (their pages
    belong to the OS page cache, not to the process heap, and each live map holds one file
    descriptor and one of the kernel's ``vm.max_map_count`` mappings), in-memory arrays for
    smaller grams.  A float16 gram can be used wherever float32 is expected; NumPy upcasts it in
    arithmetic, or call ``np.asarray(g, dtype=np.float32)`` for a copy.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> store = FeatureStore(tempfile.mkdtemp(), max_bytes=10_000_000)
    >>> g = store.put("a1b2c3d4e5f60718", "0123456789abcdef", np.ones((100, 64), np.float32))
    >>> store.get("a1b2c3d4e5f60718", "0123456789abcdef").shape
    (100, 64)
    >>> store.info()["entries"]
    1
    """

    def __init__(self, root=None, *, max_bytes: int | None = None, dtype="float32",
                 verify: bool = True, mmap_min_bytes: int = 1 << 20, sync: bool | None = None):
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(
                max_bytes, (int, np.integer)) or max_bytes < 0):
            raise ParameterError(f"parameter max_bytes of FeatureStore must be None or an int >= 0; "
                                 f"got {max_bytes!r}")
        self.max_bytes = None if max_bytes is None else int(max_bytes)
        #: Entries this process evicted to stay within ``max_bytes``.
        self.evicted = 0
        #: Grams this process did not store because each alone does not fit in ``max_bytes``
        #: (beside the index files).
        self.not_stored = 0
        #: Corrupt entries this process found and removed (e.g. after a power cut).
        self.corrupt_removed = 0
        self.dtype = _check_dtype(dtype, "FeatureStore")
        self.verify = bool(verify)
        self.sync = (not self.verify) if sync is None else bool(sync)
        if isinstance(mmap_min_bytes, bool) or not isinstance(mmap_min_bytes, (int, np.integer)) \
                or mmap_min_bytes < 0:
            raise ParameterError(f"parameter mmap_min_bytes of FeatureStore must be an int >= 0; "
                                 f"got {mmap_min_bytes!r}")
        self.mmap_min_bytes = int(mmap_min_bytes)
        self.root = Path(default_root() if root is None else root).expanduser()
        self._root_s = str(self.root)
        self._write_failed = _WriteFailures(self.root)
        #: SQLite files counted against ``max_bytes`` besides the entries (with their logs).
        self._databases = [os.path.join(self._root_s, name)
                           for name in (INDEX_NAME, FILE_FACTS_NAME)]
        fresh = self._prepare_root()
        wal = None if self.max_bytes is None else self.max_bytes // _WAL_SHARE
        try:
            self._index = StoreIndex(self.root, INDEX_NAME, LOCK_NAME, max_wal_bytes=wal,
                                     on_write_error=self._write_failed)
            self._clean_tmp()
            # counted with every measure of the index files: the tag and a commit's log frames
            self._fixed_bytes = (self._index.commit_reserve
                                 + os.stat(os.path.join(self._root_s, TAG_NAME)).st_size)
            if fresh or self._index.rebuilt:
                self.reindex()
        except _WRITE_ERRORS as exc:
            if getattr(self, "_index", None) is not None:
                self._index.close()
            raise CacheError(f"cannot open the index of feature cache {self.root} "
                             f"({_reason(exc)}); free space, or give another folder as the store "
                             f"root or set WAVETRAIN_CACHE") from None

    @property
    def write_errors(self) -> int:
        """Writes this instance could not make (disk full, read-only, I/O error)."""
        return self._write_failed.count

    # -- setup ---------------------------------------------------------------------------------
    def _prepare_root(self) -> bool:
        """Create the folder layout; True when there was no index yet."""
        root = self.root
        if root.exists() and not root.is_dir():
            raise CacheError(f"feature cache {root} is not a folder; give a folder as the store "
                             f"root or set WAVETRAIN_CACHE")
        tag = root / TAG_NAME
        try:
            (root / TMP_DIR).mkdir(parents=True, exist_ok=True)
            if os.path.islink(tag) or os.path.islink(root / TMP_DIR):
                raise CacheError(f"feature cache {root}: {tag if os.path.islink(tag) else root / TMP_DIR} is a "
                                 "symbolic link; the store writes only its own files, so remove the link")
            if not tag.exists():
                try:      # created here, never through a link planted since
                    fd = os.open(tag, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
                    with os.fdopen(fd, "w") as f:
                        f.write(TAG_TEXT)
                except FileExistsError:
                    pass
                except OSError:
                    tag.unlink(missing_ok=True)          # not an empty or partial tag
                    raise
        except OSError as exc:
            fix = "free space, or give another" if exc.errno in (errno.ENOSPC, errno.EDQUOT) \
                else "give a writable"
            raise CacheError(f"cannot create feature cache {root}: {_reason(exc)}; {fix} folder "
                             f"as the store root or set WAVETRAIN_CACHE") from None
        if not os.access(root, os.W_OK | os.X_OK):
            raise CacheError(f"feature cache {root} is not writable; give a writable folder as "
                             f"the store root or set WAVETRAIN_CACHE")
        return not (root / INDEX_NAME).exists()

    def _clean_tmp(self) -> int:
        """Remove temp files of dead writers on this host, or older than an hour; return count."""
        removed = 0
        now = time.time()
        try:
            items = list(os.scandir(self.root / TMP_DIR))
        except FileNotFoundError:
            return 0
        for item in items:
            parts = item.name.rsplit(".", 3)
            if len(parts) != 4 or parts[3] != "tmp":
                continue
            head, pid, _token, _ = parts
            host = head.split(".", 1)[1] if "." in head else ""
            try:
                stale = ((host == _HOST and pid.isdigit() and not pid_alive(int(pid)))
                         or now - item.stat().st_mtime > _TMP_MAX_AGE_S)
                if stale:
                    os.unlink(item.path)
                    removed += 1
            except FileNotFoundError:
                continue
        if removed:
            log.info("feature store %s: removed %d stale temporary files", self.root, removed)
        return removed

    def _tmp_path(self, rec: str) -> str:
        name = f"{rec[:16]}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        return os.path.join(self._root_s, TMP_DIR, name)

    # -- reading -------------------------------------------------------------------------------
    def _open(self, spec: str, rec: str, path: str):
        """Map the entry read-only; None if absent or corrupt (a corrupt file is removed)."""
        try:
            f = open(path, "rb")  # noqa: SIM115 (closed by the `with f` below, after the misses)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("feature store: cannot open %s (%s); treated as a miss", path, exc)
            return None
        with f:
            ino = os.fstat(f.fileno()).st_ino
            try:
                return _format.load_entry(f, verify=self.verify,
                                          mmap_min_bytes=self.mmap_min_bytes)
            except (CorruptEntry, ValueError) as exc:
                reason = exc
            except OSError as exc:
                log.warning("feature store: cannot read %s (%s); treated as a miss", path, exc)
                return None
        self.corrupt_removed += 1
        if self.corrupt_removed <= _CORRUPT_WARNINGS:
            log.warning("feature store: removing corrupt entry %s (%s)%s", path, reason,
                        "; further ones are removed without a warning"
                        if self.corrupt_removed == _CORRUPT_WARNINGS else "")
        else:
            log.debug("feature store: removing corrupt entry %s (%s)", path, reason)
        self._remove_if(spec, rec, path, ino)
        return None

    def _remove_if(self, spec: str, rec: str, path: str, ino: int | None) -> None:
        """Under the writer lock: delete the entry file if it is still inode ``ino`` (or, with
        ``ino=None``, only the row when the file is gone).  A refused write is counted, not
        raised (a read's housekeeping)."""
        try:
            self._remove_locked(spec, rec, path, ino)
        except _WRITE_ERRORS as exc:
            self._write_failed(exc)

    def _remove_locked(self, spec: str, rec: str, path: str, ino: int | None) -> None:
        with self._index.writer() as conn:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None
            if st is not None and ino is not None and st.st_ino == ino:
                os.unlink(path)
                st = None
            if st is None:
                StoreIndex.delete(conn, spec, rec)

    def _adopt(self, spec: str, rec: str, path: str, ino: int) -> None:
        """Index an entry file that has no row (left by a crash between rename and commit).  A
        refused write is counted, not raised (a read's housekeeping)."""
        try:
            with self._index.writer() as conn:
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    return
                if st.st_ino == ino:
                    StoreIndex.upsert(conn, spec, rec, st.st_size)
                    self._evict(conn, keep=(spec, rec))
        except _WRITE_ERRORS as exc:
            self._write_failed(exc)

    def get(self, rec_id: str, spec_key: str) -> np.ndarray | None:
        """Read a stored gram.

        Counts a hit or a miss and, on a hit, marks the entry most recently used.

        Parameters
        ----------
        rec_id : str
            Recording content hash (8 to 128 hex digits).
        spec_key : str
            FeatureSpec key (16 hex digits).

        Returns
        -------
        gram : np.ndarray of shape (n_frames, n_features) or None
            Read-only, float32 or float16 (the dtype it was stored in), an ``np.memmap`` when the
            gram has at least ``mmap_min_bytes``; ``None`` when the entry is absent or was
            corrupt.

        Raises
        ------
        CacheError
            If a key is malformed.
        """
        rec, spec = check_keys(rec_id, spec_key)
        path = entry_file(self._root_s, rec, spec)
        gram = self._open(spec, rec, path)
        if gram is None:
            if self._index.record_miss(spec, rec):
                self._remove_if(spec, rec, path, None)       # drop a row whose file is gone
            return None
        if not self._index.record_hit(spec, rec):
            try:
                self._adopt(spec, rec, path, os.stat(path).st_ino)
            except FileNotFoundError:
                pass
        return gram

    def contains(self, rec_id: str, spec_key: str) -> bool:
        """Whether an entry with a valid header and size exists (no counting, no recency; the
        data checksum is not read, so an entry damaged by a power cut counts until a read finds it)."""
        rec, spec = check_keys(rec_id, spec_key)
        try:
            with open(entry_file(self._root_s, rec, spec), "rb") as f:
                _format.read_header(f)
        except (OSError, CorruptEntry):
            return False
        return True

    # -- writing -------------------------------------------------------------------------------
    def _index_bytes(self) -> int:
        """Bytes on disk besides the entries: both SQLite files with their logs and the tag, plus
        room for the log frames of the commit in progress (four to six ``os.stat`` calls)."""
        total = self._fixed_bytes
        for db in self._databases:
            try:
                total += os.stat(db).st_size
            except OSError:
                continue                        # no file facts memo here: no logs of it either
            for suffix in ("-wal", "-shm"):
                try:
                    total += os.stat(db + suffix).st_size
                except OSError:
                    pass
        return total

    def _room(self) -> int | None:
        """Bytes left for entries under ``max_bytes`` beside the index files (None: unbounded;
        negative when the index files alone exceed the bound)."""
        return None if self.max_bytes is None else self.max_bytes - self._index_bytes()

    def _evict(self, conn, keep: tuple[str, str], room: int | None = None,
               deleted: list | None = None) -> int:
        """Inside a writer transaction: delete LRU entries (never ``keep``) until the entries fit
        in ``room`` (default: measured now, see :meth:`_room`); ``deleted`` collects the keys
        whose files were removed.

        The entry total comes from a counter the index keeps exact with triggers (O(1), and it
        includes every process's entries), so the bound holds after every put."""
        if self.max_bytes is None:
            return 0
        if room is None:
            room = cast(int, self._room())  # an int: max_bytes is set
        total = StoreIndex.total_bytes(conn)
        evicted = 0
        while total > room:
            rows = conn.execute("SELECT spec, rec, nbytes FROM entries "
                                "WHERE NOT (spec = ? AND rec = ?) ORDER BY used LIMIT 64",
                                keep).fetchall()
            if not rows:
                break
            for spec, rec, nbytes in rows:
                if total <= room:
                    break
                try:
                    os.unlink(entry_file(self._root_s, rec, spec))
                except FileNotFoundError:
                    pass
                if deleted is not None:
                    deleted.append((spec, rec))
                StoreIndex.delete(conn, spec, rec)
                total -= nbytes
                evicted += 1
        if evicted:
            log.debug("feature store %s: evicted %d entries", self.root, evicted)
            self.evicted += evicted
        return evicted

    def put(self, rec_id: str, spec_key: str, array) -> np.ndarray:
        """Store a gram atomically (replacing any entry of the same key).

        Parameters
        ----------
        rec_id : str
            Recording content hash (8 to 128 hex digits).
        spec_key : str
            FeatureSpec key (16 hex digits).
        array : array_like of shape (n_frames, n_features)
            Real-valued; converted to the store dtype.

        Returns
        -------
        gram : np.ndarray of shape (n_frames, n_features)
            The stored gram, read-only, in the store dtype: an ``np.memmap`` of the entry when it
            has at least ``mmap_min_bytes``, else in memory.  A gram that does not fit in
            ``max_bytes`` beside the index files, or that the disk refused (full, read-only, I/O
            error: counted in ``write_errors``, the first one logged), is not stored and comes
            back as a read-only in-memory array.

        Raises
        ------
        CacheError
            If a key is malformed or ``array`` is not a real 2-D array.
        """
        rec, spec = check_keys(rec_id, spec_key)
        data = _as_gram(array, self.dtype, f"recording {rec} / spec {spec}")
        nbytes = HEADER_BYTES + data.nbytes
        if self.max_bytes is None or nbytes <= self.max_bytes:
            try:
                stored = self._write(spec, rec, data, nbytes, array)
            except _WRITE_ERRORS as exc:
                self._write_failed(exc)
                return _readonly_copy(data, array)
            if stored is not None:
                return stored
        self.not_stored += 1
        log.info("feature store: gram %s/%s (%d bytes) does not fit in max_bytes=%d beside the "
                 "index files; not stored", spec, rec, nbytes, self.max_bytes)
        return _readonly_copy(data, array)

    def _write(self, spec: str, rec: str, data: np.ndarray, nbytes: int,
               array) -> np.ndarray | None:
        """Write an entry atomically and index it; the gram ``put`` returns, or None when it does
        not fit beside the index files (then only the LRU entries beyond the bound are evicted).

        A refused write raises after the temp file is removed and the transaction rolled back;
        :meth:`_undo` then removes the file it may have moved into place and the rows of files it
        replaced or evicted."""
        path = entry_file(self._root_s, rec, spec)
        tmp = self._tmp_path(rec)
        changed: list[tuple[str, str]] = []   # the key once its file is in place, then victims
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            with os.fdopen(fd, "w+b") as f:
                _format.write_entry(f, data, sync=self.sync)
                with self._index.writer(undo=lambda conn: self._undo(conn, path, changed)) as conn:
                    room = self._room()
                    if room is not None and nbytes > room:
                        self._evict(conn, keep=("", ""), room=room)
                        return None
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    os.replace(tmp, path)
                    changed.append((spec, rec))
                    StoreIndex.upsert(conn, spec, rec, nbytes)
                    self._evict(conn, keep=(spec, rec), room=room, deleted=changed)
                if data.nbytes < self.mmap_min_bytes:
                    return _readonly_copy(data, array)
                return _format.load_entry(f, verify=False, mmap_min_bytes=0)
        finally:
            if not changed:                      # not renamed into place: remove the temp file
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    @staticmethod
    def _undo(conn, path: str, changed: list[tuple[str, str]]) -> None:
        """After a put's transaction was rolled back, under the writer lock: remove the entry file
        it moved into place (its row was rolled back) and drop the rows of the files it replaced
        or evicted.  If this fails too, such rows are dropped by the next read or eviction."""
        if not changed:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        for spec, rec in changed:
            StoreIndex.delete(conn, spec, rec)

    def get_or_compute(self, rec_id: str, spec_key: str,
                       compute: Callable[[], np.ndarray]) -> np.ndarray:
        """Return the stored gram, or compute, store and return it.

        Parameters
        ----------
        rec_id, spec_key : str
            The key, as for :meth:`get`.
        compute : callable () -> array_like of shape (n_frames, n_features)
            Called only on a miss.

        Returns
        -------
        gram : np.ndarray of shape (n_frames, n_features)
            Read-only (see :meth:`get` and :meth:`put`).
        """
        gram = self.get(rec_id, spec_key)
        if gram is None:
            gram = self.put(rec_id, spec_key, compute())
        return gram

    # -- housekeeping --------------------------------------------------------------------------
    def info(self) -> dict:
        """Store statistics, shared by every process using the folder.

        Returns
        -------
        info : dict
            ``entries`` (int), ``bytes`` (int, entry bytes as counted by ``max_bytes``), ``hits``,
            ``misses`` (int, since the store folder was created), ``hit_rate`` (float in [0, 1],
            0.0 before the first get), ``root`` (str), ``max_bytes`` (int or None).
        """
        entries, nbytes = self._index.totals()
        c = self._index.counters()
        hits, misses = c.get("hits", 0), c.get("misses", 0)
        return {"entries": entries, "bytes": nbytes, "hits": hits, "misses": misses,
                "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
                "root": str(self.root), "max_bytes": self.max_bytes}

    def clear(self) -> int:
        """Remove every entry (hit/miss counters are kept).

        Returns
        -------
        removed : int
            Entry files removed.
        """
        removed = 0
        with self._index.writer() as conn:
            for _spec, _rec, path in list(iter_entry_files(self.root)):
                try:
                    os.unlink(path)
                    removed += 1
                except FileNotFoundError:
                    pass
            conn.execute("DELETE FROM entries")
            for spec_dir in self.root.iterdir():
                if spec_dir.is_dir() and is_spec_dir_name(spec_dir.name):
                    for sub in spec_dir.iterdir():
                        _rmdir_quiet(sub)
                    _rmdir_quiet(spec_dir)
        self._clean_tmp()
        return removed

    def reindex(self) -> tuple[int, int]:
        """Make the index match the files on disk (after the index was lost or files were
        deleted by hand), then evict down to ``max_bytes``.

        Returns
        -------
        added, dropped : int
            Rows added for unindexed files and rows dropped for missing files.
        """
        added = dropped = 0
        with self._index.writer() as conn:
            rows = {(s, r) for s, r in conn.execute("SELECT spec, rec FROM entries")}
            for spec, rec, path in iter_entry_files(self.root):
                if (spec, rec) in rows:
                    rows.discard((spec, rec))
                    continue
                StoreIndex.upsert(conn, spec, rec, path.stat().st_size)
                added += 1
            for spec, rec in rows:
                StoreIndex.delete(conn, spec, rec)
                dropped += 1
            StoreIndex.resum_bytes(conn)
            self._evict(conn, keep=("", ""))
        return added, dropped

    def close(self) -> None:
        """Release this process's index connection and lock file (reopened on next use)."""
        self._index.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        return {"root": str(self.root), "max_bytes": self.max_bytes, "dtype": self.dtype.name,
                "verify": self.verify, "mmap_min_bytes": self.mmap_min_bytes, "sync": self.sync}

    def __setstate__(self, state):
        type(self).__init__(self, state["root"], max_bytes=state["max_bytes"], dtype=state["dtype"],
                            verify=state["verify"], mmap_min_bytes=state["mmap_min_bytes"],
                            sync=state.get("sync"))

    def __repr__(self) -> str:
        return (f"FeatureStore(root={str(self.root)!r}, max_bytes={self.max_bytes!r}, "
                f"dtype={self.dtype.name!r})")


def _rmdir_quiet(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


class NullStore:
    """A store that stores nothing (``--no-cache``); same API as :class:`FeatureStore`.

    Every :meth:`get` is a miss, :meth:`put` returns the gram as a read-only in-memory array and
    :meth:`get_or_compute` always computes.  Counters live in the process only.

    Parameters
    ----------
    dtype : {"float32", "float16"}, default="float32"
        Dtype of the arrays :meth:`put` returns.
    """

    root = None
    evicted = 0
    not_stored = 0
    write_errors = 0
    max_bytes = 0

    def __init__(self, *, dtype="float32"):
        self.dtype = _check_dtype(dtype, "NullStore")
        self._misses = 0

    def get(self, rec_id: str, spec_key: str) -> None:
        """Always ``None`` (counts a miss)."""
        check_keys(rec_id, spec_key)
        self._misses += 1
        return None

    def put(self, rec_id: str, spec_key: str, array) -> np.ndarray:
        """Return ``array`` as a read-only array of the store dtype; nothing is stored."""
        rec, spec = check_keys(rec_id, spec_key)
        return _readonly_copy(_as_gram(array, self.dtype, f"recording {rec} / spec {spec}"), array)

    def get_or_compute(self, rec_id: str, spec_key: str,
                       compute: Callable[[], np.ndarray]) -> np.ndarray:
        """Call ``compute`` and return its result as :meth:`put` does."""
        self.get(rec_id, spec_key)
        return self.put(rec_id, spec_key, compute())

    def contains(self, rec_id: str, spec_key: str) -> bool:
        """Always ``False``."""
        check_keys(rec_id, spec_key)
        return False

    def info(self) -> dict:
        """Statistics in the form of :meth:`FeatureStore.info` (no entries, no hits)."""
        return {"entries": 0, "bytes": 0, "hits": 0, "misses": self._misses, "hit_rate": 0.0,
                "root": None, "max_bytes": 0}

    def clear(self) -> int:
        """Nothing to remove; returns 0."""
        return 0

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def __repr__(self) -> str:
        return f"NullStore(dtype={self.dtype.name!r})"
