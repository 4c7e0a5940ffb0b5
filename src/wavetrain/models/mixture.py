"""Diagonal Gaussian mixtures as map and reduce: E-step statistics that add, an M-step on their
sum, SQUAREM-accelerated EM driven one E-step at a time, and a reservoir sample that merges.

EM over data split anywhere (threads, processes, Spark partitions) is::

    stats = sum(e_step(theta, part) for part in parts)      # map, then reduce with +
    theta = m_step(stats, reg)

:func:`em_fit` drives that loop for several mixtures at once from any function that returns
each pass's summed statistics; ``GMMClassifier`` uses it on a feature stream, and its
in-memory path runs the same per-mixture state machine (:class:`LabelEM`). Initialisation merges
too: each part keeps a :class:`KeyedSample` of its frames, :meth:`KeyedSample.merge` combines
them into exactly the sample one pass over the whole would keep, and k-means++
(:func:`kmeans_init`) seeds from it.

Shapes: ``k`` components, ``d`` features, ``n`` frames; float64 throughout.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from wavetrain.core.graph import DOUBLE, Graph

__all__ = ["CHUNK_FRAMES", "FrameKeys", "KeyedSample", "LabelEM", "Stats", "Theta", "Workspace", "e_step", "em_fit",
           "frame_loglik", "gauss_terms", "kmeans_init", "log_sum_exp", "m_step", "responsibilities",
           "squared_blocks"]

_LOG_2PI = math.log(2 * math.pi)
#: Log-ratios to the best component are clipped here before exp: exp(-700) ~ 1e-304 adds nothing
#: next to the best term (1.0), and it keeps exp out of the subnormal range (-708 .. -745),
#: where it is ~100x slower (and ~15x below it) — common with well-separated components.
_EXP_FLOOR = -700.0
#: Frames per E-step block: bounds the working arrays (x, x², responsibilities) whatever the batch.
CHUNK_FRAMES = 8192

#: Mixture parameters: weights (k,), means (k, d), variances (k, d).
Theta = tuple[np.ndarray, np.ndarray, np.ndarray]


def gauss_terms(weights: np.ndarray, means: np.ndarray, variances: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The terms of ``log(w N(x; mu, diag(var))) = [x, x²] · W + const`` per component.

    weights (..., k), means and variances (..., k, d) -> W (..., k, 2d) = [mu / var, -0.5 / var]
    and const (..., k): the squared distance expanded into one matrix product with ``[x, x²]``.
    """
    prec = 1.0 / variances
    const = np.log(weights) - 0.5 * (means.shape[-1] * _LOG_2PI + np.sum(np.log(variances), axis=-1)
                                     + np.sum(means * means * prec, axis=-1))
    return np.concatenate([means * prec, -0.5 * prec], axis=-1), const


def graph_mixture_logliks(g: Graph, gram: str, weights: np.ndarray, means: np.ndarray, variances: np.ndarray) -> str:
    """ONNX nodes: each frame's log-likelihood under each of ``G`` diagonal mixtures (weights
    ``(G, K)``, means and variances ``(G, K, D)``), float64 ``(frames, G)``: ``[x, x²]`` times
    :func:`gauss_terms`, then a log-sum-exp over the components (a component of weight 0 gets
    -1e300, so that a sum of only such terms stays finite)."""
    gn, k = weights.shape
    d = means.shape[-1]
    with np.errstate(divide="ignore"):
        terms, const = gauss_terms(weights, means, variances)
    terms = terms.reshape(gn * k, -1)
    x = g.cast(gram, DOUBLE)
    a = g.op("Add", g.op("MatMul", x, g.const(np.ascontiguousarray(terms[:, :d].T))),
             g.op("MatMul", g.op("Mul", x, x), g.const(np.ascontiguousarray(terms[:, d:].T))))
    a = g.op("Add", a, g.const(np.nan_to_num(const.reshape(-1), neginf=-1e300)))
    return g.reduce("ReduceLogSumExp", g.op("Reshape", a, g.i64(-1, gn, k)), [2], keepdims=False)


def log_sum_exp(a: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``log(sum(exp(a), axis))`` and the sums of ``exp(a - max)``; ``a`` becomes exp(a - max).

    Log-ratios to the largest term are clipped at ``_EXP_FLOOR`` before exp."""
    m = a.max(axis=axis)
    a -= np.expand_dims(m, axis)
    np.maximum(a, _EXP_FLOOR, out=a)
    np.exp(a, out=a)
    total = a.sum(axis=axis)
    return m + np.log(total), total


def responsibilities(xx, terms: np.ndarray, const: np.ndarray, out: np.ndarray | None = None,
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
    ll, total = log_sum_exp(a, axis=0)
    a /= total
    return ll, a


class Workspace:
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

    def squares(self, n: int) -> np.ndarray:
        """The (n, d) buffer of x² (n <= the capacity)."""
        return self._x2[:n]

    def out(self, n: int) -> dict[str, np.ndarray]:
        """The ``out`` and ``tmp`` (k, n) arrays of :func:`responsibilities`."""
        return {"out": self._a[0, :self.k * n].reshape(self.k, n),
                "tmp": self._a[1, :self.k * n].reshape(self.k, n)}


def frame_loglik(x: np.ndarray, weights: np.ndarray, means: np.ndarray, variances: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per-frame log-likelihood (n,) and responsibilities (k, n) of frames x (n, d)."""
    x = np.asarray(x, dtype=np.float64)
    return responsibilities((x, x * x), *gauss_terms(weights, means, variances))


def kmeans_init(x: np.ndarray, k: int, rng: np.random.Generator, iters: int = 10
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


class Stats:
    """Sufficient statistics of one mixture over some frames: N (k,), S = [sum x, sum x²] (k, 2d),
    the summed frame log-likelihood and the frame count. Statistics of disjoint frames add
    (``a + b``): the statistics of a whole are the sum of those of its parts."""

    def __init__(self, k: int, d: int):
        self.n = np.zeros(k)
        self.s = np.zeros((k, 2 * d))
        self.ll = 0.0
        self.frames = 0

    def __add__(self, other: Stats) -> Stats:
        out = Stats(self.n.shape[0], self.s.shape[1] // 2)
        out.n = self.n + other.n
        out.s = self.s + other.s
        out.ll = self.ll + other.ll
        out.frames = self.frames + other.frames
        return out

    def __radd__(self, other):  # sum() starts from 0
        return self if other == 0 else NotImplemented

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


def squared_blocks(x: np.ndarray, block: int = CHUNK_FRAMES) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Frames ``x`` (n, d) as ``(x, x²)`` pairs of float64 blocks of at most ``block`` frames."""
    for s in range(0, x.shape[0], block):
        part = np.asarray(x[s:s + block], dtype=np.float64)
        yield part, part * part


def e_step(theta: Theta, blocks: Iterable[np.ndarray | tuple[np.ndarray, np.ndarray]],
           ws: Workspace | None = None) -> Stats:
    """The map step: statistics of frame blocks under ``theta``. A block is ``[x, x²]`` (n, 2d)
    or a pair ``(x, x²)`` of (n, d) arrays (:func:`squared_blocks` makes them from frames);
    ``ws`` lends its buffers.

    ``e_step(theta, a) + e_step(theta, b)`` equals the statistics of ``a`` and ``b`` together up
    to rounding (summation order)."""
    st = Stats(theta[0].shape[0], theta[1].shape[1])
    terms = gauss_terms(*theta)
    for xx in blocks:
        n = xx[0].shape[0] if isinstance(xx, tuple) else xx.shape[0]
        ll, resp = responsibilities(xx, *terms, **(ws.out(n) if ws is not None else {}))
        st.add(xx, resp, ll)
    return st


def m_step(st: Stats, reg: float) -> Theta:
    """The reduce step's result: new (weights (k,), means (k, d), variances (k, d)) from summed
    statistics, as sklearn's M-step."""
    d = st.s.shape[1] // 2
    nk = st.n + 10 * np.finfo(float).eps
    means = st.s[:, :d] / nk[:, None]
    variances = st.s[:, d:] / nk[:, None] - means * means + reg
    variances = np.maximum(variances, reg)
    return nk / nk.sum(), means, variances


class LabelEM:
    """EM of one label's mixture, driven one E-step at a time.

    Each E-step's statistics (taken at :attr:`theta`) go to :meth:`step`, which sets the next
    :attr:`theta`. With ``accelerate``, every two plain EM steps are followed by a SQUAREM
    extrapolation (Varadhan & Roland 2008, step length S3) in the space of log weights, means and
    log variances; the E-step at the extrapolated point keeps it only if its log-likelihood is at
    least that of the point before (else the plain EM point is taken), then an EM step from it
    starts the next cycle. Convergence is judged on plain EM steps only, as sklearn's: the mean
    frame log-likelihood improved by less than ``tol``.
    """

    def __init__(self, theta: Theta, tol: float, reg: float, accelerate: bool):
        self.theta, self.tol, self.reg, self.accelerate = theta, tol, reg, accelerate
        self.done = False
        self.loglik: list[float] = []      # mean frame log-likelihood of each E-step (of a rejected
                                           # extrapolated point: that of the point kept instead)
        self.frames = 0
        self._phase, self._prev, self._step_max = 0, -np.inf, 1.0
        self._theta0: Theta = theta         # the cycle's start, its EM step and the step after it
        self._theta2: Theta = theta
        self._ll1 = -np.inf

    @property
    def result(self):
        """The parameters to keep: never an extrapolated point that was not checked."""
        return self._theta2 if self._phase == 2 else self.theta

    def step(self, st: Stats) -> None:
        ll = st.ll / max(st.frames, 1)
        self.frames = st.frames
        new = m_step(st, self.reg)
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


class KeyedSample:
    """A bounded uniform sample of frames that merges exactly (bottom-k sampling).

    Every frame carries a random key (:func:`frame_keys`: a function of the seed and where the
    frame lies, never of the order frames arrive in); the sample is the ``capacity`` frames with
    the smallest keys. Samples of disjoint parts merge into exactly the sample of the whole
    (:meth:`merge`), so a sample gathered over Spark partitions, threads or one stream is the same
    set of frames, returned in key order."""

    def __init__(self, capacity: int, d: int):
        self.capacity, self.d = int(capacity), int(d)
        self.keys = np.empty(0)
        self.x = np.empty((0, d))
        self.seen = 0
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_rows = 0
        self._threshold = np.inf        # the largest key kept once full: larger ones are dropped at once

    def add(self, x: np.ndarray, keys: np.ndarray) -> None:
        """Frames x (n, d) with their keys (n,)."""
        self.seen += x.shape[0]
        if self._threshold < np.inf:
            keep = keys < self._threshold
            x, keys = x[keep], keys[keep]
        if keys.shape[0] == 0:
            return
        self._pending.append((np.asarray(keys, dtype=np.float64), np.asarray(x, dtype=np.float64)))
        self._pending_rows += keys.shape[0]
        if self._pending_rows >= self.capacity:
            self._compact()

    def _compact(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([self.keys] + [k for k, _ in self._pending])
        x = np.concatenate([self.x] + [f for _, f in self._pending])
        self._pending, self._pending_rows = [], 0
        if keys.shape[0] > self.capacity:
            idx = np.argpartition(keys, self.capacity - 1)[:self.capacity]
            keys, x = keys[idx], x[idx]
            self._threshold = float(keys.max())
        self.keys, self.x = keys, x

    @property
    def size(self) -> int:
        self._compact()
        return int(self.keys.shape[0])

    def sample(self) -> np.ndarray:
        """The sampled frames (size, d), in key order."""
        self._compact()
        return self.x[np.argsort(self.keys, kind="stable")]

    @staticmethod
    def merge(a: KeyedSample, b: KeyedSample) -> KeyedSample:
        """The sample of the frames ``a`` and ``b`` saw together (same capacity and width)."""
        if (a.capacity, a.d) != (b.capacity, b.d):
            raise ValueError(f"KeyedSample.merge: capacities and widths differ ({a.capacity}x{a.d} and "
                             f"{b.capacity}x{b.d})")
        out = KeyedSample(a.capacity, a.d)
        for s in (a, b):
            s._compact()
            out.add(s.x, s.keys)
        out.seen = a.seen + b.seen
        out._compact()
        return out


class FrameKeys:
    """Sampling keys of frames by where they lie: the frames of recording number ``ordinal`` (in
    the training data set's order) take the successive values of a generator seeded by
    ``(seed, ordinal)``, so every engine that reads a recording's frames in order gives them the
    same keys, whatever order recordings arrive in."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._ordinal: int | None = None
        self._gen = np.random.default_rng(0)

    def __call__(self, ordinal: int, n: int) -> np.ndarray:
        """Keys (n,) of the next ``n`` frames of recording ``ordinal`` (a recording met again after
        another starts over: its windows are expected back to back)."""
        if ordinal != self._ordinal:
            self._ordinal, self._gen = ordinal, np.random.default_rng([self.seed, int(ordinal), 0x5EED])
        return self._gen.random(n)


def em_fit(thetas: Sequence[Theta], pass_stats: Callable[[list[Theta], np.ndarray], Sequence[Stats | None]], *,
           tol: float, reg: float, accelerate: bool, max_iter: int,
           on_pass: Callable[[list[LabelEM]], None] | None = None) -> list[LabelEM]:
    """Fit several mixtures by EM, one pass over the data per iteration, from any source of
    statistics.

    ``pass_stats(thetas, active)`` returns, for every mixture ``c`` with ``active[c]``, the summed
    statistics of its frames under ``thetas[c]`` (``None`` for inactive ones) — computed in this
    process, or as a map over partitions reduced with ``+``. Each mixture stops on its own when
    converged (``tol``) or after ``max_iter`` E-steps. Returns each mixture's :class:`LabelEM`
    (``result`` the parameters, ``loglik`` its history, ``done`` whether it converged)."""
    ems = [LabelEM(theta, tol, reg, accelerate) for theta in thetas]
    for _ in range(max_iter):
        active = np.array([not em.done for em in ems])
        stats = pass_stats([em.theta for em in ems], active)
        for c in np.flatnonzero(active):
            st = stats[int(c)]
            assert st is not None
            ems[c].step(st)
        if on_pass is not None:
            on_pass(ems)
        if all(em.done for em in ems):
            break
    return ems
