"""``anomaly-gmm``: one Gaussian mixture of normal frames, trained by the streaming EM of ``gmm``
(flat memory, SQUAREM, frames kept in memory only when they fit ``frame_cache_mb``); a window's
anomaly score is its negative mean frame log-likelihood."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from wavetrain.core.graph import FLOAT, Graph
from wavetrain.models.anomaly import AnomalyDetector, NormalStream
from wavetrain.models.base import FitOptions
from wavetrain.models.gmm import GMMClassifier
from wavetrain.models.passes import Executor, StreamExecutor, fit_mixture
from wavetrain.stream.batches import WindowStream

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

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.mixture_: _OneMixture | None = None

    def _new_mixture(self) -> _OneMixture:
        p = self.params
        keep = ("features", "clip_ms", "clip_shift_ms", "pad", "seed") + _MIXTURE
        return _OneMixture(**{k: p[k] for k in keep})

    def _fit_normal(self, stream: WindowStream, options: FitOptions) -> None:
        self.mixture_ = self._new_mixture()
        self.mixture_.fit(stream, options=FitOptions(progress=options.progress,
                                                     frame_cache_bytes=options.frame_cache_bytes))
        self._keep_history()

    def _learn_normal(self, data: Executor, options: FitOptions) -> None:
        """Locally, the mixture's own fit (its frames kept in memory when they fit
        ``frame_cache_mb``); on another executor, the same EM by passes of statistics
        (:func:`~wavetrain.models.passes.fit_mixture`)."""
        if isinstance(data, StreamExecutor):
            self._fit_normal(NormalStream(data.stream, self.fitted_labels[0]), options)
            return
        mixture = self._new_mixture()
        fit_mixture(mixture, data, labels=self.fitted_labels)
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
