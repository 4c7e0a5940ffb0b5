"""metadata.csv in the Java framework's format.

Each line: ``file[startMs-endMs],labels,tags``

* ``file`` is relative to the csv's folder; an optional ``[start-end]`` (milliseconds) selects a
  segment;
* ``labels`` and ``tags`` are ``name=value`` pairs separated by ``;``; both columns are optional
  and trailing empty columns are allowed;
* a header is optional; the old header ``File,Sensor,Labels`` is accepted and its sensor column
  ignored.
"""
from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Iterable
from pathlib import Path

from wavetrain.core.errors import MetadataError
from wavetrain.core.outputs import refuse_inputs, write_atomic
from wavetrain.data.recording import Recording, format_labels

_SEGMENT = re.compile(r"^(?P<file>.*?)\[(?P<start>\d+(?:\.\d+)?)-(?P<end>\d+(?:\.\d+)?)\]$")
_HEADER_NAMES = {"file", "files", "sensor", "labels", "label", "tags", "tag"}


def parse_pairs(text: str, *, where: str, what: str = "labels") -> dict[str, str]:
    """Parse ``k=v;k=v`` into a dict. Raises :class:`MetadataError` naming ``where``."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise MetadataError(f"{where}: malformed {what} {part!r}; expected name=value pairs "
                                f"separated by ';' (e.g. word=yes;speaker=s1)")
        k, v = (s.strip() for s in part.split("=", 1))
        if not k:
            raise MetadataError(f"{where}: empty label name in {part!r}; expected name=value")
        out[k] = v
    return out


def parse_file_field(field: str, *, where: str) -> tuple[str, tuple[int, int] | None]:
    """Split ``name.wav[100-900]`` into the file name and a millisecond segment."""
    field = field.strip()
    m = _SEGMENT.match(field)
    if not m:
        if "[" in field or "]" in field:
            raise MetadataError(f"{where}: malformed segment in {field!r}; expected file.wav[startMs-endMs]")
        return field, None
    start, end = int(float(m["start"])), int(float(m["end"]))
    if end <= start:
        raise MetadataError(f"{where}: segment [{start}-{end}] ends before it starts; expected start < end")
    return m["file"].strip(), (start, end)


def read_metadata(csv_path: str | os.PathLike) -> list[Recording]:
    """Read a metadata.csv into :class:`Recording` objects (audio is not opened)."""
    csv_path = Path(csv_path)
    try:
        text = csv_path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise MetadataError(f"{csv_path}: file not found") from None
    except UnicodeDecodeError as e:
        raise MetadataError(f"{csv_path}: not UTF-8 text ({e.reason} at byte {e.start}); expected a csv file") from None
    except IsADirectoryError:
        raise MetadataError(f"{csv_path}: is a folder, expected a metadata.csv file") from None
    except OSError as e:
        raise MetadataError(f"{csv_path}: cannot be read ({e.strerror})") from None
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise MetadataError(f"{csv_path}:{line}: holds a NUL byte; expected a text csv file "
                            "(file[,labels][,tags] per line)")
    root = csv_path.parent
    recs: list[Recording] = []
    columns: tuple[str, ...] = ("file", "labels", "tags")
    reader = csv.reader(io.StringIO(text))
    for lineno, row in enumerate(_rows(reader, csv_path), start=1):
        where = f"{csv_path}:{reader.line_num}"
        cells = [c.strip() for c in row]
        while cells and not cells[-1]:
            cells.pop()
        if not cells or cells[0].startswith("#"):
            continue
        if lineno == 1 and cells[0].lower() in ("file", "files") and all(
                c.lower() in _HEADER_NAMES for c in cells):
            columns = tuple("labels" if c.lower() == "label" else "tags" if c.lower() == "tag"
                            else c.lower().rstrip("s") if c.lower() == "files" else c.lower() for c in cells)
            continue
        if len(cells) > len(columns):
            raise MetadataError(f"{where}: {len(cells)} columns, expected at most {len(columns)} "
                                f"({','.join(columns)})")
        values = dict(zip(columns, cells))
        fname, segment = parse_file_field(values.get("file", ""), where=where)
        if not fname:
            raise MetadataError(f"{where}: empty file name; expected file[,labels][,tags]")
        labels = parse_pairs(values.get("labels", ""), where=where, what="labels")
        tags = parse_pairs(values.get("tags", ""), where=where, what="tags")
        path = Path(fname) if os.path.isabs(fname) else root / fname
        recs.append(Recording(path, labels, tags, segment, source=where))
    return recs


def _rows(reader, csv_path: Path):
    """The csv rows, with a csv error (an over-long field, a broken quote) as one MetadataError."""
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise MetadataError(f"{csv_path}:{reader.line_num}: not a valid csv line ({e}); expected "
                                "file[,labels][,tags]") from None


def write_metadata(csv_path: str | os.PathLike, recordings: Iterable[Recording]) -> None:
    """Write recordings as a metadata.csv (paths relative to its folder), atomically; refused
    (:class:`~wavetrain.core.outputs.OutputError`) when ``csv_path`` is one of the recordings."""
    csv_path = Path(csv_path)
    root = csv_path.parent.resolve()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    listed: list[Path] = []
    for r in recordings:
        listed.append(r.path)
        try:
            rel = os.path.relpath(r.path.resolve(), root)
        except ValueError:
            rel = str(r.path.resolve())
        f = rel if r.segment_ms is None else f"{rel}[{r.segment_ms[0]}-{r.segment_ms[1]}]"
        row = [f, format_labels(r.labels)]
        if r.tags:
            row.append(format_labels(r.tags))
        w.writerow(row)
    data = buf.getvalue().encode("utf-8")
    refuse_inputs([csv_path], listed, option="", files=True)          # never over a recording it lists
    write_atomic(csv_path, lambda f: f.write(data), what="metadata")
