"""``anomaly-gmm``: one Gaussian mixture of normal frames, trained by the streaming EM of ``gmm``
(flat memory, SQUAREM, frames kept in memory only when they fit ``frame_cache_mb``); a window's
anomaly score is its negative mean frame log-likelihood."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from wavetrain.core.graph import FLOAT, Graph
from wavetrain.models.anomaly import AnomalyDetector
from wavetrain.models.base import FitOptions
from wavetrain.models.gmm import GMMClassifier
from wavetrain.models.passes import Executor

#: Parameters handed to the mixture (``features``, windowing and ``seed`` too).
_MIXTURE = ("components", "max_iter", "accelerate", "tol", "reg", "init_frames", "frame_cache_mb")


class _OneMixture(GMMClassifier):
    """A ``gmm`` of one label value."""

    min_labels = 1


class AnomalyGMM(AnomalyDetector):
    """One diagonal Gaussian mixture of normal frames (attribute ``mixture_``: the fitted ``gmm``
    of one value)."""

    name = "anomaly-gmm"
    summary = "anomaly detector: a Gaussian mixture of normal frames; score = -mean frame log-likelihood"
    #: Chosen on the machine sounds (mean AUC over 12 units: 0.79; logmel(bands=64): 0.75).
    default_features = "mfcc(bands=40, coeffs=20)"
    hyperparams = tuple(p for p in GMMClassifier.hyperparams if p.name in _MIXTURE)
    runtime_imports = GMMClassifier.runtime_imports
    #: The mixture's EM by passes of statistics on any executor (local or Spark).
    any_executor = True

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.mixture_: _OneMixture | None = None

    def _new_mixture(self) -> _OneMixture:
        p = self.params
        keep = ("features", "clip_ms", "clip_shift_ms", "pad", "seed") + _MIXTURE
        return _OneMixture(**{k: p[k] for k in keep})

    def frame_cache_budget(self, options: FitOptions) -> int:
        """The mixture's: ``frame_cache_mb``, else the memory plan's grant, else 64 MB."""
        return self._new_mixture().frame_cache_budget(options)

    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """The mixture's EM by passes of statistics on any executor
        (:func:`~wavetrain.models.mixture_fit.fit_mixture`)."""
        mixture = self._new_mixture()
        mixture.fit_em(data, options, labels=self.fitted_labels)
        self.mixture_ = mixture
        self._keep_history()

    def _keep_history(self) -> None:
        assert self.mixture_ is not None
        self.train_info_ = dict(self.mixture_.train_info_)
        self.history_ = self.mixture_.history_

    def _anomaly_score(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        assert self.mixture_ is not None
        return -self.mixture_.decision_function(grams)[:, 0]

    def graph_scores(self, g: Graph, gram: str) -> dict[str, str]:
        assert self.mixture_ is not None
        score = g.op("Neg", self.mixture_.graph_loglik(g, gram))
        return {"scores": g.cast(score, FLOAT), "best": g.i64(0)}

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int) -> int:
        return self._new_mixture().memory_estimate(feature_dim, 1, batch_frames, total_frames, window_frames)

    def _state(self) -> dict[str, np.ndarray]:
        assert self.mixture_ is not None
        return self.mixture_.state_dict()

    def _load_state(self, state: dict[str, np.ndarray]) -> None:
        m = self._new_mixture()
        m.labels_, m.feature_dim_ = list(self.fitted_labels), self.feature_dim_
        m.feature_rate_, m.channels_ = self.feature_rate_, self.channels_
        m.load_state_dict(state)
        self.mixture_ = m
