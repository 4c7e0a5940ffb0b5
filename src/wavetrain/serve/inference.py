"""One loaded model and what a server answers with it: :func:`classify_samples` on decoded samples
(or, with ``events``, :func:`~wavetrain.pipeline.events.event_stream`), turned into the JSON of
``POST /v1/classify`` and ``GET /v1/model``.

The model is shared by every request and never changed: clip settings asked for by one request
go to a shallow copy of it (its own ``params``), which is also where the inference time is
measured. Nothing of a request is kept after it.
"""
from __future__ import annotations

import copy
import json
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.data.recording import file_sha256
from wavetrain.models.base import Classifier
from wavetrain.models.modelfile import load_model
from wavetrain.pipeline.events import BLOCK_S, EventOptions, event_stream
from wavetrain.pipeline.memory import EXTRACT_BYTES, SLACK, WHOLE_CLIP_FACTOR
from wavetrain.pipeline.prediction import Prediction, classify_samples, request_windowing, with_windows
from wavetrain.pipeline.smoothing import (
    LIVE,
    MAX_HOLD_MS,
    MAX_SMOOTH,
    UNKNOWN,
    AnswerOptions,
    LiveAnswers,
    describe_rule,
    is_unknown,
    parse_unknown,
    unknown_rule,
)
from wavetrain.serve.decode import Decoded, RequestError
from wavetrain.stream.source import check_layout
from wavetrain.stream.windows import Windowing

__all__ = ["Cancelled", "ClassifyOptions", "ModelService", "file_sha256"]

#: Longest clip (and clip shift) a request may ask for: one hour.
MAX_CLIP_MS = 3_600_000
#: Feature frames scored at a time: the windows of a request are scored in chunks of about this
#: many frames (bounding the memory of models that stack them) and the work stops between chunks
#: when the client has gone.
CHUNK_FRAMES = 1 << 16
#: Bytes of the answer per window, and per value listed in a window (an estimate, on the high side).
_WINDOW_BYTES, _VALUE_BYTES = 160, 48


class Cancelled(Exception):
    """The work of a request was stopped (its client went away)."""


#: The options of ``POST /v1/classify`` (besides the raw PCM layout).
OPTIONS = ("top_k", "clip_ms", "clip_shift_ms", "smooth", "hold", "unknown", "events")
#: Options of the windows a request cuts and how their answers are smoothed: a request for events
#: cuts none (each event is answered as a whole), so it may not give them.
WINDOW_OPTIONS = ("clip_ms", "clip_shift_ms", "smooth", "hold")
#: ``events=`` values that ask for windows, as without the option.
_NO_EVENTS = ("0", "off", "false", "no")


@dataclass(frozen=True)
class ClassifyOptions:
    """Per-request options: how many values to answer, clip settings (None: the model's), how
    window predictions become answers (:mod:`wavetrain.pipeline.smoothing`; None: the server's
    default), and ``events``: the event detector's settings when the request asks for the events
    of its audio rather than its windows (None: windows)."""

    top_k: int = 5
    clip_ms: int | None = None
    clip_shift_ms: int | None = None
    smooth: int | None = None
    hold: int | None = None
    unknown: str | float | None = None
    events: EventOptions | None = None

    @classmethod
    def from_query(cls, query) -> ClassifyOptions:
        """From query parameters (a mapping); a bad value is a 400."""
        unknown = set(query) - {*OPTIONS, "sample_rate", "channels", "format"}
        if unknown:
            raise RequestError(400, f"unknown option(s) {', '.join(sorted(unknown))}: expected "
                                    f"{', '.join(OPTIONS)} (and sample_rate, channels, format for raw PCM)")
        level = query.get("unknown")
        try:
            level = None if level is None else parse_unknown(level, option="unknown")
        except ParameterError as e:
            raise RequestError(400, str(e)) from None
        events = _events_option(query)
        return cls(top_k=_int_option(query, "top_k", 1, 10_000) or 5,
                   clip_ms=_int_option(query, "clip_ms", 0, MAX_CLIP_MS),
                   clip_shift_ms=_int_option(query, "clip_shift_ms", 0, MAX_CLIP_MS),
                   smooth=_int_option(query, "smooth", 1, MAX_SMOOTH),
                   hold=_int_option(query, "hold", 0, MAX_HOLD_MS), unknown=level, events=events)

    def answers(self, default: AnswerOptions) -> AnswerOptions:
        """The request's answer settings, the server's ``default`` where it gives none."""
        return AnswerOptions(smooth=default.smooth if self.smooth is None else self.smooth,
                             hold_ms=default.hold_ms if self.hold is None else self.hold,
                             unknown=default.unknown if self.unknown is None else self.unknown)


def _events_option(query) -> EventOptions | None:
    """``events=1`` (or ``on``, ``true``, empty: the detector's defaults) or ``events=SETTINGS``
    (:meth:`EventOptions.parse`); ``0``, ``off``, ``false`` or no option: None. A bad text, or
    window options beside it, is a 400."""
    text = query.get("events")
    if text is None or text.strip().lower() in _NO_EVENTS:
        return None
    try:
        events = EventOptions.parse(text, option="events")
    except ParameterError as e:
        message = str(e)
        raise RequestError(400, message if message.startswith("events") else f"events: {message}") from None
    given = [name for name in WINDOW_OPTIONS if query.get(name) is not None]
    if given:
        raise RequestError(400, f"events with {', '.join(given)}: {' and '.join(given)} "
                                f"{'is a window option' if len(given) == 1 else 'are window options'}, and a "
                                "request for events cuts no windows (each event is answered as a whole); "
                                "drop them, or drop events")
    return events


def _int_option(query, name: str, low: int, high: int) -> int | None:
    text = query.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise RequestError(400, f"{name}={text!r}: expected an integer") from None
    if not low <= value <= high:
        raise RequestError(400, f"{name}={value}: expected {low} to {high}")
    return value


class ModelService:
    """A fitted model, its identity and the JSON a server answers with."""

    def __init__(self, model: Classifier, *, model_id: str, sha256: str | None = None,
                 answers: AnswerOptions = LIVE):
        model.check_is_fitted()
        if model.adapts:
            raise UserError(f"{model_id}: this {model.name} detector keeps learning while it classifies "
                            f"(adapt={model.params.get('adapt')}), which a server cannot do (every request gets "
                            "the model as trained); serve a model trained with adapt=0, or classify a live stream "
                            "with `wavetrain classify -m MODEL -`")
        self.model = model
        self.model_id = model_id
        self.sha256 = sha256
        #: The answer settings of a request that gives none (checked against the model here).
        self.answers = answers
        LiveAnswers(model, answers)

    @classmethod
    def from_file(cls, path: str | Path, *, answers: AnswerOptions = LIVE) -> ModelService:
        return cls(load_model(path), model_id=Path(path).name, sha256=file_sha256(path), answers=answers)

    @property
    def labels(self) -> list[str]:
        return list(self.model.fitted_labels)

    def describe(self) -> dict[str, Any]:
        """``GET /v1/model``."""
        m = self.model
        out: dict[str, Any] = {
            "id": self.model_id, "sha256": self.sha256, "family": m.name, "preset": m.preset_,
            "detector": bool(m.detector),
            "score_kind": m.score_kind, "label": m.label_name_ or "label", "labels": self.labels,
            "feature_spec": m.params.get("features"), "feature_rate": m.feature_rate_, "channels": m.channels_,
            "windowing": {k: m.params.get(k) for k in ("clip_ms", "clip_shift_ms", "pad")},
            "parameters": {k: _jsonable(v) for k, v in m.params.items()},
        }
        if m.detector:
            out["threshold"] = _num(getattr(m, "threshold_", None))
        d = self.answers
        out["options"] = {"top_k": ClassifyOptions.top_k, "clip_ms": m.params.get("clip_ms"),
                          "clip_shift_ms": m.params.get("clip_shift_ms"), **d.describe()}
        out["unknown_rule"] = describe_rule(unknown_rule(m, d.unknown))
        return out

    def peak_bytes(self, *, max_bytes: int, max_samples: int) -> int:
        """About the most memory one request takes in a worker: its body (and a multipart part
        copied out of it), its samples as float32 (decoded, mixed down, resampled), the
        extractor's working memory (the planner's :data:`~wavetrain.pipeline.memory.EXTRACT_BYTES`, or its
        per-sample factor for whole-input specs), the feature gram of ``max_samples`` samples at
        the model's rate (twice: extraction and processors), a chunk of stacked windows, and the
        planner's slack for fragmentation."""
        m = self.model
        spec = m.feature_spec
        rate = int(spec.rate or m.feature_rate_ or 16000)
        channels = int(m.channels_ or 1) if spec.per_axis else 1
        dim = spec.feature_dim(rate, channels=channels)
        framed = spec.frame_shift_s(rate) > 0
        frames = spec.n_frames(max_samples // channels, rate) if framed else 1
        extract = EXTRACT_BYTES if framed else WHOLE_CLIP_FACTOR * 4 * max_samples
        work = 2 * max_bytes + 3 * 4 * max_samples + extract + 2 * 4 * frames * dim + 4 * CHUNK_FRAMES * dim
        return int(work * (1 + SLACK))

    # -- bounds -------------------------------------------------------------------------------
    def frame_shift_ms(self) -> float:
        """Milliseconds between the model's feature frames (0 for one frame per input)."""
        m = self.model
        spec = m.feature_spec
        rate = int(spec.rate or m.feature_rate_ or 16000)
        return 1000.0 * spec.frame_shift_s(rate)

    def windowing(self, options: ClassifyOptions) -> Windowing:
        """The windows of a request: :func:`~wavetrain.pipeline.prediction.request_windowing` (the model's
        clip settings, or the request's)."""
        return request_windowing(self.model, options.clip_ms, options.clip_shift_ms, warn=False)

    def live_answers(self, options: ClassifyOptions) -> LiveAnswers:
        """The answers of a request's windows (a 400 for an unknown level the model cannot take)."""
        try:
            return LiveAnswers(self.model, options.answers(self.answers))
        except ParameterError as e:
            raise RequestError(400, str(e)) from None

    def check_options(self, options: ClassifyOptions) -> None:
        """Refuse (400) a clip or a shift shorter than a feature frame shift (windows start on
        frames, so a finer step only repeats windows), an unknown level the model cannot take, and
        event settings the model cannot answer (``detector=model`` without its background value)."""
        answers = self.live_answers(options)
        if options.events is not None:
            # the detector checks its settings against the model as it starts: a stream of no
            # samples starts it and ends at once
            m = self.model
            rate = int(m.feature_spec.rate or m.feature_rate_ or 16000)
            try:
                next(iter(event_stream(m, (), rate, options=options.events, unknown=answers.options.unknown)), None)
            except ParameterError as e:
                raise RequestError(400, str(e)) from None
        shift = self.frame_shift_ms()
        for name, value in (("clip_ms", options.clip_ms), ("clip_shift_ms", options.clip_shift_ms)):
            if value and value < shift:
                raise RequestError(400, f"{name}={value}: windows start on the model's feature frames, "
                                        f"{shift:g} ms apart; give {math.ceil(shift)} ms or more (0: the "
                                        f"{'whole input' if name == 'clip_ms' else 'clip length'})")

    def check_cost(self, decoded: Decoded, options: ClassifyOptions, *, max_samples: int, max_windows: int,
                   max_window_frames: int, max_answer_bytes: int) -> None:
        """Refuse, before any feature is computed, a request whose samples at the model's rate,
        windows, frames in them or answer would exceed the limits (413, 422). A request for events
        is held to the same samples, windows and frames (the model's windows over the whole
        input: about what answering its events scores), and refused at a rate no event could be
        answered at; its answer is bounded as its events are found (:meth:`events`)."""
        m = self.model
        spec = m.feature_spec
        target = int(spec.rate or m.feature_rate_ or decoded.rate)
        if options.events is not None:
            # (the windows check this as they are cut; an event the model cannot answer is only
            # skipped, so a rate or a layout no event can be answered at is refused here)
            check_layout("the audio", decoded.rate, decoded.channels, rate=target,
                         channels=m.channels_ if spec.per_axis else None)
        n = decoded.samples.shape[0]
        at_target = n if target == decoded.rate else -(-n * target // decoded.rate)
        width = decoded.channels if spec.per_axis else 1
        if at_target * width > max_samples:
            raise RequestError(413, f"the audio resampled to the model's {target} Hz holds {at_target * width} "
                                    f"samples; at most {max_samples} are accepted")
        frames = spec.n_frames(n, decoded.rate)
        spans = self.windowing(options).spans(frames, spec.frame_shift_s(target)) if frames else []
        window_frames = sum(b - a for a, b in spans)
        k = min(options.top_k, len(self.labels))
        a = options.answers(self.answers)
        # (events: the answer is counted as the events are found, see :meth:`events`)
        answer = 0 if options.events is not None else \
            len(spans) * (_WINDOW_BYTES + _VALUE_BYTES * k * (2 if a.smooth > 1 or a.hold_ms else 1))
        limits = (f"this server cuts at most {max_windows} windows of at most {max_window_frames} frames in all, "
                  f"and answers at most {max_answer_bytes} bytes, per request")
        what = (f"{len(spans)} windows of {spans[0][1] - spans[0][0] if spans else 0} feature frames "
                f"({window_frames} frames to score, an answer of about {answer} bytes with top_k={k})")
        if len(spans) > max_windows or window_frames > max_window_frames or answer > max_answer_bytes:
            raise RequestError(422, f"{decoded.duration_s:.1f} s of audio cut into {what}: {limits}; ask for a "
                                    "larger clip_shift_ms, a shorter clip_ms, a smaller top_k or send less audio")

    # -- work -----------------------------------------------------------------------------------
    def classify(self, decoded: Decoded, options: ClassifyOptions, *,
                 cancel: threading.Event | None = None) -> tuple[list[Prediction], float, float]:
        """``classify_samples`` with the request's clip settings; returns the window predictions,
        the feature seconds (everything but the model's scoring) and the inference seconds.

        The windows are scored in chunks of about :data:`CHUNK_FRAMES` frames; :class:`Cancelled`
        is raised before a chunk once ``cancel`` is set."""
        model, spent = _scored_in_chunks(with_windows(self.model, options.clip_ms, options.clip_shift_ms), cancel)
        t0 = time.perf_counter()
        preds = classify_samples(model, decoded.for_model(), decoded.rate)
        total = time.perf_counter() - t0
        return preds, total - spent[0], spent[0]

    def events(self, decoded: Decoded, options: ClassifyOptions, *, cancel: threading.Event | None = None,
               max_answer_bytes: int | None = None) -> tuple[list[dict[str, Any]], float, float]:
        """The events of the input (``options.events`` set): its samples go through the event
        detector in blocks of :data:`~wavetrain.pipeline.events.BLOCK_S` seconds, as
        :func:`~wavetrain.pipeline.events.sample_events` sends them, and each event is answered by
        the model under the request's unknown rule (the server's default: ``auto``).

        Returns each event's JSON (:meth:`~wavetrain.pipeline.prediction.Prediction.to_json`
        without ``file``), the feature seconds and the inference seconds. :class:`Cancelled` is
        raised between blocks, events and chunks of windows once ``cancel`` is set; a 422 as soon
        as the events found would make an answer over ``max_answer_bytes``."""
        assert options.events is not None
        model, spent = _scored_in_chunks(self.model, cancel)
        x = decoded.for_model()
        step = max(1, int(decoded.rate * BLOCK_S))
        label_name = self.model.label_name_ or "label"

        def blocks():
            for i in range(0, x.shape[0], step):
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                yield x[i:i + step], 0.0

        rows: list[dict[str, Any]] = []
        size = 0
        t0 = time.perf_counter()
        unknown = options.answers(self.answers).unknown
        for w in event_stream(model, blocks(), decoded.rate, options=options.events, unknown=unknown):
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            row = _jsonable(w.prediction.to_json(label_name))
            del row["file"]
            rows.append(row)
            size += len(json.dumps(row, separators=(",", ":"))) + 1
            if max_answer_bytes is not None and size > max_answer_bytes:
                raise RequestError(422, f"{decoded.duration_s:.1f} s of audio hold more than {len(rows) - 1} events, "
                                        f"an answer over {max_answer_bytes} bytes (the most this server answers "
                                        "per request); ask for longer events (min_ms), longer gaps between them "
                                        "(gap_ms) or a higher on_db, or send less audio")
        total = time.perf_counter() - t0
        return rows, total - spent[0], spent[0]

    def answer(self, preds: list[Prediction], decoded: Decoded, options: ClassifyOptions) -> dict[str, Any]:
        """The JSON of ``POST /v1/classify`` for the window predictions of one input: each window's
        answer by the request's answer settings (:meth:`live_answers`), and the whole input's."""
        m = self.model
        labels = self.labels
        k = min(options.top_k, len(labels))
        answers = self.live_answers(options)
        preds = list(answers(preds))
        out: dict[str, Any] = {"model": {"id": self.model_id, "sha256": self.sha256},
                               "duration_s": round(decoded.duration_s, 6), "sample_rate": decoded.rate,
                               "channels": decoded.channels, "score_kind": m.score_kind,
                               "label_name": m.label_name_ or "label", "windows": len(preds),
                               "answers": {**answers.options.describe(), "unknown_rule": describe_rule(answers.rule)}}
        if m.detector:
            # as `wavetrain classify` answers: each window against the per-window threshold (its
            # smoothed score, held, with smooth or hold); the input is anomalous when one of its
            # windows is (its score: the highest window score)
            threshold = float(preds[0].details["threshold"])
            score = float(max(p.score for p in preds))
            anomalous = any(bool(p.anomaly) for p in preds)
            answer = "anomaly" if anomalous else labels[0]
            out.update(label=answer, predictions=[{"label": answer, "score": _num(score)}], anomaly=anomalous,
                       anomaly_score=_num(score), threshold=_num(threshold))
        else:
            # the whole input: the mean of its windows' own scores (and details), by the unknown rule
            own = [p.raw or p for p in preds]
            mean = np.stack([p.scores for p in own]).astype(np.float64).mean(axis=0)
            details = {n: float(np.mean([p.details.get(n, np.nan) for p in own])) for n in own[0].details}
            out["predictions"] = _top(mean, labels, k)
            best = int(np.argmax(mean))
            out["label"] = (UNKNOWN if answers.rule is not None and is_unknown(answers.rule, mean, best, details)
                            else out["predictions"][0]["label"])
        out["segments"] = [self._segment(p, labels, k) for p in preds]
        return out

    def answer_events(self, rows: list[dict[str, Any]], decoded: Decoded, options: ClassifyOptions) -> dict[str, Any]:
        """The JSON of ``POST /v1/classify`` for the events of one input (:meth:`events`): the
        events in order, the detector's settings and the unknown rule they were answered by."""
        assert options.events is not None
        m = self.model
        unknown = options.answers(self.answers).unknown
        return {"model": {"id": self.model_id, "sha256": self.sha256}, "duration_s": round(decoded.duration_s, 6),
                "sample_rate": decoded.rate, "channels": decoded.channels, "score_kind": m.score_kind,
                "label_name": m.label_name_ or "label", "events": rows, "event_settings": options.events.describe(),
                "answers": {"unknown": unknown, "unknown_rule": describe_rule(unknown_rule(m, unknown))}}

    def _segment(self, p: Prediction, labels: list[str], k: int) -> dict[str, Any]:
        seg: dict[str, Any] = {"start_ms": p.start_ms, "end_ms": p.end_ms, "label": p.label}
        if p.anomaly is not None:
            seg.update(predictions=[{"label": p.label, "score": _num(float(p.scores[0]))}], anomaly=p.anomaly,
                       anomaly_score=_num(float(p.scores[0])), threshold=_num(float(p.details["threshold"])))
        else:
            seg["predictions"] = _top(p.scores, labels, k)
            details = {n: _num(v) for n, v in p.details.items()}
            if details:
                seg["details"] = details
        if p.raw is not None:
            seg.update(smoothed=p.smoothed, pending=p.pending,
                       raw={"label": p.raw.label, "predictions": _top(p.raw.scores, labels, k)})
        return seg


def _scored_in_chunks(model: Classifier, cancel: threading.Event | None) -> tuple[Classifier, list[float]]:
    """A shallow copy of ``model`` (its own ``params``) that scores windows in chunks
    (:func:`_score_in_chunks`), and the list whose one item counts the seconds it spends scoring."""
    model = copy.copy(model)
    spent = [0.0]
    score = model.predict_scores             # bound to the copy: its own params

    def chunked(grams):
        t = time.perf_counter()
        try:
            return _score_in_chunks(score, grams, cancel)
        finally:
            spent[0] += time.perf_counter() - t

    model.predict_scores = chunked  # type: ignore[method-assign]   # this copy only
    return model, spent


def _score_in_chunks(score, grams: list, cancel: threading.Event | None):
    """``score(grams)`` a chunk of windows at a time (one call when they fit in one chunk)."""
    per = max(1, CHUNK_FRAMES // max(1, max(len(g) for g in grams)))
    if cancel is not None and cancel.is_set():
        raise Cancelled()
    if len(grams) <= per:
        return score(grams)
    names: list[str] = []
    values: list[np.ndarray] = []
    details: dict[str, list[np.ndarray]] = {}
    for i in range(0, len(grams), per):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        n, v, d = score(grams[i:i + per])
        names.extend(n)
        values.append(np.asarray(v))
        for key, x in d.items():
            details.setdefault(key, []).append(np.asarray(x))
    return names, np.concatenate(values), {k: np.concatenate(x) for k, x in details.items()}


def _top(scores: np.ndarray, labels: list[str], k: int) -> list[dict[str, Any]]:
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:k]
    return [{"label": labels[i], "score": _num(float(scores[i]))} for i in order]


def _num(x: Any) -> float | None:
    """A JSON number (None for NaN and infinities, which JSON has not)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return _num(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)
