"""The classifier contract every model family implements.

A classifier sees windows (feature grams) through a :class:`~wavetrain.stream.batches.WindowStream`; it
never opens a file. ``__init__`` only stores validated hyper-parameters (the family's declared
table, :attr:`Classifier.hyperparams`, plus :data:`COMMON_PARAMS`), ``learn(executor)`` (and
``fit(stream)``, ``learn`` on the local executor) returns ``self``, learned state ends in ``_``,
and prediction before ``fit`` raises :class:`~wavetrain.core.errors.NotFittedError`.
"""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, final

import numpy as np

from wavetrain.core.errors import NotFittedError, ParameterError, UserError
from wavetrain.core.graph import Graph
from wavetrain.core.params import Param, validate_params
from wavetrain.features import FeatureSpec, parse_spec
from wavetrain.features.augment import Augmenter, parse_augment
from wavetrain.features.embedding import pinned_text
from wavetrain.models.passes import Executor, StreamExecutor
from wavetrain.stream.batches import WindowStream

__all__ = ["COMMON_PARAMS", "LEARNS_BY", "TAGS", "UNKNOWN", "Classifier", "FitOptions", "control_characters",
           "is_unknown", "label_values_problem", "plain_text", "state_arrays"]

#: Longest window (and step between windows) in ms: about 28 hours.
MAX_CLIP_MS = 100_000_000

#: What a classifier answers for a window its unknown rule rejects: never one of its label values.
UNKNOWN = "unknown"
#: Most label values, and longest label value or name (characters), a model may hold.
MAX_LABELS = 100_000
MAX_LABEL_TEXT = 1000

#: Parameters shared by every classifier: how recordings become windows of features.
COMMON_PARAMS: tuple[Param, ...] = (
    Param("clip_ms", 0, "window (clip) length in ms; 0 = each recording or segment is one window", int, low=0,
          high=MAX_CLIP_MS),
    Param("clip_shift_ms", 0, "step between windows in ms; 0 = back to back (= clip_ms)", int, low=0,
          high=MAX_CLIP_MS),
    Param("pad", "zero", "how a last, short window is completed", str, choices=("none", "zero", "duplicate")),
    Param("augment", "", "training-time augmentation, streamed (e.g. 'room | pitch(semitones=-2:2, p=0.5)'; "
          "stages: copies (first), pad, noise, gain, shift, freqshift, speed, pitch, reverb, bandlimit, warp, "
          "specaugment, mixup (neural classifiers, last); preset: room); empty = none", str),
)


#: How a family learns (:attr:`Classifier.learns_by`): passes of mergeable statistics,
#: mini-batch gradient steps, or members that each learn in their own way.
LEARNS_BY: tuple[str, ...] = ("statistics", "sgd", "members")

#: The capability tags every family declares (class attributes of :class:`Classifier`).
TAGS: tuple[str, ...] = ("learns_by", "detector", "any_executor", "supports_distributed", "supports_device_groups",
                         "supports_checkpoints", "mixes_batches", "scores_samples", "embeds", "adapts_to_new")


@dataclass(frozen=True)
class FitOptions:
    """Run settings of :meth:`Classifier.fit` that are not hyper-parameters; a family ignores
    those it does not use.

    Attributes
    ----------
    progress : bool
        Show progress bars.
    device : str or None
        Compute device (``cpu``, ``cuda``, ``cuda:N``, ``auto``); None: the family's own
        ``device`` parameter.
    checkpoint, resume : str or None
        Checkpoint folder to write, and to continue from (families with ``supports_checkpoints``).
    group_by : str or None
        Label whose values are held out whole for validation.
    callbacks : tuple
        Extra training callbacks (:class:`wavetrain.train.callbacks.Callback`), run after the
        family's own.
    distributed : bool
        Train as one rank of the ``torch.distributed`` process group this process has joined
        (see :func:`wavetrain.spark.neural.fit_neural`): the stream is this rank's share of the
        data, every rank of the group calls ``fit`` with the same model and options (a checkpoint
        folder aside: give it to one rank only), and they agree on the input normaliser, the
        steps per epoch, the validation figures and the state resumed from (rank 0's).
    devices : tuple of str
        Two or more devices (``cpu``, ``cuda:N``; ``cpu`` twice is two CPU replicas) that share
        every training step (:class:`wavetrain.train.device_group.DeviceGroup`); empty: ``device``.
    balance : str
        How a device group splits each batch: ``throughput`` (default), ``gradient`` or
        ``fixed:F1,F2,...``.
    sync : str
        How a device group combines its replicas: ``allreduce`` (every step) or ``average:H``.
    frame_cache_bytes : int or None
        What the memory plan grants a family that asks to keep its training frames between passes
        (:meth:`Classifier.frame_cache_request`); None: the family's own default.
    """

    progress: bool = False
    device: str | None = None
    checkpoint: str | None = None
    resume: str | None = None
    group_by: str | None = None
    callbacks: tuple = ()
    distributed: bool = False
    devices: tuple = ()
    balance: str = "throughput"
    sync: str = "allreduce"
    frame_cache_bytes: int | None = None


#: Bytes of training frames a family that asks for a frame cache keeps without a memory plan's grant.
FRAME_CACHE_DEFAULT = 64 << 20

#: Each model's parsed ``augment`` with the text it was parsed from (:attr:`Classifier.augmenter`).
_AUGMENTERS: weakref.WeakKeyDictionary[Classifier, tuple[str, Augmenter]] = weakref.WeakKeyDictionary()


class Classifier:
    """Base class: stores validated hyper-parameters; learned state ends in ``_``.

    Subclasses set ``name``, ``hyperparams`` (their own table; :data:`COMMON_PARAMS` is added) and
    the capability tags (:data:`TAGS`), and implement ``_learn`` (the one training hook: see
    :meth:`learn`), ``predict_proba``, ``state_dict`` and ``load_state_dict``.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: The built-in spec (preset) the model was built from, e.g. ``gmm-speech``; None when it was
    #: built from its family's name (set by :func:`~wavetrain.models.registry.build`, kept in the
    #: model file).
    preset_: str | None = None
    #: The family's own hyper-parameters (``features`` and :data:`COMMON_PARAMS` are added).
    hyperparams: ClassVar[tuple[Param, ...]] = ()
    default_features: ClassVar[str] = "logmel(bands=64)"
    #: Heavy modules the family imports when it trains (counted by the memory planner).
    runtime_imports: ClassVar[tuple[str, ...]] = ()
    #: How ``fit`` learns (one of :data:`LEARNS_BY`): ``"statistics"`` — passes over the data
    #: that each add up mergeable statistics (sums, moments, summaries; any order of adding gives
    #: the same sums), with an update of the model between passes and a stop rule;
    #: ``"sgd"`` — mini-batch gradient steps; ``"members"`` — an ensemble whose members learn
    #: each in their own way. Engines choose how to train a family from it, never from its name.
    learns_by: ClassVar[str] = ""
    #: Whether :meth:`learn` runs on any executor (local or Spark: passes of statistics, gradient
    #: steps through :meth:`Executor.train_steps <wavetrain.models.passes.Executor.train_steps>`, or
    #: members that each do), not on the local executor only.
    any_executor: ClassVar[bool] = False
    #: Whether ``fit`` trains as one rank of a ``torch.distributed`` process group
    #: (``FitOptions.distributed``: each rank sees its share of the data, gradients averaged).
    supports_distributed: ClassVar[bool] = False
    #: Whether ``fit`` writes and resumes from checkpoints (``checkpoint``/``resume`` options).
    supports_checkpoints: ClassVar[bool] = False
    #: Whether ``fit`` trains on several devices at once (``FitOptions.devices``).
    supports_device_groups: ClassVar[bool] = False
    #: Label values ``fit`` needs at least (a one-class anomaly model needs one).
    min_labels: ClassVar[int] = 2
    #: An anomaly detector (:class:`wavetrain.models.anomaly.AnomalyDetector`): trained on normal
    #: recordings only; it answers the normal value or ``anomaly`` with an anomaly score.
    detector: ClassVar[bool] = False
    #: What :meth:`predict_scores` gives per label value: ``"probability"`` (the model's estimate of
    #: P(value | window) among the trained values) or ``"mean_loglik"`` (a mean frame
    #: log-likelihood: a density, not a probability) or ``"anomaly"`` (a detector's one score: higher
    #: is less like the normal training sound).
    score_kind: ClassVar[str] = "probability"
    #: What the loss in the family's training history measures (``train_loss``, ``valid_loss`` per
    #: epoch of an ``sgd`` family): the axis label of ``wavetrain plot history``.
    history_loss: ClassVar[str] = "cross-entropy loss"
    #: Whether ``fit`` mixes its mini-batches as an ``augment`` spec's ``mixup`` stage says.
    mixes_batches: ClassVar[bool] = False
    #: Whether the model scores clips of samples (:meth:`score_clips`: an exported graph computes
    #: its own features) instead of windows of features (:meth:`predict_scores`).
    scores_samples: ClassVar[bool] = False
    #: Whether a fitted model's network embeds windows (``embedding(model=...)`` features: the
    #: family implements ``embedding_layers``, ``embedding_window``, ``embedding_dim`` and
    #: ``graph_embedding``).
    embeds: ClassVar[bool] = False
    #: Whether a fitted detector learns new normal recordings without retraining
    #: (:meth:`~wavetrain.models.anomaly.AnomalyDetector.adapt`: ``wavetrain adapt``).
    adapts_to_new: ClassVar[bool] = False

    def __init__(self, **params: Any):
        self.params: dict[str, Any] = validate_params(self.param_table(), params, self.name)
        self.labels_: list[str] | None = None
        self.label_name_: str | None = None
        self.feature_dim_: int | None = None
        #: Sample rate (Hz) the training features were computed at; inputs are resampled to it.
        self.feature_rate_: int | None = None
        #: Channels of the training recordings when the features are per axis (else None).
        self.channels_: int | None = None
        self.history_: list[dict] = []
        #: How the last ``fit`` went (family-specific: stop reason, iterations, input stall).
        self.train_info_: dict[str, Any] = {}
        #: The metadata of the model file it was loaded from (None when not loaded from one).
        self.meta_: dict[str, Any] | None = None

    @property
    def title(self) -> str:
        """The model's name as a user knows it: the preset it was trained with and its family,
        e.g. ``gmm-speech (gmm)``, else the family's name."""
        return f"{self.preset_} ({self.name})" if self.preset_ else self.name

    @property
    def adapts(self) -> bool:
        """Whether classifying changes the model (a detector with ``adapt`` > 0): such a model is
        never shared between streams (each gets a copy), never served and never scored in Spark
        tasks. A capability of the instance (it follows a parameter), not a class tag."""
        return False

    def members(self) -> list[Classifier]:
        """The models a combining family is made of (an ensemble's members), else none."""
        return []

    @classmethod
    def tags(cls) -> dict[str, Any]:
        """The family's capability tags (:data:`TAGS`) by name.

        Examples
        --------
        >>> from wavetrain.models import family
        >>> family("gmm").tags()["learns_by"]
        'statistics'
        """
        return {t: getattr(cls, t) for t in TAGS}

    # -- parameter table ------------------------------------------------------------------------
    @classmethod
    def param_table(cls) -> tuple[Param, ...]:
        return (Param("features", cls.default_features, "feature spec (extractors, processors and their "
                      "parameters: `wavetrain features --help`)", str),
                ) + COMMON_PARAMS + cls.hyperparams

    @property
    def feature_spec(self) -> FeatureSpec:
        return parse_spec(self.params["features"])

    @property
    def augmenter(self) -> Augmenter:
        """The ``augment`` parameter, parsed (empty: an :class:`Augmenter` that does nothing): what
        the training streams augment with and the trainer's ``mixup``. Parsed once per model and
        value (parsed again when the parameter changes), and kept beside the model, not in it (a
        parsed spec may hold what neither pickles nor copies, a noise folder's lock).

        Raises
        ------
        SpecError
            An ``augment`` that does not parse.
        """
        text = self.params.get("augment") or ""
        cached = _AUGMENTERS.get(self)
        if cached is None or cached[0] != text:
            cached = _AUGMENTERS[self] = (text, parse_augment(text))
        return cached[1]

    def get_params(self) -> dict[str, Any]:
        return dict(self.params)

    # -- fitting --------------------------------------------------------------------------------
    @final
    def fit(self, stream: WindowStream, valid: WindowStream | None = None,
            options: FitOptions | None = None) -> Classifier:
        """Learn from ``stream`` (iterated as many times as the model needs); returns ``self``:
        :meth:`learn` on the local executor (:class:`~wavetrain.models.passes.StreamExecutor`).

        ``valid`` is an optional held-out stream (neural models validate on it, a detector sets
        its threshold on it)."""
        every = self.detector           # a detector's windows are all normal, labelled or not
        return self.learn(StreamExecutor(stream, every_window=every),
                          None if valid is None else StreamExecutor(valid, every_window=every), options)

    @final
    def learn(self, data: Executor, valid: Executor | None = None, options: FitOptions | None = None) -> Classifier:
        """Learn from the labelled windows of ``data`` on any executor (local or Spark: see
        :mod:`wavetrain.models.passes`), ``valid`` an optional held-out part; returns ``self``.

        The one way every family learns: the layout of the data is taken, the executor is set up
        for the fit (:meth:`Executor.using <wavetrain.models.passes.Executor.using>`: the frame
        cache of :meth:`frame_cache_budget`, the devices of a family that shares its passes'
        kernels over them) and the family's :meth:`_learn` runs on it."""
        options = options or FitOptions()
        pinned = pinned_text(parse_spec(self.params["features"]))
        if pinned is not None:          # (kept with the model file's digest: a changed file is refused)
            self.params["features"] = pinned
        self._take_layout(data)
        with data.using(cache_bytes=self.frame_cache_budget(options), devices=self._pass_devices(options)) as d:
            self._train(d, valid, options)
            info = d.report()
        self.train_info_.update(info)
        return self

    def _pass_devices(self, options: FitOptions) -> tuple[str, ...]:
        """The devices an executor spreads kernel passes over: ``options.devices`` for a family
        that learns by statistics and shares them over devices (gradient-step families use them as a
        device group of their own)."""
        if self.learns_by == "statistics" and self.supports_device_groups:
            return tuple(options.devices)
        return ()

    def _take_layout(self, data: Executor) -> None:
        """The label values and feature layout of the training data (``labels``, ``feature_dim``,
        ``rate``, ``channels``), refusing too few values."""
        if len(data.labels) < self.min_labels:
            raise UserError(f"{self.name}: training needs at least {self.min_labels} label values, got "
                            f"{len(data.labels)} ({', '.join(data.labels) or 'none'})")
        if UNKNOWN in data.labels:
            raise UserError(f"{self.name}: a label value cannot be {UNKNOWN!r}, what a classifier answers for a "
                            "window that is none of its values; rename it in the metadata, or keep the other values "
                            "with --where LABEL=VALUE,VALUE")
        self.labels_ = list(data.labels)
        self.feature_dim_ = int(data.feature_dim)
        self.feature_rate_ = data.rate
        self.channels_ = data.channels

    def _train(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """What :meth:`learn` runs once the executor is set up: the family's :meth:`_learn` (a
        detector also holds out recordings and sets its threshold around it)."""
        self._learn(data, valid, options)

    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """The family's fit on ``data`` (the layout taken), ``valid`` an optional held-out part:
        passes of statistics (:meth:`Executor.run <wavetrain.models.passes.Executor.run>`),
        gradient steps (:meth:`Executor.train_steps <wavetrain.models.passes.Executor.train_steps>`)
        or its members' :meth:`learn`. The one training hook a family implements; it never asks
        which executor it has."""
        raise NotImplementedError

    @property
    def fitted_labels(self) -> list[str]:
        """``labels_`` of a fitted model (raises :class:`NotFittedError` before ``fit``)."""
        if self.labels_ is None or self.feature_dim_ is None:
            raise NotFittedError(f"this {self.name} model is not fitted yet; call fit() or load a model file")
        return self.labels_

    def check_is_fitted(self) -> None:
        self.fitted_labels  # noqa: B018 (raises when not fitted)

    def _check_grams(self, grams: Sequence[np.ndarray]) -> None:
        self.check_is_fitted()
        for g in grams:
            if g.ndim != 2 or g.shape[1] != self.feature_dim_:
                raise ParameterError(f"{self.name}: expected windows of shape (frames, {self.feature_dim_}), "
                                     f"got {tuple(g.shape)}")
            if g.shape[0] == 0:
                raise ParameterError(f"{self.name}: a window has no frames")
            if not np.isfinite(g).all():
                raise ParameterError(f"{self.name}: features hold NaN or infinite values")

    # -- prediction -----------------------------------------------------------------------------
    def predict_proba(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """Confidences ``(n_windows, n_labels)`` that sum to 1 per window."""
        raise NotImplementedError

    def predict(self, grams: Sequence[np.ndarray]) -> list[str]:
        return self.predict_with_proba(grams)[0]

    def predict_with_proba(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray]:
        """``(predict(grams), predict_proba(grams))`` from one pass over the windows."""
        p = self.predict_proba(grams)
        labels = self.fitted_labels
        return [labels[i] for i in p.argmax(axis=1)], p

    def predict_scores(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """Predicted values, per-label scores ``(n_windows, n_labels)`` of kind :attr:`score_kind`,
        and per-window details the family reports (``{name: (n_windows,)}``, may be empty)."""
        names, p = self.predict_with_proba(grams)
        return names, p, {}

    def score_clips(self, clips: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """:meth:`predict_scores` of clips of samples at the model's rate (models that
        :attr:`scores_samples`)."""
        raise NotImplementedError

    def member_refusal(self) -> str | None:
        """Why this model cannot be an ensemble's member (whose members read their columns of one
        set of features, the same fitted or not), or None when it can."""
        return None

    def check_clip(self, clip_ms: int) -> None:
        """Refuse windows of ``clip_ms`` the model cannot score (an exported graph completes a
        short clip to its own window only)."""

    # -- export ---------------------------------------------------------------------------------
    def graph_scores(self, g: Graph, gram: str) -> dict[str, str]:
        """ONNX nodes scoring one window (``wavetrain export``): ``gram`` names its float32
        features ``(frames, features)``; returns the outputs by name: ``scores`` (float32, one per
        label value, of kind :attr:`score_kind`), ``best`` (int64 ``(1,)``: the value answered
        before any unknown or anomaly rule) and the family's per-window details (float32 ``(1,)``,
        as in :meth:`predict_scores`). A family that cannot be exported raises a one-line
        :class:`ParameterError`."""
        raise ParameterError(f"export: {self.name} models cannot be exported to ONNX")

    def graph_proba(self, g: Graph, gram: str) -> str:
        """ONNX nodes of :meth:`predict_proba` for one window, float64 ``(labels,)`` (what an
        ensemble combines); a family that cannot be exported raises a one-line
        :class:`ParameterError`."""
        raise ParameterError(f"export: {self.name} models cannot be exported to ONNX")

    def unknown_rule(self) -> dict[str, Any] | None:
        """When a window is answered ``unknown`` (for an exported graph's metadata), or None: never.
        ``{"rule": "top_below", "value": t}`` (the highest score below t), ``{"rule": "best_below",
        "floors": [...]}`` (the best score below its value's floor) or ``{"rule": "above", "output":
        name, "value": t}`` (a detail output above t)."""
        return None

    def live_unknown_rule(self, level: float | None = None) -> dict[str, Any] | None:
        """When live use (a stream, a server, ``sound label``) answers a window ``unknown`` when the
        model file holds no trained rule (:meth:`unknown_rule`), from what the model knows; None:
        the family knows no such rule.

        The dict has the form of :meth:`unknown_rule` (``{"rule": "outside", "output": name,
        "low": a, "high": b}`` too: a detail output outside [a, b]) plus ``level`` (the family's
        own scale) and ``text`` (what the rule says, for people). ``level`` None is the family's
        default. Here: a model that answers probabilities calls a window unknown when its top
        probability is below ``level``, by default half-way between chance (1/values) and
        certainty; a model of other scores (and a detector, whose answer for such sound is
        ``anomaly``) knows no rule. A family overrides this with what its scores know.

        Raises
        ------
        ParameterError
            A level outside the family's scale (here: 0 < level < 1).
        """
        if self.detector or self.score_kind != "probability":
            return None
        n = len(self.fitted_labels)
        t = (1.0 + 1.0 / n) / 2.0 if level is None else float(level)
        if not 0.0 < t < 1.0:
            raise ParameterError(f"unknown level {level:g}: this {self.name} model answers probabilities; give a "
                                 "top probability between 0 and 1 below which a window is unknown")
        return {"rule": "top_below", "value": t, "level": t, "text": f"top probability below {t:.3g}"}

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int) -> int:
        """Bytes of model state plus per-batch working memory while training (for the planner).

        ``batch_frames`` frames arrive per stream batch, ``total_frames`` in the whole training set,
        ``window_frames`` in the longest window. The default assumes a few float32 copies of a
        batch; families override it."""
        return 4 * batch_frames * feature_dim * 4

    def task_memory(self, feature_dim: int, n_labels: int, *, batch_frames: int, task_frames: float,
                    total_frames: int, window_frames: int) -> int:
        """Bytes one task of a distributed pass holds while it adds ``task_frames`` frames to this
        family's statistics and merges its neighbours' (for the Spark plan); by default the local
        training's :meth:`memory_estimate`. A family whose statistics grow with the frames a task
        sees overrides it."""
        return self.memory_estimate(feature_dim, n_labels, batch_frames, total_frames, window_frames=window_frames)

    def merged_memory(self, feature_dim: int, n_labels: int, total_frames: float) -> int:
        """Bytes the driver holds of this family's statistics merged from every task, besides its
        parameters (for the Spark plan); by default none worth counting."""
        return 0

    def frame_cache_budget(self, options: FitOptions) -> int:
        """Bytes of training windows the local executor may keep in memory between this family's
        passes (:meth:`Executor.using <wavetrain.models.passes.Executor.using>`); 0: none. A family
        whose passes re-read the data asks for it (:meth:`frame_cache_request`) and reads the
        grant from ``options.frame_cache_bytes``."""
        return 0

    def _frame_cache_grant(self, options: FitOptions) -> int:
        """What a family with a ``frame_cache_mb`` parameter keeps: that when set, else what the
        memory plan granted (``options.frame_cache_bytes``), else 64 MB."""
        if self.params["frame_cache_mb"] is not None:
            return self.params["frame_cache_mb"] << 20
        return FRAME_CACHE_DEFAULT if options.frame_cache_bytes is None else options.frame_cache_bytes

    def _unknown_holdout(self, data: Executor, valid: Executor | None,
                         options: FitOptions) -> tuple[Executor, Executor | None]:
        """``(training, held-out)`` windows for a family with ``unknown_fpr``: with it set and no
        validation stream given, ``valid_fraction`` of the recordings (whole ``group_by`` groups)
        held out by ``seed`` to set the unknown threshold on."""
        if self.params["unknown_fpr"] is None or valid is not None:
            return data, valid
        parts = data.split(self.params["valid_fraction"], self.params["seed"], options.group_by)
        if parts is None:
            raise UserError(f"{self.name}: unknown_fpr needs a stream that can hold out recordings")
        return parts

    def frame_cache_request(self, feature_dim: int, n_labels: int, total_frames: int) -> int:
        """Bytes the family would keep in memory between training passes to hold every one of
        ``total_frames`` frames (asked for when its passes would otherwise decode and augment every
        recording again; the memory plan grants it through ``FitOptions.frame_cache_bytes`` when it
        fits), or 0: it asks for nothing."""
        return 0

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in self.param_table()}
        changed = {k: v for k, v in self.params.items() if v != defaults[k]}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


def control_characters(text: str) -> bool:
    """Whether ``text`` holds a control character (C0, DEL or C1: a terminal escape, a NUL, a line
    break), which no text a model's metadata prints may hold."""
    return any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text)


def plain_text(text: Any) -> bool:
    """A label value or name a model may hold: a string of at most :data:`MAX_LABEL_TEXT`
    characters without :func:`control_characters`."""
    return isinstance(text, str) and len(text) <= MAX_LABEL_TEXT and not control_characters(text)


def label_values_problem(labels: Any, *, reserved: str | None = None) -> str | None:
    """Why ``labels`` cannot be a model's label values, or None: the one check of every model
    loader (``.wt`` and ``.onnx``). They must be a non-empty list of distinct, non-empty
    :func:`plain_text` strings, at most :data:`MAX_LABELS` of them, none equal to ``reserved``:
    the answer that is no label value (:data:`UNKNOWN` for a classifier, ``anomaly`` for a
    detector)."""
    if not (isinstance(labels, list) and labels and all(isinstance(v, str) and v for v in labels)):
        return "labels is not a list of label values"
    if len(labels) > MAX_LABELS:
        return f"labels holds {len(labels)} values, more than {MAX_LABELS}"
    if len(set(labels)) != len(labels):
        return "labels repeats a value"
    if not all(plain_text(v) for v in labels):
        return f"labels holds a value with control characters or over {MAX_LABEL_TEXT} characters"
    if reserved is not None and reserved in labels:
        return f"labels holds {reserved!r}, the answer for a window that is none of the label values"
    return None


def is_unknown(rule: dict[str, Any], scores: np.ndarray, best: int, details: dict[str, Any], *,
               dtype: Any = np.float64) -> bool:
    """Whether ``rule`` (:meth:`Classifier.unknown_rule`, :meth:`Classifier.live_unknown_rule`)
    answers a window of these scores (its best value ``best``) and details ``unknown``, each
    threshold compared as ``dtype`` (float32 for a graph's float32 outputs: a score equal to a
    threshold in float64 stays equal to it after rounding); a detail the rule needs that is missing
    or NaN never does, nor a rule of another kind (as an exported graph reads its metadata)."""
    kind = rule.get("rule")
    if kind == "top_below":
        return bool(scores.max() < dtype(rule["value"]))
    if kind == "best_below":
        return bool(scores[best] < dtype(rule["floors"][best]))
    value = details.get(rule.get("output", ""), np.nan)
    if kind == "above":
        return bool(value > dtype(rule["value"]))
    if kind == "outside":
        return bool(value < dtype(rule["low"]) or value > dtype(rule["high"]))
    return False


def state_arrays(family: str, state: dict[str, np.ndarray], shapes: dict[str, tuple], layout: str
                 ) -> dict[str, np.ndarray]:
    """The arrays of a model file's ``state`` named in ``shapes``, as float64, each of its shape; a
    one-line :class:`ParameterError` names the first that is missing or of another shape (``layout``
    says what the shapes follow from, e.g. ``"3 label values, 8 components and 39 features"``)."""
    out = {}
    for name, shape in shapes.items():
        if name not in state:
            raise ParameterError(f"{family}: state lacks {name!r}")
        a = np.asarray(state[name], dtype=np.float64)
        if a.shape != shape:
            raise ParameterError(f"{family}: {name} has shape {a.shape}, expected {shape} for {layout}")
        out[name] = a
    return out
