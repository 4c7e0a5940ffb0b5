"""Live answers: what a stream of window predictions reports, as edge monitors do it — one place
for a live stream (``classify -``), a server request and ``sound label`` (and ``classify`` of
files when asked).

The windows of one stream, recording or request are taken in order (:class:`LiveAnswers`):

1. **smoothing** (``smooth=N``, at most :data:`MAX_SMOOTH`): a window's scores become the mean of
   the last N windows' scores (at the start, of those so far), and its details (``z``, ``nearest``,
   ...) the mean of theirs (a detail a window lacks counts as NaN). The means are kept as running
   sums over a sliding window (:class:`_MovingMean`): each window costs the same whatever N is,
   and the sums never subtract a value, so that a NaN, an infinity or a huge score leaving the
   window leaves nothing behind;
2. **the answer** from those scores: the best value, or ``unknown`` when the unknown rule in
   effect says the window is unlike what the model was trained on (:func:`unknown_rule`); a
   detector answers ``anomaly`` when the (smoothed) anomaly score is above its threshold;
3. **hold** (``hold_ms=MS``): a new answer is reported once the windows have given it for MS ms
   of the stream — from the start of the first window that gave it to the start of the current
   one, so one window alone is 0 ms and never outlasts a hold; until then the answer reported
   before stands. Before any answer has held, a classifier reports :data:`UNDECIDED`
   (``undecided``: no answer yet, which ``unknown``, sound unlike the training, is not) and a
   detector its normal value (an alarm must hold too).

The unknown rule (``unknown=``): ``off`` (never unknown, even where the model was trained with a
rule), ``trained`` (the rule the model file holds, if any: what ``classify`` of files does by
default), ``auto`` (that rule, else the family's live rule from what the model knows:
:meth:`~wavetrain.models.base.Classifier.live_unknown_rule`; the default of live use) or a level
(the family's live rule at that level: a top probability for models of probabilities, a number of
training standard deviations of ``z`` for Gaussian mixtures).

A prediction reported with smoothing or hold carries the smoothed scores as its ``scores``, the
held answer as its ``label``, the window's own prediction as ``raw`` and a change held back as
``pending``; without them, and with the model's own rule, predictions pass unchanged.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.models.anomaly import ANOMALY
from wavetrain.models.base import UNKNOWN, Classifier, is_unknown
from wavetrain.pipeline.prediction import Prediction

__all__ = ["LIVE", "MAX_HOLD_MS", "MAX_SMOOTH", "UNDECIDED", "UNKNOWN", "UNKNOWN_MODES", "AnswerOptions",
           "LiveAnswers", "describe_rule", "is_unknown", "parse_unknown", "unknown_rule"]

#: What a classifier's live answers report before any answer has held (``hold``): not decided yet.
#: It is not :data:`UNKNOWN`, the answer for a window unlike the training.
UNDECIDED = "undecided"

#: The named settings of the unknown rule (else a level: a number).
UNKNOWN_MODES = ("off", "trained", "auto")
#: Most windows averaged: 10 s of the finest (10 ms) windows, over 8 minutes of 500 ms ones. A
#: stream keeps the scores and details of that many windows (``smooth`` x values x 8 bytes).
MAX_SMOOTH = 1_000
#: The longest hold (one hour).
MAX_HOLD_MS = 3_600_000


def parse_unknown(text: str | float, *, option: str = "--unknown") -> str | float:
    """``off``, ``trained``, ``auto`` or a level (a finite number > 0) from ``text``; anything
    else is a one-line :class:`ParameterError` naming ``option`` (``--unknown X`` for a command
    line option, ``unknown=X`` for a query option: a name without dashes)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        level = float(text)
    else:
        word = str(text).strip().lower()
        if word in UNKNOWN_MODES:
            return word
        try:
            level = float(word)
        except ValueError:
            level = float("nan")
    if not (np.isfinite(level) and level > 0):
        given = f"{option} {text}" if option.startswith("-") else f"{option}={text}"
        raise ParameterError(f"{given}: expected off, trained, auto or a level > 0 (a top probability, or training "
                             "sd of z for Gaussian mixtures)", param=option.lstrip("-"))
    return level


@dataclass(frozen=True)
class AnswerOptions:
    """How window predictions become the answers reported (see the module notes).

    Attributes
    ----------
    smooth : int
        Windows whose scores are averaged (1: the window's own).
    hold_ms : int
        Milliseconds of the stream a new answer must persist before it is reported (0: at once).
    unknown : str or float
        ``off``, ``trained``, ``auto`` or a level (:func:`parse_unknown`).
    """

    smooth: int = 1
    hold_ms: int = 0
    unknown: str | float = "trained"

    def __post_init__(self):
        if isinstance(self.smooth, bool) or not isinstance(self.smooth, int) or not 1 <= self.smooth <= MAX_SMOOTH:
            raise ParameterError(f"smooth={self.smooth!r}: expected windows 1 to {MAX_SMOOTH}", param="smooth")
        if isinstance(self.hold_ms, bool) or not isinstance(self.hold_ms, int) or \
                not 0 <= self.hold_ms <= MAX_HOLD_MS:
            raise ParameterError(f"hold={self.hold_ms!r}: expected milliseconds 0 to {MAX_HOLD_MS}", param="hold")
        object.__setattr__(self, "unknown", parse_unknown(self.unknown, option="unknown"))

    def describe(self) -> dict[str, Any]:
        """The settings as JSON (``smooth``, ``hold``, ``unknown``)."""
        return {"smooth": self.smooth, "hold": self.hold_ms, "unknown": self.unknown}


#: What live use (a stream, a server, ``sound label``) answers with unless told otherwise.
LIVE = AnswerOptions(unknown="auto")


def unknown_rule(model: Classifier, unknown: str | float) -> dict[str, Any] | None:
    """The unknown rule in effect for ``model`` under the setting ``unknown`` (:func:`parse_unknown`),
    in the form of :meth:`~wavetrain.models.base.Classifier.unknown_rule` (and ``outside``), or
    None: no window is answered unknown.

    Raises
    ------
    ParameterError
        A level for a detector (its answer for unlike sound is ``anomaly``), for a family that knows
        no live rule, or outside the family's scale.
    """
    if unknown == "off" or model.detector and unknown in ("trained", "auto"):
        return None
    if model.detector:
        raise ParameterError(f"unknown {unknown:g}: this {model.name} is an anomaly detector, whose answer for sound "
                             "unlike its training is `anomaly` (its threshold); leave the unknown level out",
                             param="unknown")
    if unknown == "trained":
        return model.unknown_rule()
    if unknown == "auto":
        return model.unknown_rule() or model.live_unknown_rule()
    rule = model.live_unknown_rule(float(unknown))
    if rule is None:
        raise ParameterError(f"unknown {unknown:g}: this {model.name} model ({model.score_kind} scores) knows no rule "
                             "for windows unlike its training; give --unknown off or auto, or train it with "
                             "unknown_fpr where the family has it", param="unknown")
    return rule


def describe_rule(rule: dict[str, Any] | None) -> str:
    """What a rule says, for people (``never`` for None)."""
    if rule is None:
        return "never"
    if "text" in rule:
        return str(rule["text"])
    kind = rule.get("rule")
    if kind == "top_below":
        return f"top probability below {rule['value']:.4g} (trained)"
    if kind == "best_below":
        return "the best score below its value's trained floor"
    if kind == "above":
        return f"{rule['output']} above {rule['value']:.4g} (trained)"
    return str(kind)


class LiveAnswers:
    """The answers of the windows of one stream at a time (:meth:`add`, in order; :meth:`reset`
    between streams), or of a sequence of predictions of several recordings (calling it: each
    recording's windows are a stream of their own).

    Parameters
    ----------
    model : Classifier
        The model the predictions come from (its unknown rules and whether it is a detector).
    options : AnswerOptions
        Smoothing, hold and unknown setting.

    Raises
    ------
    ParameterError
        An unknown level the model cannot take (:func:`unknown_rule`).
    """

    def __init__(self, model: Classifier, options: AnswerOptions):
        self.options = options
        self.detector = bool(model.detector)
        self.rule = unknown_rule(model, options.unknown)
        # the model's own answer stands where it answers by the rule in effect, window by window
        self._own = options.smooth == 1 and (self.detector or self.rule == model.unknown_rule())
        #: Whether any prediction changes (else predictions pass as they are).
        self.active = options.smooth > 1 or options.hold_ms > 0 or not self._own
        self.reset()

    def reset(self) -> None:
        """Forget the windows seen: the next one starts a stream."""
        self._mean = _MovingMean(self.options.smooth)
        self._keys: dict[str, int] = {}         # detail name -> its place after the scores
        self._reported: str | None = None
        self._pending: str | None = None
        self._since = 0
        self._recording: Any = None

    def add(self, p: Prediction) -> Prediction:
        """The answer for the next window of the stream, ``p`` (the model's prediction of it)."""
        if not self.active:
            return p
        o = self.options
        scores, details = self._smoothed(p)
        answer = self._answer(p, scores, details)
        if self._reported is None:
            self._reported = p.labels[0] if self.detector else UNDECIDED
        if answer == self._reported:
            self._pending = None
        else:
            if answer != self._pending:
                self._pending, self._since = answer, p.start_ms
            if p.start_ms - self._since >= o.hold_ms:
                self._reported, self._pending = answer, None
        live = o.smooth > 1 or o.hold_ms > 0
        return Prediction(p.recording, p.start_ms, p.end_ms, self._reported, scores, p.score_kind, p.labels, details,
                          raw=p if live else None, smoothed=self._mean.count, pending=self._pending)

    def _smoothed(self, p: Prediction) -> tuple[np.ndarray, dict[str, float]]:
        """The mean scores and details of the last ``smooth`` windows, ``p`` the newest."""
        scores = np.asarray(p.scores, dtype=np.float64)
        if self.options.smooth == 1:
            return scores, {k: float(v) for k, v in p.details.items()}
        new = [k for k in p.details if k not in self._keys]
        if new:                                  # a detail not seen before: NaN in the windows before
            for k in new:
                self._keys[k] = len(scores) + len(self._keys)
            self._mean.widen(len(scores) + len(self._keys))
        row = np.full(len(scores) + len(self._keys), np.nan)
        row[:len(scores)] = scores
        for k, v in p.details.items():
            row[self._keys[k]] = float(v)
        mean = self._mean.add(row)
        return mean[:len(scores)], {k: float(mean[self._keys[k]]) for k in p.details}

    def _answer(self, p: Prediction, scores: np.ndarray, details: dict[str, float]) -> str:
        if self._own:
            return p.label
        if self.detector:
            return ANOMALY if scores[0] > details["threshold"] else p.labels[0]
        best = int(np.argmax(scores))
        if self.rule is not None and is_unknown(self.rule, scores, best, details):
            return UNKNOWN
        return p.labels[best]

    def __call__(self, preds: Iterable[Prediction]) -> Iterator[Prediction]:
        """The answers of ``preds`` in order, each recording's windows a stream of their own (a
        prediction of samples in memory, ``recording`` None, continues the stream before it)."""
        for p in preds:
            if p.recording is not self._recording:
                self.reset()
                self._recording = p.recording
            yield self.add(p)


class _MovingMean:
    """The mean of the last ``n`` rows added (of those so far at the start), each added row
    costing the same whatever ``n`` is.

    Two stacks, as sliding-window aggregates are kept: the newer rows and their running sum
    (``_back``), and the older rows as suffix sums (``_front``, oldest last), refilled from the
    newer ones in one cumulative sum when the oldest leaves. A mean is the sum of at most two
    partial sums, each a plain sum of rows of the window: nothing is ever subtracted, so a mean
    differs from ``np.mean`` of the same rows by rounding only, and a NaN or an infinity counts
    exactly as long as its row is in the window.
    """

    def __init__(self, n: int):
        self.n = n
        self._back: list[np.ndarray] = []
        self._back_sum: np.ndarray | None = None
        self._front = np.empty((0, 0))           # suffix sums, oldest row's last
        self._front_len = 0

    @property
    def count(self) -> int:
        return self._front_len + len(self._back)

    def add(self, row: np.ndarray) -> np.ndarray:
        """Add ``row`` (float64, of the current width) and return the mean of the window."""
        with np.errstate(invalid="ignore", over="ignore"):     # inf - inf is NaN, as in np.mean
            if self.count == self.n:
                if not self._front_len:
                    self._refill()
                self._front_len -= 1                 # the oldest row leaves
            self._back.append(row)
            self._back_sum = row.copy() if self._back_sum is None else self._back_sum + row
            total = self._back_sum if not self._front_len else self._front[self._front_len - 1] + self._back_sum
            return total / self.count

    def _refill(self) -> None:
        rows = np.stack(self._back[::-1])        # newest first: row i sums the newest i + 1
        self._front = np.cumsum(rows, axis=0)
        self._front_len = len(rows)
        self._back, self._back_sum = [], None

    def widen(self, width: int) -> None:
        """Rows grow to ``width`` values; the rows already in hold NaN in the new places."""
        def pad(a: np.ndarray) -> np.ndarray:
            out = np.full(a.shape[:-1] + (width,), np.nan)
            out[..., :a.shape[-1]] = a
            return out

        if self._front_len:
            self._front = pad(self._front[:self._front_len])
        self._back = [pad(r) for r in self._back]
        if self._back_sum is not None:
            self._back_sum = pad(self._back_sum)
