"""``knn``: k nearest neighbours over a bounded per-label summary of sub-window vectors.

A window's vectors are its sub-windows: the means of ``subwindow_frames`` consecutive frames
(after subtracting the window's mean over time with ``normalize``). Training streams them into a
:class:`~wavetrain.models.vector_summary.VectorSummary`: at most ``capacity`` weighted vectors per
label, the nearest same-label pair merged into its weighted mean when a label is full (memory
``labels × 2 × capacity × (features + 2)`` 8-byte numbers: vectors, weights, provenance keys,
whatever the amount of data; deterministic). On an executor with several parts (Spark), the
parts' summaries merge: the result equals the local one bit for bit while every label's vectors
fit ``2 × capacity``, and beyond that depends on the split and on the shape of the merge tree
(:class:`SummaryPass` states the guarantee exactly).

Prediction: each sub-window finds its ``k`` nearest summary vectors (searched in blocks so one
block of distances stays under 8 MB) and gives each one vote to its label (``vote=uniform``), or
votes weighted by the summary vector's weight (``weight``: how many training vectors it stands
for) or by 1/distance (``distance``); each sub-window's votes are normalised to sum 1. A window's
probabilities are the vote shares of its sub-windows, smoothed (add 0.5 vote per label) so that no
value gets zero. With ``unknown_distance`` a window whose sub-windows lie, on average, farther
than that from their nearest summary vector is predicted ``unknown``; with ``unknown_fpr`` that
distance is calibrated on ``valid_fraction`` of the training recordings, held out of the summary.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.graph import DOUBLE, FLOAT, Graph
from wavetrain.core.params import Param
from wavetrain.models.base import UNKNOWN, Classifier, FitOptions
from wavetrain.models.passes import Executor, ScoreList
from wavetrain.models.vector_summary import (
    BLOCK_BYTES,
    DISTANCES,
    VectorSummary,
    check_vectors,
    nearest,
    subwindows,
)

#: Pseudo-votes added to every label of a window (no zero probabilities).
SMOOTHING = 0.5
#: Sub-window vectors searched at once when predicting (bounded further by BLOCK_BYTES).
QUERY_BLOCK = 4096

#: The summary's parameters, shared with ``knn-anomaly``.
SUMMARY_PARAMS: tuple[Param, ...] = (
    Param("k", 5, "neighbours each sub-window looks up", int, low=1, high=1000),
    Param("capacity", 2000, "summary vectors kept per label value; when full, the nearest pair is merged into "
          "its weighted mean", int, low=1, high=1_000_000),
    Param("distance", "euclidean", "distance between vectors", str, choices=DISTANCES),
    Param("p", 3.0, "exponent of the lp (Minkowski) distance", float, low=1),
    Param("subwindow_frames", 1, "consecutive frames averaged into one vector", int, low=1),
    Param("normalize", False, "subtract each window's mean over time before forming sub-windows", bool),
)


class SummaryModel:
    """What ``knn`` and ``knn-anomaly`` share: sub-window vectors, the summary, the search and
    the state. Mixed into a :class:`Classifier` that has the :data:`SUMMARY_PARAMS`."""

    params: dict[str, Any]
    name: ClassVar[str]
    #: One pass adds each window's sub-window vectors to a mergeable summary.
    learns_by: ClassVar[str] = "statistics"
    #: The summary pass runs on any executor (local or Spark).
    any_executor: ClassVar[bool] = True
    feature_dim_: int | None
    train_info_: dict[str, Any]

    def _init_summary(self) -> None:
        self.vectors_ = np.zeros((0, 0))     # (N, dims) float64
        self.weights_ = np.zeros(0)          # (N,)
        self.vector_labels_ = np.zeros(0, dtype=np.int64)   # (N,)

    def _vectors(self, g: np.ndarray) -> np.ndarray:
        return subwindows(g, self.params["subwindow_frames"], self.params["normalize"])

    def _learn_from(self, data: Executor, n_labels: int) -> None:
        """One pass over the executor's labelled windows into the summary (:class:`SummaryPass`)."""
        summary = data.run(SummaryPass(self, n_labels))
        summary.finish()
        x, w, y = summary.arrays()
        if x.shape[0] == 0:
            raise UserError(f"{self.name}: no training vectors")
        empty = [i for i, c in enumerate(np.bincount(y, minlength=n_labels)) if c == 0]
        if empty:
            names = list(getattr(self, "labels_", None) or range(n_labels))
            raise UserError(f"{self.name}: no training windows of {', '.join(str(names[i]) for i in empty[:5])}; "
                            "every label value needs some")
        self.vectors_, self.weights_, self.vector_labels_ = x, w, y
        self.train_info_ = {"vectors_seen": int(summary.seen.sum()), "summary_vectors": int(x.shape[0]),
                            "merges": int(summary.merges)}

    def _search(self, grams: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every window's sub-windows' neighbours: ``(owner window (m,), indices (m, k),
        distances (m, k))``, searched a block of sub-windows at a time."""
        p = self.params
        vecs = [self._vectors(g) for g in grams]
        owner = np.repeat(np.arange(len(vecs)), [v.shape[0] for v in vecs])
        q = np.concatenate(vecs) if vecs else np.zeros((0, self.vectors_.shape[1]))
        k = min(p["k"], self.vectors_.shape[0])
        idx = np.empty((q.shape[0], k), dtype=np.int64)
        dist = np.empty((q.shape[0], k))
        for s in range(0, q.shape[0], QUERY_BLOCK):
            idx[s:s + QUERY_BLOCK], dist[s:s + QUERY_BLOCK] = nearest(q[s:s + QUERY_BLOCK], self.vectors_, k,
                                                                      p["distance"], p["p"])
        return owner, idx, dist

    def _graph_search(self, g: Graph, gram: str) -> tuple[str, str]:
        """Nodes of :meth:`_search` for one window: the distances ``(m, k)`` float64 of its ``m``
        sub-windows to their ``k`` nearest summary vectors, nearest first (ties: lower row, as
        ``TopK``), and their rows ``(m, k)``."""
        p = self.params
        x = g.cast(gram, DOUBLE)
        if p["normalize"]:
            x = g.op("Sub", x, g.reduce("ReduceMean", x, [0]))
        frames = int(p["subwindow_frames"])
        if frames > 1:     # the means of groups of `frames` frames (the last may be shorter) as one product
            t = g.dim(x, 0)
            rows = g.op("Range", g.const(np.int64(0)), g.scalar(t), g.const(np.int64(1)))
            m = g.op("Div", g.op("Add", t, g.i64(frames - 1)), g.i64(frames))
            groups = g.op("Range", g.const(np.int64(0)), g.scalar(m), g.const(np.int64(1)))
            member = g.cast(g.op("Equal", g.op("Unsqueeze", groups, g.i64(1)),
                                 g.op("Div", rows, g.const(np.int64(frames)))), DOUBLE)
            x = g.op("MatMul", g.op("Div", member, g.reduce("ReduceSum", member, [1])), x)
        ref = self.vectors_
        dist = p["distance"]
        if dist == "euclidean":
            cost = g.op("Add", g.reduce("ReduceSum", g.op("Mul", x, x), [1]),
                        g.const(np.einsum("ij,ij->i", ref, ref)[None, :]))
            cost = g.op("Sub", cost, g.op("Mul", g.const(np.float64(2.0)), g.op("MatMul", x, g.const(ref.T.copy()))))
            cost = g.op("Max", cost, g.const(np.float64(0.0)))
        elif dist == "cosine":
            norm = g.op("Sqrt", g.reduce("ReduceSum", g.op("Mul", x, x), [1]))
            unit = g.op("Div", x, g.op("Where", g.op("Greater", norm, g.const(np.float64(0.0))), norm,
                                       g.const(np.float64(1.0))))
            rn = np.sqrt(np.einsum("ij,ij->i", ref, ref))
            cost = g.op("Sub", g.const(np.float64(1.0)),
                        g.op("MatMul", unit, g.const((ref / np.where(rn > 0, rn, 1.0)[:, None]).T.copy())))
        else:
            diff = g.op("Abs", g.op("Sub", g.op("Unsqueeze", x, g.i64(1)), g.const(ref[None])))
            if dist == "lp":
                diff = g.op("Pow", diff, g.const(np.float64(p["p"])))
            cost = g.reduce("ReduceSum", diff, [2], keepdims=False)
        k = min(int(p["k"]), ref.shape[0])
        near, idx = g.op("TopK", cost, g.i64(k), outputs=2, axis=1, largest=0, sorted=1)
        if dist == "euclidean":
            near = g.op("Sqrt", near)
        elif dist == "lp":
            near = g.op("Pow", near, g.const(np.float64(1.0 / p["p"])))
        return near, idx

    def _summary_memory(self, feature_dim: int, n_labels: int, batch_frames: int) -> int:
        p = self.params
        summary = VectorSummary.bytes_needed(n_labels, feature_dim, p["capacity"], p["distance"])
        batch = 3 * max(batch_frames, 1) * feature_dim * 8             # float64 sub-windows of a batch
        search = min(BLOCK_BYTES, QUERY_BLOCK * n_labels * p["capacity"] * 8) * 3
        return summary + batch + search

    def _summary_state(self) -> dict[str, np.ndarray]:
        return {"vectors": self.vectors_, "weights": self.weights_, "vector_labels": self.vector_labels_}

    def _load_summary(self, state: dict[str, np.ndarray], n_labels: int) -> None:
        for key in ("vectors", "weights", "vector_labels"):
            if key not in state:
                raise ParameterError(f"{self.name}: state lacks {key!r}")
        x = np.asarray(state["vectors"], np.float64)
        w = np.asarray(state["weights"], np.float64)
        y = np.asarray(state["vector_labels"], np.int64)
        check_vectors(x, w, y, n_labels, int(self.feature_dim_ or 0), self.params["capacity"], self.name)
        self.vectors_, self.weights_, self.vector_labels_ = x, w, y


@dataclass
class SummaryPass:
    """The summary as a pass: a part's windows add their sub-window vectors (a batch's vectors
    of a label at once), each keyed by its recording's ordinal and its place among that
    recording's vectors, and two parts' summaries merge with :meth:`VectorSummary.merge
    <wavetrain.models.vector_summary.VectorSummary.merge>` (the key-ordered union of their
    rows, reduced only when it exceeds the ``2 × capacity`` buffer).

    What the merge guarantees (a recording's windows all read by one part, as executors do):
    ``merge`` is exactly commutative. While every label's vectors over all parts fit the buffer,
    nothing is reduced before :meth:`~wavetrain.models.vector_summary.VectorSummary.finish`, and
    the finished summary is bit-identical to the local one (same rows, same order) for any split
    and any order or tree of merges. Beyond the buffer, greedy reduction is not associative: the
    summary is a deterministic function of the parts and of the shape of the merge tree, the same
    for any operand order within that shape; it is reproducible run to run only when the executor
    merges the parts along a tree fixed by the parts (e.g. folded in part order)."""

    model: Any
    n_labels: int

    def new(self) -> VectorSummary:
        p = self.model.params
        return VectorSummary(self.n_labels, int(self.model.feature_dim_ or 0), p["capacity"], p["distance"], p["p"])

    def add(self, summary: VectorSummary, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]
            ) -> VectorSummary:
        pending: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        for g, y, o in zip(grams, ys, ordinals):
            if y >= 0 and g.shape[0]:
                v = self.model._vectors(g)
                vs, ks = pending.setdefault(int(y), ([], []))
                vs.append(v)
                ks.append(summary.keys_for(int(o), v.shape[0]))
        for y, (vs, ks) in pending.items():
            summary.add(y, np.concatenate(vs), keys=np.concatenate(ks))
        return summary

    def merge(self, a: VectorSummary, b: VectorSummary) -> VectorSummary:
        a.merge(b)
        return a


class KNNClassifier(SummaryModel, Classifier):
    """k nearest neighbours over a bounded summary of each label's sub-window vectors.

    Attributes
    ----------
    vectors_ : (N, features)  weights_ : (N,)  vector_labels_ : (N,)
        The summary: at most ``capacity`` vectors per label value, each with the number of
        training vectors it stands for.
    """

    name = "knn"
    summary = "k nearest neighbours over a bounded per-label summary of sub-window vectors; vote shares"
    default_features = "mfcc(bands=40, coeffs=13, window_ms=25, shift_pct=40) | delta(order=2)"
    hyperparams = SUMMARY_PARAMS + (
        Param("vote", "uniform", "how a neighbour's vote counts: one each (uniform), its summary weight (weight) "
              "or 1/distance (distance)", str, choices=("uniform", "weight", "distance")),
        Param("unknown_distance", None, "predict 'unknown' when a window's sub-windows lie on average farther than "
              "this from their nearest summary vector (none = never; see the 'nearest' detail of predictions)",
              float, low=0, optional=True),
        Param("unknown_fpr", None, "predict 'unknown' for windows farther from the summary than all but this share "
              "of held-out training windows (e.g. 0.05; calibrated when training, instead of unknown_distance)",
              float, low=0, high=0.5, optional=True),
        Param("valid_fraction", 0.1, "part of the training recordings (or groups) held out to calibrate "
              "unknown_fpr (only with it)", float, low=0.01, high=0.5),
        Param("seed", 0, "seed of the hold-out for unknown_fpr", int, low=0),
    )

    UNKNOWN = UNKNOWN      # (models.base.UNKNOWN, the answer for a window unlike the training)

    def __init__(self, **params: Any):
        super().__init__(**params)
        if self.params["unknown_distance"] is not None and self.params["unknown_fpr"] is not None:
            raise ParameterError(f"{self.name}: set unknown_distance or unknown_fpr, not both")
        self._init_summary()
        #: Windows whose sub-windows lie on average farther than this are ``unknown`` (NaN: never).
        self.unknown_threshold_ = float("nan")

    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """The summary by one pass on any executor; with ``unknown_fpr`` the held-out windows'
        nearest distances (an exact list) set the unknown threshold."""
        fpr = self.params["unknown_fpr"]
        data, valid = self._unknown_holdout(data, valid, options)
        self._learn_from(data, len(self.fitted_labels))
        if fpr is not None and valid is not None:
            near = valid.run(ScoreList(self, of="nearest_distances")).scores()
            if near.size == 0:
                raise UserError(f"{self.name}: no held-out windows to calibrate unknown_fpr on")
            self.unknown_threshold_ = float(np.quantile(near, 1.0 - fpr))
            self.train_info_["unknown_threshold"] = self.unknown_threshold_

    def nearest_distances(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """Each window's mean distance of its sub-windows to their nearest summary vector ``(n,)``."""
        return self._votes(grams)[1]

    def _votes(self, grams: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Vote shares ``(n, labels)`` (smoothed, rows sum to 1) and each window's mean distance of
        its sub-windows to their nearest summary vector ``(n,)``."""
        self._check_grams(grams)
        nl, n = len(self.fitted_labels), len(grams)
        owner, idx, dist = self._search(grams)
        mode = self.params["vote"]
        if mode == "weight":
            v = self.weights_[idx]
        elif mode == "distance":
            v = 1.0 / np.maximum(dist, 1e-12)
        else:
            v = np.ones(idx.shape)
        v = v / v.sum(axis=1, keepdims=True)                 # one vote per sub-window
        counts = np.zeros((n, nl))
        np.add.at(counts, (np.repeat(owner, idx.shape[1]), self.vector_labels_[idx].ravel()), v.ravel())
        subs = np.bincount(owner, minlength=n).astype(np.float64)
        proba = (counts + SMOOTHING) / (subs + SMOOTHING * nl)[:, None]
        near = np.bincount(owner, weights=dist[:, 0], minlength=n) / np.maximum(subs, 1)
        return proba, near

    def predict_proba(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """Smoothed vote shares of the windows' sub-windows ``(n, labels)``; rows sum to 1."""
        return self._votes(grams)[0]

    def predict_with_proba(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray]:
        proba, near = self._votes(grams)
        return self._labels_of(proba, near), proba

    def predict_scores(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """Values, vote shares and ``nearest``: each window's mean distance of its sub-windows to
        their nearest summary vector (what ``unknown_distance`` is compared with)."""
        proba, near = self._votes(grams)
        return self._labels_of(proba, near), proba, {"nearest": near}

    def _labels_of(self, proba: np.ndarray, near: np.ndarray) -> list[str]:
        out = [self.fitted_labels[i] for i in proba.argmax(axis=1)]
        t = self.params["unknown_distance"]
        if t is None and np.isfinite(self.unknown_threshold_):
            t = self.unknown_threshold_
        if t is not None:
            out = [self.UNKNOWN if near[i] > t else v for i, v in enumerate(out)]
        return out

    def _graph_votes(self, g: Graph, gram: str) -> tuple[str, str]:
        """Nodes of :meth:`_votes` for one window: vote shares float64 ``(labels,)`` and the mean
        nearest distance ``(1,)``."""
        nl = len(self.fitted_labels)
        dist, idx = self._graph_search(g, gram)
        mode = self.params["vote"]
        if mode == "weight":
            v = g.op("Gather", g.const(self.weights_), idx)
        elif mode == "distance":
            v = g.op("Reciprocal", g.op("Max", dist, g.const(np.float64(1e-12))))
        else:
            v = g.op("Mul", dist, g.const(np.float64(0.0)))
            v = g.op("Add", v, g.const(np.float64(1.0)))
        v = g.op("Div", v, g.reduce("ReduceSum", v, [1]))
        onehot = g.op("Gather", g.const(np.eye(nl)[self.vector_labels_]), idx)        # (m, k, labels)
        counts = g.reduce("ReduceSum", g.op("Mul", onehot, g.op("Unsqueeze", v, g.i64(2))), [0, 1], keepdims=False)
        subs = g.cast(g.dim(dist, 0), DOUBLE)
        proba = g.op("Div", g.op("Add", counts, g.const(np.float64(SMOOTHING))),
                     g.op("Add", subs, g.const(np.float64(SMOOTHING * nl))))
        first = g.op("Slice", dist, g.i64(0), g.i64(1), g.i64(1))
        return proba, g.reduce("ReduceMean", first, [0, 1], keepdims=False)

    def graph_scores(self, g: Graph, gram: str) -> dict[str, str]:
        proba, near = self._graph_votes(g, gram)
        return {"scores": g.cast(proba, FLOAT), "best": g.op("ArgMax", proba, axis=0, keepdims=1),
                "nearest": g.cast(g.op("Unsqueeze", near, g.i64(0)), FLOAT)}

    def graph_proba(self, g: Graph, gram: str) -> str:
        return self._graph_votes(g, gram)[0]

    def unknown_rule(self) -> dict[str, Any] | None:
        t = self.params["unknown_distance"]
        if t is None and np.isfinite(self.unknown_threshold_):
            t = self.unknown_threshold_
        return None if t is None else {"rule": "above", "output": "nearest", "value": float(t)}

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int) -> int:
        """The summary (buffers of 2 × capacity per label), a batch's vectors and one block of
        distances."""
        return self._summary_memory(feature_dim, n_labels, batch_frames)

    def state_dict(self) -> dict[str, np.ndarray]:
        self.check_is_fitted()
        state = self._summary_state()
        if np.isfinite(self.unknown_threshold_):
            state["unknown_threshold"] = np.array([self.unknown_threshold_])
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self._load_summary({k: v for k, v in state.items() if k != "unknown_threshold"}, len(self.labels_ or ()))
        self.unknown_threshold_ = float(np.asarray(state.get("unknown_threshold", [np.nan])).reshape(-1)[0])
