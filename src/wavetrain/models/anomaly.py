"""The anomaly-detector contract: learn normal sound only, score how unlike it a window is, and
flag the windows scoring above a threshold chosen for a target false-alarm rate.

A detector is a :class:`~wavetrain.models.base.Classifier` with one label value (the value its
training recordings share, e.g. ``normal``, or ``normal`` when they have no label): every window
of the training data is normal. Its :meth:`~wavetrain.models.base.Classifier.learn` (``fit`` is
``learn`` on the local executor of :mod:`wavetrain.models.passes`; the Spark engine calls ``learn``
with its own) holds out ``valid_fraction`` of the recordings (whole groups with ``group_by``), has
the family learn from the rest (its ``_learn``: passes of statistics or gradient steps, on any
executor), scores the held-out windows (:meth:`AnomalyDetector.anomaly_score`: higher = less
normal) and sets ``threshold_`` to their ``1 - fpr`` quantile, or with few of them to that of a
gamma distribution fitted to their scores, so about ``fpr`` of normal windows raise a false alarm.
A prediction is the normal value or ``anomaly``; its one score is the anomaly score.

**Scores by group** (``normalize_by=section,domain``): units of one product line, or one unit in
two operating conditions, differ in how high their normal windows score (a noisier hall scores
higher everywhere), so one threshold misses faults in the quiet group and raises false alarms in
the loud one. The held-out part is then drawn from every combination of those labels' values (a
combination with one recording keeps it for training) and each group's *shift* is recorded: how
far the mean score of its held-out windows lies above that of all held-out windows. A window of a
recording of a known group scores its anomaly score minus its group's shift
(:meth:`AnomalyDetector.group_shift`, applied where predictions know their recording); the
threshold is set on the shifted held-out scores, so one threshold serves every group. A window
whose recording is not known (live input, a server, an exported graph) or whose group the model
has not seen scores on the pooled scale (no shift). ``wavetrain adapt`` sets the shift of the
groups its new recordings belong to from their part-wise scores.
"""
from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.params import Param
from wavetrain.evaluation.detection_metrics import ThresholdFit, fit_threshold
from wavetrain.models.base import Classifier, FitOptions
from wavetrain.models.passes import Executor, ScoreList
from wavetrain.stream.batches import Batch, CountsFrames, WindowStream

__all__ = ["ADAPT_FOLDS", "ANOMALY", "DETECTOR_PARAMS", "AnomalyDetector", "NormalStream"]

log = logging.getLogger(__name__)

#: The value a detector answers for a window scoring above its threshold.
ANOMALY = "anomaly"
#: The most parts new recordings are split into to score each against the others (``adapt``).
ADAPT_FOLDS = 8
#: The value of a detector trained on recordings without a label.
NORMAL = "normal"

#: Parameters every detector has: how the threshold is chosen.
DETECTOR_PARAMS: tuple[Param, ...] = (
    Param("fpr", 0.05, "false-alarm rate the threshold is set for: the share of held-out normal windows "
          "scoring above it", float, low=0.0, high=0.5),
    Param("valid_fraction", 0.2, "part of the normal recordings (or groups, with --group-by) held out to "
          "set the threshold; 0 = set it on the training windows (fewer false alarms in training than "
          "later)", float, low=0.0, high=0.9),
    Param("seed", 0, "random seed (validation hold-out, initialisation)", int, low=0),
    Param("normalize_by", "", "labels whose values group the recordings, e.g. section,domain: each group's "
          "scores are shifted by its held-out normal windows' mean, so one threshold serves every group "
          "(empty: one scale for all)", str),
    Param("id_labels", "", "labels a network first learns to tell apart from the normal recordings, e.g. section "
          "(several: each combination of their values); the detector then learns the network's embeddings "
          "(empty: its own features)", str),
    Param("id_network", "cnn-id", "the network that learns id_labels: a family or preset whose models embed, "
          "or a .toml model spec", str),
)

#: The state key of the groups' values (JSON as bytes: a model file stores numbers only).
_GROUPS = "group_values"
#: The state key of the groups' shifts.
_SHIFTS = "group_shifts"


class NormalStream:
    """A stream's windows, every one labelled as the detector's one value (index 0)."""

    def __init__(self, stream: WindowStream, value: str):
        self.stream, self.labels = stream, [value]
        self.feature_dim, self.rate, self.channels = stream.feature_dim, stream.rate, stream.channels

    def batches(self, *, shuffle: bool = False, seed: int = 0) -> Iterator[Batch]:
        for b in self.stream.batches(shuffle=shuffle, seed=seed):
            yield Batch(b.grams, np.zeros(len(b.grams), dtype=np.int64), b.refs)

    def expected_frames(self) -> int | None:
        return self.stream.expected_frames() if isinstance(self.stream, CountsFrames) else None


class AnomalyDetector(Classifier):
    """Base class of the anomaly detectors.

    Subclasses set ``name``, ``hyperparams`` (without ``seed``: :data:`DETECTOR_PARAMS` has it) and
    implement ``_learn`` (normal sound), ``_anomaly_score``, ``_state`` and ``_load_state``.

    Attributes
    ----------
    threshold_ : float
        Scores above it are anomalous.
    normal_score_mean_, normal_score_sd_ : float
        Mean and sd of the held-out normal windows' scores (the training windows' with
        ``valid_fraction=0``; shifted by group with ``normalize_by``).
    group_shifts_ : dict of tuple of str to float
        With ``normalize_by``: per group (its values of those labels) the shift of its scores.
    """

    detector: ClassVar[bool] = True
    #: Moments, summaries or mixture statistics of normal windows, then a threshold calibrated
    #: from held-out scores (the autoencoder learns by gradient steps instead).
    learns_by: ClassVar[str] = "statistics"
    min_labels = 1
    score_kind = "anomaly"

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.threshold_ = float("nan")
        self.normal_score_mean_ = float("nan")
        self.normal_score_sd_ = float("nan")
        self.group_shifts_: dict[tuple[str, ...], float] = {}

    @classmethod
    def param_table(cls) -> tuple[Param, ...]:
        return super().param_table() + DETECTOR_PARAMS

    # -- fitting --------------------------------------------------------------------------------
    def _take_layout(self, data: Executor) -> None:
        """The one value of the training windows (``normal`` when they have none), refusing
        several: every window of a detector's training data is normal."""
        if len(data.labels) > 1:
            raise UserError(f"{self.name} learns from normal recordings only, and these have {len(data.labels)} "
                            f"values ({', '.join(data.labels)}); keep the normal ones (train --normal VALUE "
                            "or --where LABEL=VALUE)")
        self.labels_ = [data.labels[0] if data.labels else NORMAL]
        self.feature_dim_ = int(data.feature_dim)
        self.feature_rate_ = data.rate
        self.channels_ = data.channels

    @property
    def id_labels(self) -> tuple[str, ...]:
        """The labels a network learns before the detector learns its embeddings (``id_labels``), or none."""
        return tuple(n.strip() for n in str(self.params.get("id_labels") or "").split(",") if n.strip())

    @property
    def score_groups(self) -> tuple[str, ...]:
        """The labels whose values group the recordings' scores (``normalize_by``), or none."""
        return tuple(n.strip() for n in str(self.params.get("normalize_by") or "").split(",") if n.strip())

    def _train(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """Learn normal sound from every labelled window of ``data`` (the family's :meth:`_learn`)
        and set the threshold on the scores of ``valid`` (default: ``valid_fraction`` of the
        recordings held out; with ``normalize_by``, of each group): the fit of every detector on
        any executor (local or Spark)."""
        train = data
        groups = self.score_groups
        if groups:
            self._window_groups(data, np.zeros(0, dtype=np.int64))      # (the labels exist, or one line)
        if valid is None and self.params["valid_fraction"] > 0:
            try:
                parts = data.split(self.params["valid_fraction"], self.params["seed"], options.group_by, groups)
            except (UserError, ParameterError) as e:
                log.warning("%s: %s; the threshold is set on the training windows", self.name, e)
            else:
                if parts is None:
                    log.warning("%s: the stream cannot hold out normal recordings; the threshold is set on the "
                                "training windows", self.name)
                else:
                    train, valid = parts
        self._learn(train, None, options)
        scored = valid if valid is not None else train
        on = "held-out normal windows" if valid is not None else "training windows"
        if groups:
            ordinals, scores = scored.run(ScoreList(self)).ordered()
        else:
            scores = scored.scores(self)
        if scores.size == 0:
            raise UserError(f"{self.name}: no windows to set the threshold on")
        bad = int((~np.isfinite(scores)).sum())
        if bad:
            raise UserError(f"{self.name}: {bad} of {scores.size} {on} score NaN or infinity, so no threshold can "
                            "be set; the model or the features are degenerate (a constant or silent recording?): "
                            "check the training recordings or change the features")
        if groups:
            self.group_shifts_ = {}
            shifted = self._shift_groups(scores, self._window_groups(scored, ordinals), ordinals.tolist())
            self._say_unshifted(data, on)
            if shifted.size:
                scores = shifted
            else:
                log.warning("%s: normalize_by: no group has two recordings among the %s to measure how its scores "
                            "spread about its shift: the threshold is set on the scores as they are (hold out more: "
                            "valid_fraction)", self.name, on)
        fit = self.set_threshold(scores)
        self.train_info_.update(threshold=self.threshold_, threshold_windows=int(scores.size),
                                threshold_method=fit.method, expected_fpr=list(fit.fpr_range),
                                threshold_on=f"{on} ({fit.describe()})")

    # -- scores by group ------------------------------------------------------------------------
    def _window_groups(self, data: Executor, ordinals: np.ndarray) -> list[tuple[str, ...]]:
        """The group (values of the ``normalize_by`` labels) of each window, from its recording."""
        try:
            values = data.recording_values(self.score_groups)
        except UserError as e:
            raise UserError(f"normalize_by={','.join(self.score_groups)}: {e}") from None
        if values is None:
            raise UserError(f"normalize_by={','.join(self.score_groups)}: these windows do not know their "
                            "recordings' labels (train on a data set)")
        return [values[int(o)] for o in ordinals]

    def _shift_groups(self, scores: np.ndarray, keys: Sequence[tuple[str, ...]], recordings: Sequence[Any], *,
                      pooled: float | None = None) -> np.ndarray:
        """Set the shift of each group in ``keys`` (the group of each score) to its scores' mean
        minus ``pooled`` (default: the mean of all of them, which is then the pooled scale's).

        Returns the scores a threshold can be set on: each recording's scores shifted by its
        group's shift measured *without* that recording (a group's own mean would fit its
        scores to it: one recording's would all land on the pooled mean). Groups with one
        recording give none; empty when none has two."""
        base = float(np.mean(scores)) if pooled is None else pooled
        raw = np.asarray(scores, dtype=np.float64)
        ids = {r: i for i, r in enumerate(dict.fromkeys(recordings))}
        rec = np.array([ids[r] for r in recordings], dtype=np.int64)
        index: dict[tuple[str, ...], list[int]] = {}
        for i, k in enumerate(keys):
            index.setdefault(tuple(k), []).append(i)
        out = []
        for k, rows in index.items():
            own = np.asarray(rows)
            self.group_shifts_[k] = float(np.mean(raw[own])) - base
            for r in np.unique(rec[own]):
                mine = own[rec[own] == r]
                others = own[rec[own] != r]
                if others.size:
                    out.append(raw[mine] - (float(np.mean(raw[others])) - base))
        self.train_info_["group_shifts"] = {"/".join(k): round(v, 6) for k, v in self.group_shifts_.items()}
        return np.concatenate(out) if out else np.zeros(0)

    def _say_unshifted(self, data: Executor, on: str) -> None:
        """Log the training groups without scores to shift them by (one recording, kept for training)."""
        missing = sorted(set(data.recording_values(self.score_groups) or []) - set(self.group_shifts_))
        if missing:
            named = ", ".join("/".join(k) for k in missing[:5]) + (" ..." if len(missing) > 5 else "")
            log.warning("%s: normalize_by=%s: %d group(s) had no %s (%s): their windows score on the pooled scale; "
                        "give each group two or more recordings", self.name, ",".join(self.score_groups),
                        len(missing), on, named)

    def group_shift(self, labels: Mapping[str, str] | None) -> float:
        """What a window of a recording with these ``labels`` scores below its anomaly score: its
        group's shift (``normalize_by``); 0 without groups, without labels, or for a group the
        model has not seen (the pooled scale)."""
        if not self.group_shifts_ or labels is None:
            return 0.0
        return self.group_shifts_.get(tuple(labels.get(n) or "" for n in self.score_groups), 0.0)

    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """Learn normal sound from every labelled window of ``data`` (all labelled 0); ``valid``
        is None (the held-out part sets the threshold afterwards)."""
        raise NotImplementedError

    # -- adapting to new normal sound -----------------------------------------------------------
    def adapt(self, parts: Sequence[Executor]) -> dict[str, Any]:
        """Learn new normal recordings without retraining (a family with ``adapts_to_new``): a new
        unit or operating condition from a few clips.

        ``parts`` are the new recordings in up to :data:`ADAPT_FOLDS` parts (each recording in
        one). The family adds every part to what it knows (:meth:`_extend`); the new recordings'
        normal scores are measured part by part, each against what the model knows without that
        part (as a new recording of the unit would be scored), and the threshold becomes the
        higher of the old one and the one those scores give at the model's ``fpr`` — one threshold
        for the old units and the new one. Returns what changed (also in ``train_info_["adapted"]``).
        """
        if not self.adapts_to_new:
            raise ParameterError(f"{self.name} does not learn new recordings without retraining")
        self.check_is_fitted()
        if not parts:
            raise UserError(f"{self.name}: no new recordings to adapt to")
        scores: list[np.ndarray] = []
        keys: list[tuple[str, ...]] = []
        recordings: list[tuple[int, int]] = []

        def score(part: Executor, model: AnomalyDetector) -> None:
            ordinals, s = part.run(ScoreList(model)).ordered()
            scores.append(s)
            if self.score_groups:
                keys.extend(self._window_groups(part, ordinals))
                recordings.extend((len(scores), int(o)) for o in ordinals)

        if len(parts) > 1:
            for i, part in enumerate(parts):
                held = copy.deepcopy(self)
                held._extend([p for j, p in enumerate(parts) if j != i])
                score(part, held)
        self._extend(parts)
        if len(parts) == 1:              # one new recording: scored by what the model knew before it
            score(parts[0], self)
        new = np.concatenate(scores)
        finite = np.isfinite(new)
        new = new[finite]
        if new.size == 0:
            raise UserError(f"{self.name}: the new recordings give no windows to score")
        if self.score_groups:            # their groups shift by what they score now, on the pooled scale
            kept = np.flatnonzero(finite)
            shifted = self._shift_groups(new, [keys[i] for i in kept], [recordings[i] for i in kept],
                                         pooled=self.normal_score_mean_)
            new = shifted if shifted.size else new - np.array([self.group_shifts_[keys[i]] for i in kept])
        before = self.threshold_
        fit = fit_threshold(new, self.params["fpr"], seed=int(self.params.get("seed") or 0))
        self.threshold_ = max(float(before), fit.threshold)
        info = {"windows": int(new.size), "threshold_before": float(before), "threshold_new": float(fit.threshold),
                "threshold": float(self.threshold_), "threshold_method": fit.method}
        self.train_info_.setdefault("adapted", []).append(info)
        return info

    def _extend(self, parts: Sequence[Executor]) -> None:
        """Add the windows of ``parts`` to what the model knows of normal sound."""
        raise NotImplementedError

    def stream_scores(self, stream: WindowStream) -> np.ndarray:
        """Anomaly scores of every window of one pass over ``stream``."""
        parts = [self.anomaly_score(b.grams) for b in stream.batches() if len(b.grams)]
        return np.concatenate(parts) if parts else np.zeros(0)

    def set_threshold(self, normal_scores: np.ndarray) -> ThresholdFit:
        """The threshold for the target false-alarm rate from normal windows' (finite) scores:
        their quantile, or with few windows a gamma distribution fitted to them
        (:func:`~wavetrain.evaluation.detection_metrics.fit_threshold`); returns the fit."""
        fit = fit_threshold(normal_scores, self.params["fpr"], seed=int(self.params.get("seed") or 0))
        self.threshold_ = fit.threshold
        self.normal_score_mean_ = float(np.mean(normal_scores))
        self.normal_score_sd_ = float(np.std(normal_scores))
        return fit

    # -- scoring --------------------------------------------------------------------------------
    def anomaly_score(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """How unlike normal sound each window is, ``(n_windows,)``: higher = more anomalous."""
        self._check_grams(grams)
        return self._anomaly_score(grams)

    def _anomaly_score(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def predict_proba(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """One column, the probability of the normal value among the values the detector knows:
        always 1 (a detector knows one value; its answer is :meth:`anomaly_score` against
        ``threshold_``)."""
        self._check_grams(grams)
        return np.ones((len(grams), 1))

    def predict_with_proba(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray]:
        names, _, _ = self.predict_scores(grams)
        return names, np.ones((len(grams), 1))

    def predict_scores(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """``anomaly`` or the normal value per window, the anomaly scores ``(n, 1)`` and the
        threshold (per window, for the predictions' records)."""
        s = self.anomaly_score(grams)
        normal = self.fitted_labels[0]
        names = [ANOMALY if v > self.threshold_ else normal for v in s]
        return names, s[:, None], {"threshold": np.full(len(s), self.threshold_)}

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        self.check_is_fitted()
        state = dict(self._state())
        state["threshold"] = np.array([self.threshold_, self.normal_score_mean_, self.normal_score_sd_])
        if self.group_shifts_:
            keys = list(self.group_shifts_)
            state[_GROUPS] = np.frombuffer(json.dumps([list(k) for k in keys]).encode(), dtype=np.uint8)
            state[_SHIFTS] = np.array([self.group_shifts_[k] for k in keys], dtype=np.float64)
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        if "threshold" not in state:
            raise ParameterError(f"{self.name}: state lacks 'threshold'")
        t = np.asarray(state["threshold"], dtype=np.float64)
        if t.shape != (3,):
            raise ParameterError(f"{self.name}: threshold has shape {t.shape}, expected (3,)")
        unset = bool(np.isnan(t).all())   # not fitted yet: weights handed over before the threshold is set
        if not unset and not (t[2] > 0 or (t[2] == 0 and np.isclose(t[0], t[1], rtol=1e-9, atol=0))):
            raise ParameterError(f"{self.name}: the normal scores' sd is {t[2]:g}; expected a positive one (or 0 "
                                 "with the threshold at their mean, when every normal window scored alike)")
        self.group_shifts_ = self._load_groups(state.get(_GROUPS), state.get(_SHIFTS))
        self._load_state({k: v for k, v in state.items() if k not in ("threshold", _GROUPS, _SHIFTS)})
        self.threshold_, self.normal_score_mean_, self.normal_score_sd_ = (float(v) for v in t)

    def _load_groups(self, values: np.ndarray | None, shifts: np.ndarray | None) -> dict[tuple[str, ...], float]:
        """The group shifts of a state (none when it has none), checked."""
        if values is None and shifts is None:
            return {}
        n = len(self.score_groups)
        try:
            keys = json.loads(np.asarray(values, dtype=np.uint8).tobytes().decode())
        except (ValueError, TypeError, UnicodeDecodeError):
            keys = None
        s = np.asarray(shifts, dtype=np.float64).ravel() if shifts is not None else np.zeros(0)
        if not (n and isinstance(keys, list) and len(keys) == s.size and np.isfinite(s).all()
                and all(isinstance(k, list) and len(k) == n and all(isinstance(v, str) for v in k) for k in keys)):
            raise ParameterError(f"{self.name}: the group shifts do not match normalize_by="
                                 f"{','.join(self.score_groups) or '(none)'}")
        return {tuple(k): float(v) for k, v in zip(keys, s, strict=True)}

    def _state(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _load_state(self, state: dict[str, np.ndarray]) -> None:
        raise NotImplementedError
