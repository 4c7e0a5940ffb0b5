"""The classifier contract every model family implements.

A classifier sees *windows*: feature grams of shape ``(frames, features)``, float32. It never opens
a file. Training data arrives as a :class:`WindowStream`, which may be iterated several times
(EM passes, epochs) and yields :class:`Batch` objects; nothing requires the whole data set to be in
memory at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Protocol, Sequence

import numpy as np

from wavetrain.errors import NotFittedError, ParameterError, UserError
from wavetrain.models.params import Param, validate_params

#: Parameters shared by every classifier: how recordings become windows of features.
COMMON_PARAMS: tuple[Param, ...] = (
    Param("clip_ms", 0, "window (clip) length in ms; 0 = each recording or segment is one window", int, low=0),
    Param("clip_shift_ms", 0, "step between windows in ms; 0 = back to back (= clip_ms)", int, low=0),
    Param("pad", "zero", "how a last, short window is completed", str, choices=("none", "zero", "duplicate")),
)


@dataclass
class Batch:
    """A batch of labelled windows.

    Attributes
    ----------
    grams : list of np.ndarray [shape=(frames_i, features), dtype=float32]
        Windows may differ in length.
    y : np.ndarray [shape=(batch,), dtype=int64]
        Label index of each window (-1 = unlabelled).
    refs : list of (int, int, int) or None
        Where each window comes from: recording index in the stream, start and end in ms.
    """

    grams: list[np.ndarray]
    y: np.ndarray
    refs: list | None = None  # per window: (recording index, start_ms, end_ms), when known

    def __len__(self) -> int:
        return len(self.grams)

    def padded(self, frames: int | None = None, *, pad_value: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Stack into ``(batch, frames, features)``: longer windows are cropped at the centre,
        shorter ones padded at the end with ``pad_value``. Returns the array and the lengths."""
        lengths = np.array([g.shape[0] for g in self.grams], dtype=np.int64)
        t = int(frames or lengths.max())
        f = self.grams[0].shape[1]
        out = np.full((len(self.grams), t, f), pad_value, dtype=np.float32)
        for i, g in enumerate(self.grams):
            if g.shape[0] >= t:
                s = (g.shape[0] - t) // 2
                out[i] = g[s:s + t]
            else:
                out[i, :g.shape[0]] = g
        return out, np.minimum(lengths, t)


class WindowStream(Protocol):
    """What ``fit`` consumes. See :class:`wavetrain.stream.FeatureStream`."""

    labels: list[str]          # class values; Batch.y indexes this list
    feature_dim: int
    rate: int | None           # sample rate (Hz) the features were computed at, when known
    channels: int | None       # channels of every recording, for per-axis features (else None)

    def batches(self, *, shuffle: bool = False, seed: int = 0) -> Iterator[Batch]:
        """One pass over the data."""


class Classifier:
    """Base class: stores validated hyper-parameters; learned state ends in ``_``.

    Subclasses set ``name``, ``params`` (their own table; :data:`COMMON_PARAMS` is added) and
    implement ``_fit``, ``_predict_log_proba`` / ``predict_proba``, ``state_dict`` and
    ``load_state_dict``.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    params: ClassVar[tuple[Param, ...]] = ()
    default_features: ClassVar[str] = "logmel(bands=64)"
    #: Heavy modules the family imports when it trains (counted by the memory planner).
    runtime_imports: ClassVar[tuple[str, ...]] = ()
    #: Whether ``fit`` writes and resumes from checkpoints (``checkpoint``/``resume`` options).
    supports_checkpoints: ClassVar[bool] = False
    #: What :meth:`predict_scores` gives per label value: ``"probability"`` (the model's estimate of
    #: P(value | window) among the trained values) or ``"mean_loglik"`` (a mean frame
    #: log-likelihood: a density, not a probability).
    score_kind: ClassVar[str] = "probability"

    def __init__(self, **params: Any):
        self.params = validate_params(self.param_table(), params, self.name)
        self.labels_: list[str] | None = None
        self.label_name_: str | None = None
        self.feature_dim_: int | None = None
        #: Sample rate (Hz) the training features were computed at; inputs are resampled to it.
        self.feature_rate_: int | None = None
        #: Channels of the training recordings when the features are per axis (else None).
        self.channels_: int | None = None
        self.history_: list[dict] = []

    # -- parameter table ------------------------------------------------------------------------
    @classmethod
    def param_table(cls) -> tuple[Param, ...]:
        return (Param("features", cls.default_features, "feature spec (extractors, processors and their "
                      "parameters: `wavetrain features --help`)", str),
                ) + COMMON_PARAMS + cls.params

    @property
    def feature_spec(self):
        from wavetrain.features import parse_spec

        return parse_spec(self.params["features"])

    def get_params(self) -> dict[str, Any]:
        return dict(self.params)

    # -- fitting --------------------------------------------------------------------------------
    def fit(self, stream: WindowStream, valid: WindowStream | None = None, **options: Any) -> "Classifier":
        """Learn from ``stream`` (iterated as many times as the model needs); returns ``self``.

        ``valid`` is an optional held-out stream (neural models validate on it). ``options`` are
        run settings that are not hyper-parameters: ``progress`` (bool), ``checkpoint`` and
        ``resume`` (folders), ``device``; a family ignores those it does not use.
        """
        if len(stream.labels) < 2:
            raise UserError(f"{self.name}: training needs at least 2 label values, got "
                            f"{len(stream.labels)} ({', '.join(stream.labels) or 'none'})")
        self.labels_ = list(stream.labels)
        self.feature_dim_ = int(stream.feature_dim)
        self.feature_rate_ = stream.rate
        self.channels_ = stream.channels
        self._fit(stream, valid, **options)
        return self

    def _fit(self, stream: WindowStream, valid: WindowStream | None, **options: Any) -> None:
        raise NotImplementedError

    def check_is_fitted(self) -> None:
        if self.labels_ is None:
            raise NotFittedError(f"this {self.name} model is not fitted yet; call fit() or load a model file")

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
        p = self.predict_proba(grams)
        return [self.labels_[i] for i in p.argmax(axis=1)]

    def predict_scores(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """Predicted values, per-label scores ``(n_windows, n_labels)`` of kind :attr:`score_kind`,
        and per-window details the family reports (``{name: (n_windows,)}``, may be empty)."""
        names, p = self.predict_with_proba(grams)
        return names, p, {}

    def predict_with_proba(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray]:
        """``(predict(grams), predict_proba(grams))``, from one pass over the windows unless a
        subclass has its own ``predict`` rule (then both are called)."""
        p = self.predict_proba(grams)
        if type(self).predict is not Classifier.predict:
            return self.predict(grams), p
        return [self.labels_[i] for i in p.argmax(axis=1)], p

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

    def memory_bytes(self) -> int:
        """Bytes of learned state (for the memory planner)."""
        return sum(int(a.nbytes) for a in self.state_dict().values()) if self.labels_ else 0

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.params.items()
                   if v != {p.name: p.default for p in self.param_table()}[k]}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"
