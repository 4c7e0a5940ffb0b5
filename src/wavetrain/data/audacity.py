"""Audacity label tracks: read and write.

An Audacity label track (File > Export > Labels, File > Import > Labels) is a text file with one
label a line, ``start<TAB>end<TAB>label``, times in seconds; a point label has ``start == end``.
Audacity also writes, after a label with a spectral selection, a line that starts with a
backslash (``\\<TAB>low_hz<TAB>high_hz``); :func:`read_labels` skips those lines.

:func:`write_labels` writes atomically (:func:`wavetrain.core.outputs.write_atomic`), with six decimals
as Audacity does.
"""
from __future__ import annotations

import errno
import math
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from wavetrain.core.errors import UserError
from wavetrain.core.outputs import write_atomic

__all__ = ["LabelError", "read_labels", "write_labels", "format_labels"]


class LabelError(UserError):
    """A label track that cannot be read (missing file, malformed line)."""


def _time(text: str, where: str, what: str) -> float:
    try:
        value = float(text.strip().replace(",", "."))   # some locales export a decimal comma
    except ValueError:
        raise LabelError(f"{where}: {what} {text.strip()!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise LabelError(f"{where}: {what} {text.strip()!r} must be a finite number of seconds >= 0")
    return value


def read_labels(path: str | os.PathLike) -> list[tuple[float, float, str]]:
    """Read an Audacity label track.

    Parameters
    ----------
    path : path-like
        A text file of ``start<TAB>end<TAB>label`` lines (seconds). The label may be missing or
        empty (``''``); it may contain spaces but not tabs. Blank lines and the spectral-selection
        lines (starting with ``\\``) are skipped. A line with a single time is a point label.

    Returns
    -------
    list of (start_s, end_s, text)
        In file order.

    Raises
    ------
    LabelError
        A missing or unreadable file, a line whose times are not numbers, or ``end < start``;
        the message names the file and line.
    """
    p = Path(path)
    try:
        raw = _read_regular(p)
    except FileNotFoundError:
        raise LabelError(f"{p}: no such label file") from None
    except IsADirectoryError:
        raise LabelError(f"{p}: is a folder; give an Audacity label file (.txt)") from None
    except OSError as e:
        raise LabelError(f"{p}: cannot be read ({e.strerror})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    rows: list[tuple[float, float, str]] = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.rstrip("\r\n")
        if not line.strip() or line.startswith("\\"):
            continue
        where = f"{p} line {n}"
        parts = line.split("\t")
        if len(parts) == 1:
            fields = line.split(None, 2)          # a hand-written file with spaces
            if len(fields) >= 2:
                parts = fields
        start = _time(parts[0], where, "start")
        end = _time(parts[1], where, "end") if len(parts) > 1 and parts[1].strip() else start
        if end < start:
            raise LabelError(f"{where}: end {end:g} s is before start {start:g} s")
        label = "\t".join(parts[2:]).strip() if len(parts) > 2 else ""
        rows.append((start, end, label))
    return rows


def _read_regular(p: Path) -> bytes:
    """The bytes of ``p`` if it is a regular file. It is opened without blocking and checked
    before any read, so a named pipe or a device is refused instead of waiting forever."""
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a folder", str(p))
        if not stat.S_ISREG(st.st_mode):
            raise LabelError(f"{p}: is not a regular file (a named pipe, a device or a socket); give an "
                             "Audacity label file (.txt)")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return f.read()
    finally:
        if fd >= 0:
            os.close(fd)


def format_labels(rows: Iterable[tuple[float, float, str]]) -> str:
    """The text of a label track: ``start\\tend\\tlabel`` lines, six decimals."""
    out = []
    for start, end, label in rows:
        text = str(label).replace("\t", " ").replace("\r", " ").replace("\n", " ")
        out.append(f"{float(start):.6f}\t{float(end):.6f}\t{text}\n")
    return "".join(out)


def write_labels(path: str | os.PathLike, rows: Iterable[tuple[float, float, str]]) -> Path:
    """Write an Audacity label track atomically.

    Parameters
    ----------
    path : path-like
        The file to write (replaced when it exists).
    rows : iterable of (start_s, end_s, text)
        Times in seconds; ``start == end`` writes a point label. Tabs and newlines in a text
        become spaces.

    Raises
    ------
    LabelError
        A negative, non-finite or reversed time.
    wavetrain.core.outputs.OutputError
        The file cannot be written.
    """
    rows = list(rows)
    for i, (start, end, _) in enumerate(rows):
        s, e = float(start), float(end)
        if not (math.isfinite(s) and math.isfinite(e)) or s < 0 or e < s:
            raise LabelError(f"{path}: label {i + 1} has times {start!r}..{end!r}; expected "
                             "0 <= start <= end seconds")
    data = format_labels(rows).encode("utf-8")
    return write_atomic(path, lambda f: f.write(data), what="label track")
