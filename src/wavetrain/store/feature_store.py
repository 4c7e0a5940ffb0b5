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
* ``max_bytes`` bounds the bytes of all entries (``entry_bytes``); a put evicts the least recently
  used entries (recency is refreshed by every hit) until the store fits.

The store folder must be on a local file system (SQLite WAL and flock are unreliable on NFS).
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

from wavetrain.errors import CacheError, ParameterError
from wavetrain.store import _format
from wavetrain.store._format import HEADER_BYTES, CorruptEntry
from wavetrain.store._index import StoreIndex
from wavetrain.store._paths import (
    INDEX_NAME, LOCK_NAME, TAG_NAME, TAG_TEXT, TMP_DIR, check_keys, default_root, entry_file,
    is_spec_dir_name, iter_entry_files,
)

log = logging.getLogger(__name__)
#: Corrupt entries reported one by one (after a power cut there may be thousands).
_CORRUPT_WARNINGS = 5

_STORE_DTYPES = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}
_TMP_MAX_AGE_S = 3600.0          # temp files older than this are stale even if their pid lives
_HOST = socket.gethostname().replace("/", "_") or "host"


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FeatureStore:
    """Persistent, content-addressed store of feature grams on local disk.

    Parameters
    ----------
    root : str or os.PathLike, default=None
        Store folder, created if missing.  ``None`` uses :func:`default_root`
        (``$WAVETRAIN_CACHE``, else ``$XDG_CACHE_HOME/wavetrain``, else ``~/.cache/wavetrain``).
    max_bytes : int >= 0, default=None
        Upper bound of the bytes of all entries (header included, see :func:`entry_bytes`);
        ``None`` means unbounded.  Each put evicts least-recently-used entries until the store
        fits.  A gram larger than ``max_bytes`` is not stored (``put`` returns it in memory).
        Processes sharing a folder may use different bounds; each enforces its own on put
        (against the bytes of all processes' entries).
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

    Raises
    ------
    CacheError
        If ``root`` exists but is not a folder, or cannot be written.
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
        #: Grams this process did not store because each alone exceeds ``max_bytes``.
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
        fresh = self._prepare_root()
        self._index = StoreIndex(self.root, INDEX_NAME, LOCK_NAME)
        self._clean_tmp()
        if fresh or self._index.rebuilt:
            self.reindex()

    # -- setup ---------------------------------------------------------------------------------
    def _prepare_root(self) -> bool:
        """Create the folder layout; True when there was no index yet."""
        root = self.root
        if root.exists() and not root.is_dir():
            raise CacheError(f"feature cache {root} is not a folder; pass a folder to --cache or "
                             f"set WAVETRAIN_CACHE")
        try:
            (root / TMP_DIR).mkdir(parents=True, exist_ok=True)
            if not (root / TAG_NAME).exists():
                (root / TAG_NAME).write_text(TAG_TEXT)
        except OSError as exc:
            raise CacheError(f"cannot create feature cache {root}: {exc.strerror}; pass a writable "
                             f"folder to --cache or set WAVETRAIN_CACHE") from None
        if not os.access(root, os.W_OK | os.X_OK):
            raise CacheError(f"feature cache {root} is not writable; pass a writable folder to "
                             f"--cache or set WAVETRAIN_CACHE")
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
                stale = ((host == _HOST and pid.isdigit() and not _pid_alive(int(pid)))
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
            f = open(path, "rb")
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
        ``ino=None``, only the row when the file is gone)."""
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
        """Index an entry file that has no row (left by a crash between rename and commit)."""
        with self._index.writer() as conn:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return
            if st.st_ino == ino:
                StoreIndex.upsert(conn, spec, rec, st.st_size)
                self._evict(conn, keep=(spec, rec))

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
    def _evict(self, conn, keep: tuple[str, str]) -> int:
        """Inside a writer transaction: delete LRU entries (never ``keep``) until within bounds.

        The total comes from a counter the index keeps exact with triggers (O(1), and it
        includes every process's entries), so the bound holds after every put."""
        if self.max_bytes is None:
            return 0
        total = StoreIndex.total_bytes(conn)
        evicted = 0
        while total > self.max_bytes:
            rows = conn.execute("SELECT spec, rec, nbytes FROM entries "
                                "WHERE NOT (spec = ? AND rec = ?) ORDER BY used LIMIT 64",
                                keep).fetchall()
            if not rows:
                break
            for spec, rec, nbytes in rows:
                if total <= self.max_bytes:
                    break
                try:
                    os.unlink(entry_file(self._root_s, rec, spec))
                except FileNotFoundError:
                    pass
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
            has at least ``mmap_min_bytes``, else in memory.  A gram larger than ``max_bytes`` is
            not stored and comes back as a read-only in-memory array.

        Raises
        ------
        CacheError
            If a key is malformed or ``array`` is not a real 2-D array.
        """
        rec, spec = check_keys(rec_id, spec_key)
        data = _as_gram(array, self.dtype, f"recording {rec} / spec {spec}")
        nbytes = HEADER_BYTES + data.nbytes
        if self.max_bytes is not None and nbytes > self.max_bytes:
            self.not_stored += 1
            log.info("feature store: gram %s/%s (%d bytes) exceeds max_bytes=%d; not stored",
                     spec, rec, nbytes, self.max_bytes)
            return _readonly_copy(data, array)
        path = entry_file(self._root_s, rec, spec)
        tmp = self._tmp_path(rec)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w+b") as f:
            try:
                _format.write_entry(f, data, sync=self.sync)
                with self._index.writer() as conn:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    os.replace(tmp, path)
                    StoreIndex.upsert(conn, spec, rec, nbytes)
                    self._evict(conn, keep=(spec, rec))
            except BaseException:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise
            if data.nbytes < self.mmap_min_bytes:
                return _readonly_copy(data, array)
            return _format.load_entry(f, verify=False, mmap_min_bytes=0)

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
        self.__init__(state["root"], max_bytes=state["max_bytes"], dtype=state["dtype"],
                      verify=state["verify"], mmap_min_bytes=state["mmap_min_bytes"],
                      sync=state.get("sync"))

    def __repr__(self) -> str:
        return (f"FeatureStore(root={str(self.root)!r}, max_bytes={self.max_bytes!r}, "
                f"dtype={self.dtype.name!r})")


def _rmdir_quiet(path: str) -> None:
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
