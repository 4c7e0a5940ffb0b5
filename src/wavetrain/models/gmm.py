"""``gmm``: one Gaussian mixture per label value, trained by streaming EM.

Training memory does not depend on the amount of data: each EM pass adds up sufficient statistics
(per component: weight, sum of x, sum of x²; see :mod:`wavetrain.models.mixture`, where EM is a
map and a reduce) over the executor's windows; initialisation uses k-means++ and Lloyd steps on a
bounded reservoir sample of frames. The fit is :func:`~wavetrain.models.mixture_fit.fit_mixture`
on any executor. Locally, when all training frames fit ``frame_cache_mb`` (by default: 64 MB, or
what the memory plan grants an augmented run, whose passes would otherwise decode and augment
every recording again) the executor keeps them in memory after the first pass and EM reads them
there. Each label's mixture stops on its own; between EM steps, SQUAREM extrapolation
(``accelerate``) cuts the passes needed; an extrapolated point is kept only when it does not
lower the log-likelihood.
With several devices (``FitOptions.devices``, ``train --devices cpu,cpu`` or ``cpu,cuda:0``), each
E-step's blocks of frames are handed out to the devices one at a time and their statistics added
in the blocks' order (the local executor's :class:`~wavetrain.models.device_pool.DevicePool`):
the fit is the one-device fit (bit for bit on ``cpu`` devices, to rounding with a GPU).
A window is scored by its mean frame log-likelihood under each label's mixture (``score_kind``
``mean_loglik``: a density, not a probability).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.graph import FLOAT, Graph
from wavetrain.core.params import Param
from wavetrain.core.progress import progress_counter
from wavetrain.models.base import UNKNOWN, Classifier, FitOptions, state_arrays
from wavetrain.models.mixture import (
    CHUNK_FRAMES,
    KeyedSample,
    LabelEM,
    Stats,
    Theta,
    gauss_terms,
    graph_mixture_logliks,
    kmeans_init,
    log_sum_exp,
    m_step,
    responsibilities,
)
from wavetrain.models.mixture_fit import MixtureScores, MixtureStats, fit_mixture
from wavetrain.models.passes import WINDOW_OVERHEAD, Executor, add_by_kernel
from wavetrain.models.vtln import VTLN_PARAMS, WarpSearch, graph_warp_detail, warp_detail

log = logging.getLogger(__name__)

def cache_bytes(d: int, total_frames: int) -> int:
    """Bytes the local executor's frame cache takes for ``total_frames`` frames of ``d`` features:
    the windows (float32, with the upkeep of windows of at least 16 frames:
    :data:`~wavetrain.models.passes.WINDOW_OVERHEAD`) and the E-step's blocks of each label's
    frames kept beside them (float64)."""
    return total_frames * d * (4 + 8) + total_frames * WINDOW_OVERHEAD // 16


#: Bound of the (labels, components, frames) float64 array scored at once.
SCORE_BLOCK_BYTES = 4 << 20
#: Copies of an init sample's frames a task of a distributed pass holds at once (kept and pending
#: frames with their keys, the compaction's copies, the pickled result, a group's merges):
#: measured 68 MB for one task of 2 x 20,000 frames of 39 features (5.3 times the kept frames).
SAMPLE_COPIES = 6

#: Labelled windows: ``(gram, label index)``.
Windows = Iterable[tuple[np.ndarray, int]]


#: How many training standard deviations from a value's training windows a window's score (its
#: ``z``) may lie before live use calls it unknown (:meth:`GMMClassifier.live_unknown_rule`).
LIVE_UNKNOWN_SD = 4.0


def z_rule(family: str, level: float | None = None) -> dict[str, Any]:
    """The live unknown rule of a model that reports ``z`` (:meth:`Classifier.live_unknown_rule
    <wavetrain.models.base.Classifier.live_unknown_rule>`): a window is unknown when its ``z`` lies
    more than ``level`` (default :data:`LIVE_UNKNOWN_SD`) training standard deviations from the mean
    score of the value's training windows, below (noise, another machine) or above (a degenerate
    window such as digital silence, whose constant features one narrow component scores far higher
    than any training window)."""
    t = LIVE_UNKNOWN_SD if level is None else float(level)
    if not t > 0:
        raise ParameterError(f"unknown level {level:g}: this {family} model compares z with it; give the training "
                             "standard deviations (> 0) beyond which a window is unknown")
    return {"rule": "outside", "output": "z", "low": -t, "high": t, "level": t,
            "text": f"|z| above {t:g} (more than {t:g} training sd from the value's training windows)"}


class GMMClassifier(WarpSearch, Classifier):
    """One diagonal Gaussian mixture per label value.

    Parameters (see ``wavetrain models``) are declared in :attr:`hyperparams`.

    Attributes
    ----------
    weights_ : (labels, k)  means_ : (labels, k, d)  variances_ : (labels, k, d)
    score_mean_, score_sd_ : (labels,)  mean frame log-likelihood of the training windows of each
        label under its own mixture (used by ``unknown_sd`` and the ``z`` of predictions).
    """

    name = "gmm"
    summary = "one Gaussian mixture per label value; windows scored by mean frame log-likelihood"
    default_features = "mfcc(bands=40, coeffs=13, window_ms=25, shift_pct=40) | delta(order=2)"
    hyperparams = (
        Param("components", 8, "mixture components per label value", int, low=1, high=1024),
        Param("covariance", "diag", "covariance type (diagonal)", str, choices=("diag",)),
        Param("max_iter", 100, "maximum EM passes over the training data (each label stops on its own at tol)",
              int, low=1),
        Param("accelerate", True, "SQUAREM extrapolation between EM passes: fewer passes to converge", bool),
        Param("tol", 1e-3, "stop when the mean frame log-likelihood improves less than this", float, low=0),
        Param("reg", 1e-4, "added to every variance (numerical floor)", float, low=0),
        Param("init_frames", 20000, "frames per label kept in the reservoir for k-means++ init", int, low=16),
        Param("seed", 0, "random seed (initialisation)", int, low=0),
        Param("frame_cache_mb", None, "keep all training frames (and their squares, float64) in memory for EM when "
              "they fit in this many MB; larger data sets are re-read from the feature store each pass (none: 64, "
              "or with augment= as much as the memory plan grants within --memory-limit)", int, low=0,
              optional=True),
        Param("unknown_sd", None, "predict 'unknown' when the best score is this many training sd below "
              "that label's training mean (none = never)", float, low=0, optional=True),
        Param("unknown_fpr", None, "predict 'unknown' for about this share of windows like the training ones: "
              "unknown_sd set from it, the training scores taken as normal (0.05: 1.64 sd; none = never)",
              float, low=0, high=0.5, optional=True),
    ) + VTLN_PARAMS

    UNKNOWN = UNKNOWN      # (models.base.UNKNOWN, the answer for a window unlike the training)
    score_kind = "mean_loglik"
    #: EM: each pass adds up every label's sufficient statistics under the current mixtures.
    learns_by = "statistics"
    #: ``FitOptions.devices`` share every E-step (the blocks of frames handed out to them).
    supports_device_groups = True
    #: EM by passes of statistics on any executor (local or Spark).
    any_executor = True

    def __init__(self, **params: Any):
        super().__init__(**params)
        if self.params["unknown_sd"] is not None and self.params["unknown_fpr"] is not None:
            raise ParameterError(f"{self.name}: set unknown_sd or unknown_fpr, not both")
        self._check_vtln()
        self.weights_: np.ndarray = np.zeros((0, 0))         # (labels, k)
        self.means_: np.ndarray = np.zeros((0, 0, 0))        # (labels, k, d)
        self.variances_: np.ndarray = np.zeros((0, 0, 0))
        self.score_mean_: np.ndarray = np.zeros(0)           # (labels,)
        self.score_sd_: np.ndarray = np.zeros(0)
        self.converged_ = False

    # -- training -------------------------------------------------------------------------------
    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """EM by passes on any executor (:meth:`fit_em`), then the warps to score at."""
        self.fit_em(data, options)
        self._read_warps()

    def fit_em(self, data: Executor, options: FitOptions, *, labels: Sequence[str] | None = None) -> None:
        """EM by passes on any executor (:func:`~wavetrain.models.mixture_fit.fit_mixture`), with a
        progress bar of the passes: where the frames are kept between passes and which devices
        share the E-steps is the executor's (the local one keeps them in memory within
        :meth:`frame_cache_budget`). ``labels``: the values window label indices name (default
        ``data.labels``)."""
        bar = progress_counter(desc=f"{self.name} EM", total=self.params["max_iter"], unit="pass",
                               enable=options.progress)

        def on_pass(ems: list[LabelEM]) -> None:
            if bar is not None:
                bar.update(1)
                bar.set_postfix(active=sum(not em.done for em in ems))

        try:
            fit_mixture(self, data, labels=labels, on_pass=on_pass)
        finally:
            if bar is not None:
                bar.close()

    # -- the parts of a fit the mixture passes drive: sample, statistics, mixtures ---------------
    def new_samples(self) -> list[KeyedSample]:
        """Empty init samples, one per label: a window's frames go to its label's, keyed by
        :class:`~wavetrain.models.mixture.FrameKeys` of the recording's ordinal."""
        return [KeyedSample(self.params["init_frames"], self._dim) for _ in self.fitted_labels]

    def initial_thetas(self, samples: Sequence[KeyedSample]) -> list[Theta]:
        """Initial mixtures from the label samples (merged over every part of the data)."""
        rng = np.random.default_rng(self.params["seed"])
        return [self._initial(c, s.sample(), rng) for c, s in enumerate(samples)]

    def pass_stats(self, windows: Windows, thetas: Sequence[Theta], active: np.ndarray) -> list[Stats]:
        """One E-step over labelled windows ``(gram, label index)`` of the active labels, on this
        thread: each label's statistics (they add over parts of the data; an inactive label's are
        zero). :class:`~wavetrain.models.mixture_fit.MixtureStats` is this as a pass."""
        step = MixtureStats(self, list(thetas), np.asarray(active))
        got = add_by_kernel(step, step.new(), ((g, y, 0) for g, y in windows))
        k = self.params["components"]
        return [st if st is not None else Stats(k, self._dim) for st in got]

    def set_mixtures(self, ems: Sequence[LabelEM]) -> None:
        """Keep the fitted mixtures, their history and whether they converged."""
        self.weights_ = np.stack([em.result[0] for em in ems])
        self.means_ = np.stack([em.result[1] for em in ems])
        self.variances_ = np.stack([em.result[2] for em in ems])
        self.history_ = self._history(list(ems))
        self.converged_ = all(em.done for em in ems)
        self.train_info_ = {"em_passes": max(len(em.loglik) for em in ems), "converged": self.converged_}
        if not self.converged_:
            log.warning("gmm: %d label mixture(s) did not converge in max_iter=%d passes; raise max_iter or tol",
                        sum(not em.done for em in ems), self.params["max_iter"])

    def score_sums(self, windows: Windows) -> np.ndarray:
        """Per label: count, sum and sum of squares (labels, 3) of its windows' mean frame
        log-likelihoods under its own mixture (they add over parts of the data):
        :class:`~wavetrain.models.mixture_fit.MixtureScores` on this thread."""
        scores = MixtureScores(self)
        return add_by_kernel(scores, scores.new(), ((g, y, 0) for g, y in windows))

    def set_score_stats(self, sums: np.ndarray) -> None:
        """Mean and sd of each label's training window scores from :meth:`score_sums`."""
        n = np.maximum(sums[:, 0], 1)
        self.score_mean_ = sums[:, 1] / n
        self.score_sd_ = np.sqrt(np.maximum(sums[:, 2] / n - self.score_mean_ ** 2, 0))

    @property
    def _dim(self) -> int:
        if self.feature_dim_ is None:
            self.check_is_fitted()
        return int(self.feature_dim_ or 0)

    def frame_cache_budget(self, options: FitOptions) -> int:
        """``frame_cache_mb`` when set, else what the memory plan granted, else 64 MB."""
        return self._frame_cache_grant(options)

    def frame_cache_request(self, feature_dim: int, n_labels: int, total_frames: int) -> int:
        """Every frame as the executor keeps it (:func:`cache_bytes`), unless ``frame_cache_mb``
        is set."""
        if self.params["frame_cache_mb"] is not None:
            return 0
        return cache_bytes(feature_dim, total_frames)

    def _initial(self, c: int, x: np.ndarray, rng: np.random.Generator) -> Theta:
        """Initial parameters of label ``c``'s mixture: k-means++ and Lloyd steps on its sample
        ``x`` (n, d), then the M-step of the hard assignment (as sklearn's kmeans init)."""
        k = self.params["components"]
        if x.shape[0] < k:
            raise UserError(f"gmm: label value {self.fitted_labels[c]!r} has {x.shape[0]} feature frames, "
                            f"fewer than components={k}; add data or lower components")
        _, lab = kmeans_init(x, k, rng)
        resp = np.zeros((k, x.shape[0]))
        resp[lab, np.arange(x.shape[0])] = 1.0
        st = Stats(k, self._dim)
        for s in range(0, x.shape[0], CHUNK_FRAMES):          # x² a block at a time
            part = x[s:s + CHUNK_FRAMES]
            st.add((part, part * part), resp[:, s:s + CHUNK_FRAMES])
        return m_step(st, self.params["reg"])

    @staticmethod
    def _history(ems: list[LabelEM]) -> list[dict]:
        """Per pass: the frame-weighted mean log-likelihood of the labels (each label's latest),
        the frames, and how many labels were still running after it."""
        out = []
        frames = np.array([em.frames for em in ems], dtype=float)
        for it in range(max(len(em.loglik) for em in ems)):
            last = np.array([em.loglik[min(it, len(em.loglik) - 1)] for em in ems])
            active = sum(it < len(em.loglik) - 1 or (it == len(em.loglik) - 1 and not em.done) for em in ems)
            out.append({"iteration": it + 1, "mean_loglik": float(np.sum(last * frames) / max(frames.sum(), 1)),
                        "frames": int(frames.sum()), "active_labels": int(active)})
        return out

    @staticmethod
    def frames_by_label(windows: Windows, active: np.ndarray | None = None
                        ) -> Iterator[tuple[list[np.ndarray], int]]:
        """Yield ``(parts, label index)``: windows' frames (n_i, d) of one label, at most
        ``CHUNK_FRAMES`` frames in all.

        Frames are buffered per label across batches so that blocks are large (fast E-steps)
        while at most ``4 * CHUNK_FRAMES`` frames are held in all."""
        buffers: dict[int, list[np.ndarray]] = {}
        sizes: dict[int, int] = {}

        def flush(y: int):
            sizes.pop(y)
            return buffers.pop(y), y

        for g, y in windows:
            if active is not None and not active[y]:
                continue
            for s in range(0, g.shape[0], CHUNK_FRAMES):
                part = g[s:s + CHUNK_FRAMES]
                if sizes.get(y, 0) + part.shape[0] > CHUNK_FRAMES:
                    yield flush(y)
                buffers.setdefault(y, []).append(part)
                sizes[y] = sizes.get(y, 0) + part.shape[0]
                if sum(sizes.values()) > 4 * CHUNK_FRAMES:
                    yield flush(max(sizes, key=lambda label: sizes[label]))
        for y in list(buffers):
            yield flush(y)

    # -- scoring --------------------------------------------------------------------------------
    @staticmethod
    def _blocks(grams: Sequence[np.ndarray]
                ) -> Iterator[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]]:
        """Yield ``(i, j, x, starts, lengths)``: windows ``grams[i:j]`` concatenated into frames
        x (about ``CHUNK_FRAMES`` or one window) with each window's start row and length."""
        i = 0
        while i < len(grams):
            j, frames = i, 0
            while j < len(grams) and (j == i or frames + grams[j].shape[0] <= CHUNK_FRAMES):
                frames += grams[j].shape[0]
                j += 1
            block = grams[i:j]
            lengths = np.array([g.shape[0] for g in block])
            x = np.concatenate([np.asarray(g) for g in block]).astype(np.float64, copy=False)
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            yield i, j, x, starts, lengths
            i = j

    def _loglik(self, grams) -> np.ndarray:
        """Mean frame log-likelihood of each window under each label's mixture: (n, labels).

        Windows are scored in blocks of about ``CHUNK_FRAMES`` frames, several labels' mixtures
        at once (one matrix product for all their components) while the (labels, k, frames)
        working array stays under ``SCORE_BLOCK_BYTES``."""
        nl, k = self.weights_.shape
        out = np.empty((len(grams), nl))
        terms, const = gauss_terms(self.weights_, self.means_, self.variances_)
        terms, const = terms.reshape(nl * k, -1), const.reshape(nl * k)
        d = self.means_.shape[2]
        for i, j, x, starts, lengths in self._blocks(grams):
            x2 = x * x
            group = max(1, SCORE_BLOCK_BYTES // (8 * k * x.shape[0]))
            for c0 in range(0, nl, group):
                c1 = min(nl, c0 + group)
                r = slice(c0 * k, c1 * k)
                a = terms[r, :d] @ x.T
                a += terms[r, d:] @ x2.T
                a += const[r, None]
                ll, _ = log_sum_exp(a.reshape(c1 - c0, k, -1), axis=1)         # (labels, n)
                out[i:j, c0:c1] = (np.add.reduceat(ll, starts, axis=1) / lengths).T
        return out

    def _mean_loglik(self, grams, c: int) -> np.ndarray:
        """Mean frame log-likelihood of each window under label ``c``'s mixture only: (n,)."""
        out = np.empty(len(grams))
        terms = gauss_terms(self.weights_[c], self.means_[c], self.variances_[c])
        for i, j, x, starts, lengths in self._blocks(grams):
            ll, _ = responsibilities((x, x * x), *terms)
            out[i:j] = np.add.reduceat(ll, starts) / lengths
        return out

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int = 0) -> int:
        """State, EM statistics, init reservoir and one E-step block (float64)."""
        k, d = self.params["components"], feature_dim
        state = n_labels * k * (2 * d + 1) * 8 * 3           # parameters + statistics + new parameters
        per_label = min(self.params["init_frames"], total_frames / max(n_labels, 1) * 1.5)
        reservoir = n_labels * per_label * d * 8             # only the filled part is resident
        kmeans = per_label * (1.5 * d + 2 * k) * 8           # x - centre, x² sums, distances, one-hot (one label)
        block = min(max(batch_frames, 1), CHUNK_FRAMES)
        estep = block * (d * 8 * 4 + k * 8 * 4)                 # x, x², products; log-probs, resp
        memo = cache_bytes(d, total_frames)
        # kept between EM passes (with frame_cache_mb unset, the memory plan counts what it grants)
        if self.params["frame_cache_mb"] is not None and memo <= self.params["frame_cache_mb"] << 20:
            state += memo
        return state + reservoir + max(kmeans, estep)

    def task_memory(self, feature_dim: int, n_labels: int, *, batch_frames: int, task_frames: float,
                    total_frames: int, window_frames: int) -> int:
        """Parameters and statistics, and the larger of the init sample a task keeps of its frames
        (kept and pending frames with their keys, the compaction's copies, the pickled result and
        the merges of a group of tasks: :data:`SAMPLE_COPIES` times the kept frames, measured) and
        one E-step block."""
        k, d = self.params["components"], feature_dim
        sample = n_labels * min(self.params["init_frames"], task_frames / max(n_labels, 1)) * (d + 1) * 8
        estep = 4 * CHUNK_FRAMES * d * 4 + CHUNK_FRAMES * (d * 8 * 4 + k * 8 * 4)
        return int(n_labels * k * (2 * d + 1) * 8 * 4 + max(sample * SAMPLE_COPIES, estep))

    def merged_memory(self, feature_dim: int, n_labels: int, total_frames: float) -> int:
        """The merged init sample (its last merges, unpickled)."""
        per_label = min(self.params["init_frames"], total_frames / max(n_labels, 1))
        return int(n_labels * per_label * (feature_dim + 1) * 8 * SAMPLE_COPIES)

    def decision_function(self, grams) -> np.ndarray:
        """Mean frame log-likelihoods ``(n_windows, n_labels)`` (with ``vtln``: at each window's
        best warp)."""
        self._check_grams(grams)
        return self.warped_loglik(grams)[0]

    def predict_proba(self, grams) -> np.ndarray:
        """Softmax over values of the mean frame log-likelihoods ``(n, labels)``: how the values
        rank relative to one another, not a calibrated probability (a window unlike every value
        still gets rows summing to one; see :meth:`predict_scores`' ``z`` for that)."""
        return self._proba(self.decision_function(grams))

    @staticmethod
    def _proba(s: np.ndarray) -> np.ndarray:
        s = s - s.max(axis=1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=1, keepdims=True)

    def predict_with_proba(self, grams) -> tuple[list[str], np.ndarray]:
        s = self.decision_function(grams)
        return self._labels_of(s), self._proba(s)

    def predict_scores(self, grams) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """Values, mean frame log-likelihoods ``(n, labels)`` and ``z``: how many training
        standard deviations the best score lies from the mean score of that value's training
        windows (NaN when the value had fewer than two training windows); with ``vtln``, ``warp``:
        each window's warp."""
        self._check_grams(grams)
        s, warps = self.warped_loglik(grams)
        best = s.argmax(axis=1)
        sd = self.score_sd_[best]
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(sd > 0, (s[np.arange(len(s)), best] - self.score_mean_[best]) / sd, np.nan)
        return self._labels_of(s), s, {"z": z, **warp_detail(self, warps)}

    def unknown_sd(self) -> float | None:
        """How many training sd below a value's mean score a window is ``unknown``: ``unknown_sd``,
        or the normal quantile of ``unknown_fpr``; None: never."""
        if self.params["unknown_sd"] is not None:
            return float(self.params["unknown_sd"])
        if self.params["unknown_fpr"] is not None:
            from scipy.special import ndtri

            return float(-ndtri(self.params["unknown_fpr"]))
        return None

    def _labels_of(self, s: np.ndarray) -> list[str]:
        best = s.argmax(axis=1)
        out = [self.fitted_labels[i] for i in best]
        t = self.unknown_sd()
        if t is not None:
            floor = self.score_mean_ - t * self.score_sd_
            for i, b in enumerate(best):
                if s[i, b] < floor[b]:
                    out[i] = self.UNKNOWN
        return out

    # -- export ---------------------------------------------------------------------------------
    def graph_loglik(self, g: Graph, gram: str) -> str:
        """Nodes of :meth:`_loglik` for one window (of one warp): the mean frame log-likelihood
        under each value's mixture, float64 ``(labels,)``, from ``[x, x²]`` times the mixtures' terms."""
        frames = graph_mixture_logliks(g, gram, self.weights_, self.means_, self.variances_)
        return g.reduce("ReduceMean", frames, [0], keepdims=False)

    def graph_scores(self, g: Graph, gram: str) -> dict[str, str]:
        """The mean frame log-likelihoods, the best value and its ``z`` (NaN without a training sd);
        with ``vtln``, at the best warp, and the warp."""
        s, warp = self.graph_warped(g, gram)
        best = g.op("ArgMax", s, axis=0, keepdims=1)
        sd = g.op("Gather", g.const(self.score_sd_), best)
        gap = g.op("Sub", g.op("Gather", s, best), g.op("Gather", g.const(self.score_mean_), best))
        z = g.op("Where", g.op("Greater", sd, g.const(np.float64(0.0))), g.op("Div", gap, sd),
                 g.const(np.float64(np.nan)))
        return {"scores": g.cast(s, FLOAT), "best": best, "z": g.cast(z, FLOAT), **graph_warp_detail(self, g, warp)}

    def graph_proba(self, g: Graph, gram: str) -> str:
        """:meth:`predict_proba` of one window (an ensemble member's), float64 ``(labels,)``."""
        return g.op("Softmax", self.graph_warped(g, gram)[0], axis=0)

    def unknown_rule(self) -> dict[str, Any] | None:
        t = self.unknown_sd()
        if t is None:
            return None
        return {"rule": "best_below", "floors": [float(v) for v in self.score_mean_ - t * self.score_sd_]}

    def live_unknown_rule(self, level: float | None = None) -> dict[str, Any] | None:
        """Live use without a trained rule: :func:`z_rule` (the ``z`` of every window)."""
        return z_rule(self.name, level)

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        self.check_is_fitted()
        return {"weights": self.weights_, "means": self.means_, "variances": self.variances_,
                "score_mean": self.score_mean_, "score_sd": self.score_sd_}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Set the learned state; its shapes must fit ``labels_``, ``components`` and
        ``feature_dim_`` (a :class:`ParameterError` names the first that does not)."""
        nl, k, d = len(self.labels_ or ()), self.params["components"], self.frame_dim
        shapes = {"weights": (nl, k), "means": (nl, k, d), "variances": (nl, k, d), "score_mean": (nl,),
                  "score_sd": (nl,)}
        arrays = state_arrays("gmm", state, shapes, f"{nl} label values, {k} components and {d} features")
        if (arrays["variances"] <= 0).any() or (arrays["weights"] < 0).any() or (arrays["score_sd"] < 0).any():
            raise ParameterError("gmm: variances must be positive, and weights and score_sd not negative")
        self.weights_, self.means_, self.variances_ = arrays["weights"], arrays["means"], arrays["variances"]
        self.score_mean_, self.score_sd_ = arrays["score_mean"], arrays["score_sd"]
