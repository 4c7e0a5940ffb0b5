"""``linear``: multinomial logistic regression with an L2 penalty, trained by passes of mergeable
loss and gradient sums.

The model is scikit-learn's ``LogisticRegression(C=c, penalty='l2', fit_intercept=True)``: one
coefficient row ``W[k]`` and intercept ``b[k]`` per label value, ``P(k | x) = softmax(W x + b)[k]``,
fitted by minimising

    sum over training examples of -log P(y | x)  +  ||W||^2 / (2 c)

(the intercepts are not penalised; the penalty does not shrink as examples are added, as
scikit-learn's ``C``). With two label values scikit-learn fits binary logistic regression, one
vector ``w`` penalised by ``||w||^2 / (2 c)``; the family fits that same model, whose two rows are
``-w/2`` and ``w/2`` (it doubles the penalty of its two rows, which is the same objective). The
intercepts are centred (they sum to zero, as scikit-learn's multinomial ones do: the objective
does not depend on their common shift).

A window is scored by its mean frame: its probabilities are ``softmax(W mean(x) + b)``, which is
also the normalised geometric mean of its frames' probabilities (the mean of their
log-probabilities, normalised), since the model is linear in x. A training example is, by default,
what is scored: each window's mean frame (``examples=windows``; with whole recordings as windows,
one example per recording), or else each frame (``examples=frames``, as ``gmm`` and ``knn`` learn
from frames); features pooled over a recording (one frame per window) are one example each either
way. On spoken words (four folds by speaker) window means gave 0.974 against 0.962 for frames, with
far fewer examples to train on.

Training: a first pass adds up each feature's moments and each value's examples
(:class:`ExampleMoments`, merged as Chan et al.'s parallel moments); with ``standardize`` the
optimisation runs on standardised features, ``(x - mean) / scale`` (``scale``: the feature's sd,
raised for a nearly constant feature where the penalty outweighs the data, see :data:`CURVATURE`),
and the coefficients are folded back to the raw features afterwards (a change of variables with
the penalty carried along, so the optimum is scikit-learn's on the raw features, only reached in
fewer passes). Then L-BFGS (scipy's L-BFGS-B, with scikit-learn's settings) runs on this side,
and each evaluation of the objective is one pass over the data (:class:`LossGradient`) that adds
up the cross-entropy and its gradient: sums over windows, merged in any order, so the fit streams
(memory independent of the data) and runs on any executor, Spark included. The local executor
keeps the training windows, and the blocks of examples cut from them, in memory between passes
while they fit ``frame_cache_mb``.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.graph import DOUBLE, FLOAT, Graph
from wavetrain.core.params import Param
from wavetrain.core.progress import progress_counter
from wavetrain.models.base import UNKNOWN, Classifier, FitOptions, state_arrays
from wavetrain.models.device_pool import Device
from wavetrain.models.passes import WINDOW_OVERHEAD, Executor, MomentState, ScoreList, Window, add_by_kernel

__all__ = ["ExampleMoments", "GradientSums", "LinearClassifier", "LossGradient", "MomentCounts"]

log = logging.getLogger(__name__)

#: Examples (rows) whose logits are computed at once in a pass (bounds its working arrays).
CHUNK_ROWS = 8192
#: The largest curvature of one example's cross-entropy along one logit (p (1 - p) <= 1/4): with
#: ``standardize`` a feature of variance v is divided by ``sqrt(v + penalty / (examples x this))``,
#: so that along every coefficient the mean objective curves about as much, whether the data or the
#: penalty bends it (a feature of nearly constant value is scaled by the penalty's share, not by its
#: tiny sd, which would make the penalty on its coefficient far steeper than the rest).
CURVATURE = 0.25
#: Training windows whose mean frames vary less than this share of the frames' variance (in all)
#: have the same mean frame: features normalised over time (no linear model tells them apart).
SAME_MEANS = 1e-10
#: Line-search evaluations L-BFGS may take per iteration, and its relative reduction of the
#: objective below which it stops: scikit-learn's settings.
MAX_LINE_SEARCH = 50
FTOL = 64 * np.finfo(float).eps


def example_rows(g: np.ndarray, examples: str) -> np.ndarray:
    """The training examples of one window, float64: its frames ``(frames, d)``, or its mean frame
    ``(1, d)`` with ``examples="windows"``."""
    x = np.asarray(g, dtype=np.float64)
    return x if examples == "frames" else x.mean(axis=0, keepdims=True)


def _blocks(windows: Iterable[tuple[np.ndarray, int]], examples: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The examples of labelled windows ``(gram, label index)`` and their label indices, in blocks
    of at most :data:`CHUNK_ROWS` rows (a long window is cut over several blocks)."""
    parts: list[np.ndarray] = []
    labels: list[int] = []
    lengths: list[int] = []
    rows = 0
    for g, y in windows:
        x = example_rows(g, examples)
        for s in range(0, x.shape[0], CHUNK_ROWS):
            part = x[s:s + CHUNK_ROWS]
            if rows + part.shape[0] > CHUNK_ROWS and parts:
                yield np.concatenate(parts), np.repeat(np.asarray(labels, dtype=np.int64), lengths)
                parts, labels, lengths, rows = [], [], [], 0
            parts.append(part)
            labels.append(int(y))
            lengths.append(part.shape[0])
            rows += part.shape[0]
    if parts:
        yield np.concatenate(parts), np.repeat(np.asarray(labels, dtype=np.int64), lengths)


@dataclass
class MomentCounts:
    """Moments of the examples' features, of the frames' (with ``examples="windows"``; else those
    of the examples) and of the windows' mean frames, and the examples of each label value."""

    moments: MomentState
    frames: MomentState
    window_means: MomentState
    counts: np.ndarray


def _moments(v: np.ndarray) -> MomentState:
    mean = v.mean(axis=0)
    return MomentState(v.shape[0], mean, ((v - mean) ** 2).sum(axis=0))


@dataclass
class ExampleMoments:
    """The first pass: mean and squared deviations of every feature over the training examples,
    the frames and the windows' mean frames (:class:`~wavetrain.models.passes.MomentState`, merged
    exactly up to rounding) and each label value's examples."""

    n_labels: int
    examples: str

    def new(self) -> MomentCounts:
        return MomentCounts(MomentState(), MomentState(), MomentState(), np.zeros(self.n_labels, dtype=np.int64))

    def add(self, state: MomentCounts, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]
            ) -> MomentCounts:
        for x, y in _blocks(zip(grams, ys), self.examples):
            state.moments = state.moments.merged(_moments(x))
            state.counts = state.counts + np.bincount(y, minlength=self.n_labels)
        if len(grams):
            frames = [np.asarray(g, dtype=np.float64) for g in grams]
            state.window_means = state.window_means.merged(_moments(np.stack([f.mean(axis=0) for f in frames])))
            if self.examples == "windows":
                state.frames = state.frames.merged(_moments(np.concatenate(frames)))
        return state

    def merge(self, a: MomentCounts, b: MomentCounts) -> MomentCounts:
        return MomentCounts(a.moments.merged(b.moments), a.frames.merged(b.frames),
                            a.window_means.merged(b.window_means), a.counts + b.counts)


@dataclass
class GradientSums:
    """Sums over examples: how many, their cross-entropy and its gradient with respect to the
    (standardised) coefficients and the intercepts."""

    n: int = 0
    loss: float = 0.0
    coef: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    intercept: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def merged(self, other: GradientSums) -> GradientSums:
        return GradientSums(self.n + other.n, self.loss + other.loss, self.coef + other.coef,
                            self.intercept + other.intercept)


@dataclass
class LossGradient:
    """One evaluation of the objective's data term: over every example ``x`` of label ``y``, with
    ``z = (x - mean) / scale`` and logits ``coef z + intercept``, the sum of ``-log softmax(logits)[y]``
    and of its gradient (``(p - onehot(y)) z``, ``p - onehot(y)``). Sums: they merge in any order.

    A kernel pass (:class:`~wavetrain.models.passes.KernelPass`) whose pieces are blocks of up to
    :data:`CHUNK_ROWS` examples (float64) with their label indices: cut the same whatever the
    coefficients, so the local executor keeps them beside its frame cache, and a pass after the
    first only computes."""

    examples: str
    mean: np.ndarray          # (d,)
    scale: np.ndarray         # (d,)
    coef: np.ndarray          # (labels, d), of the standardised features
    intercept: np.ndarray     # (labels,)

    @property
    def pieces_key(self) -> tuple[str, str, int]:
        return ("linear examples", self.examples, CHUNK_ROWS)

    def new(self) -> GradientSums:
        return GradientSums(0, 0.0, np.zeros_like(self.coef), np.zeros_like(self.intercept))

    def add(self, state: GradientSums, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]
            ) -> GradientSums:
        return add_by_kernel(self, state, zip(grams, ys, ordinals))

    def merge(self, a: GradientSums, b: GradientSums) -> GradientSums:
        return a.merged(b)

    # -- the kernel --------------------------------------------------------------------------------
    def pieces(self, windows: Iterable[Window]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return _blocks(((g, int(y)) for g, y, _ in windows), self.examples)

    def setup(self, device: Device) -> tuple[np.ndarray, np.ndarray]:
        """The coefficients and intercepts of the raw features (the standardisation folded in)."""
        raw = self.coef / self.scale
        return np.ascontiguousarray(raw.T), self.intercept - raw @ self.mean

    def compute(self, device: Device, context: tuple[np.ndarray, np.ndarray], piece: tuple[np.ndarray, np.ndarray]
                ) -> GradientSums:
        """The block's sums; the gradient with respect to the standardised coefficients is
        ``(r^T x - (r^T 1) mean^T) / scale`` for residuals ``r = p - onehot(y)``."""
        x, y = piece
        weights, bias = context
        logits = x @ weights
        logits += bias
        rows = np.arange(x.shape[0])
        picked = logits[rows, y]
        top = logits.max(axis=1, keepdims=True)
        logits -= top
        r = np.exp(logits, out=logits)                 # (logits no longer needed)
        total = r.sum(axis=1, keepdims=True)
        loss = float(np.sum(np.log(total[:, 0]) + top[:, 0] - picked))
        r /= total
        r[rows, y] -= 1.0
        sums = r.sum(axis=0)
        grad = r.T @ x
        grad -= sums[:, None] * self.mean
        grad /= self.scale
        return GradientSums(x.shape[0], loss, grad, sums)

    def fold(self, state: GradientSums, result: GradientSums) -> GradientSums:
        state.n += result.n
        state.loss += result.loss
        state.coef += result.coef
        state.intercept += result.intercept
        return state


class _OutOfPasses(Exception):
    """The optimiser asked for a pass beyond ``max_passes``."""


class LinearClassifier(Classifier):
    """Multinomial logistic regression with an L2 penalty (scikit-learn's ``LogisticRegression``).

    Attributes
    ----------
    coef_ : (labels, features)  intercept_ : (labels,)
        ``P(value | window) = softmax(coef_ @ mean frame + intercept_)``, on the raw features;
        the intercepts sum to zero.
    unknown_threshold_ : float
        With ``unknown_fpr``: a window whose top probability is below it is ``unknown`` (NaN: never).
    """

    name = "linear"
    summary = ("multinomial logistic regression with an L2 penalty (scikit-learn's LogisticRegression) on each "
               "window's mean frame")
    #: Chosen on spoken words, four folds by speaker, window means: 0.974 (13 coefficients with
    #: deltas and delta-deltas: 0.955; 20 without deltas: 0.921).
    default_features = "mfcc(coeffs=20) | delta"
    hyperparams = (
        Param("c", 1.0, "inverse strength of the L2 penalty, scikit-learn's C: the objective is the sum of every "
              "training example's cross-entropy plus ||coefficients||^2 / (2 c) (intercepts not penalised)", float,
              low=0, low_open=True),
        Param("examples", "windows", "what one training example is: each window's mean frame, what is scored "
              "(windows), or each frame (frames)", str, choices=("windows", "frames")),
        Param("standardize", True, "optimise on features scaled to mean 0 and sd 1 (from a first pass), folded "
              "back into coefficients of the raw features: the same model in fewer passes", bool),
        Param("max_passes", 200, "maximum passes over the training data of the optimiser (L-BFGS: each evaluates "
              "the loss and its gradient once), besides the first pass for the standardisation", int, low=1),
        Param("tol", 1e-4, "stop when no gradient component of the mean objective (standardised) exceeds this, "
              "as scikit-learn's tol", float, low=0),
        Param("frame_cache_mb", None, "keep the training windows in memory between passes when they fit in this "
              "many MB (none: 64, or with augment= as much as the memory plan grants)", int, low=0, optional=True),
        Param("unknown_fpr", None, "answer 'unknown' for windows less confident than all but this share of "
              "held-out training windows (e.g. 0.05; none = never)", float, low=0, high=0.5, optional=True),
        Param("valid_fraction", 0.1, "part of the training recordings (or groups) held out to calibrate "
              "unknown_fpr (only with it)", float, low=0.01, high=0.5),
        Param("seed", 0, "seed of the hold-out for unknown_fpr", int, low=0),
    )
    history_loss = "objective per example (cross-entropy + L2 penalty)"
    #: Each optimiser step evaluates the objective by one pass of mergeable sums.
    learns_by = "statistics"
    #: The passes run on any executor (local or Spark).
    any_executor = True

    UNKNOWN = UNKNOWN      # (models.base.UNKNOWN, the answer for a window unlike the training)

    def __init__(self, **params: Any):
        super().__init__(**params)
        self.coef_ = np.zeros((0, 0))
        self.intercept_ = np.zeros(0)
        self.unknown_threshold_ = float("nan")

    # -- training -------------------------------------------------------------------------------
    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """The fit by passes on any executor; with ``unknown_fpr``, the held-out windows' top
        probabilities (an exact list) set the unknown threshold."""
        fpr = self.params["unknown_fpr"]
        data, valid = self._unknown_holdout(data, valid, options)
        self._fit(data, options)
        self.unknown_threshold_ = float("nan")
        if fpr is not None and valid is not None:
            top = valid.run(ScoreList(self, of="top_probability")).scores()
            if top.size == 0:
                raise UserError(f"{self.name}: no held-out windows to calibrate unknown_fpr on")
            self.unknown_threshold_ = float(np.quantile(top, fpr))
            self.train_info_["unknown_threshold"] = self.unknown_threshold_

    def _fit(self, data: Executor, options: FitOptions) -> None:
        """The moments pass, then L-BFGS with one :class:`LossGradient` pass per evaluation."""
        from scipy.optimize import minimize

        p = self.params
        labels, d = self.fitted_labels, int(self.feature_dim_ or 0)
        nl, examples = len(labels), p["examples"]
        first = data.run(ExampleMoments(nl, examples))
        n, counts = first.moments.n, first.counts
        empty = [labels[i] for i in np.flatnonzero(counts == 0)]
        if empty:
            raise UserError(f"{self.name}: no training examples of {', '.join(empty[:5])}; every label value "
                            "needs some")
        frames, windows = first.moments if examples == "frames" else first.frames, first.window_means
        if frames.m2 is None or windows.m2 is None or \
                float(windows.m2.sum()) / windows.n <= SAME_MEANS * float(frames.m2.sum()) / frames.n:
            raise UserError(f"{self.name}: every training window has the same mean frame (features normalised over "
                            "time, such as normalize(axis=time), centre each window), and a linear model scores a "
                            "window by its mean frame: it would answer the same for every window; use features "
                            "without normalisation over time")
        # scikit-learn's penalty; with two values its binary model's (see the module notes)
        strength = (2.0 if nl == 2 else 1.0) / p["c"]
        mean, scale = np.zeros(d), np.ones(d)
        if p["standardize"] and first.moments.mean is not None and first.moments.m2 is not None:
            mean = first.moments.mean
            scale = np.sqrt(first.moments.m2 / n + strength / (n * CURVATURE))
        weight = strength / scale ** 2                     # the penalty on standardised coefficients

        bar = progress_counter(desc=f"{self.name} L-BFGS", total=p["max_passes"], unit="pass",
                               enable=options.progress)
        self.history_ = []
        best: list[Any] = [np.inf, None]

        def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
            if len(self.history_) >= p["max_passes"]:
                raise _OutOfPasses
            coef, intercept = theta[:nl * d].reshape(nl, d), theta[nl * d:]
            sums = data.run(LossGradient(examples, mean, scale, coef, intercept))
            if sums.n != n:
                raise UserError(f"{self.name}: a pass over the training data saw {sums.n} examples, the first "
                                f"{n}; the training data changed while it was read")
            penalty = 0.5 * float(np.sum(weight * coef * coef))
            f = (sums.loss + penalty) / n
            grad = np.concatenate([((sums.coef + weight * coef) / n).ravel(), sums.intercept / n])
            self.history_.append({"epoch": len(self.history_) + 1, "train_loss": round(f, 8),
                                  "cross_entropy": round(sums.loss / n, 8)})
            if f < best[0]:
                best[:] = [f, theta.copy()]
            if bar is not None:
                bar.update(1)
                bar.set_postfix(objective=f"{f:.5f}")
            return f, grad

        log_counts = np.log(counts.astype(np.float64))
        theta0 = np.concatenate([np.zeros(nl * d), log_counts - log_counts.mean()])
        try:
            res = minimize(objective, theta0, method="L-BFGS-B", jac=True,
                           options={"maxiter": p["max_passes"], "maxfun": p["max_passes"], "maxls": MAX_LINE_SEARCH,
                                    "gtol": p["tol"], "ftol": FTOL})
            theta, converged, iterations, stop = res.x, bool(res.success), int(res.nit), str(res.message)
        except _OutOfPasses:
            theta, converged, iterations, stop = best[1], False, -1, "max_passes reached"
        finally:
            if bar is not None:
                bar.close()
        coef = theta[:nl * d].reshape(nl, d) / scale
        intercept = theta[nl * d:] - coef @ mean
        self.coef_, self.intercept_ = coef, intercept - intercept.mean()
        self.train_info_ = {"passes": len(self.history_) + 1, "examples": int(n), "converged": converged,
                            "objective": float(best[0]), "stop": stop}
        if iterations >= 0:
            self.train_info_["iterations"] = iterations
        if not converged:
            log.warning("%s: the optimiser did not converge in %d passes (%s); raise max_passes or tol",
                        self.name, len(self.history_), stop)

    def frame_cache_budget(self, options: FitOptions) -> int:
        """``frame_cache_mb`` when set, else what the memory plan granted, else 64 MB."""
        return self._frame_cache_grant(options)

    def frame_cache_request(self, feature_dim: int, n_labels: int, total_frames: int) -> int:
        """Every training frame as the local executor keeps it: the windows (float32, with the
        upkeep of windows of at least 16 frames) and the blocks of examples kept beside them
        (float64, with their label indices), unless ``frame_cache_mb`` is set."""
        if self.params["frame_cache_mb"] is not None:
            return 0
        return total_frames * (feature_dim * (4 + 8) + 8) + total_frames * WINDOW_OVERHEAD // 16

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int) -> int:
        """Coefficients, their gradient and the optimiser's history (float64), and one block of
        examples being cut (its parts and the block, float64) and computed (logits, gradient)."""
        params = n_labels * (feature_dim + 1) * 8
        lbfgs = params * (4 + 2 * 10)                # iterate, gradient, sums, best; 10 correction pairs
        block = CHUNK_ROWS + min(max(window_frames, 1), CHUNK_ROWS)
        work = block * (2 * feature_dim + 2 * n_labels + 2) * 8
        state = lbfgs + work
        cache = self.frame_cache_request(feature_dim, n_labels, total_frames)
        if self.params["frame_cache_mb"] is not None and cache <= self.params["frame_cache_mb"] << 20:
            state += cache
        return int(state)

    # -- scoring --------------------------------------------------------------------------------
    def decision_function(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """Each window's logits ``coef_ @ mean frame + intercept_`` ``(n, labels)``."""
        self._check_grams(grams)
        means = np.stack([np.asarray(g, dtype=np.float64).mean(axis=0) for g in grams])
        return means @ self.coef_.T + self.intercept_

    def predict_proba(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """``softmax(coef_ @ mean frame + intercept_)`` of each window ``(n, labels)``."""
        s = self.decision_function(grams)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def top_probability(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """Each window's highest probability (what ``unknown_fpr`` is calibrated on)."""
        return self.predict_proba(grams).max(axis=1)

    def predict_with_proba(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray]:
        """Values (``unknown`` below the ``unknown_fpr`` threshold) and probabilities."""
        p = self.predict_proba(grams)
        names = [self.fitted_labels[i] for i in p.argmax(axis=1)]
        if np.isfinite(self.unknown_threshold_):
            names = [UNKNOWN if top < self.unknown_threshold_ else v for v, top in zip(names, p.max(axis=1))]
        return names, p

    def unknown_rule(self) -> dict[str, Any] | None:
        t = self.unknown_threshold_
        return {"rule": "top_below", "value": float(t)} if np.isfinite(t) else None

    # -- export ---------------------------------------------------------------------------------
    def graph_proba(self, g: Graph, gram: str) -> str:
        """The window's mean frame times the coefficients plus the intercepts, softmax: float64
        ``(labels,)``."""
        mean = g.reduce("ReduceMean", g.cast(gram, DOUBLE), [0], keepdims=False)
        logits = g.op("Add", g.op("MatMul", mean, g.const(np.ascontiguousarray(self.coef_.T))),
                      g.const(self.intercept_))
        return g.op("Softmax", logits, axis=0)

    def graph_scores(self, g: Graph, gram: str) -> dict[str, str]:
        p = self.graph_proba(g, gram)
        return {"scores": g.cast(p, FLOAT), "best": g.op("ArgMax", p, axis=0, keepdims=1)}

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        self.check_is_fitted()
        state = {"coef": self.coef_, "intercept": self.intercept_}
        if np.isfinite(self.unknown_threshold_):
            state["unknown_threshold"] = np.array([self.unknown_threshold_])
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Set the learned state; its shapes must fit ``labels_`` and ``feature_dim_`` (a
        :class:`ParameterError` names the first that does not)."""
        nl, d = len(self.labels_ or ()), int(self.feature_dim_ or 0)
        arrays = state_arrays(self.name, state, {"coef": (nl, d), "intercept": (nl,)},
                              f"{nl} label values and {d} features")
        t = np.asarray(state.get("unknown_threshold", [np.nan]), dtype=np.float64).reshape(-1)
        if t.size != 1 or not (np.isnan(t[0]) or 0.0 <= t[0] <= 1.0):
            raise ParameterError(f"{self.name}: unknown_threshold must be one probability between 0 and 1")
        self.coef_, self.intercept_ = arrays["coef"], arrays["intercept"]
        self.unknown_threshold_ = float(t[0])
