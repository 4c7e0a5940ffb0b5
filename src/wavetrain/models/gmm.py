"""``gmm``: one Gaussian mixture per label value, trained by streaming EM.

Training memory does not depend on the amount of data: each EM pass reads the stream batch by
batch and accumulates sufficient statistics (per component: weight, sum of x, sum of x²);
initialisation uses k-means++ and Lloyd steps on a bounded reservoir sample of frames.
A window is scored by its mean frame log-likelihood under each label's mixture; confidences are
the softmax of those scores.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from wavetrain.errors import UserError
from wavetrain.models.base import Classifier
from wavetrain.models.params import Param

_LOG_2PI = math.log(2 * math.pi)
#: Log-ratios to the best component are clipped here before exp: exp(-700) ~ 1e-304 adds nothing
#: next to the best term (1.0), and it keeps exp out of the subnormal range (-708 .. -745),
#: where it is ~100x slower (and ~15x below it) — common with well-separated components.
_EXP_FLOOR = -700.0
#: Frames per E-step block: bounds the working arrays (x, x², responsibilities) whatever the batch.
CHUNK_FRAMES = 8192
#: Bound of the (labels, components, frames) float64 array scored at once.
SCORE_BLOCK_BYTES = 4 << 20


# ---- private numeric functions (shapes in the docstrings) --------------------------------------
def _gauss_terms(weights: np.ndarray, means: np.ndarray, variances: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The terms of ``log(w N(x; mu, diag(var))) = x² · w2 + x · w1 + const`` per component.

    weights (..., k), means and variances (..., k, d) -> w2 = -0.5 / var, w1 = mu / var
    (..., k, d) and const (..., k): the squared distance expanded into two matrix products.
    """
    prec = 1.0 / variances
    const = np.log(weights) - 0.5 * (means.shape[-1] * _LOG_2PI + np.sum(np.log(variances), axis=-1)
                                     + np.sum(means * means * prec, axis=-1))
    return -0.5 * prec, means * prec, const


def _log_sum_exp(a: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``log(sum(exp(a), axis))`` and the sums of ``exp(a - max)``; ``a`` becomes exp(a - max).

    Log-ratios to the largest term are clipped at ``_EXP_FLOOR`` before exp."""
    m = a.max(axis=axis)
    a -= np.expand_dims(m, axis)
    np.maximum(a, _EXP_FLOOR, out=a)
    np.exp(a, out=a)
    total = a.sum(axis=axis)
    return m + np.log(total), total


def _frame_loglik(x: np.ndarray, weights: np.ndarray, means: np.ndarray, variances: np.ndarray,
                  x2: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-frame log-likelihood (n,) and responsibilities (k, n); one exp per entry.

    x (n, d) float64, optional x2 = x² (n, d).  Components come first: the reductions over the
    few components then run along the long axis (numpy reduces an (8, n) array along axis 0
    ~30x faster than an (n, 8) one along axis 1).
    """
    w2, w1, const = _gauss_terms(weights, means, variances)
    a = w2 @ (x * x if x2 is None else x2).T
    a += w1 @ x.T
    a += const[:, None]
    ll, total = _log_sum_exp(a, axis=0)
    a /= total
    return ll, a


def _kmeans_init(x: np.ndarray, k: int, rng: np.random.Generator, iters: int = 10
                 ) -> tuple[np.ndarray, np.ndarray]:
    """k-means++ seeding then Lloyd steps on a sample x (n, d) -> (means (k, d), labels (n,))."""
    n = x.shape[0]
    centers = np.empty((k, x.shape[1]))
    centers[0] = x[rng.integers(n)]
    d2 = np.sum((x - centers[0]) ** 2, axis=1)
    for i in range(1, k):
        p = d2 / d2.sum() if d2.sum() > 0 else None
        centers[i] = x[rng.choice(n, p=p)]
        d2 = np.minimum(d2, np.sum((x - centers[i]) ** 2, axis=1))
    labels = np.zeros(n, dtype=np.int64)
    cols = np.arange(n)
    xt = np.ascontiguousarray(x.T)
    onehot = np.zeros((k, n))
    for _ in range(iters):
        # argmin_j |x - c_j|^2 = argmin_j (|c_j|^2 - 2 c_j.x), as (k, n) reduced along axis 0
        dist = centers @ xt
        dist *= -2.0
        dist += (centers * centers).sum(1)[:, None]
        labels = dist.argmin(axis=0)
        onehot[:] = 0.0
        onehot[labels, cols] = 1.0
        counts = onehot.sum(axis=1)
        keep = counts > 0                       # an empty cluster keeps its centre
        centers[keep] = (onehot @ x)[keep] / counts[keep, None]
    return centers, labels


class _Stats:
    """Sufficient statistics of one mixture over one pass: N (k,), S1 (k, d), S2 (k, d)."""

    def __init__(self, k: int, d: int):
        self.n = np.zeros(k)
        self.s1 = np.zeros((k, d))
        self.s2 = np.zeros((k, d))
        self.ll = 0.0
        self.frames = 0

    def add(self, x: np.ndarray, resp: np.ndarray, ll: np.ndarray, x2: np.ndarray | None = None) -> None:
        """Frames x (n, d), responsibilities resp (k, n), frame log-likelihoods ll (n,)."""
        self.n += resp.sum(axis=1)
        self.s1 += resp @ x
        self.s2 += resp @ (x * x if x2 is None else x2)
        self.ll += float(ll.sum())
        self.frames += x.shape[0]


def _m_step(st: _Stats, reg: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """New (weights (k,), means (k, d), variances (k, d)) from statistics, as sklearn's M-step."""
    nk = st.n + 10 * np.finfo(float).eps
    means = st.s1 / nk[:, None]
    variances = st.s2 / nk[:, None] - means * means + reg
    variances = np.maximum(variances, reg)
    return nk / nk.sum(), means, variances


class _Reservoir:
    """A bounded uniform sample of frames (Algorithm R over frame blocks)."""

    def __init__(self, capacity: int, d: int, rng: np.random.Generator):
        self.buf = np.empty((capacity, d))
        self.size = 0
        self.seen = 0
        self.rng = rng

    def add_block(self, x: np.ndarray) -> None:
        cap = self.buf.shape[0]
        free = cap - self.size
        if free > 0:
            take = min(free, x.shape[0])
            self.buf[self.size:self.size + take] = x[:take]
            self.size += take
            self.seen += take
            x = x[take:]
        if x.shape[0] == 0:
            return
        # vectorised Algorithm R: item number t (0-based, t >= cap) replaces slot j ~ U[0, t]
        t = self.seen + np.arange(x.shape[0])
        j = (self.rng.random(x.shape[0]) * (t + 1)).astype(np.int64)
        keep = j < cap
        self.buf[j[keep]] = x[keep]  # later rows win, as in the sequential algorithm
        self.seen += x.shape[0]

    def sample(self) -> np.ndarray:
        return self.buf[:self.size]


class GMMClassifier(Classifier):
    """One diagonal Gaussian mixture per label value.

    Parameters (see ``wavetrain models``) are declared in :attr:`params`.

    Attributes
    ----------
    weights_ : (labels, k)  means_ : (labels, k, d)  variances_ : (labels, k, d)
    score_mean_, score_sd_ : (labels,)  mean frame log-likelihood of the training windows of each
        label under its own mixture (used by ``unknown_sd``).
    """

    name = "gmm"
    summary = "one Gaussian mixture per label value; windows scored by mean frame log-likelihood"
    default_features = "mfcc(bands=40, coeffs=13, window_ms=25, shift_pct=40) | delta(order=2)"
    params = (
        Param("components", 8, "mixture components per label value", int, low=1, high=1024),
        Param("covariance", "diag", "covariance type (diagonal)", str, choices=("diag",)),
        Param("max_iter", 100, "maximum EM passes over the training data (each label stops on its own at tol)", int, low=1),
        Param("tol", 1e-3, "stop when the mean frame log-likelihood improves less than this", float, low=0),
        Param("reg", 1e-4, "added to every variance (numerical floor)", float, low=0),
        Param("init_frames", 20000, "frames per label kept in the reservoir for k-means++ init", int, low=16),
        Param("seed", 0, "random seed (initialisation)", int, low=0),
        Param("frame_cache_mb", 64, "keep all training frames in memory between EM passes when they fit in this "
              "many MB (float64); larger data sets are re-read from the feature store each pass", int, low=0),
        Param("unknown_sd", None, "predict 'unknown' when the best score is this many training sd below "
              "that label's training mean (none = never)", float, low=0, optional=True),
    )

    UNKNOWN = "unknown"

    # -- training -------------------------------------------------------------------------------
    def _fit(self, stream, valid=None, *, progress: bool = False, **_: Any) -> None:
        from wavetrain.progress import progress_bar

        p = self.params
        nl, k, d = len(self.labels_), p["components"], self.feature_dim_
        rng = np.random.default_rng(p["seed"])
        reservoirs = [_Reservoir(p["init_frames"], d, rng) for _ in range(nl)]
        for batch in stream.batches():
            for g, y in zip(batch.grams, batch.y):
                if y >= 0:
                    reservoirs[y].add_block(np.asarray(g, dtype=np.float64))
        self.weights_ = np.zeros((nl, k))
        self.means_ = np.zeros((nl, k, d))
        self.variances_ = np.zeros((nl, k, d))
        for c, res in enumerate(reservoirs):
            x = res.sample()
            if x.shape[0] < k:
                raise UserError(f"gmm: label value {self.labels_[c]!r} has {x.shape[0]} feature frames, "
                                f"fewer than components={k}; add data or lower --set components=")
            centers, lab = _kmeans_init(x, k, rng)
            # initial parameters from the hard assignment, as sklearn's kmeans init
            resp = np.zeros((k, x.shape[0]))
            resp[lab, np.arange(x.shape[0])] = 1.0
            st = _Stats(k, d)
            st.add(x, resp, np.zeros(x.shape[0]))
            self.weights_[c], self.means_[c], self.variances_[c] = _m_step(st, p["reg"])
        # Each label's mixture converges on its own (as fitting one sklearn model per label would):
        # a converged label is frozen and its frames are no longer scored.
        prev = np.full(nl, -np.inf)
        last = np.zeros(nl)
        frames_of = np.zeros(nl)
        active = np.ones(nl, dtype=bool)
        self.history_ = []
        total_frames = sum(r.seen for r in reservoirs)
        # frames and their squares, kept between passes when they fit frame_cache_mb
        blocks: list | None = [] if 2 * total_frames * d * 8 <= p["frame_cache_mb"] * (1 << 20) else None
        bar = progress_bar(range(p["max_iter"]), desc="gmm EM", unit="pass", enable=progress)
        for it in bar:
            stats = [_Stats(k, d) for _ in range(nl)]
            if blocks is not None and it > 0:
                source = blocks
            else:
                source = ((x, x * x, y) for x, y in self._frames_by_label(stream, active))
            for x, x2, y in source:
                if not active[y]:
                    continue
                if blocks is not None and it == 0:
                    blocks.append((x, x2, y))
                ll, resp = _frame_loglik(x, self.weights_[y], self.means_[y], self.variances_[y], x2)
                stats[y].add(x, resp, ll, x2)
            for c in np.flatnonzero(active):
                st = stats[c]
                self.weights_[c], self.means_[c], self.variances_[c] = _m_step(st, p["reg"])
                last[c], frames_of[c] = st.ll / max(st.frames, 1), st.frames
                if abs(last[c] - prev[c]) < p["tol"]:
                    active[c] = False
                prev[c] = last[c]
            mean_ll = float(np.sum(last * frames_of) / max(frames_of.sum(), 1))
            self.history_.append({"iteration": it + 1, "mean_loglik": mean_ll, "frames": int(frames_of.sum()),
                                  "active_labels": int(active.sum())})
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loglik=f"{mean_ll:.4f}", active=int(active.sum()))
            if not active.any():
                break
        self.converged_ = not active.any()
        if not self.converged_:
            import logging

            logging.getLogger(__name__).warning(
                "gmm: %d label mixture(s) did not converge in max_iter=%d passes; raise --set max_iter= or tol=",
                int(active.sum()), p["max_iter"])
        # per-label score statistics of the training windows (for unknown detection): each window
        # is scored under its own label's mixture only
        sums = np.zeros((nl, 3))
        for batch in stream.batches():
            for c in np.unique(np.asarray(batch.y)[np.asarray(batch.y) >= 0]):
                own = [g for g, y in zip(batch.grams, batch.y) if y == c]
                s = self._mean_loglik(own, int(c))
                sums[c] += (s.size, s.sum(), (s * s).sum())
        n = np.maximum(sums[:, 0], 1)
        self.score_mean_ = sums[:, 1] / n
        self.score_sd_ = np.sqrt(np.maximum(sums[:, 2] / n - self.score_mean_ ** 2, 0))

    @staticmethod
    def _frames_by_label(stream, active: np.ndarray | None = None):
        """Yield ``(frames (n <= CHUNK_FRAMES, d) float64, label index)`` blocks.

        Frames are buffered per label across batches so that blocks are large (fast E-steps)
        while at most ``4 * CHUNK_FRAMES`` frames are held in all."""
        buffers: dict[int, list[np.ndarray]] = {}
        sizes: dict[int, int] = {}

        def flush(y: int):
            x = np.concatenate(buffers.pop(y)).astype(np.float64, copy=False)
            sizes.pop(y)
            return x, y

        for batch in stream.batches():
            for g, y in zip(batch.grams, batch.y):
                if y < 0 or (active is not None and not active[y]):
                    continue
                y = int(y)
                for s in range(0, g.shape[0], CHUNK_FRAMES):
                    part = g[s:s + CHUNK_FRAMES]
                    if sizes.get(y, 0) + part.shape[0] > CHUNK_FRAMES:
                        yield flush(y)
                    buffers.setdefault(y, []).append(part)
                    sizes[y] = sizes.get(y, 0) + part.shape[0]
                    if sum(sizes.values()) > 4 * CHUNK_FRAMES:
                        yield flush(max(sizes, key=sizes.get))
        for y in list(buffers):
            yield flush(y)

    # -- scoring --------------------------------------------------------------------------------
    @staticmethod
    def _blocks(grams):
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

    def _scores(self, grams) -> np.ndarray:
        """Mean frame log-likelihood of each window under each label's mixture: (n, labels).

        Windows are scored in blocks of about ``CHUNK_FRAMES`` frames, several labels' mixtures
        at once (one matrix product for all their components) while the (labels, k, frames)
        working array stays under ``SCORE_BLOCK_BYTES``."""
        nl, k = self.weights_.shape
        out = np.empty((len(grams), nl))
        w2, w1, const = _gauss_terms(self.weights_, self.means_, self.variances_)
        w2, w1, const = w2.reshape(nl * k, -1), w1.reshape(nl * k, -1), const.reshape(nl * k)
        for i, j, x, starts, lengths in self._blocks(grams):
            x2 = x * x
            group = max(1, SCORE_BLOCK_BYTES // (8 * k * x.shape[0]))
            for c0 in range(0, nl, group):
                c1 = min(nl, c0 + group)
                r = slice(c0 * k, c1 * k)
                a = w2[r] @ x2.T
                a += w1[r] @ x.T
                a += const[r, None]
                ll, _ = _log_sum_exp(a.reshape(c1 - c0, k, -1), axis=1)         # (labels, n)
                out[i:j, c0:c1] = (np.add.reduceat(ll, starts, axis=1) / lengths).T
        return out

    def _mean_loglik(self, grams, c: int) -> np.ndarray:
        """Mean frame log-likelihood of each window under label ``c``'s mixture only: (n,)."""
        out = np.empty(len(grams))
        for i, j, x, starts, lengths in self._blocks(grams):
            ll, _ = _frame_loglik(x, self.weights_[c], self.means_[c], self.variances_[c])
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
        all_frames = 2 * total_frames * d * 8                   # frames and their squares
        if all_frames <= self.params["frame_cache_mb"] * (1 << 20):
            state += all_frames                                 # kept between EM passes
        return state + reservoir + max(kmeans, estep)

    def decision_function(self, grams) -> np.ndarray:
        """Mean frame log-likelihoods ``(n_windows, n_labels)``."""
        self._check_grams(grams)
        return self._scores(grams)

    def predict_proba(self, grams) -> np.ndarray:
        return self._proba(self.decision_function(grams))

    @staticmethod
    def _proba(s: np.ndarray) -> np.ndarray:
        s = s - s.max(axis=1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, grams) -> list[str]:
        return self._labels_of(self.decision_function(grams))

    def predict_with_proba(self, grams) -> tuple[list[str], np.ndarray]:
        s = self.decision_function(grams)
        return self._labels_of(s), self._proba(s)

    def _labels_of(self, s: np.ndarray) -> list[str]:
        best = s.argmax(axis=1)
        out = [self.labels_[i] for i in best]
        t = self.params["unknown_sd"]
        if t is not None:
            floor = self.score_mean_ - t * self.score_sd_
            for i, b in enumerate(best):
                if s[i, b] < floor[b]:
                    out[i] = self.UNKNOWN
        return out

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        self.check_is_fitted()
        return {"weights": self.weights_, "means": self.means_, "variances": self.variances_,
                "score_mean": self.score_mean_, "score_sd": self.score_sd_}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.weights_ = np.asarray(state["weights"], dtype=np.float64)
        self.means_ = np.asarray(state["means"], dtype=np.float64)
        self.variances_ = np.asarray(state["variances"], dtype=np.float64)
        self.score_mean_ = np.asarray(state["score_mean"], dtype=np.float64)
        self.score_sd_ = np.asarray(state["score_sd"], dtype=np.float64)
