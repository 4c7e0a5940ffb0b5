"""The shared feature table: feature grams in Parquet, keyed like the local store (recording
content hash, feature spec key), in a folder every executor can reach (a local path, or any URI
pyarrow opens: ``hdfs://``, ``s3://``...).

Layout::

    ROOT/spec=<spec hash>/spec.txt                 the spec key, for people
    ROOT/spec=<spec hash>/part-<content>.parquet   grams of some recordings
    ROOT/_files.sqlite                             the driver's manifest of the data sets' files

The manifest (a local table's; see :meth:`FeatureTable.remember_files`) keeps what the driver
learns of each audio file — its content hash, the recordings' identity, and its header — while the
file is unchanged, so that a run over data the table already holds re-reads no audio.

A part file holds whole recordings, each as consecutive rows of at most :data:`BLOCK_FRAMES`
frames (columns :data:`SCHEMA`), so a reader streams a file a few rows at a time and still meets
every recording's frames together, in order. Its name is a hash of the spec key and of the
recordings it holds: a task that Spark runs twice (a retry, a speculative copy) writes the same
file with the same content, by a rename of a finished temporary file, so readers never see a
part-written file and a re-run changes nothing. Recordings already in the table are not
extracted again.

Damage is repaired, not reported as a crash. Pages carry CRC checksums, verified on every read.
A part file that cannot be opened (truncated, garbage) is removed when the catalog is read, with
one warning, so its recordings count as missing and are extracted again; one whose pages fail
their checksums when a task reads them is removed there, and the job stops with a one-line
:class:`~wavetrain.core.errors.UserError` (the next run extracts its recordings again). Temporary
files of runs that died (``.tmp-*.parquet`` parts, ``_scratch`` folders of predictions) are
swept by :meth:`FeatureTable.sweep`.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from wavetrain.core.errors import UserError
from wavetrain.core.outputs import check_output_folder
from wavetrain.data import file_facts

__all__ = ["BLOCK_FRAMES", "MANIFEST", "READ_ROWS", "FeatureTable", "TableGram", "check_location"]

#: The driver's manifest of file facts, in the table's root (a local table's only).
MANIFEST = "_files.sqlite"

#: Frames per row: a row is at most 4096 x features float32 values (624 KiB for 39 features).
BLOCK_FRAMES = 4096
#: Rows per Arrow record batch when a task reads a part file.
READ_ROWS = 8
#: Rows per row group (buffered before it is written). pyarrow decodes a whole row group before it
#: hands out its first batch, so this, not :data:`READ_ROWS`, bounds a reader's memory (besides the
#: longest recording, which is assembled whole as the local engine does): 8 rows of 4,096 x 39
#: float32 are 5 MB. With 64 rows, an executor's peak grew with the files a task holds
#: (12 MB per hour of audio, 2 to 8 h).
WRITE_ROWS = 8
COLUMNS = ("rec", "block", "frames", "dim", "rate", "shift", "duration_ms", "x")
#: A temporary file of another run not modified for this long belongs to a run that died (a live
#: task writes its part at least once per recording; an hour is far beyond one recording).
STALE_SECONDS = 3600
#: Scratch folders of other runs that :meth:`FeatureTable.sweep` may remove once stale (their files
#: are a job's intermediate results: a dead run's are never read again).
SWEPT_SCRATCH = ("predictions",)

#: Why a file cannot be created that no retry changes: refused in one line, not retried.
LASTING_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EEXIST)

log = logging.getLogger(__name__)


@dataclass
class TableGram:
    """One recording's gram as read back from the table."""

    rec: str
    gram: np.ndarray          # (frames, features) float32
    rate: int                 # Hz the features were computed at
    shift: float              # seconds between frames
    duration_ms: int


def _schema():
    import pyarrow as pa

    return pa.schema([("rec", pa.string()), ("block", pa.int32()), ("frames", pa.int32()), ("dim", pa.int32()),
                      ("rate", pa.int32()), ("shift", pa.float64()), ("duration_ms", pa.int64()),
                      ("x", pa.binary())])


def check_location(root: str, *, option: str = "--table") -> None:
    """Check, before Spark starts, that a feature table can live at ``root``.

    A local path must be a folder that can be written, or a path that can be created as one;
    a URI (``hdfs://``, ``s3://``...) is left to its file system.

    Raises
    ------
    OutputError
        An empty path, a file or named pipe, a path under a file, or a read-only location (one
        line naming ``option``).
    """
    if "://" not in str(root):
        check_output_folder(root, option=option)


def spec_folder(spec_key: str) -> str:
    return "spec=" + hashlib.sha1(spec_key.encode()).hexdigest()[:16]


class FeatureTable:
    """The feature table at ``root`` (a local path or a URI pyarrow can open)."""

    def __init__(self, root: str, *, run: str | None = None):
        self.root = str(root).rstrip("/") or "/"
        self.run = run or uuid.uuid4().hex[:12]     # in the names of this run's temporary files
        self._open()

    def _open(self) -> None:
        from pyarrow import fs

        if "://" in self.root:
            self.fs, self._base = fs.FileSystem.from_uri(self.root)
        else:
            self.fs, self._base = fs.LocalFileSystem(), str(_absolute(self.root))

    def __getstate__(self):          # a FileSystem is rebuilt where the table is unpickled
        return {"root": self.root, "run": self.run}

    def __setstate__(self, state):
        self.root, self.run = state["root"], state["run"]
        self._open()

    def remember_files(self) -> None:
        """On the driver: keep the facts of the data set's files (content hash, header; see
        :mod:`wavetrain.data.file_facts`) in the table's :data:`MANIFEST` from now on, so that a
        later run neither re-hashes nor re-opens an unchanged file (without it every run reads
        every byte of the data set on the driver to find its recordings in the table). A table
        behind a URI keeps none: its file system is not SQLite's."""
        if "://" not in self.root:
            file_facts.use(f"{self._base}/{MANIFEST}")

    # -- paths ----------------------------------------------------------------------------------
    def folder(self, spec_key: str) -> str:
        return f"{self._base}/{spec_folder(spec_key)}"

    def parts(self, spec_key: str) -> list[str]:
        """Part files of a spec, sorted (finished files only: temporary ones start with a dot)."""
        from pyarrow import fs

        info = self.fs.get_file_info(fs.FileSelector(self.folder(spec_key), allow_not_found=True))
        return sorted(i.path for i in info if i.type == fs.FileType.File and i.base_name.startswith("part-")
                      and i.base_name.endswith(".parquet"))

    def catalog(self, spec_keys: Iterable[str]) -> dict[tuple[str, str], str]:
        """``(recording id, spec key) -> part file`` of every recording in the table under those
        specs (the first part file in name order when two runs wrote one twice). Reads only the
        ``rec`` column."""
        import pyarrow.parquet as pq

        out: dict[tuple[str, str], str] = {}
        for key in set(spec_keys):
            for path in self.parts(key):
                try:
                    with self.fs.open_input_file(path) as f:
                        recs = pq.read_table(f, columns=["rec"], page_checksum_verification=True
                                             ).column("rec").unique().to_pylist()
                except ValueError as e:            # pyarrow.ArrowInvalid: not Parquet, truncated
                    self._remove_damaged(path, e)
                    continue
                for rec in recs:
                    out.setdefault((rec, key), path)
        return out

    def _remove_damaged(self, path: str, error: Exception) -> None:
        """Remove a part file that cannot be read, saying so in one warning line; its recordings
        are then missing from the catalog and extracted again."""
        reason = _first_line(error)
        try:
            self.fs.delete_file(path)
        except OSError as e:
            raise UserError(f"feature table {self.root}: part file {path} cannot be read ({reason}) nor removed "
                            f"({e}); remove it by hand") from None
        log.warning("feature table %s: part file %s could not be read (%s); removed it, its recordings are "
                    "extracted again", self.root, path, reason)

    def scratch(self, what: str) -> str:
        """A new, empty folder for a job's intermediate files (``ROOT/_scratch/<what>-<run>-<id>``,
        with this table's run token); the job deletes it."""
        path = f"{self._base}/_scratch/{what}-{self.run}-{uuid.uuid4().hex[:8]}"
        self.fs.create_dir(path, recursive=True)
        return path

    def sweep(self, *, mine: bool = False, older_than: float = STALE_SECONDS) -> int:
        """Remove temporary files that no live task will finish: ``.tmp-*.parquet`` parts in every
        spec folder and scratch folders of predictions.

        Parameters
        ----------
        mine : bool, default=False
            Sweep this run's temporary files and scratch folders (every kind), whatever their
            age: after its jobs were cancelled (an interrupt). Otherwise sweep those of other runs
            not modified for ``older_than`` seconds (runs that died), never this run's.
        older_than : float, default=:data:`STALE_SECONDS`
            Seconds without a change after which another run's temporary file is stale.

        Returns
        -------
        int
            Files and folders removed (a missing table or one removed meanwhile: 0, no error).
        """
        from pyarrow import fs

        cutoff = time.time_ns() - int(older_than * 1e9)
        token = f"-{self.run}-"

        def stale(*infos) -> bool:        # not this run's, and nothing changed since the cutoff
            return token not in infos[0].base_name and 0 < max(i.mtime_ns or 0 for i in infos) < cutoff

        removed = 0
        for folder in self._list(self._base):
            if folder.type != fs.FileType.Directory or not folder.base_name.startswith("spec="):
                continue
            for f in self._list(folder.path):
                if f.type == fs.FileType.File and f.base_name.startswith(".tmp-") and (
                        token in f.base_name if mine else stale(f)):
                    removed += self._delete(f.path, folder=False)
        for folder in self._list(f"{self._base}/_scratch"):
            if folder.type != fs.FileType.Directory:
                continue
            if mine:
                hit = token in folder.base_name
            else:
                hit = (folder.base_name.split("-", 1)[0] in SWEPT_SCRATCH
                       and stale(folder, *self._list(folder.path, deep=True)))
            if hit:
                removed += self._delete(folder.path, folder=True)
        if removed:
            log.info("feature table %s: removed %d temporary file(s) of unfinished runs", self.root, removed)
        return removed

    def _list(self, folder: str, *, deep: bool = False) -> list:
        """The entries of ``folder`` (none when it is missing or cannot be listed)."""
        from pyarrow import fs

        try:
            return self.fs.get_file_info(fs.FileSelector(folder, allow_not_found=True, recursive=deep))
        except OSError:
            return []

    def _delete(self, path: str, *, folder: bool) -> int:
        try:
            self.fs.delete_dir(path) if folder else self.fs.delete_file(path)
        except OSError:           # removed meanwhile, or not ours to remove
            return 0
        return 1

    def feature_dim(self, path: str) -> int:
        """Features per frame of the grams in a part file (its first row's)."""
        import pyarrow.parquet as pq

        with self.fs.open_input_file(path) as f:
            return int(next(pq.ParquetFile(f).iter_batches(batch_size=1, columns=["dim"])).column(0)[0].as_py())

    # -- writing --------------------------------------------------------------------------------
    def write_part(self, spec_key: str, grams: Iterable[tuple[str, np.ndarray, int, float, int]],
                   rec_ids: list[str]) -> str:
        """Write the grams ``(rec id, gram, rate, shift, duration_ms)`` of the recordings
        ``rec_ids`` (in that order) as one part file, atomically; returns its path.

        Raises
        ------
        UserError
            The spec folder cannot be created or written (permission, read-only, full): one line,
            so that a task does not retry what cannot pass.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder = self.folder(spec_key)
        digest = hashlib.sha1("\n".join([spec_key, *rec_ids]).encode()).hexdigest()[:24]
        final = f"{folder}/part-{digest}.parquet"
        tmp = f"{folder}/.tmp-{digest}-{self.run}-{uuid.uuid4().hex[:8]}.parquet"
        try:
            self.fs.create_dir(folder, recursive=True)
            note = f"{folder}/spec.txt"
            if self.fs.get_file_info(note).type.name == "NotFound":
                with self.fs.open_output_stream(note) as f:
                    f.write(spec_key.encode() + b"\n")
            stream = self.fs.open_output_stream(tmp)
        except OSError as e:
            if e.errno not in LASTING_ERRNOS:
                raise
            raise UserError(f"feature table {self.root}: cannot write in {folder} ({os.strerror(e.errno)}); give a "
                            "writable table location") from None
        schema = _schema()
        rows: dict[str, list] = {c: [] for c in COLUMNS}
        try:
            with stream as out, pq.ParquetWriter(out, schema, compression="zstd", write_page_checksum=True) as w:
                for rec, g, rate, shift, duration_ms in grams:
                    g = np.ascontiguousarray(g, dtype="<f4")
                    starts = range(0, max(g.shape[0], 1), BLOCK_FRAMES)
                    for b, s in enumerate(starts):
                        part = g[s:s + BLOCK_FRAMES]
                        for c, v in zip(COLUMNS, (rec, b, part.shape[0], g.shape[1], rate, shift, duration_ms,
                                                   part.tobytes())):
                            rows[c].append(v)
                        if len(rows["rec"]) >= WRITE_ROWS:
                            w.write_table(pa.table(rows, schema=schema))
                            rows = {c: [] for c in COLUMNS}
                if rows["rec"]:
                    w.write_table(pa.table(rows, schema=schema))
            self.fs.move(tmp, final)        # a rename: readers never see a part-written file
        except BaseException:
            try:
                self.fs.delete_file(tmp)
            except OSError:
                pass
            raise
        return final

    # -- reading --------------------------------------------------------------------------------
    def read_part(self, path: str, wanted: set[str] | None = None, *, rows: int = READ_ROWS) -> Iterator[TableGram]:
        """The recordings of one part file in order (only those in ``wanted`` when given), read
        ``rows`` rows at a time; each recording's blocks are joined into its gram.

        Raises
        ------
        UserError
            The file is damaged (not Parquet, or a page fails its checksum): it is removed, and
            the message says to run again (which extracts its recordings again).
        """
        try:
            yield from self._read_part(path, wanted, rows)
        except (ValueError, OSError) as e:
            if not _damaged(e):
                raise                       # e.g. a read that timed out: the task may pass on retry
            reason = _first_line(e)
            try:
                self.fs.delete_file(path)
                done = "removed it: run the command again to extract its recordings again"
            except OSError as gone:
                done = f"it could not be removed ({gone}): remove it by hand and run again"
            raise UserError(f"feature table {self.root}: part file {path} is damaged ({reason}); {done}") from None

    def _read_part(self, path: str, wanted: set[str] | None, rows: int) -> Iterator[TableGram]:
        import pyarrow.parquet as pq

        with self.fs.open_input_file(path) as f:
            # no pre-buffering and one thread: pyarrow's defaults read ahead of the consumer (a part
            # file of 15 row groups: 65 MB of Arrow buffers against 16 MB)
            pf = pq.ParquetFile(f, pre_buffer=False, buffer_size=1 << 20, page_checksum_verification=True)
            cur: str | None = None
            blocks: list[np.ndarray] = []
            meta: tuple[int, float, int, int] = (0, 0.0, 0, 0)
            for batch in pf.iter_batches(batch_size=rows, columns=list(COLUMNS), use_threads=False):
                cols = batch.to_pydict()
                for i, rec in enumerate(cols["rec"]):
                    if rec != cur:
                        if cur is not None and (wanted is None or cur in wanted):
                            yield _gram(cur, blocks, meta)
                        cur, blocks = rec, []
                        meta = (cols["rate"][i], cols["shift"][i], cols["duration_ms"][i], cols["dim"][i])
                    if wanted is None or rec in wanted:
                        blocks.append(np.frombuffer(cols["x"][i], dtype="<f4").reshape(cols["frames"][i],
                                                                                         cols["dim"][i]))
            if cur is not None and (wanted is None or cur in wanted):
                yield _gram(cur, blocks, meta)


def _damaged(error: Exception) -> bool:
    """Whether pyarrow's ``error`` says a file's content is wrong (never passes on retry), not that
    reading it failed (a lost connection)."""
    return isinstance(error, ValueError) or "checksum" in str(error).lower()


def _first_line(error: Exception) -> str:
    """The first line of ``error``'s message (its class name when it has none)."""
    lines = str(error).splitlines()
    return lines[0] if lines else type(error).__name__


def _gram(rec: str, blocks: list[np.ndarray], meta: tuple[int, float, int, int]) -> TableGram:
    rate, shift, duration_ms, dim = meta
    g = blocks[0] if len(blocks) == 1 else (np.concatenate(blocks) if blocks else np.zeros((0, dim), np.float32))
    return TableGram(rec, g, int(rate), float(shift), int(duration_ms))


def _absolute(path: str):
    from pathlib import Path

    return Path(path).expanduser().absolute()
