"""``hmm``: a left-to-right hidden Markov model per label value, each state a diagonal Gaussian
mixture: the classic isolated-word recogniser, and a model of a machine's cycle.

Each value's model has ``states`` states entered from the first, each either kept (self-loop) or
left for the next (and, with ``skip``, the one after); a state emits frames from its mixture of
``mixtures`` diagonal Gaussians. Training: uniform segmentation of every window into the states
(one pass of moments), then Baum-Welch in log space: each pass adds up, window by window, the
expected state and component occupancies, the weighted sums of frames and of their squares and the
expected transitions (statistics that add across windows and across parts of the data: the same
map and reduce as the ``gmm``'s EM, so it runs on either executor with memory that does not grow
with the data), and the M-step on the driver sets the new model. It stops when the mean frame
log-likelihood improves by less than ``tol`` or after ``max_iter`` passes.

A window is scored by its forward log-likelihood under each value's model (``score=viterbi``: the
best path's), divided by its frames (``score_kind`` ``mean_loglik``, as a ``gmm``). The forward
recursions run over a batch of windows at once, one frame step at a time; the emissions of a long
window are computed a block of frames at a time.

The conventions are ``hmmlearn``'s (``GMMHMM`` with ``covariance_type="diag"``, the model entered
in its first state and no end state required): its log-likelihood of a sequence, and one
Baum-Welch step with its default priors, equal this family's (``reg=0``) to rounding.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.core.graph import DOUBLE, FLOAT, Graph
from wavetrain.core.params import Param
from wavetrain.core.progress import progress_counter
from wavetrain.models.base import Classifier, FitOptions, state_arrays
from wavetrain.models.mixture import gauss_terms, graph_mixture_logliks
from wavetrain.models.passes import Executor
from wavetrain.models.vtln import VTLN_PARAMS, WarpSearch, graph_warp_detail, warp_detail

__all__ = ["HMMClassifier", "HMMStats"]

#: Frames whose emissions are computed at once (bounds the (frames, labels x states x mixtures) array).
EMISSION_BLOCK = 4096
#: Windows whose recursions run together (padded to the longest of them).
BATCH_WINDOWS = 64
NEG = -np.inf


def _lse(a: np.ndarray, axis: int) -> np.ndarray:
    """``log(sum(exp(a), axis))`` with -inf entries (an all -inf slice gives -inf, no warning)."""
    m = np.max(a, axis=axis, keepdims=True)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(a - safe), axis=axis, keepdims=True)) + safe
    return np.squeeze(out, axis=axis)


@dataclass
class HMMParams:
    """One value's model: start (S,), log transitions (S, S), weights (S, M), means and variances (S, M, D)."""

    log_start: np.ndarray
    log_trans: np.ndarray
    weights: np.ndarray
    means: np.ndarray
    variances: np.ndarray


def _emissions(x: np.ndarray, weights: np.ndarray, means: np.ndarray, variances: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per frame and state: the log emission density ``(T, ..., S)`` and each component's log
    share of it ``(T, ..., S, M)``, for models stacked on the leading axes of the parameters."""
    lead = weights.shape[:-1]                                    # (..., S)
    m = weights.shape[-1]
    terms, const = gauss_terms(weights.reshape(-1, m), means.reshape(-1, m, means.shape[-1]),
                               variances.reshape(-1, m, means.shape[-1]))
    d = x.shape[1]
    with np.errstate(divide="ignore"):                           # (a component of weight 0)
        a = x @ terms[..., :d].reshape(-1, d).T + (x * x) @ terms[..., d:].reshape(-1, d).T + const.reshape(-1)
    a = a.reshape(x.shape[0], *lead, m)
    lb = _lse(a, axis=-1)
    return lb, a - lb[..., None]


class HMMStats:
    """Baum-Welch statistics of every value (they add): occupancies (L, S, M), weighted frame sums
    and squares (L, S, M, D), expected transitions (L, S, S), log-likelihood and frames (L,)."""

    def __init__(self, labels: int, states: int, mixtures: int, dims: int):
        self.occ = np.zeros((labels, states, mixtures))
        self.sx = np.zeros((labels, states, mixtures, dims))
        self.sxx = np.zeros((labels, states, mixtures, dims))
        self.trans = np.zeros((labels, states, states))
        self.loglik = np.zeros(labels)
        self.frames = np.zeros(labels)
        self.windows = np.zeros(labels)

    def __add__(self, other: HMMStats) -> HMMStats:
        out = HMMStats(0, 0, 0, 0)
        for k, v in vars(self).items():
            setattr(out, k, v + getattr(other, k))
        return out


@dataclass
class UniformSegments:
    """The initial pass: each window cut into ``states`` equal runs of frames, one per state; the
    moments of each value's states (one component each)."""

    model: Any

    def new(self) -> HMMStats:
        m = self.model
        return HMMStats(len(m.fitted_labels), m.params["states"], 1, int(m.feature_dim_))

    def add(self, st: HMMStats, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]) -> HMMStats:
        s = self.model.params["states"]
        for g, y in zip(grams, ys):
            x = np.asarray(g, dtype=np.float64)
            t = x.shape[0]
            state = (np.arange(t) * s) // t
            for j in range(s):
                part = x[state == j]
                st.occ[y, j, 0] += part.shape[0]
                st.sx[y, j, 0] += part.sum(axis=0)
                st.sxx[y, j, 0] += (part * part).sum(axis=0)
            st.frames[y] += t
            st.windows[y] += 1
        return st

    def merge(self, a: HMMStats, b: HMMStats) -> HMMStats:
        return a + b


@dataclass
class BaumWelch:
    """One Baum-Welch pass under ``params`` (one :class:`HMMParams` per value)."""

    model: Any
    params: list[HMMParams]

    def new(self) -> HMMStats:
        m = self.model
        return HMMStats(len(m.fitted_labels), m.params["states"], m.params["mixtures"], int(m.feature_dim_))

    def add(self, st: HMMStats, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]) -> HMMStats:
        windows = [(np.asarray(g, dtype=np.float64), int(y)) for g, y in zip(grams, ys) if g.shape[0]]
        for a in range(0, len(windows), BATCH_WINDOWS):
            with np.errstate(divide="ignore", under="ignore"):
                _accumulate(st, windows[a:a + BATCH_WINDOWS], self.params)
        return st

    def merge(self, a: HMMStats, b: HMMStats) -> HMMStats:
        return a + b


def _accumulate(st: HMMStats, windows: Sequence[tuple[np.ndarray, int]], models: Sequence[HMMParams]) -> None:
    """Forward-backward of windows ``(frames float64, value)`` under their values' models, added to
    ``st``: the recursions run over the windows at once (padded to the longest; a window's
    variables stay put past its end), then each window's sums."""
    lengths = np.array([x.shape[0] for x, _ in windows])
    b, tmax = len(windows), int(lengths.max())
    s = st.trans.shape[1]
    lb = np.zeros((b, tmax, s))
    shares = []
    for i, (x, y) in enumerate(windows):
        p = models[y]
        lb[i, :x.shape[0]], lr = _emissions(x, p.weights, p.means, p.variances)
        shares.append(lr)
    trans = np.stack([models[y].log_trans for _, y in windows])             # (B, S, S)
    alpha = np.empty((b, tmax, s))
    beta = np.zeros((b, tmax, s))
    alpha[:, 0] = np.stack([models[y].log_start for _, y in windows]) + lb[:, 0]
    for t in range(1, tmax):
        new = _lse(alpha[:, t - 1, :, None] + trans, axis=1) + lb[:, t]
        alpha[:, t] = np.where((t < lengths)[:, None], new, alpha[:, t - 1])
    for t in range(tmax - 2, -1, -1):
        new = _lse(trans + (lb[:, t + 1] + beta[:, t + 1])[:, None, :], axis=2)
        beta[:, t] = np.where((t < lengths - 1)[:, None], new, 0.0)
    ll = _lse(alpha[:, -1], axis=1)                                          # (B,)
    for i, (x, y) in enumerate(windows):
        t = x.shape[0]
        if not np.isfinite(ll[i]):
            continue                                         # (a window the model cannot emit: no statistics)
        a, be = alpha[i, :t], beta[i, :t]
        w = np.exp(a + be - ll[i])[:, :, None] * np.exp(shares[i])          # (T, S, M)
        flat = w.reshape(t, -1)
        st.occ[y] += w.sum(axis=0)
        st.sx[y] += (flat.T @ x).reshape(st.sx.shape[1:])
        st.sxx[y] += (flat.T @ (x * x)).reshape(st.sxx.shape[1:])
        if t > 1:
            xi = a[:-1, :, None] + trans[i][None] + (lb[i, 1:t] + be[1:])[:, None, :] - ll[i]
            st.trans[y] += np.exp(xi).sum(axis=0)
        st.loglik[y] += ll[i]
        st.frames[y] += t
        st.windows[y] += 1


class HMMClassifier(WarpSearch, Classifier):
    """Left-to-right HMMs with Gaussian-mixture states, one per label value.

    Attributes
    ----------
    log_start_ : (labels, S)  log_trans_ : (labels, S, S)  (logs: -inf where a move is impossible; the
        model file holds the probabilities)
    weights_ : (labels, S, M)  means_, variances_ : (labels, S, M, D)
    """

    name = "hmm"
    summary = "left-to-right hidden Markov model per label value, Gaussian-mixture states; forward log-likelihood"
    default_features = "mfcc(bands=40, coeffs=13, window_ms=25, shift_pct=40) | delta(order=2)"
    hyperparams = (
        Param("states", 5, "states of each value's left-to-right model", int, low=1, high=64),
        Param("mixtures", 2, "diagonal Gaussians per state", int, low=1, high=64),
        Param("skip", False, "allow a transition that skips one state", bool),
        Param("max_iter", 20, "maximum Baum-Welch passes over the training data", int, low=1),
        Param("tol", 1e-3, "stop when the mean frame log-likelihood improves less than this", float, low=0),
        Param("reg", 1e-3, "added to every variance (numerical floor)", float, low=0),
        Param("spread", 0.5, "initial means of a state's components: its mean +- spread standard deviations", float,
              low=0),
        Param("score", "forward", "window score: the forward log-likelihood (all paths) or the best path's (viterbi)",
              str, choices=("forward", "viterbi")),
    ) + VTLN_PARAMS
    score_kind = "mean_loglik"
    #: Baum-Welch: each pass adds up every value's expected occupancies, frame sums and transitions.
    learns_by = "statistics"
    #: Baum-Welch by passes of statistics on any executor (local or Spark).
    any_executor = True

    def __init__(self, **params: Any):
        super().__init__(**params)
        self._check_vtln()
        s, m = self.params["states"], self.params["mixtures"]
        self.log_start_ = np.zeros((0, s))
        self.log_trans_ = np.zeros((0, s, s))
        self.weights_ = np.zeros((0, s, m))
        self.means_ = np.zeros((0, s, m, 0))
        self.variances_ = np.zeros((0, s, m, 0))

    # -- training -------------------------------------------------------------------------------
    def _learn(self, data: Executor, valid: Executor | None, options: FitOptions) -> None:
        """Uniform segmentation, then Baum-Welch passes on any executor."""
        p = self.params
        init = data.run(UniformSegments(self))
        empty = [self.fitted_labels[i] for i in np.flatnonzero(init.windows == 0)]
        if empty:
            raise UserError(f"{self.name}: no training windows of {', '.join(empty[:5])}; every value needs some")
        models = self._initial(init)
        self.history_ = []
        bar = progress_counter(desc=f"{self.name} Baum-Welch", total=p["max_iter"], unit="pass",
                               enable=options.progress)
        prev = -np.inf
        try:
            for it in range(p["max_iter"]):
                st = data.run(BaumWelch(self, models))
                ll = float(st.loglik.sum() / max(st.frames.sum(), 1))
                self.history_.append({"pass": it + 1, "mean_loglik": round(ll, 6)})
                models = self._m_step(st, models)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loglik=f"{ll:.3f}")
                if ll - prev < p["tol"]:
                    break
                prev = ll
        finally:
            if bar is not None:
                bar.close()
        self._keep(models)
        self.train_info_ = {"passes": len(self.history_), "converged": len(self.history_) < p["max_iter"]}
        self._read_warps()

    def _initial(self, st: HMMStats) -> list[HMMParams]:
        """States from the uniform segmentation's moments (components at +- ``spread`` sd), each
        state kept for about its share of a value's mean window length."""
        p = self.params
        s, m, reg = p["states"], p["mixtures"], p["reg"]
        n = np.maximum(st.occ[..., 0], 1.0)[..., None]                       # (L, S, 1)
        mean = st.sx[:, :, 0] / n
        var = np.maximum(st.sxx[:, :, 0] / n - mean * mean, 0.0) + reg + 1e-6
        offsets = np.linspace(-p["spread"], p["spread"], m) if m > 1 else np.zeros(1)
        out = []
        for c in range(len(self.fitted_labels)):
            means = mean[c][:, None, :] + offsets[None, :, None] * np.sqrt(var[c])[:, None, :]
            stay = float(np.clip(1.0 - s * st.windows[c] / max(st.frames[c], 1.0), 0.5, 0.99))
            with np.errstate(divide="ignore"):                       # (impossible moves: -inf)
                log_trans = np.log(_transitions(s, stay, p["skip"]))
            out.append(HMMParams(_log_start(s), log_trans, np.full((s, m), 1.0 / m), means,
                                 np.repeat(var[c][:, None, :], m, axis=1)))
        return out

    def _m_step(self, st: HMMStats, models: list[HMMParams]) -> list[HMMParams]:
        """New models from the pass's statistics (a value or state that saw no frame keeps its own)."""
        reg = self.params["reg"]
        out = []
        for c, old in enumerate(models):
            occ = st.occ[c]
            if st.windows[c] == 0 or occ.sum() <= 0:
                out.append(old)
                continue
            state_occ = occ.sum(axis=1, keepdims=True)
            seen = state_occ[:, 0] > 0
            weights = np.where(seen[:, None], occ / np.maximum(state_occ, 1e-300), old.weights)
            n = np.maximum(occ, 1e-300)[..., None]
            means = st.sx[c] / n
            variances = np.maximum(st.sxx[c] / n - means * means + reg, max(reg, 1e-10))
            used = occ > 0
            means = np.where(used[..., None], means, old.means)
            variances = np.where(used[..., None], variances, old.variances)
            rows = st.trans[c].sum(axis=1, keepdims=True)
            with np.errstate(divide="ignore"):
                trans = np.where(rows > 0, np.log(st.trans[c] / np.maximum(rows, 1e-300)), old.log_trans)
            out.append(HMMParams(old.log_start, trans, weights, means, variances))
        return out

    def _keep(self, models: list[HMMParams]) -> None:
        self.log_start_ = np.stack([m.log_start for m in models])
        self.log_trans_ = np.stack([m.log_trans for m in models])
        self.weights_ = np.stack([m.weights for m in models])
        self.means_ = np.stack([m.means for m in models])
        self.variances_ = np.stack([m.variances for m in models])

    # -- scoring --------------------------------------------------------------------------------
    def decision_function(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """Mean frame log-likelihood of each window under each value's model ``(n, labels)`` (with
        ``vtln``: at each window's best warp)."""
        self._check_grams(grams)
        return self.warped_loglik(grams)[0]

    def _loglik(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """:meth:`decision_function` of windows of one warp, unchecked."""
        out = np.empty((len(grams), len(self.fitted_labels)))
        viterbi = self.params["score"] == "viterbi"
        short = [i for i, g in enumerate(grams) if g.shape[0] <= EMISSION_BLOCK]
        with np.errstate(divide="ignore", under="ignore"):
            for a in range(0, len(short), BATCH_WINDOWS):    # windows together, padded to the longest
                idx = short[a:a + BATCH_WINDOWS]
                xs = [np.asarray(grams[i], dtype=np.float64) for i in idx]
                lengths = np.array([x.shape[0] for x in xs])
                lb = np.zeros((len(xs), int(lengths.max()), *self.log_start_.shape))
                for k, x in enumerate(xs):
                    lb[k, :x.shape[0]] = _emissions(x, self.weights_, self.means_, self.variances_)[0]
                out[idx] = _total(_forward_block(lb, self.log_start_, self.log_trans_, None, viterbi, lengths),
                                  viterbi) / lengths[:, None]
            for i in sorted(set(range(len(grams))) - set(short)):   # a long window: a block of frames at a time
                x = np.asarray(grams[i], dtype=np.float64)
                alpha = None
                for a in range(0, x.shape[0], EMISSION_BLOCK):
                    lb = _emissions(x[a:a + EMISSION_BLOCK], self.weights_, self.means_, self.variances_)[0]
                    alpha = _forward_block(lb[None], self.log_start_, self.log_trans_, alpha, viterbi)
                assert alpha is not None
                out[i] = _total(alpha, viterbi)[0] / x.shape[0]
        return out

    def predict_proba(self, grams: Sequence[np.ndarray]) -> np.ndarray:
        """Softmax over values of the mean frame log-likelihoods (how they rank, not a calibrated
        probability)."""
        s = self.decision_function(grams)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def predict_scores(self, grams: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
        """Values, mean frame log-likelihoods ``(n, labels)`` and, with ``vtln``, each window's warp."""
        self._check_grams(grams)
        s, warps = self.warped_loglik(grams)
        return [self.fitted_labels[i] for i in s.argmax(axis=1)], s, warp_detail(self, warps)

    def memory_estimate(self, feature_dim: int, n_labels: int, batch_frames: int, total_frames: int,
                        window_frames: int) -> int:
        """The models and their statistics, and one window's forward-backward arrays."""
        s, m = self.params["states"], self.params["mixtures"]
        model = n_labels * s * (m * (2 * feature_dim + 1) + s) * 8 * 3
        window = max(window_frames, 1) * (s * m * 3 + s * 4 + feature_dim * 2) * 8
        return model + window + 2 * max(batch_frames, 1) * feature_dim * 8

    # -- export ---------------------------------------------------------------------------------
    def graph_scores(self, g: Graph, gram: str) -> dict[str, str]:
        """The mean frame log-likelihoods (with ``vtln``: at the best warp, and the warp)."""
        scores, warp = self.graph_warped(g, gram)
        return {"scores": g.cast(scores, FLOAT), "best": g.op("ArgMax", scores, axis=0, keepdims=1),
                **graph_warp_detail(self, g, warp)}

    def graph_loglik(self, g: Graph, gram: str) -> str:
        """The forward (or Viterbi) recursion over one window of one warp as a ``Scan`` over frames,
        every value at once, in float64 (-1e300 for impossible transitions: a log-sum-exp of only
        those stays finite): the mean frame log-likelihoods ``(labels,)``."""
        from onnx import TensorProto, helper

        nl, s, m = self.weights_.shape
        d = self.means_.shape[-1]
        states = graph_mixture_logliks(g, gram, self.weights_.reshape(-1, m), self.means_.reshape(-1, m, d),
                                       self.variances_.reshape(-1, m, d))
        lb = g.op("Reshape", states, g.i64(-1, nl, s))                        # (T, labels, S)
        trans = g.const(np.nan_to_num(self.log_trans_, neginf=-1e300))        # (labels, S, S)
        reduce = "ReduceMax" if self.params["score"] == "viterbi" else "ReduceLogSumExp"
        # alpha (labels, S) -> (labels, S, 1) + transitions (labels, from, to), reduced over `from`
        axes_in: list[str] = ["axis1"] if g.opset >= 18 else []
        axes_attr: dict[str, Any] = {} if g.opset >= 18 else {"axes": [1]}
        nodes = [helper.make_node("Unsqueeze", ["alpha", "axis2"], ["a3"]),
                 helper.make_node("Add", ["a3", trans], ["step"]),
                 helper.make_node(reduce, ["step", *axes_in], ["moved"], keepdims=0, **axes_attr),
                 helper.make_node("Add", ["moved", "lb_t"], ["alpha_out"]),
                 helper.make_node("Identity", ["alpha_out"], ["scan_out"])]
        body = helper.make_graph(
            nodes, "hmm_forward",
            [helper.make_tensor_value_info("alpha", TensorProto.DOUBLE, [nl, s]),
             helper.make_tensor_value_info("lb_t", TensorProto.DOUBLE, [nl, s])],
            [helper.make_tensor_value_info("alpha_out", TensorProto.DOUBLE, [nl, s]),
             helper.make_tensor_value_info("scan_out", TensorProto.DOUBLE, [nl, s])],
            initializer=[helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
                         helper.make_tensor("axis1", TensorProto.INT64, [1], [1])])
        first = g.op("Squeeze", g.op("Slice", lb, g.i64(0), g.i64(1), g.i64(0)), g.i64(0))
        alpha0 = g.op("Add", first, g.const(np.nan_to_num(self.log_start_, neginf=-1e300)))
        rest = g.op("Slice", lb, g.i64(1), g.i64(np.iinfo(np.int64).max), g.i64(0))
        alpha, _ = g.op("Scan", alpha0, rest, outputs=2, body=body, num_scan_inputs=1)
        total = g.reduce(reduce, alpha, [1], keepdims=False)
        return g.op("Div", total, g.cast(g.dim(gram, 0), DOUBLE))

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        self.check_is_fitted()
        return {"start": np.exp(self.log_start_), "transitions": np.exp(self.log_trans_), "weights": self.weights_,
                "means": self.means_, "variances": self.variances_}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        nl, s, m, d = len(self.labels_ or ()), self.params["states"], self.params["mixtures"], self.frame_dim
        shapes = {"start": (nl, s), "transitions": (nl, s, s), "weights": (nl, s, m), "means": (nl, s, m, d),
                  "variances": (nl, s, m, d)}
        arrays = state_arrays("hmm", state, shapes, f"{nl} label values, {s} states, {m} mixtures and {d} features")
        probs = [arrays[k] for k in ("start", "transitions", "weights")]
        if (arrays["variances"] <= 0).any() or any(((a < 0) | (a > 1 + 1e-9)).any() for a in probs):
            raise ParameterError("hmm: variances must be positive, and start, transition and mixture weights "
                                 "probabilities")
        with np.errstate(divide="ignore"):
            self.log_start_, self.log_trans_ = np.log(arrays["start"]), np.log(arrays["transitions"])
        self.weights_, self.means_, self.variances_ = arrays["weights"], arrays["means"], arrays["variances"]


def _log_start(s: int) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.eye(1, s)[0])


def _transitions(s: int, stay: float, skip: bool) -> np.ndarray:
    """Left-to-right transitions: stay with ``stay``, else the next state (and with ``skip`` a
    tenth of the leaving to the one after); the last state keeps itself."""
    a = np.zeros((s, s))
    for i in range(s):
        if i == s - 1:
            a[i, i] = 1.0
        elif skip and i + 2 < s:
            a[i, i], a[i, i + 1], a[i, i + 2] = stay, 0.9 * (1 - stay), 0.1 * (1 - stay)
        else:
            a[i, i], a[i, i + 1] = stay, 1 - stay
    return a


def _forward_block(lb: np.ndarray, log_start: np.ndarray, log_trans: np.ndarray, alpha: np.ndarray | None,
                   viterbi: bool, lengths: np.ndarray | None = None) -> np.ndarray:
    """The forward (or Viterbi) variables ``(B, labels, S)`` of windows after a block of their log
    emissions ``(B, T, labels, S)``, from ``alpha`` (None: the windows' start); a window of
    ``lengths`` shorter than the block keeps its variables past its end."""
    t0 = 0
    if alpha is None:
        alpha, t0 = log_start + lb[:, 0], 1
    for t in range(t0, lb.shape[1]):
        step = alpha[..., :, None] + log_trans
        new = (np.max(step, axis=-2) if viterbi else _lse(step, axis=-2)) + lb[:, t]
        alpha = new if lengths is None else np.where((t < lengths)[:, None, None], new, alpha)
    return alpha


def _total(alpha: np.ndarray, viterbi: bool) -> np.ndarray:
    """A window's log-likelihood from its last forward variables (any end state)."""
    return np.max(alpha, axis=-1) if viterbi else _lse(alpha, axis=-1)
