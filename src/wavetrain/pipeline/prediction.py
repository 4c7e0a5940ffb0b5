"""Predictions: what a model answers for each window, from a feature stream or from samples in
memory (:func:`classify_samples`: numpy in, window predictions out — what a server or a live
monitor calls without a data set).
"""
from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from wavetrain.core.errors import AudioError, ParameterError
from wavetrain.core.outputs import write_atomic
from wavetrain.data.live import SampleRing
from wavetrain.data.recording import Recording
from wavetrain.features import extract, resample
from wavetrain.features.graph import min_samples
from wavetrain.features.spec import CombinedSpec
from wavetrain.models.anomaly import ANOMALY, AnomalyDetector
from wavetrain.models.base import Classifier
from wavetrain.stream.feature_stream import FeatureStream
from wavetrain.stream.source import check_layout
from wavetrain.stream.windows import Windowing, cut_windows, silence_row

__all__ = ["PREDICTION_FORMATS", "LiveWindow", "Prediction", "by_group", "classify_samples", "classify_stream",
           "predict", "predict_recordings", "request_windowing", "with_windows", "write_predictions"]

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    """The answer for one window.

    ``scores`` holds one score per value the model knows (``model.labels_`` order), of the kind
    ``score_kind``: ``"probability"`` — the model's estimate of P(value | window) among the values it
    was trained on (neural models, trained for it with cross-entropy; not calibrated for sounds
    unlike any training window) — or ``"mean_loglik"`` — the mean frame log-likelihood of the window
    under each value's mixture (GMM: a density, not a probability; ``margin`` is how far the best
    exceeds the runner-up, and ``details["z"]`` how many training standard deviations the best lies
    from that value's training windows: far below zero means unlike anything trained) — or
    ``"anomaly"`` — a detector's one anomaly score (higher = less normal), with
    ``details["threshold"]`` above which the window is anomalous (``label`` is then ``anomaly``).

    A prediction of live answers (:mod:`wavetrain.pipeline.smoothing`, with smoothing or hold)
    holds the mean scores and details of the last ``smoothed`` windows, the answer reported (held
    until a new one has persisted), the window's own prediction as ``raw``, and ``pending``: an
    answer the windows give that has not persisted long enough to be reported yet.
    """

    recording: Recording | None     # None for samples given in memory
    start_ms: int
    end_ms: int
    label: str
    scores: np.ndarray
    score_kind: str
    labels: list
    details: dict = field(default_factory=dict)
    raw: Prediction | None = None
    smoothed: int = 1
    pending: str | None = None

    @property
    def file(self) -> str | None:
        """The recording's path (None for samples given in memory)."""
        return None if self.recording is None else str(self.recording.path)

    @property
    def name(self) -> str:
        """The recording's display name (``samples`` for samples given in memory)."""
        return "samples" if self.recording is None else self.recording.name

    @property
    def best(self) -> int:
        """Index of the value answered (the best-scoring one when the answer is ``unknown``)."""
        return self.labels.index(self.label) if self.label in self.labels else int(np.argmax(self.scores))

    @property
    def score(self) -> float:
        """The answered value's score (of the kind ``score_kind``)."""
        return float(self.scores[self.best])

    @property
    def confidence(self) -> float | None:
        """The model's probability of the answer, or None when its scores are not probabilities."""
        return self.score if self.score_kind == "probability" else None

    @property
    def margin(self) -> float:
        """Best score minus the runner-up's (``inf`` with one value)."""
        s = np.sort(self.scores)
        return float(s[-1] - s[-2]) if s.size > 1 else float("inf")

    @property
    def anomaly(self) -> bool | None:
        """A detector's answer: whether the window is answered ``anomaly`` — its anomaly score is
        above the threshold, or with live answers the smoothed score, held (None for a
        classifier)."""
        if self.score_kind != "anomaly":
            return None
        return self.label == ANOMALY

    def describe(self, label_name: str) -> str:
        """``word=seven confidence=0.93``, ``word=seven loglik=-41.3 margin=5.2 z=-0.4`` or (a
        detector) ``anomaly=true score=4.1 threshold=2.7``; live answers add ``raw=VALUE`` when
        the window alone answered otherwise and ``pending=VALUE`` while a new answer is held back."""
        if self.anomaly is not None:
            text = (f"anomaly={'true' if self.anomaly else 'false'} score={self.score:.4g} "
                    f"threshold={self.details['threshold']:.4g}")
        elif self.confidence is not None:
            text = f"{label_name}={self.label} confidence={self.confidence:.2f}"
        else:
            more = "".join(f" {k}={v:.1f}" for k, v in self.details.items() if np.isfinite(v))
            text = f"{label_name}={self.label} loglik={self.score:.1f} margin={self.margin:.1f}{more}"
        if self.raw is not None and self.raw.label != self.label:
            text += f" raw={self.raw.label}"
        if self.pending is not None:
            text += f" pending={self.pending}"
        return text

    def to_json(self, label_name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "start_ms": self.start_ms, "end_ms": self.end_ms,
                               "label": label_name, "value": self.label, "score_kind": self.score_kind}
        if self.anomaly is not None:
            out.update(anomaly=self.anomaly, anomaly_score=round(self.score, 6),
                       threshold=round(float(self.details["threshold"]), 6))
        elif self.confidence is not None:
            out["confidence"] = round(self.confidence, 6)
        else:
            out.update(loglik=round(self.score, 4), margin=round(self.margin, 4) if np.isfinite(self.margin) else None,
                       **{k: round(float(v), 4) if np.isfinite(v) else None for k, v in self.details.items()})
        out["scores"] = {v: round(float(x), 6) for v, x in zip(self.labels, self.scores)}
        if self.raw is not None:
            out.update(smoothed=self.smoothed, pending=self.pending,
                       raw={"value": self.raw.label,
                            "scores": {v: round(float(x), 6) for v, x in zip(self.labels, self.raw.scores)}})
        return out


def predict(model: Classifier, stream: FeatureStream) -> Iterator[Prediction]:
    """Classify every window of every recording of the stream, in order (a detector scoring by
    group: :func:`by_group`)."""
    labels = list(model.fitted_labels)

    def windows() -> Iterator[Prediction]:
        for batch in stream.batches():
            names, values, details = model.predict_scores(batch.grams)
            for j, ((i, s, e), row, name) in enumerate(zip(batch.refs or [], values, names)):
                yield Prediction(stream.dataset[i], s, e, name, row, model.score_kind, labels,
                                 {k: float(v[j]) for k, v in details.items()})

    return by_group(model, windows())


def by_group(model: Classifier, preds: Iterable[Prediction]) -> Iterator[Prediction]:
    """The predictions of a detector that scores by group (``normalize_by``), each window of a
    recording of a known group shifted by that group's shift and answered against the threshold
    (:meth:`~wavetrain.models.anomaly.AnomalyDetector.group_shift`); other models' predictions
    as they are. Recordings of a group the model has not seen keep the pooled scale: said once."""
    if not (isinstance(model, AnomalyDetector) and model.group_shifts_):
        yield from preds
        return
    normal, unseen = model.fitted_labels[0], set()
    for p in preds:
        shift = model.group_shift(None if p.recording is None else p.recording.labels)
        if shift:
            score = float(p.scores[0]) - shift
            p = replace(p, label=ANOMALY if score > model.threshold_ else normal, scores=np.array([score]))
        elif p.recording is not None:
            key = tuple(p.recording.labels.get(n) or "" for n in model.score_groups)
            if key not in model.group_shifts_ and key not in unseen:
                unseen.add(key)
                if len(unseen) == 1:
                    log.warning("%s scores by %s and has not seen %s (%s): its windows score on the pooled scale",
                                model.name, ",".join(model.score_groups), "/".join(key) or "(no value)",
                                p.recording.name)
        yield p


#: Requests whose windows differ from the training windows already warned about (once a process).
_WARNED_WINDOWS: set[tuple] = set()


def request_windowing(model: Classifier, clip_ms: int | None = None, shift_ms: int | None = None, *,
                      warn: bool = True, options: tuple[str, str] | None = None) -> Windowing:
    """The windows a request (a file, a live stream, a server request, ``sound label``) cuts.

    The one windowing rule: the model's own windows by default. A request for other clips gets
    them with the model's ``pad`` rule for a short last window, except that a model trained on
    whole recordings (``clip_ms=0``) is given a short last window as it is (``pad="keep"``), as
    it would see a file of those samples: a recording shorter than one clip is then classified
    exactly as the file is, and the last window of a stream is never padded with silence the
    model has never seen.

    Parameters
    ----------
    model : Classifier
        A fitted model (its ``clip_ms``, ``clip_shift_ms`` and ``pad`` are the training windows).
    clip_ms, shift_ms : int, optional
        The request's clip length and step in ms (None: the model's; ``shift_ms`` None with a
        ``clip_ms`` given: back to back).
    warn : bool, default=True
        Log a warning, once a process for each model family and setting, when the request's
        windows differ from the training windows (scores are then less comparable with the
        threshold or the training statistics).
    options : (str, str), optional
        The names of the options that ask for the clip and the step (``("--clip-ms",
        "--clip-shift-ms")``): the warning then says what to pass to match the training windows.

    Returns
    -------
    Windowing

    Raises
    ------
    ParameterError
        A negative clip or shift.
    """
    base = Windowing.from_params(model.params)
    if clip_ms is None and shift_ms is None:
        return base
    clip = base.clip_ms if clip_ms is None else int(clip_ms)
    shift = int(shift_ms) if shift_ms is not None else (base.shift_ms if clip_ms is None else 0)
    pad = "keep" if base.clip_ms == 0 and clip > 0 else base.pad
    out = Windowing(clip, shift, pad)
    if warn and (out.clip_ms, out.shift_ms or out.clip_ms) != (base.clip_ms, base.shift_ms or base.clip_ms):
        warn_windows(model, out.clip_ms, out.shift_ms, options=options)
    return out


def with_windows(model: Classifier, clip_ms: int | None = None, shift_ms: int | None = None, *,
                 options: tuple[str, str] | None = None) -> Classifier:
    """``model`` itself when no windows are asked for, else a shallow copy of it whose clip
    settings are :func:`request_windowing`'s (its own ``params``; the model is not changed):
    what a server request or ``sound label --clip-ms`` classifies with, so that a recording, a
    stream and samples in memory are cut by one rule (``options``: as for
    :func:`request_windowing`)."""
    if clip_ms is None and shift_ms is None:
        return model
    w = request_windowing(model, clip_ms, shift_ms, options=options)
    out = copy.copy(model)
    out.params = {**model.params, "clip_ms": w.clip_ms, "clip_shift_ms": w.shift_ms, "pad": w.pad}
    return out


def warn_windows(model: Classifier, clip_ms: int, shift_ms: int, *, options: tuple[str, str] | None = None) -> None:
    """Warn, once a process per model family and setting, that windows of ``clip_ms`` (step
    ``shift_ms``) differ from the windows ``model`` was trained on; with the names of the
    ``options`` that ask for the clip and the step, say what to pass to match them."""
    base = Windowing.from_params(model.params)
    key = (model.name, base, clip_ms, shift_ms)
    if key in _WARNED_WINDOWS:
        return
    _WARNED_WINDOWS.add(key)
    trained = "whole recordings (clip_ms=0)" if base.clip_ms == 0 else \
        f"{base.clip_ms} ms windows every {base.shift_ms or base.clip_ms} ms"
    asked = "whole recordings" if clip_ms == 0 else f"{clip_ms} ms windows every {shift_ms or clip_ms} ms"
    hint = ""
    if options is not None:
        clip_opt, shift_opt = options
        if base.clip_ms == 0:
            hint = f"; to match, leave {clip_opt} and {shift_opt} out (the model classifies whole recordings)"
        else:
            step = f" {shift_opt} {base.shift_ms}" if base.shift_ms and base.shift_ms != base.clip_ms else ""
            hint = f"; to match, leave {clip_opt} and {shift_opt} out or pass {clip_opt} {base.clip_ms}{step}"
    log.warning("%s was trained on %s and is asked for %s: its scores%s may differ from those on its own windows%s",
                model.title, trained, asked, " and threshold" if model.detector else "", hint)


def classify_samples(model: Classifier, samples: np.ndarray, rate: int, *,
                     windowing: Windowing | None = None, clip_ms: int | None = None,
                     shift_ms: int | None = None) -> list[Prediction]:
    """Classify samples held in memory, window by window, exactly as a recording of them would be.

    Parameters
    ----------
    model : Classifier
        A fitted model.
    samples : np.ndarray [shape=(n,) or (n, channels)]
        The signal (float, about [-1, 1]); several channels are averaged, or kept for a per-axis
        model (which needs its own channel count).
    rate : int
        Sample rate of ``samples`` in Hz; resampled to the model's rate when it differs.
    windowing : Windowing, optional
        How to cut the samples into windows, as given; when None, :func:`request_windowing` of
        ``clip_ms`` and ``shift_ms``.
    clip_ms, shift_ms : int, optional
        The request's windows (None: the model's own; ``Windowing(clip_ms=0)`` classifies all the
        samples as one window). A model trained on whole recordings asked for clips classifies
        samples shorter than one clip as one window, as the file of them.

    Returns
    -------
    list of Prediction
        One per window, in order (``recording`` is None; ``start_ms``/``end_ms`` from the start).

    Raises
    ------
    AudioError
        Empty or non-finite samples, a signal shorter than one feature sub-window, the wrong
        channel count for a per-axis model, or a rate far below the model's.
    """
    labels = model.fitted_labels
    spec = model.feature_spec
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim not in (1, 2) or x.size == 0:
        raise AudioError(f"samples: expected a non-empty (n,) or (n, channels) array, got shape {x.shape}")
    if isinstance(rate, bool) or not float(rate).is_integer() or rate <= 0:
        raise ParameterError(f"rate={rate!r}: expected a positive integer sample rate in Hz", param="rate")
    rate = int(rate)
    if windowing is None:
        windowing = request_windowing(model, clip_ms, shift_ms)
    target = spec.rate or model.feature_rate_ or rate
    check_layout("samples", rate, 1 if x.ndim == 1 else x.shape[1], rate=target,
                 channels=model.channels_ if spec.per_axis else None)
    if rate < target:
        log.warning("samples at %d Hz are resampled up to the model's %d Hz: they hold nothing above %d Hz, so "
                    "answers on them may be unreliable", rate, target, rate // 2)
    if spec.per_axis:
        x = x[:, None] if x.ndim == 1 else x
    elif x.ndim == 2:
        x = x.mean(axis=1, dtype=np.float32)
    if target != rate:
        x = resample(x, rate, target, axis=0)
    if model.scores_samples:
        return _classify_clips(model, x, target, windowing)
    gram = extract(x, target, spec)
    silence = None if spec.per_axis else lambda: silence_row(spec, target)
    wins, spans = cut_windows(gram, windowing, spec.frame_shift_s(target),
                              int(round(1000 * x.shape[0] / target)), silence=silence)
    if not wins:
        return []
    names, values, details = model.predict_scores(wins)
    return [Prediction(None, s, e, name, row, model.score_kind, list(labels),
                       {k: float(v[j]) for k, v in details.items()})
            for j, ((s, e), row, name) in enumerate(zip(spans, values, names))]


def _classify_clips(model: Classifier, x: np.ndarray, rate: int, windowing: Windowing) -> list[Prediction]:
    """:func:`classify_samples` for a model that scores clips of samples (an exported graph): the
    clips of a live stream's windows (:class:`LiveGeometry`), a last partial one as it is (the
    graph completes it by the model's ``pad`` rule; dropped with ``pad=none``)."""
    n = x.shape[0]
    duration = int(round(1000 * n / rate))
    model.check_clip(windowing.clip_ms)
    shortest = min_samples(model.feature_spec, rate)
    if n < shortest:
        raise AudioError(f"signal of {n} samples ({n / rate:.4g} s at {rate} Hz) is shorter than one feature "
                         f"sub-window of {shortest} samples ({1000 * shortest / rate:.4g} ms)")
    if windowing.clip_ms == 0:
        clips, spans = [x], [(0, duration)]
    else:
        geo = live_geometry(model, rate, clip_ms=windowing.clip_ms, shift_ms=windowing.shift_ms)
        clips, spans = [], []
        k = 0
        while True:
            a, b = geo.span(k)
            if a + geo.frame_size > n or (b > n and windowing.pad == "none"):
                break
            start = geo.start_ms(k)
            clips.append(x[a:min(b, n)])
            spans.append((start, min(start + windowing.clip_ms, duration)))
            if b >= n:
                break
            k += 1
    if not clips:
        return []
    names, values, details = model.score_clips(clips)
    labels = list(model.fitted_labels)
    return [Prediction(None, s, e, name, row, model.score_kind, labels, {k: float(v[j]) for k, v in details.items()})
            for j, ((s, e), row, name) in enumerate(zip(spans, values, names))]


def predict_recordings(model: Classifier, recordings: Iterable[Recording], *, skipped: list | None = None
                       ) -> Iterator[Prediction]:
    """Classify every window of every recording with a model that scores samples (an exported
    graph): each recording read whole at the model's rate, then :func:`classify_samples`. A
    recording that cannot be read or is shorter than one feature sub-window raises
    :class:`AudioError`, or with a ``skipped`` list is added to it as ``(recording, reason)`` and
    passed over."""
    rate = model.feature_rate_
    for rec in recordings:
        try:
            x, r = rec.load(rate)
            preds = classify_samples(model, x, r, windowing=Windowing.from_params(model.params))
        except AudioError as e:
            if skipped is None:
                raise
            skipped.append((rec, f"{rec.name}: {e}"))
            continue
        for p in preds:
            p.recording = rec
            yield p


@dataclass
class LiveWindow:
    """A window of a live stream classified: the answer, and the :func:`time.perf_counter` time
    the last sample the window needs arrived (the answer's latency is measured from it)."""

    prediction: Prediction
    arrived: float


@dataclass(frozen=True)
class LiveGeometry:
    """Where the windows of a live stream lie, in samples at the input rate.

    Window ``k`` starts at the feature frame ``k * step_frames`` (its ``start_ms`` is where a file
    of the stream would put it) and needs the samples up to the end of its last feature
    sub-window, so its features are those a file of the same samples would give it (extractors
    frame without centring; processors that look across frames, such as deltas, see the window's
    own frames only).
    """

    rate: int
    target: int
    clip_ms: int
    shift_ms: int
    windowing: Windowing
    frame_shift_s: float
    clip_frames: int
    step_frames: int
    frame_step: float     # samples at the model's rate between frames
    frame_size: int       # samples at the model's rate in one feature sub-window

    def start_ms(self, k: int) -> int:
        if self.frame_shift_s > 0:
            return int(round(k * self.step_frames * self.frame_shift_s * 1000))
        return k * (self.shift_ms or self.clip_ms)

    def _target_span(self, k: int) -> tuple[float, float]:
        if self.frame_shift_s > 0:
            start = k * self.step_frames * self.frame_step
            return start, start + (self.clip_frames - 1) * self.frame_step + self.frame_size
        start = self.start_ms(k) * self.target / 1000.0
        return start, start + self.clip_ms * self.target / 1000.0

    def span(self, k: int) -> tuple[int, int]:
        """Input samples ``[start, stop)`` that window ``k`` needs."""
        a, b = self._target_span(k)
        ratio = self.rate / self.target
        return int(np.floor(a * ratio + 1e-9)), int(np.ceil(b * ratio - 1e-9))


def live_geometry(model: Classifier, rate: int, *, clip_ms: int | None = None,
                  shift_ms: int | None = None) -> LiveGeometry:
    """Windows of a live stream at ``rate`` Hz: ``clip_ms`` defaults to the model's (1000 ms when
    the model classifies whole recordings), ``shift_ms`` to the model's when the clip is the
    model's, else back to back; a last partial window is cut as :func:`request_windowing` cuts a
    file's (the model's padding, or as it is for a model trained on whole recordings)."""
    spec = model.feature_spec
    target = int(spec.rate or model.feature_rate_ or rate)
    base = Windowing.from_params(model.params)
    clip = int(clip_ms) if clip_ms is not None else (base.clip_ms or LIVE_CLIP_MS)
    if clip <= 0:
        raise ParameterError(f"--clip-ms {clip}: a live stream has no end to wait for; give a clip > 0 ms",
                             param="clip_ms")
    shift = int(shift_ms) if shift_ms is not None else (base.shift_ms if clip == base.clip_ms else 0)
    for option, ms in (("--clip-ms", clip), ("--clip-shift-ms", shift)):
        if ms > MAX_LIVE_CLIP_MS:
            raise ParameterError(f"{option} {ms}: a live window's samples are held in memory until it is answered; "
                                 f"expected at most {MAX_LIVE_CLIP_MS} ms (10 minutes)", param="clip_ms")
    Windowing(clip, shift, base.pad)        # (checks the values)
    pad = "keep" if base.clip_ms == 0 else base.pad
    fs = spec.frame_shift_s(target)
    if fs > 0:
        first = spec.parts[0] if isinstance(spec, CombinedSpec) else spec
        ext = first.build_extractor()
        size = ext.frame_size(first.rate or target)
        step = fs * target
        clip_frames = max(1, int(round(clip / 1000.0 / fs)))
        step_frames = max(1, int(round((shift or clip) / 1000.0 / fs)))
        windowing = Windowing(clip, 0, pad)
    else:
        size, step, clip_frames, step_frames = 0, 0.0, 0, 0
        windowing = Windowing(0, 0, base.pad)
    return LiveGeometry(int(rate), target, clip, shift, windowing, fs, clip_frames, step_frames, step, size)


#: A live stream's window when the model classifies whole recordings and none is asked for.
LIVE_CLIP_MS = 1000
#: The longest window (and step) of a live stream: its samples wait in memory until it is answered.
MAX_LIVE_CLIP_MS = 600_000


def classify_stream(model: Classifier, blocks: Iterable[tuple[np.ndarray, float]], rate: int, *,
                    clip_ms: int | None = None, shift_ms: int | None = None) -> Iterator[LiveWindow]:
    """Classify a live stream window by window, each as soon as its samples have arrived.

    The windows are those a file of the stream would get (:func:`request_windowing`): a stream
    that ends before its first window is complete is classified as one window, as the file of it
    (for a model trained on whole recordings) or padded by the model's ``pad`` rule (a clip
    model); after the complete windows, the first partial one is cut the same way and is the
    last, as in a file.

    Parameters
    ----------
    model : Classifier
        A fitted model. A model that keeps learning while it classifies (``normal-dist`` with
        ``adapt``) is copied: the copy is this stream's own adapting state, and ``model`` is
        left as it was.
    blocks : iterable of (samples, arrived)
        Samples ``(n,)`` (or ``(n, channels)`` for a per-axis model) as they arrive, with the
        :func:`time.perf_counter` time they did (:class:`wavetrain.data.live.PcmStream`).
    rate : int
        Their sample rate (resampled to the model's, window by window).
    clip_ms, shift_ms : int, optional
        Window length and step (:func:`live_geometry`).

    Yields
    ------
    LiveWindow
        In order. Only the samples the next window needs are held (a :class:`SampleRing`), so
        memory stays flat over any length of input.

    Raises
    ------
    AudioError
        A rate far below the model's, or a stream without one feature sub-window of samples.
    """
    geo = live_geometry(model, rate, clip_ms=clip_ms, shift_ms=shift_ms)
    check_layout("the stream", rate, 1, rate=geo.target, channels=None)      # before any warning
    base = Windowing.from_params(model.params)
    if clip_ms is not None or shift_ms is not None:
        request_windowing(model, geo.clip_ms, geo.shift_ms)          # the warning when they differ
    if model.adapts:
        model = copy.deepcopy(model)     # this stream's own adapting state
    with upsampling_said_once(rate, geo.target):
        for i, w in enumerate(_classify_stream(model, blocks, rate, geo)):
            if i == 1 and base.clip_ms == 0 and clip_ms is None:
                warn_windows(model, geo.clip_ms, geo.shift_ms)   # a stream longer than one window
            yield w


@contextlib.contextmanager
def upsampling_said_once(rate: int, target: int) -> Iterator[None]:
    """Inside the block, samples at ``rate`` below the model's ``target`` rate are said to be
    resampled up once (here), not once per window or event that :func:`classify_samples` gets."""
    if rate < target:
        log.warning("samples at %d Hz are resampled up to the model's %d Hz: they hold nothing above %d Hz, so "
                    "answers on them may be unreliable", rate, target, rate // 2)
    once = _OnceFilter()
    log.addFilter(once)
    try:
        yield
    finally:
        log.removeFilter(once)


class _OnceFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "resampled up" not in str(record.msg)


def _classify_stream(model: Classifier, blocks: Iterable[tuple[np.ndarray, float]], rate: int,
                     geo: LiveGeometry) -> Iterator[LiveWindow]:
    ring: SampleRing | None = None
    k = 0
    arrived = 0.0

    def answer(k: int, x: np.ndarray, end_ms: int | None) -> Prediction | None:
        preds = classify_samples(model, x, rate, windowing=geo.windowing)
        if not preds:
            return None
        p = preds[0]
        p.start_ms = geo.start_ms(k)
        p.end_ms = p.start_ms + geo.clip_ms if end_ms is None else min(p.start_ms + geo.clip_ms, end_ms)
        return p

    for x, arrived in blocks:
        if ring is None:
            ring = SampleRing(None if x.ndim == 1 else x.shape[1],
                              capacity=max(1 << 14, 2 * (geo.span(0)[1] - geo.span(0)[0])))
        ring.append(x)
        while True:
            a, b = geo.span(k)
            if b > ring.end:
                break
            p = answer(k, ring.get(a, b), None)
            if p is not None:
                yield LiveWindow(p, arrived)
            k += 1
            ring.drop_before(geo.span(k)[0])
        ring.drop_before(geo.span(k)[0])
    if ring is None:
        return
    # the first partial window, if any, is the last, cut as a file's (padded, kept as it is or dropped)
    total = ring.end
    a, _ = geo.span(k)
    if a >= total or a < ring.first:
        return
    try:
        p = answer(k, ring.get(a, total), int(round(1000 * total / rate)))
    except AudioError:          # fewer samples than one feature sub-window
        if k == 0:
            raise
        return
    if p is not None:
        yield LiveWindow(p, arrived)


#: Predictions files by suffix: one row per window.
PREDICTION_FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl"}
#: Columns of csv and Parquet predictions, then ``score:<value>`` per value the model knows.
PREDICTION_COLUMNS = ("file", "start_ms", "end_ms", "label", "value", "score_kind", "confidence", "loglik", "margin",
                      "z", "anomaly", "anomaly_score", "threshold")
#: Rows per Parquet row group (and per batch held while writing one).
PARQUET_ROWS = 4096


def prediction_format(path: str) -> str:
    """``parquet``, ``csv`` or ``jsonl`` from the file name (a one-line error for another)."""
    import os

    fmt = PREDICTION_FORMATS.get(os.path.splitext(str(path))[1].lower())
    if fmt is None:
        raise ParameterError(f"-o {path}: a predictions file ends in {', '.join(PREDICTION_FORMATS)}")
    return fmt


def flat_prediction(row: dict[str, Any], labels: list) -> dict[str, Any]:
    """A row of :meth:`Prediction.to_json` with its scores as ``score:<value>`` columns."""
    out = {c: row.get(c) for c in PREDICTION_COLUMNS}
    out.update({f"score:{v}": row["scores"].get(v) for v in labels})
    return out


def write_predictions(path: str, rows: Iterator[dict[str, Any]], labels: list) -> int:
    """Write prediction rows (:meth:`Prediction.to_json`, in order) to ``path`` in the format of
    its suffix, atomically, holding at most :data:`PARQUET_ROWS` rows; returns how many."""
    import io
    import json

    fmt = prediction_format(path)
    count = 0

    def write(f) -> None:
        nonlocal count
        if fmt == "jsonl":
            for row in rows:
                f.write(json.dumps(row).encode() + b"\n")
                count += 1
        elif fmt == "csv":
            import csv

            text = io.TextIOWrapper(f, encoding="utf-8", newline="")
            w = csv.DictWriter(text, fieldnames=list(PREDICTION_COLUMNS) + [f"score:{v}" for v in labels])
            w.writeheader()
            for row in rows:
                w.writerow(flat_prediction(row, labels))
                count += 1
            text.flush()
            text.detach()
        else:
            count = _write_parquet(f, rows, labels)

    write_atomic(path, write, what="predictions")
    return count


def _write_parquet(f, rows: Iterator[dict[str, Any]], labels: list) -> int:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ParameterError("Parquet predictions need pyarrow: pip install 'wavetrain[spark]', or write "
                             ".csv or .jsonl") from None
    types = {"file": pa.string(), "start_ms": pa.int64(), "end_ms": pa.int64(), "label": pa.string(),
             "value": pa.string(), "score_kind": pa.string(), "anomaly": pa.bool_()}
    schema = pa.schema([(c, types.get(c, pa.float64())) for c in PREDICTION_COLUMNS]
                       + [(f"score:{v}", pa.float64()) for v in labels])
    count = 0
    with pq.ParquetWriter(f, schema, compression="zstd") as w:
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append(flat_prediction(row, labels))
            if len(batch) == PARQUET_ROWS:
                w.write_table(pa.Table.from_pylist(batch, schema=schema))
                count, batch = count + len(batch), []
        if batch or count == 0:
            w.write_table(pa.Table.from_pylist(batch, schema=schema))
            count += len(batch)
    return count
