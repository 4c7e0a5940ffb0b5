"""A model's answers as metadata rows: one segment row per run of adjacent windows with the same
value (``file[start-end],<label>=<value>``; tags ``windows`` and, for models that answer
probabilities, the run's mean ``confidence``).

Windows below ``min_confidence`` are dropped first; kept windows that touch or overlap
(``clip_shift_ms < clip_ms``) are adjacent, so a dropped window breaks a run only where it leaves a
gap. Where two neighbouring segments of different values overlap, the boundary is put half-way
through the overlap, so segments never overlap. Times are times in the audio file (a prediction of
a segment recording ``f.wav[a-b]`` already counts from the file's start).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from wavetrain.core.errors import ParameterError
from wavetrain.data.dataset import Dataset
from wavetrain.data.recording import Recording
from wavetrain.models.base import Classifier
from wavetrain.pipeline.prediction import Prediction

__all__ = ["Segment", "check_confidence", "event_rows", "merge_windows", "segment_rows", "track_names"]


@dataclass
class Segment:
    recording: Recording
    start_ms: int
    end_ms: int
    value: str
    confidences: list[float] = field(default_factory=list)
    windows: int = 0


def check_confidence(model: Classifier, min_confidence: float | None) -> None:
    """``min_confidence`` needs probabilities; refuse it for log-likelihoods and anomaly scores."""
    if min_confidence is None:
        return
    if not 0.0 <= min_confidence <= 1.0:
        raise ParameterError(f"--min-confidence {min_confidence}: expected a probability between 0 and 1")
    if model.score_kind != "probability":
        raise ParameterError(f"--min-confidence: this {model.name} model answers {model.score_kind} scores, not "
                             "probabilities; use a model that answers probabilities (knn, cnn, ensemble) or "
                             "leave --min-confidence out")


def merge_windows(preds: Iterable[Prediction], min_confidence: float | None = None) -> tuple[list[Segment], int]:
    """Segments of runs of same-valued adjacent windows (in stream order) and the windows dropped."""
    segments: list[Segment] = []
    dropped = 0
    last: Segment | None = None
    last_end = 0                            # end of the previous kept window of the same recording
    for p in preds:
        assert p.recording is not None
        conf = p.confidence
        if last is not None and last.recording is not p.recording:
            last = None
        if min_confidence is not None and conf is not None and conf < min_confidence:
            dropped += 1
            continue
        adjacent = last is not None and p.start_ms <= last_end
        if last is not None and adjacent and last.value == p.label:
            last.end_ms = max(last.end_ms, p.end_ms)
        else:
            if last is not None and adjacent and p.start_ms < last.end_ms:
                mid = (p.start_ms + last.end_ms) // 2
                last.end_ms, start = mid, mid
            else:
                start = p.start_ms
            last = Segment(p.recording, start, p.end_ms, p.label)
            segments.append(last)
        last.windows += 1
        if conf is not None:
            last.confidences.append(conf)
        last_end = p.end_ms
    return segments, dropped


def segment_rows(segments: Iterable[Segment], label: str) -> list[Recording]:
    """Metadata rows of the segments."""
    rows = []
    for s in segments:
        r = s.recording
        tags = {"windows": str(s.windows)}
        if s.confidences:
            tags["confidence"] = f"{sum(s.confidences) / len(s.confidences):.3f}"
        if s.end_ms > s.start_ms:
            rows.append(Recording(r.path, {label: s.value}, tags, (s.start_ms, s.end_ms)))
    return rows


def event_rows(events: Iterable[Prediction], label: str, min_confidence: float | None = None
               ) -> tuple[list[Recording], int]:
    """A segment row per event (``file[start-end]``, times in the audio file), its answer the
    value of ``label``, its score a tag (``confidence``, ``loglik`` or ``anomaly_score``); events
    whose confidence is below ``min_confidence`` are dropped. Returns the rows and how many were
    dropped."""
    rows, dropped = [], 0
    for p in events:
        assert p.recording is not None
        conf = p.confidence
        if min_confidence is not None and conf is not None and conf < min_confidence:
            dropped += 1
            continue
        name = {"probability": "confidence", "anomaly": "anomaly_score"}.get(p.score_kind, "loglik")
        tags = {name: f"{p.score:.4g}"}
        if p.end_ms > p.start_ms:
            rows.append(Recording(p.recording.path, {label: p.label}, tags, (p.start_ms, p.end_ms)))
    return rows, dropped


def track_names(csv: Path, ds: Dataset) -> dict[Path, Path]:
    """The Audacity label track written beside ``csv`` for each audio file of ``ds``: ``OUT.txt``
    for one file, ``OUT.<name>.txt`` for several (a one-line error when two names clash)."""
    paths = list(dict.fromkeys(r.path for r in ds))
    if len(paths) == 1:
        return {paths[0]: csv.with_suffix(".txt")}
    out: dict[Path, Path] = {}
    seen: dict[str, Path] = {}
    for path in paths:
        other = seen.setdefault(path.stem, path)
        if other != path:
            raise ParameterError(f"label --events: {other} and {path} would both write {csv.stem}.{path.stem}.txt; "
                                 "label them in two runs (or rename one)")
        out[path] = csv.with_name(f"{csv.stem}.{path.stem}.txt")
    return out
