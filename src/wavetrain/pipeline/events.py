"""Events in long recordings: where each sound starts and ends, and what it is — one rule for a
file, a live stream, a server request and a Spark task.

Samples go through the event detector as they arrive (:func:`event_stream`): its activity
(:mod:`wavetrain.features.activity`, or a model's windows with ``detector=model``) becomes events
by the rules of :mod:`wavetrain.stream.events`, and each event, once closed, is **answered by the
model** from its own samples:

* a model trained on whole recordings (``clip_ms=0``: gmm, hmm, knn, ...) classifies the event as
  one recording, as a file of its samples;
* a clip model (cnn, ...) classifies the event's windows (a short event padded by the model's
  ``pad`` rule) and the event's scores are their mean — a detector's anomaly score is the highest
  of its windows' (an event is as anomalous as its most anomalous window);

then the unknown rule in effect answers ``unknown`` for an event unlike the training
(:func:`~wavetrain.pipeline.smoothing.unknown_rule`); with ``detector=model`` the answer is the
best value other than the background. Each event is a :class:`~wavetrain.pipeline.prediction.Prediction`
whose ``start_ms`` and ``end_ms`` are the event's, so every output that writes window predictions
writes events. A file is read in blocks (:func:`recording_events`): memory stays flat over any
length of recording.
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wavetrain.core.errors import AudioError, ParameterError
from wavetrain.data.live import SampleRing
from wavetrain.data.recording import Recording
from wavetrain.features.activity import ActivityMeter
from wavetrain.models.anomaly import ANOMALY
from wavetrain.models.base import UNKNOWN, Classifier, is_unknown
from wavetrain.pipeline.prediction import (
    LiveWindow,
    Prediction,
    classify_samples,
    classify_stream,
    upsampling_said_once,
)
from wavetrain.pipeline.smoothing import unknown_rule
from wavetrain.stream.events import EventOptions, Segmenter, Span
from wavetrain.stream.windows import Windowing

__all__ = ["BLOCK_S", "EventOptions", "answer_event", "event_stream", "recording_events", "sample_events"]

log = logging.getLogger(__name__)

#: Seconds of a file read at a time.
BLOCK_S = 10.0


@dataclass
class _Answerer:
    """Answers events with a model (see the module notes)."""

    model: Classifier
    options: EventOptions
    unknown: str | float

    def __post_init__(self):
        self.rule = unknown_rule(self.model, self.unknown)
        self.whole = Windowing.from_params(self.model.params).clip_ms == 0
        labels = list(self.model.fitted_labels)
        self.background = None
        if self.options.detector == "model":
            value = self.options.background_value
            if value not in labels:
                raise ParameterError(f"events detector=model: the model knows no value {value!r} for no event "
                                     f"(its values: {', '.join(map(str, labels))}); give background=VALUE, or train "
                                     "it with one (wavetrain sound splice --gap-label)", param="background")
            if self.model.detector:
                raise ParameterError("events detector=model: an anomaly detector has no value for no event; use "
                                     "detector=energy", param="detector")
            self.background = labels.index(value)

    def __call__(self, x: np.ndarray, rate: int) -> Prediction | None:
        """The model's answer for an event's samples (None when it gives no window)."""
        m = self.model
        if self.whole:
            preds = classify_samples(m, x, rate, windowing=Windowing(0, 0, "keep"))
        else:
            preds = classify_samples(m, x, rate, windowing=Windowing.from_params(m.params))
        if not preds:
            return None
        if len(preds) == 1 and self.background is None:
            p = preds[0]
            scores, details = np.asarray(p.scores, dtype=np.float64), dict(p.details)
        else:
            rows = np.stack([np.asarray(p.scores, dtype=np.float64) for p in preds])
            scores = rows.max(axis=0) if m.detector else rows.mean(axis=0)
            details = {k: float(np.mean([p.details.get(k, np.nan) for p in preds])) for k in preds[0].details}
            if m.detector and "threshold" in preds[0].details:
                details["threshold"] = float(preds[0].details["threshold"])
        return Prediction(None, 0, preds[-1].end_ms, self._label(preds, scores, details), scores, m.score_kind,
                          list(m.fitted_labels), details)

    def _label(self, preds: list[Prediction], scores: np.ndarray, details: dict) -> str:
        labels = preds[0].labels
        if self.model.detector:
            return ANOMALY if scores[0] > details["threshold"] else labels[0]
        if len(preds) == 1 and self.background is None and self.rule == self.model.unknown_rule():
            return preds[0].label                 # the model's own answer, by its own rule
        ranked = scores.copy()
        if self.background is not None:
            ranked[self.background] = -np.inf
        best = int(np.argmax(ranked))
        if self.rule is not None and is_unknown(self.rule, scores, best, details):
            return UNKNOWN
        return labels[best]


def answer_event(model: Classifier, samples: np.ndarray, rate: int, *, options: EventOptions | None = None,
                 unknown: str | float = "trained") -> Prediction | None:
    """The model's answer for one event's samples (see the module notes): a prediction spanning
    them, or None when a clip model with ``pad=none`` gives the event no window."""
    return _Answerer(model, options or EventOptions(), unknown)(samples, rate)


def event_stream(model: Classifier, blocks: Iterable[tuple[np.ndarray, float]], rate: int, *,
                 options: EventOptions | None = None, unknown: str | float = "auto") -> Iterator[LiveWindow]:
    """The events of a stream, each answered by the model as soon as it is closed.

    Parameters
    ----------
    model : Classifier
        A fitted model: it answers each event (and decides activity with ``detector=model``).
        A model that keeps learning while it classifies (``normal-dist`` with ``adapt``) is
        copied, as for a stream of windows.
    blocks : iterable of (samples, arrived)
        Samples as they arrive (mono ``(n,)``, or ``(n, channels)``: averaged for the energy
        detector) with the :func:`time.perf_counter` time they did, as a live stream gives them.
    rate : int
        Their sample rate in Hz.
    options : EventOptions, optional
        The detector's settings (default: the defaults).
    unknown : str or float, default='auto'
        The unknown rule (:func:`~wavetrain.pipeline.smoothing.parse_unknown`).

    Yields
    ------
    LiveWindow
        One per event, in order: the event's prediction (``start_ms``/``end_ms`` from the
        stream's start, ``recording`` None) and the time the samples that closed it arrived.
        An event longer than ``max_ms`` is cut, said once in the log.

    Raises
    ------
    ParameterError
        ``detector=model`` with a model that has no background value.
    """
    o = options or EventOptions()
    if model.adapts:
        model = copy.deepcopy(model)     # this stream's own adapting state, as a window stream's
    answer = _Answerer(model, o, unknown)
    if rate <= 0:
        raise ParameterError(f"rate={rate}: expected a positive sample rate", param="rate")
    if o.detector == "model":
        yield from _model_events(model, blocks, rate, o, answer)
        return
    with upsampling_said_once(rate, int(model.feature_spec.rate or model.feature_rate_ or rate)):
        yield from _energy_events(model, blocks, rate, o, answer)


def _energy_events(model: Classifier, blocks: Iterable[tuple[np.ndarray, float]], rate: int, o: EventOptions,
                   answer: _Answerer) -> Iterator[LiveWindow]:
    """``detector=energy``: activity from the samples' band energies (:mod:`wavetrain.features.activity`)."""
    meter = ActivityMeter(rate, o.activity)
    seg = Segmenter(o, rate, o.on_db, o.off)
    ring: SampleRing | None = None
    hop = meter.hop
    arrived = 0.0
    said: set[str] = set()
    for x, arrived in blocks:
        if ring is None:
            ring = SampleRing(None if x.ndim == 1 else x.shape[1], capacity=1 << 16)
        ring.append(x)
        first = meter.done
        levels = meter.push(x if x.ndim == 1 else x.mean(axis=1))
        spans = seg.add(*_frame_spans(first, len(levels), hop, meter.delay), levels)
        yield from _answered(answer, spans, ring, rate, arrived, said)
        ring.drop_before(min(seg.keep_from(), meter.done * hop))
    if ring is None:
        return
    first = meter.done
    levels = meter.flush()
    spans = seg.add(*_frame_spans(first, len(levels), hop, meter.delay), levels) + seg.finish(ring.end)
    yield from _answered(answer, spans, ring, rate, arrived, said)


def _frame_spans(first: int, n: int, hop: int, delay: int) -> tuple[np.ndarray, np.ndarray]:
    """Where activity frames ``first`` to ``first + n`` lie (samples): each frame's middle hop,
    moved back by the smoothing's delay."""
    at = (np.arange(first, first + n) - delay) * hop + hop // 2
    return np.maximum(at, 0), at + hop


def _model_events(model: Classifier, blocks: Iterable[tuple[np.ndarray, float]], rate: int, o: EventOptions,
                  answer: _Answerer) -> Iterator[LiveWindow]:
    """``detector=model``: activity is 1 for each window the model answers other than the
    background value (its span the middle ``shift`` of the window), else 0."""
    ring: SampleRing | None = None
    said: set[str] = set()

    def kept(blocks):
        nonlocal ring
        for x, t in blocks:
            if ring is None:
                ring = SampleRing(None if x.ndim == 1 else x.shape[1], capacity=1 << 16)
            ring.append(x)
            yield x, t

    seg = Segmenter(o, rate, 0.5, 0.5)
    arrived = 0.0
    background = answer.background
    labels = list(model.fitted_labels)
    for w in classify_stream(model, kept(blocks), rate):
        p, arrived = w.prediction, w.arrived
        assert ring is not None
        step = _step_ms(model, p)
        mid = (p.start_ms + p.end_ms) / 2.0
        a, b = (int(round((mid - step / 2) * rate / 1000)), int(round((mid + step / 2) * rate / 1000)))
        active = 0.0 if p.label in (labels[background], UNKNOWN) else 1.0   # type: ignore[index]
        spans = seg.add(np.array([max(0, a)]), np.array([b]), np.array([active]))
        yield from _answered(answer, spans, ring, rate, arrived, said)
        ring.drop_before(min(seg.keep_from(), a))
    if ring is None:
        return
    yield from _answered(answer, seg.finish(ring.end), ring, rate, arrived, said)


def _step_ms(model: Classifier, p: Prediction) -> float:
    w = Windowing.from_params(model.params)
    span = p.end_ms - p.start_ms
    return float(min(span, w.shift_ms or w.clip_ms or span))


def _answered(answer: _Answerer, spans: list[Span], ring: SampleRing, rate: int, arrived: float,
              said: set[str]) -> Iterator[LiveWindow]:
    for s in spans:
        if s.split and "split" not in said:
            said.add("split")
            log.warning("an event longer than max_ms=%d was cut into events of at most that length (the first at "
                        "%.2f s); raise max_ms to keep long events whole", answer.options.max_ms, s.start / rate)
        x = ring.get(max(s.start, ring.first), s.end)
        try:
            p = answer(x, rate)
        except AudioError as e:         # shorter than one feature sub-window
            if "short" not in said:
                said.add("short")
                log.warning("an event at %.2f s was not answered: %s", s.start / rate, e)
            continue
        if p is None:
            if "none" not in said:
                said.add("none")
                log.warning("an event at %.2f s is shorter than the model's window and the model drops short "
                            "windows (pad=none): not answered", s.start / rate)
            continue
        p.start_ms = int(round(1000 * s.start / rate))
        p.end_ms = int(round(1000 * s.end / rate))
        yield LiveWindow(p, arrived)


def sample_events(model: Classifier, samples: np.ndarray, rate: int, *, options: EventOptions | None = None,
                  unknown: str | float = "trained") -> list[Prediction]:
    """The events of samples held in memory (numpy in, one prediction per event out), exactly as
    a file or a stream of them gives them."""
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim not in (1, 2) or x.size == 0:
        raise AudioError(f"samples: expected a non-empty (n,) or (n, channels) array, got shape {x.shape}")
    step = int(rate * BLOCK_S)
    blocks = ((x[i:i + step], 0.0) for i in range(0, x.shape[0], step))
    return [w.prediction for w in event_stream(model, blocks, rate, options=options, unknown=unknown)]


def recording_events(model: Classifier, recording: Recording | str, options: EventOptions | None = None, *,
                     unknown: str | float = "trained") -> list[Prediction]:
    """The events of a recording (a file, or a segment of one), read in blocks of
    :data:`BLOCK_S` seconds: each a prediction with ``recording`` set and times in the audio
    file (as a window's: a segment ``f.wav[a-b]``'s events count from the file's start). Nothing
    found: an empty list (said once in the log for the recording)."""
    rec = recording if isinstance(recording, Recording) else Recording(Path(recording))
    out = list(iter_recording_events(model, rec, options, unknown=unknown))
    if not out:
        log.info("%s: no events (silence or steady background only)", rec.name)
    return out


def iter_recording_events(model: Classifier, rec: Recording, options: EventOptions | None = None, *,
                          unknown: str | float = "trained") -> Iterator[Prediction]:
    """:func:`recording_events`, one event at a time."""
    read, n, rate = rec.block_reader()
    step = max(1, int(rate * BLOCK_S))
    blocks = ((read(i, min(n, i + step)), 0.0) for i in range(0, n, step))
    offset = rec.segment_ms[0] if rec.segment_ms else 0
    for w in event_stream(model, blocks, rate, options=options, unknown=unknown):
        p = w.prediction
        p.recording, p.start_ms, p.end_ms = rec, p.start_ms + offset, p.end_ms + offset
        yield p
