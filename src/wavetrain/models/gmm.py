"""``gmm``: one Gaussian mixture per label value, trained by streaming EM.

Training memory does not depend on the amount of data: each EM pass reads the stream batch by
batch and accumulates sufficient statistics (per component: weight, sum of x, sum of x²);
initialisation uses k-means++ and Lloyd steps on a bounded reservoir sample of frames. When all
training frames fit ``frame_cache_mb`` they are kept in memory after the first pass and each
label's mixture is fitted on them to convergence, one label after another. Between EM steps,
SQUAREM extrapolation (``accelerate``) cuts the passes needed; an extrapolated point is kept
only when it does not lower the log-likelihood.
A window is scored by its mean frame log-likelihood under each label's mixture; confidences are
the softmax of those scores.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from wavetrain.errors import ParameterError, UserError
from wavetrain.models.base import Classifier
from wavetrain.models.params import Param

_LOG_2PI = math.log(2 * math.pi)
#: Log-ratios to the best component are clipped here before exp: exp(-700) ~ 1e-304 adds nothing
#: next to the best term (1.0), and it keeps exp out of the subnormal range (-708 .. -745),
#: where it is ~100x slower (and ~15x below it) — common with well-separated components.
_EXP_FLOOR = -700.0
#: Frames per E-step block: bounds the working arrays (x, x², responsibilities) whatever the batch.
CHUNK_FRAMES = 8192
#: Rows per block of the training frames kept in memory (1.25 MB for 39 features): small enough
#: that a label's last, partly filled block wastes little, large enough for fast E-steps.
MEMO_BLOCK_FRAMES = 2048
#: Bound of the (labels, components, frames) float64 array scored at once.
SCORE_BLOCK_BYTES = 4 << 20


# ---- private numeric functions (shapes in the docstrings) --------------------------------------
def _gauss_terms(weights: np.ndarray, means: np.ndarray, variances: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The terms of ``log(w N(x; mu, diag(var))) = [x, x²] · W + const`` per component.

    weights (..., k), means and variances (..., k, d) -> W (..., k, 2d) = [mu / var, -0.5 / var]
    and const (..., k): the squared distance expanded into one matrix product with ``[x, x²]``.
    """
    prec = 1.0 / variances
    const = np.log(weights) - 0.5 * (means.shape[-1] * _LOG_2PI + np.sum(np.log(variances), axis=-1)
                                     + np.sum(means * means * prec, axis=-1))
    return np.concatenate([means * prec, -0.5 * prec], axis=-1), const


def _log_sum_exp(a: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``log(sum(exp(a), axis))`` and the sums of ``exp(a - max)``; ``a`` becomes exp(a - max).

    Log-ratios to the largest term are clipped at ``_EXP_FLOOR`` before exp."""
    m = a.max(axis=axis)
    a -= np.expand_dims(m, axis)
    np.maximum(a, _EXP_FLOOR, out=a)
    np.exp(a, out=a)
    total = a.sum(axis=axis)
    return m + np.log(total), total


def _estep(xx, terms: np.ndarray, const: np.ndarray, out: np.ndarray | None = None,
           tmp: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-frame log-likelihood (n,) and responsibilities (k, n) of frames xx = [x, x²] (n, 2d),
    or of the pair ``(x, x²)`` of (n, d) arrays (streamed blocks: filling one (n, 2d) array
    costs more than the second matrix product saves).

    Components come first: the reductions over the few components then run along the long axis
    (numpy reduces an (8, n) array along axis 0 ~30x faster than an (n, 8) one along axis 1).
    ``out`` and ``tmp`` (k, n), when given, are used instead of new arrays; the responsibilities
    are ``out``."""
    if isinstance(xx, tuple):
        x, x2 = xx
        d = x.shape[1]
        a = np.matmul(terms[:, :d], x.T, out=out)
        a += np.matmul(terms[:, d:], x2.T, out=tmp)
    else:
        a = np.matmul(terms, xx.T, out=out)
    a += const[:, None]
    ll, total = _log_sum_exp(a, axis=0)
    a /= total
    return ll, a


class _Workspace:
    """E-step buffers reused from block to block: frames x and x² and the (k, n) arrays.

    Streamed blocks are filled as two contiguous (n, d) arrays rather than one (n, 2d): numpy
    fills the halves of an (n, 2d) array row by row (39-element inner loops), which cost more
    (1.2 vs 0.6 ms per 8,192 frames) than the second matrix product saves."""

    def __init__(self, k: int, d: int, frames: int = CHUNK_FRAMES):
        self.k, self.d = k, d
        self._x = np.empty((frames, d))
        self._x2 = np.empty((frames, d))
        self._a = np.empty((2, k * frames))

    def frames(self, parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``(x, x²)``, each (n, d) float64, of the parts (n_i, d) concatenated (n <= the capacity)."""
        n = sum(p.shape[0] for p in parts)
        x, x2 = self._x[:n], self._x2[:n]
        np.concatenate(parts, axis=0, out=x)
        np.multiply(x, x, out=x2)
        return x, x2

    def out(self, n: int) -> dict[str, np.ndarray]:
        """The ``out`` and ``tmp`` (k, n) arrays of :func:`_estep`."""
        return {"out": self._a[0, :self.k * n].reshape(self.k, n),
                "tmp": self._a[1, :self.k * n].reshape(self.k, n)}


def _frame_loglik(x: np.ndarray, weights: np.ndarray, means: np.ndarray, variances: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per-frame log-likelihood (n,) and responsibilities (k, n) of frames x (n, d)."""
    x = np.asarray(x, dtype=np.float64)
    return _estep((x, x * x), *_gauss_terms(weights, means, variances))


def _kmeans_init(x: np.ndarray, k: int, rng: np.random.Generator, iters: int = 10
                 ) -> tuple[np.ndarray, np.ndarray]:
    """k-means++ seeding then Lloyd steps on a sample x (n, d) -> (means (k, d), labels (n,))."""
    n = x.shape[0]
    centers = np.empty((k, x.shape[1]))
    centers[0] = x[rng.integers(n)]
    # squared distances to the nearest centre so far, expanded: |x|² - 2 x.c + |c|² (one GEMV each)
    x_sq = np.einsum("ij,ij->i", x, x)
    d2 = np.maximum(x_sq - 2.0 * (x @ centers[0]) + centers[0] @ centers[0], 0.0)
    for i in range(1, k):
        cdf = np.cumsum(d2)
        # a frame drawn with probability d2 / sum(d2) (uniformly when every frame is a centre)
        pick = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")) if cdf[-1] > 0 else rng.integers(n)
        centers[i] = x[min(pick, n - 1)]
        np.minimum(d2, np.maximum(x_sq - 2.0 * (x @ centers[i]) + centers[i] @ centers[i], 0.0), out=d2)
    labels = np.zeros(n, dtype=np.int64)
    cols = np.arange(n)
    xt = np.ascontiguousarray(x.T)
    onehot = np.zeros((k, n))
    for step in range(iters):
        # argmin_j |x - c_j|^2 = argmin_j (|c_j|^2 - 2 c_j.x), as (k, n) reduced along axis 0
        dist = centers @ xt
        dist *= -2.0
        dist += (centers * centers).sum(1)[:, None]
        new = dist.argmin(axis=0)
        if step > 0 and np.array_equal(new, labels):
            break                               # a fixed point: the centres would not move
        labels = new
        onehot[:] = 0.0
        onehot[labels, cols] = 1.0
        counts = onehot.sum(axis=1)
        keep = counts > 0                       # an empty cluster keeps its centre
        centers[keep] = (onehot @ x)[keep] / counts[keep, None]
    return centers, labels


def _labelled(stream):
    """Yield ``(gram, label index)`` of every labelled window of one pass over ``stream``."""
    for batch in stream.batches():
        for g, y in zip(batch.grams, batch.y):
            if y >= 0:
                yield g, int(y)


class _Stats:
    """Sufficient statistics of one mixture over one pass: N (k,), S = [sum x, sum x²] (k, 2d)."""

    def __init__(self, k: int, d: int):
        self.n = np.zeros(k)
        self.s = np.zeros((k, 2 * d))
        self.ll = 0.0
        self.frames = 0

    def add(self, xx, resp: np.ndarray, ll: np.ndarray | None = None) -> None:
        """Frames xx = [x, x²] (n, 2d) or the pair (x, x²), responsibilities resp (k, n), frame
        log-likelihoods ll (n,)."""
        self.n += resp.sum(axis=1)
        if isinstance(xx, tuple):
            d = xx[0].shape[1]
            self.s[:, :d] += resp @ xx[0]
            self.s[:, d:] += resp @ xx[1]
        else:
            self.s += resp @ xx
        if ll is not None:
            self.ll += float(ll.sum())
        self.frames += resp.shape[1]


def _m_step(st: _Stats, reg: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """New (weights (k,), means (k, d), variances (k, d)) from statistics, as sklearn's M-step."""
    d = st.s.shape[1] // 2
    nk = st.n + 10 * np.finfo(float).eps
    means = st.s[:, :d] / nk[:, None]
    variances = st.s[:, d:] / nk[:, None] - means * means + reg
    variances = np.maximum(variances, reg)
    return nk / nk.sum(), means, variances


class _LabelEM:
    """EM of one label's mixture, driven one E-step at a time.

    Each E-step's statistics (taken at :attr:`theta`) go to :meth:`step`, which sets the next
    :attr:`theta`. With ``accelerate``, every two plain EM steps are followed by a SQUAREM
    extrapolation (Varadhan & Roland 2008, step length S3) in the space of log weights, means and
    log variances; the E-step at the extrapolated point keeps it only if its log-likelihood is at
    least that of the point before (else the plain EM point is taken), then an EM step from it
    starts the next cycle. Convergence is judged on plain EM steps only, as sklearn's: the mean
    frame log-likelihood improved by less than ``tol``.
    """

    def __init__(self, theta, tol: float, reg: float, accelerate: bool):
        self.theta, self.tol, self.reg, self.accelerate = theta, tol, reg, accelerate
        self.done = False
        self.loglik: list[float] = []      # mean frame log-likelihood of each E-step (of a rejected
                                           # extrapolated point: that of the point kept instead)
        self.frames = 0
        self._phase, self._prev, self._step_max = 0, -np.inf, 1.0

    @property
    def result(self):
        """The parameters to keep: never an extrapolated point that was not checked."""
        return self._theta2 if self._phase == 2 else self.theta

    def step(self, st: _Stats) -> None:
        ll = st.ll / max(st.frames, 1)
        self.frames = st.frames
        new = _m_step(st, self.reg)
        if self._phase == 2:                          # the E-step at the extrapolated point
            if np.isfinite(ll) and ll >= self._ll1:
                self._prev, self.theta = ll, new
            else:                                     # rejected: the history keeps theta1's
                ll = self._prev = self._ll1
                self.theta = self._theta2
                self._step_max = max(1.0, self._step_max / 4)
            self.loglik.append(ll)
            self._phase = 0
            return
        self.loglik.append(ll)
        converged = abs(ll - self._prev) < self.tol
        self._prev = ll
        if converged or not self.accelerate:
            self.theta, self.done = new, converged
        elif self._phase == 0:                        # E-step at theta0; new is theta1
            self._theta0, self.theta, self._phase = self.theta, new, 1
        else:                                         # E-step at theta1; new is theta2
            self._ll1, self._theta2 = ll, new
            self.theta = self._extrapolate(self._theta0, self.theta, new)
            self._phase = 2

    def _extrapolate(self, t0, t1, t2):
        p0, p1, p2 = (np.concatenate([np.log(w), mu.ravel(), np.log(var).ravel()]) for w, mu, var in (t0, t1, t2))
        r = p1 - p0
        v = p2 - p1 - r
        vv = float(v @ v)
        alpha = -math.sqrt(float(r @ r) / vv) if vv > 0 else -1.0
        alpha = min(-1.0, max(alpha, -self._step_max))
        if alpha == -self._step_max:
            self._step_max *= 4
        p = p0 - 2 * alpha * r + alpha * alpha * v
        k, d = t0[1].shape
        logw, mu, logvar = p[:k], p[k:k + k * d].reshape(k, d), p[k + k * d:].reshape(k, d)
        if not np.all(np.isfinite(p)) or np.any(logvar > 700):
            return t2
        w = np.exp(logw - logw.max())
        return w / w.sum(), mu, np.maximum(np.exp(logvar), self.reg)


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


class _LabelFrames:
    """Every training frame in memory as ``[x, x²]`` per label, with each window's length, kept
    while they fit in ``budget`` bytes (given up as soon as they do not).

    Filled during the first pass over the stream, window by window, straight into per-label
    blocks of ``MEMO_BLOCK_FRAMES`` rows (no intermediate copy; the last block of each label is
    trimmed at the end). EM passes and the training score statistics then run on these blocks
    instead of reading the stream again."""

    def __init__(self, n_labels: int, d: int, budget: int):
        self.d, self.budget, self.bytes = d, budget, 0
        self.blocks: list[list[np.ndarray]] | None = [[] for _ in range(n_labels)] if budget > 0 else None
        self._fill = [0] * n_labels                   # rows used in each label's last block
        self._lengths: list[list[int]] = [[] for _ in range(n_labels)]

    def add(self, y: int, g: np.ndarray) -> None:
        """A window's frames g (n, d) of label index y (copied, as float64, with their squares)."""
        if self.blocks is None or g.shape[0] == 0:
            return
        self.bytes += 2 * g.shape[0] * self.d * 8
        if self.bytes > self.budget:
            self.blocks = None
            return
        self._lengths[y].append(g.shape[0])
        blocks, d, row = self.blocks[y], self.d, 0
        while row < g.shape[0]:
            if not blocks or self._fill[y] == blocks[-1].shape[0]:
                blocks.append(np.empty((MEMO_BLOCK_FRAMES, 2 * d)))
                self._fill[y] = 0
            block, at = blocks[-1], self._fill[y]
            take = min(g.shape[0] - row, block.shape[0] - at)
            dst = block[at:at + take]
            dst[:, :d] = g[row:row + take]
            np.multiply(dst[:, :d], dst[:, :d], out=dst[:, d:])
            self._fill[y] += take
            row += take

    def finish(self) -> list[tuple[list[np.ndarray], np.ndarray]] | None:
        """Per label: (blocks of frames [x, x²] (n_i, 2d) float64, window lengths (windows,));
        None if given up."""
        if self.blocks is None:
            return None
        out = []
        for c, blocks in enumerate(self.blocks):
            if blocks and self._fill[c] < blocks[-1].shape[0]:
                blocks[-1] = blocks[-1][:self._fill[c]].copy()       # trimmed: no unused rows kept
            out.append((blocks, np.array(self._lengths[c], dtype=np.int64)))
        self.blocks = None
        return out


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
        Param("accelerate", True, "SQUAREM extrapolation between EM passes: fewer passes to converge", bool),
        Param("tol", 1e-3, "stop when the mean frame log-likelihood improves less than this", float, low=0),
        Param("reg", 1e-4, "added to every variance (numerical floor)", float, low=0),
        Param("init_frames", 20000, "frames per label kept in the reservoir for k-means++ init", int, low=16),
        Param("seed", 0, "random seed (initialisation)", int, low=0),
        Param("frame_cache_mb", 64, "keep all training frames (and their squares, float64) in memory for EM when "
              "they fit in this many MB; larger data sets are re-read from the feature store each pass", int, low=0),
        Param("unknown_sd", None, "predict 'unknown' when the best score is this many training sd below "
              "that label's training mean (none = never)", float, low=0, optional=True),
    )

    UNKNOWN = "unknown"
    score_kind = "mean_loglik"

    # -- training -------------------------------------------------------------------------------
    def _fit(self, stream, valid=None, *, progress: bool = False, **_: Any) -> None:
        from wavetrain.progress import progress_bar

        p = self.params
        nl, k, d = len(self.labels_), p["components"], self.feature_dim_
        rng = np.random.default_rng(p["seed"])
        reservoirs = [_Reservoir(p["init_frames"], d, rng) for _ in range(nl)]
        # One pass over the stream: the init sample, and every frame when the stream says they
        # fit frame_cache_mb (as [x, x²] float64). A stream that cannot say gets a second pass to
        # gather them once the first has counted them: gathering blindly could hold the whole
        # budget in vain.
        budget = p["frame_cache_mb"] << 20
        expected = getattr(stream, "expected_frames", lambda: None)()
        memo = _LabelFrames(nl, d, budget if expected is not None and 2 * expected * d * 8 <= budget else 0)
        for g, y in _labelled(stream):
            reservoirs[y].add_block(np.asarray(g, dtype=np.float64))
            memo.add(y, g)
        frames = memo.finish()
        if frames is None and 0 < 2 * sum(r.seen for r in reservoirs) * d * 8 <= budget:
            memo = _LabelFrames(nl, d, budget)
            for g, y in _labelled(stream):
                memo.add(y, g)
            frames = memo.finish()
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
            for s in range(0, x.shape[0], CHUNK_FRAMES):          # x² a block at a time
                part = x[s:s + CHUNK_FRAMES]
                st.add((part, part * part), resp[:, s:s + CHUNK_FRAMES])
            self.weights_[c], self.means_[c], self.variances_[c] = _m_step(st, p["reg"])
        # Each label's mixture converges on its own (as fitting one sklearn model per label would):
        # a converged label is frozen and its frames are no longer scored.
        ws = _Workspace(k, d)
        ems = [_LabelEM((self.weights_[c], self.means_[c], self.variances_[c]), p["tol"], p["reg"],
                        p["accelerate"]) for c in range(nl)]
        if frames is not None:
            # frames in memory: label after label, each to convergence (its frames stay in cache)
            bar = progress_bar(range(nl), desc="gmm EM", unit="label", enable=progress)
            for c in bar:
                em, blocks = ems[c], frames[c][0]
                while not em.done and len(em.loglik) < p["max_iter"]:
                    em.step(self._label_pass(blocks, em.theta, ws))
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(passes=len(em.loglik))
        else:
            bar = progress_bar(range(p["max_iter"]), desc="gmm EM", unit="pass", enable=progress)
            for _ in bar:
                active = np.array([not em.done for em in ems])
                stats = self._stream_pass(stream, [em.theta for em in ems], active, ws)
                for c in np.flatnonzero(active):
                    ems[c].step(stats[c])
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(active=sum(not em.done for em in ems))
                if all(em.done for em in ems):
                    break
        for c, em in enumerate(ems):
            self.weights_[c], self.means_[c], self.variances_[c] = em.result
        self.history_ = self._history(ems)
        self.converged_ = all(em.done for em in ems)
        if not self.converged_:
            import logging

            logging.getLogger(__name__).warning(
                "gmm: %d label mixture(s) did not converge in max_iter=%d passes; raise --set max_iter= or tol=",
                sum(not em.done for em in ems), p["max_iter"])
        self._training_score_stats(stream, frames)

    def _label_pass(self, blocks: list[np.ndarray], theta, ws: _Workspace) -> _Stats:
        """One E-step over one label's frames in memory: blocks of [x, x²] (n_i, 2d)."""
        st = _Stats(theta[0].shape[0], self.feature_dim_)
        terms = _gauss_terms(*theta)
        for xx in blocks:
            ll, resp = _estep(xx, *terms, **ws.out(xx.shape[0]))
            st.add(xx, resp, ll)
        return st

    def _stream_pass(self, stream, thetas, active: np.ndarray, ws: _Workspace) -> list[_Stats]:
        """One E-step over the training frames of the active labels, read from the stream."""
        k = self.params["components"]
        stats = [_Stats(k, self.feature_dim_) for _ in thetas]
        terms = {int(c): _gauss_terms(*thetas[c]) for c in np.flatnonzero(active)}
        for parts, c in self._frames_by_label(stream, active):
            xx = ws.frames(parts)
            ll, resp = _estep(xx, *terms[c], **ws.out(xx[0].shape[0]))
            stats[c].add(xx, resp, ll)
        return stats

    @staticmethod
    def _history(ems: list[_LabelEM]) -> list[dict]:
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

    def _training_score_stats(self, stream, frames) -> None:
        """Mean and sd, per label, of the training windows' scores under their own label's mixture
        (for unknown detection)."""
        nl = len(self.labels_)
        sums = np.zeros((nl, 3))
        if frames is not None:
            for c, (blocks, lengths) in enumerate(frames):
                if not lengths.size:
                    continue
                terms = _gauss_terms(self.weights_[c], self.means_[c], self.variances_[c])
                ll = np.concatenate([_estep(xx, *terms)[0] for xx in blocks])
                starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
                s = np.add.reduceat(ll, starts) / lengths
                sums[c] = (s.size, s.sum(), (s * s).sum())
        else:
            for batch in stream.batches():
                for c in np.unique(np.asarray(batch.y)[np.asarray(batch.y) >= 0]):
                    own = [g for g, y in zip(batch.grams, batch.y) if y == c and g.shape[0] > 0]
                    if not own:
                        continue
                    s = self._mean_loglik(own, int(c))
                    sums[c] += (s.size, s.sum(), (s * s).sum())
        n = np.maximum(sums[:, 0], 1)
        self.score_mean_ = sums[:, 1] / n
        self.score_sd_ = np.sqrt(np.maximum(sums[:, 2] / n - self.score_mean_ ** 2, 0))

    @staticmethod
    def _frames_by_label(stream, active: np.ndarray | None = None):
        """Yield ``(parts, label index)``: windows' frames (n_i, d) of one label, at most
        ``CHUNK_FRAMES`` frames in all.

        Frames are buffered per label across batches so that blocks are large (fast E-steps)
        while at most ``4 * CHUNK_FRAMES`` frames are held in all."""
        buffers: dict[int, list[np.ndarray]] = {}
        sizes: dict[int, int] = {}

        def flush(y: int):
            sizes.pop(y)
            return buffers.pop(y), y

        for g, y in _labelled(stream):
            if active is not None and not active[y]:
                continue
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
        terms, const = _gauss_terms(self.weights_, self.means_, self.variances_)
        terms, const = terms.reshape(nl * k, -1), const.reshape(nl * k)
        d = self.feature_dim_
        for i, j, x, starts, lengths in self._blocks(grams):
            x2 = x * x
            group = max(1, SCORE_BLOCK_BYTES // (8 * k * x.shape[0]))
            for c0 in range(0, nl, group):
                c1 = min(nl, c0 + group)
                r = slice(c0 * k, c1 * k)
                a = terms[r, :d] @ x.T
                a += terms[r, d:] @ x2.T
                a += const[r, None]
                ll, _ = _log_sum_exp(a.reshape(c1 - c0, k, -1), axis=1)         # (labels, n)
                out[i:j, c0:c1] = (np.add.reduceat(ll, starts, axis=1) / lengths).T
        return out

    def _mean_loglik(self, grams, c: int) -> np.ndarray:
        """Mean frame log-likelihood of each window under label ``c``'s mixture only: (n,)."""
        out = np.empty(len(grams))
        terms = _gauss_terms(self.weights_[c], self.means_[c], self.variances_[c])
        for i, j, x, starts, lengths in self._blocks(grams):
            ll, _ = _estep((x, x * x), *terms)
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
            # kept between EM passes, in blocks (each label's last one full until trimmed)
            state += all_frames + n_labels * MEMO_BLOCK_FRAMES * 2 * d * 8
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

    def predict_scores(self, grams) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """Values, mean frame log-likelihoods ``(n, labels)`` and ``z``: how many training
        standard deviations the best score lies from the mean score of that value's training
        windows (NaN when the value had fewer than two training windows)."""
        s = self.decision_function(grams)
        best = s.argmax(axis=1)
        sd = self.score_sd_[best]
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(sd > 0, (s[np.arange(len(s)), best] - self.score_mean_[best]) / sd, np.nan)
        return self._labels_of(s), s, {"z": z}

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
        """Set the learned state; its shapes must fit ``labels_``, ``components`` and
        ``feature_dim_`` (a :class:`ParameterError` names the first that does not)."""
        nl, k, d = len(self.labels_ or ()), self.params["components"], self.feature_dim_
        shapes = {"weights": (nl, k), "means": (nl, k, d), "variances": (nl, k, d), "score_mean": (nl,),
                  "score_sd": (nl,)}
        arrays = {}
        for name, shape in shapes.items():
            if name not in state:
                raise ParameterError(f"gmm: state lacks {name!r}")
            a = np.asarray(state[name], dtype=np.float64)
            if a.shape != shape:
                raise ParameterError(f"gmm: {name} has shape {a.shape}, expected {shape} for {nl} label values, "
                                     f"{k} components and {d} features")
            arrays[name] = a
        if (arrays["variances"] <= 0).any() or (arrays["weights"] < 0).any():
            raise ParameterError("gmm: variances must be positive and weights not negative")
        self.weights_, self.means_, self.variances_ = arrays["weights"], arrays["means"], arrays["variances"]
        self.score_mean_, self.score_sd_ = arrays["score_mean"], arrays["score_sd"]
