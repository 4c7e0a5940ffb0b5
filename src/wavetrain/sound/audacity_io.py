"""Audacity label tracks to and from metadata segment rows (through :mod:`wavetrain.data.audacity`).

* :func:`from_audacity`: each label ``start end text`` becomes ``wav[startMs-endMs]`` with labels
  parsed from ``text``: ``name=value;name=value`` pairs as they are, any other text as the value
  of ``label``. Point labels (``start == end``) and empty texts are skipped and counted.
* :func:`to_audacity`: one label track ``<audio stem>.txt`` per audio file, a label per row of
  that file (the whole file for a row without a segment); the text is ``label``'s value when
  ``label`` is given, else every label as ``name=value;...``.
"""
from __future__ import annotations

import os
import stat
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from wavetrain.core.errors import UserError
from wavetrain.core.outputs import refuse_inputs
from wavetrain.data.audacity import read_labels, write_labels
from wavetrain.data.audio import read_info
from wavetrain.data.dataset import Dataset, input_paths
from wavetrain.data.metadata import parse_pairs
from wavetrain.data.recording import Recording, format_labels
from wavetrain.sound.common import UniqueNames, check_labels, safe_name

__all__ = ["FromAudacity", "from_audacity", "to_audacity", "track_names"]


@dataclass
class FromAudacity:
    rows: list[Recording]
    skipped_points: int
    skipped_empty: int


def from_audacity(labels_txt: Path, wav: Path, label: str | None) -> FromAudacity:
    """Metadata rows of an Audacity label track of ``wav``."""
    if label is not None:
        check_labels({label: "x"}, "--label")
    try:
        st = os.stat(wav)
    except OSError as err:
        raise UserError(f"--wav {wav}: cannot be read ({err.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"--wav {wav}: is not a regular file; give the audio file the labels belong to")
    info = read_info(wav)
    duration_ms = int(round(info.duration_s * 1000))
    rows, points, empty = [], 0, 0
    for n, (start, end, text) in enumerate(read_labels(labels_txt), 1):
        where = f"{labels_txt} label {n}"
        if not text.strip():
            empty += 1
            continue
        if "=" in text:
            labels = parse_pairs(text, where=where, what="labels")
        elif label is None:
            raise UserError(f"{where}: text {text!r} is a value, not name=value pairs; give --label NAME to "
                            "name the label it is a value of")
        else:
            labels = {label: text.strip()}
        check_labels(labels, where)
        s, e = int(round(start * 1000)), min(int(round(end * 1000)), duration_ms)
        if s >= duration_ms:
            raise UserError(f"{where}: starts at {start:g} s, after the end of {wav} ({info.duration_s:.3f} s); "
                            "is it the label track of another recording?")
        if e <= s:
            points += 1
            continue
        rows.append(Recording(wav, labels, {}, (s, e)))
    return FromAudacity(rows, points, empty)


def track_names(ds: Dataset) -> dict[Path, str]:
    """The label track file name of each audio file of ``ds`` (``<stem>.txt``, made unique)."""
    names = UniqueNames()
    out: dict[Path, str] = {}
    for r in ds:
        p = r.path.resolve()
        if p not in out:
            out[p] = names(safe_name(r.path.stem, "labels"), ".txt")
    return out


def to_audacity(ds: Dataset, out: Path, label: str | None = None) -> dict[Path, int]:
    """Write one label track per audio file of ``ds`` into ``out``; returns labels per track file."""
    refuse_inputs([out], input_paths((), ds), option="")     # never over what it reads
    key = ds.resolve_label(label) if label is not None else None
    names = track_names(ds)
    tracks: dict[Path, list[tuple[float, float, str]]] = defaultdict(list)
    for r in ds:
        if key is not None and not r.labels.get(key):
            continue
        start, end = (0.0, r.info().duration_s) if r.segment_ms is None else (
            r.segment_ms[0] / 1000.0, r.segment_ms[1] / 1000.0)
        text = r.labels[key] if key is not None else format_labels(r.labels)
        tracks[out / names[r.path.resolve()]].append((start, end, text))
    if not tracks:
        raise UserError(f"--label {label}: no row has a value for it")
    for path, rows in tracks.items():
        rows.sort(key=lambda t: (t[0], t[1]))
        write_labels(path, rows)
    return {p: len(rows) for p, rows in tracks.items()}
