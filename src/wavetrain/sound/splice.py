"""Concatenate recordings into one wav file with gaps of silence between them.

Every recording is mixed down to mono and resampled to one rate (``rate``, default the highest
rate of the recordings). Each starts on a whole millisecond, so that its segment row
``out.wav[start-end]`` selects exactly its samples (the segment ends on the next whole
millisecond: up to 1 ms of the following silence). Written: the wav file, a metadata csv of the
same name (``out.wav`` -> ``out.csv``) with one segment row per recording (its labels and tags,
plus ``source`` = the original file), a row per gap when ``gap_labels`` are given, and an Audacity
label track (``.txt``) of the same rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.core.outputs import refuse_inputs
from wavetrain.core.progress import progress_bar
from wavetrain.core.signal import MAX_RATE, MIN_RATE
from wavetrain.data.audacity import write_labels
from wavetrain.data.audio import write_audio
from wavetrain.data.dataset import Dataset, input_paths
from wavetrain.data.metadata import write_metadata
from wavetrain.data.recording import Recording, format_labels
from wavetrain.sound.common import relative, tag_value

__all__ = ["MAX_RATE", "MIN_RATE", "SpliceResult", "check_rate", "splice"]




def check_rate(rate: int) -> int:
    """Refuse a ``--rate`` outside :data:`MIN_RATE`..:data:`MAX_RATE` Hz in one line."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise ParameterError(f"--rate {rate}: expected a sample rate from {MIN_RATE} to {MAX_RATE} Hz "
                             "(e.g. --rate 16000)")
    return rate


@dataclass
class SpliceResult:
    rows: list[Recording]
    rate: int
    seconds: float


def splice(ds: Dataset, wav: Path, csv: Path, txt: Path, *, gap_ms: int = 1000,
           gap_labels: dict[str, str] | None = None, shuffle: bool = False, seed: int = 0,
           rate: int | None = None, progress: bool = False) -> SpliceResult:
    """Write ``wav`` (the recordings of ``ds`` with ``gap_ms`` of silence between them), ``csv``
    (segment rows) and ``txt`` (an Audacity label track)."""
    refuse_inputs([wav, csv, txt], input_paths((), ds), option="", files=True)     # never over what it reads
    if gap_ms < 0:
        raise ParameterError(f"--gap-ms {gap_ms}: expected >= 0")
    order = list(range(len(ds)))
    if shuffle:
        np.random.default_rng(seed).shuffle(order)
    if rate is None:
        rate = max(r.info().rate for r in ds)
    else:
        check_rate(rate)
    pieces: list[np.ndarray] = []
    rows: list[Recording] = []
    pos_ms = 0
    total = 0                                     # samples written so far
    for n, i in enumerate(progress_bar(order, desc="splicing", unit="file", enable=progress)):
        r = ds[i]
        if n and gap_ms:
            if gap_labels:
                rows.append(Recording(wav, gap_labels, {"gap": "true"}, (pos_ms, pos_ms + gap_ms)))
            pos_ms += gap_ms
        x, _ = r.load(rate, mono=True)
        start = int(round(pos_ms * rate / 1000))
        end_ms = pos_ms + int(np.ceil(len(x) * 1000 / rate))
        pieces.append(np.zeros(start - total, dtype=np.float32))
        pieces.append(x.astype(np.float32, copy=False))
        total = start + len(x)
        tags = dict(r.tags)
        tags["source"] = tag_value(relative(r.path, csv.parent))
        if r.segment_ms is not None:
            tags["source_ms"] = f"{r.segment_ms[0]}-{r.segment_ms[1]}"
        rows.append(Recording(wav, r.labels, tags, (pos_ms, end_ms)))
        pos_ms = end_ms
    last = int(round(pos_ms * rate / 1000))
    pieces.append(np.zeros(max(0, last - total), dtype=np.float32))
    audio = np.concatenate(pieces)
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    write_audio(wav, audio, rate, subtype="FLOAT" if peak > 1.0 else "PCM_16")
    write_metadata(csv, rows)
    write_labels(txt, [(r.segment_ms[0] / 1000.0, r.segment_ms[1] / 1000.0, format_labels(r.labels))
                       for r in rows if r.segment_ms is not None])
    return SpliceResult(rows, rate, len(audio) / rate)
