"""``normal-dist``: a normal distribution per feature learned from normal sound; a window is scored
by how many standard deviations its features lie from the means (root mean square z).

The moments stream (count, mean and sum of squared deviations per feature, merged batch by batch
as in Chan et al.'s parallel algorithm), so memory is a few vectors whatever the data. What is
modelled is chosen by ``compress``: every frame (``none``), each window's mean over time
(``time``), each frame's mean over features (``feature``) or each window's overall mean
(``both``). With ``sigmas=k`` a window is anomalous when its RMS z exceeds k (the "mean ± k·σ"
boundary) instead of the threshold set for ``fpr``. With ``adapt=N`` the model keeps learning
while it classifies: every window judged normal moves the means and variances by 1/N
(exponential forgetting, about the last N normal windows), for slowly drifting machines.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.graph import DOUBLE, FLOAT, Graph
from wavetrain.core.params import Param
from wavetrain.evaluation.detection_metrics import ThresholdFit
from wavetrain.models.anomaly import AnomalyDetector
from wavetrain.models.base import FitOptions
from wavetrain.models.passes import Executor, Moments

#: Variances are floored at this (a constant feature would divide by zero).
VAR_FLOOR = 1e-8


class NormalDistDetector(AnomalyDetector):
    """Per-feature normal distribution of normal sound.

    Attributes
    ----------
    mean_, var_ : (dims,)
        Means and variances of the modelled vectors (dims = features, or 1 with
        ``compress=feature|both``).
    count_ : int
        Vectors they were learned from.
    """

    name = "normal-dist"
    summary = "anomaly detector: a normal distribution per feature; score = RMS z of a window's features"
    #: Chosen on the machine sounds (mean AUC over 12 units: 0.77 with these defaults; logmel(bands=64)
    #: and every frame modelled: 0.60).
    default_features = "mfcc(bands=40, coeffs=20)"
    hyperparams = (
        Param("compress", "time", "what is modelled: every frame (none), each window's mean over time (time), "
              "each frame's mean over features (feature) or each window's mean (both)", str,
              choices=("none", "time", "feature", "both")),
        Param("sigmas", None, "k of the mean ± k·sigma boundary: a window is anomalous when its RMS z exceeds k "
              "(none = the threshold set for fpr)", float, low=0, optional=True),
        Param("adapt", 0, "keep learning while classifying: each window judged normal updates the "
              "distribution by 1/adapt (0 = never)", int, low=0),
    )

    #: One pass of moments on any executor (local or Spark).
    any_executor = True

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.mean_ = np.zeros(0)
        self.var_ = np.zeros(0)
        self.count_ = 0

    @property
    def adapts(self) -> bool:
        """Whether classifying changes the model (``adapt`` > 0): a stream that classifies with it
        owns a copy (:func:`wavetrain.pipeline.prediction.classify_stream`)."""
        return bool(self.params.get("adapt"))

    # -- training -------------------------------------------------------------------------------
    def _vectors(self, g: np.ndarray) -> np.ndarray:
        """The vectors a window contributes, ``(m, dims)`` float64."""
        g = np.asarray(g, dtype=np.float64)
        mode = self.params["compress"]
        if mode == "none":
            return g
        if mode == "time":
            return g.mean(axis=0, keepdims=True)
        if mode == "feature":
            return g.mean(axis=1, keepdims=True)
        return np.array([[g.mean()]])

    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """One pass of moments (count, mean, squared deviations of the modelled vectors)."""
        m = data.run(Moments(self._vectors))
        n, mean, m2 = m.n, m.mean, m.m2
        if mean is None or m2 is None or n < 2:
            raise UserError(f"{self.name}: needs at least 2 training vectors (frames or windows), got {n}")
        self.mean_, self.var_, self.count_ = mean, np.maximum(m2 / n, VAR_FLOOR), n
        self.train_info_ = {"vectors": n}

    def set_threshold(self, normal_scores: np.ndarray) -> ThresholdFit:
        fit = super().set_threshold(normal_scores)
        if self.params["sigmas"] is not None:
            self.threshold_ = float(self.params["sigmas"])
            share = float(np.mean(np.asarray(normal_scores) > self.threshold_))
            fit = replace(fit, threshold=self.threshold_, method="sigmas", fpr_range=(share, share))
        return fit

    # -- scoring --------------------------------------------------------------------------------
    def _z2(self, g: np.ndarray) -> float:
        v = self._vectors(g)
        return float(np.sqrt(np.mean((v - self.mean_) ** 2 / self.var_)))

    def _anomaly_score(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        adapt = self.params["adapt"]
        out = np.empty(len(grams))
        for i, g in enumerate(grams):
            out[i] = self._z2(g)
            if adapt and np.isfinite(self.threshold_) and out[i] <= self.threshold_:
                # the window's vectors, as one observation of weight a: their mean moves the means,
                # their spread and the mean's move the variances
                a, v = 1.0 / adapt, self._vectors(g)
                d = v.mean(axis=0) - self.mean_
                self.mean_ = self.mean_ + a * d
                self.var_ = np.maximum((1 - a) * self.var_ + a * v.var(axis=0) + a * (1 - a) * d * d, VAR_FLOOR)
        return out

    def graph_scores(self, g: Graph, gram: str) -> dict[str, str]:
        """The RMS z of the window's modelled vectors; a model that adapts while it classifies has
        a state a graph cannot keep between calls."""
        if self.adapts:
            raise ParameterError(f"export: this {self.name} detector keeps learning while it classifies (adapt="
                                 f"{self.params['adapt']}), which a graph without state cannot do; export a model "
                                 "trained with adapt=0")
        v = g.cast(gram, DOUBLE)
        mode = self.params["compress"]
        if mode in ("time", "both"):
            v = g.reduce("ReduceMean", v, [0])
        if mode in ("feature", "both"):
            v = g.reduce("ReduceMean", v, [1])
        dev = g.op("Sub", v, g.const(self.mean_))
        z2 = g.op("Div", g.op("Mul", dev, dev), g.const(self.var_))
        score = g.op("Sqrt", g.reduce("ReduceMean", z2, [0, 1], keepdims=False))
        return {"scores": g.cast(g.op("Unsqueeze", score, g.i64(0)), FLOAT), "best": g.i64(0)}

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int) -> int:
        """A float64 copy of a batch and its squared deviations; the moments are negligible."""
        return 3 * max(batch_frames, 1) * feature_dim * 8

    # -- state ----------------------------------------------------------------------------------
    def _state(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean_, "var": self.var_, "count": np.array([self.count_])}

    def _load_state(self, state: dict[str, np.ndarray]) -> None:
        dims = 1 if self.params["compress"] in ("feature", "both") else self.feature_dim_
        for k in ("mean", "var", "count"):
            if k not in state:
                raise ParameterError(f"{self.name}: state lacks {k!r}")
        mean, var = np.asarray(state["mean"], np.float64), np.asarray(state["var"], np.float64)
        if mean.shape != (dims,) or var.shape != (dims,) or (var <= 0).any():
            raise ParameterError(f"{self.name}: mean/var must have shape ({dims},) and positive variances")
        self.mean_, self.var_, self.count_ = mean, var, int(np.asarray(state["count"]).ravel()[0])
