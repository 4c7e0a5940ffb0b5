"""``gmm``: one Gaussian mixture per label value, trained by streaming EM.

Training memory does not depend on the amount of data: each EM pass reads the stream batch by
batch and accumulates sufficient statistics (per component: weight, sum of x, sum of x²; see
:mod:`wavetrain.models.mixture`, where EM is a map and a reduce); initialisation uses k-means++
and Lloyd steps on a bounded reservoir sample of frames. When all training frames fit
``frame_cache_mb`` (by default: 64 MB, or what the memory plan grants an augmented run, whose
passes would otherwise decode and augment every recording again) they are kept in memory after the
first pass and each label's mixture is fitted
on them to convergence, one label after another. Between EM steps, SQUAREM extrapolation
(``accelerate``) cuts the passes needed; an extrapolated point is kept only when it does not
lower the log-likelihood.
With several devices (``FitOptions.devices``, ``train --devices cpu,cpu`` or ``cpu,cuda:0``), each
E-step's blocks of frames are handed out to the devices one at a time and their statistics added
in the blocks' order (:class:`~wavetrain.models.estep_devices.DevicePool`): the fit is the
one-device fit (bit for bit on ``cpu`` devices, to rounding with a GPU).
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
from wavetrain.core.progress import progress_bar, progress_counter
from wavetrain.models.base import FRAME_CACHE_DEFAULT, UNKNOWN, Classifier, FitOptions, state_arrays
from wavetrain.models.estep_devices import DevicePool
from wavetrain.models.mixture import (
    CHUNK_FRAMES,
    FrameKeys,
    KeyedSample,
    LabelEM,
    Stats,
    Theta,
    Workspace,
    e_step,
    em_fit,
    gauss_terms,
    graph_mixture_logliks,
    kmeans_init,
    log_sum_exp,
    m_step,
    responsibilities,
)
from wavetrain.models.passes import Executor, StreamExecutor, fit_mixture
from wavetrain.models.vtln import VTLN_PARAMS, WarpSearch, graph_warp_detail, warp_detail
from wavetrain.stream.batches import CountsFrames, WindowStream

log = logging.getLogger(__name__)

#: Rows per block of the training frames kept in memory (1.25 MB for 39 features): small enough
#: that a label's last, partly filled block wastes little, large enough for fast E-steps.
MEMO_BLOCK_FRAMES = 2048


def _memo_bytes(d: int, n_labels: int, total_frames: int) -> int:
    """Bytes of every frame and its square (float64) kept in blocks (each label's last one full
    until trimmed)."""
    return 2 * total_frames * d * 8 + n_labels * MEMO_BLOCK_FRAMES * 2 * d * 8
#: Bound of the (labels, components, frames) float64 array scored at once.
SCORE_BLOCK_BYTES = 4 << 20

#: Per label: blocks of its frames [x, x²] (n_i, 2d) and its windows' lengths (windows,).
LabelFrameBlocks = list[tuple[list[np.ndarray], np.ndarray]]


#: Labelled windows: ``(gram, label index)``.
Windows = Iterable[tuple[np.ndarray, int]]


def _labelled(stream: WindowStream) -> Iterator[tuple[np.ndarray, int]]:
    """Yield ``(gram, label index)`` of every labelled window of one pass over ``stream``."""
    for g, y, _ in _labelled_with_ordinals(stream):
        yield g, y


def _labelled_with_ordinals(stream: WindowStream) -> Iterator[tuple[np.ndarray, int, int]]:
    """Yield ``(gram, label index, recording ordinal)`` of every labelled window of one pass: the
    ordinal is the recording's index in the stream (each window its own, for streams that do not
    say where windows come from)."""
    n = 0
    for batch in stream.batches():
        for i, (g, y) in enumerate(zip(batch.grams, batch.y)):
            if y >= 0:
                yield g, int(y), batch.refs[i][0] if batch.refs is not None else n
            n += 1


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
        """EM by passes on any executor (:func:`~wavetrain.models.passes.fit_mixture`); a local
        stream keeps the local fit (its frame cache and device pool), which equals it up to the
        order of summation."""
        if isinstance(data, StreamExecutor):
            self._fit(data.stream, None, options)
            return
        bar = progress_counter(desc=f"{self.name} EM", total=self.params["max_iter"], unit="pass",
                               enable=options.progress)

        def on_pass(ems: list[LabelEM]) -> None:
            if bar is not None:
                bar.update(1)
                bar.set_postfix(active=sum(not em.done for em in ems))

        try:
            fit_mixture(self, data, on_pass=on_pass)
        finally:
            if bar is not None:
                bar.close()

    def _fit(self, stream: WindowStream, valid: WindowStream | None, options: FitOptions) -> None:
        p = self.params
        pool = self._device_pool(options.devices)          # a wrong device fails before any work
        try:
            budget = self._frame_budget(options)
            samples, frames = self._first_pass(stream, budget)
            thetas = self.initial_thetas(samples)
            # Each label's mixture converges on its own (as fitting one sklearn model per label
            # would): a converged label is frozen and its frames are no longer scored.
            ws = Workspace(p["components"], self._dim)
            if frames is not None:
                ems = self._fit_in_memory(thetas, frames, ws, options.progress, pool)
            else:
                aug = getattr(stream, "augment", None)
                if aug is not None and aug.waveform:
                    need = 2 * sum(r.seen for r in samples) * self._dim * 8
                    log.warning("gmm: the augmented frames (%d MB as [x, x²] float64) do not fit the frame cache "
                                "(%d MB): every EM pass decodes and augments the audio again; --set "
                                "frame_cache_mb=%d keeps them", need >> 20, budget >> 20, (need >> 20) + 16)
                ems = self._fit_streamed(thetas, stream, ws, options.progress, pool)
            self.set_mixtures(ems)
            self._training_score_stats(stream, frames, pool)
        finally:
            if pool is not None:
                pool.close()
        if pool is not None:
            self.train_info_.update(pool.report())

    def _device_pool(self, devices: Sequence[str]) -> DevicePool | None:
        """The devices sharing each E-step; None (this thread, numpy) for none or one ``cpu``."""
        if not devices or list(devices) == ["cpu"]:
            return None
        return DevicePool(devices, self.params["components"], self._dim)

    # -- the parts of a fit another engine (Spark) drives: sample, statistics, mixtures -----------
    def new_samples(self) -> list[KeyedSample]:
        """Empty init samples, one per label: a window's frames go to its label's, keyed by
        :class:`~wavetrain.models.mixture.FrameKeys` of the recording's ordinal."""
        return [KeyedSample(self.params["init_frames"], self._dim) for _ in self.fitted_labels]

    def initial_thetas(self, samples: Sequence[KeyedSample]) -> list[Theta]:
        """Initial mixtures from the label samples (merged over every part of the data)."""
        rng = np.random.default_rng(self.params["seed"])
        return [self._initial(c, s.sample(), rng) for c, s in enumerate(samples)]

    def pass_stats(self, windows: Windows, thetas: Sequence[Theta], active: np.ndarray,
                   ws: Workspace | None = None, pool: DevicePool | None = None) -> list[Stats]:
        """One E-step over labelled windows ``(gram, label index)`` of the active labels: each
        label's statistics (they add over parts of the data). With a ``pool``, its devices share
        the blocks."""
        k = self.params["components"]
        stats = [Stats(k, self._dim) for _ in thetas]
        terms = {int(c): gauss_terms(*thetas[int(c)]) for c in np.flatnonzero(active)}
        if pool is not None:
            pool.label_stats(terms, self._frames_by_label(windows, active), stats)
            return stats
        ws = ws or Workspace(k, self._dim)
        for parts, c in self._frames_by_label(windows, active):
            xx = ws.frames(parts)
            ll, resp = responsibilities(xx, *terms[c], **ws.out(xx[0].shape[0]))
            stats[c].add(xx, resp, ll)
        return stats

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
        log-likelihoods under its own mixture (they add over parts of the data)."""
        sums = np.zeros((len(self.fitted_labels), 3))
        by_label: dict[int, list[np.ndarray]] = {}
        for g, y in windows:
            if g.shape[0] == 0:
                continue
            own = by_label.setdefault(y, [])
            own.append(g)
            if sum(w.shape[0] for w in own) >= CHUNK_FRAMES:
                s = self._mean_loglik(by_label.pop(y), y)
                sums[y] += (s.size, s.sum(), (s * s).sum())
        for y, own in by_label.items():
            s = self._mean_loglik(own, y)
            sums[y] += (s.size, s.sum(), (s * s).sum())
        return sums

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

    def _frame_budget(self, options: FitOptions) -> int:
        """Bytes the training frames may take in memory: ``frame_cache_mb`` when set, else what the
        memory plan granted (``options.frame_cache_bytes``), else 64 MB."""
        if self.params["frame_cache_mb"] is not None:
            return self.params["frame_cache_mb"] << 20
        return FRAME_CACHE_DEFAULT if options.frame_cache_bytes is None else options.frame_cache_bytes

    def frame_cache_request(self, feature_dim: int, n_labels: int, total_frames: int) -> int:
        """Every frame and its square (float64), in blocks, unless ``frame_cache_mb`` is set."""
        if self.params["frame_cache_mb"] is not None:
            return 0
        return _memo_bytes(feature_dim, n_labels, total_frames)

    def _first_pass(self, stream: WindowStream, budget: int) -> tuple[list[KeyedSample], LabelFrameBlocks | None]:
        """One pass over the stream: the init sample of each label, and every frame when the stream
        says they fit ``budget`` bytes (as [x, x²] float64). A stream that cannot say gets a
        second pass to gather them once the first has counted them: gathering blindly could hold
        the whole budget in vain."""
        nl, d = len(self.fitted_labels), self._dim
        samples, keys = self.new_samples(), FrameKeys(self.params["seed"])
        expected = stream.expected_frames() if isinstance(stream, CountsFrames) else None
        memo = _LabelFrames(nl, d, budget if expected is not None and 2 * expected * d * 8 <= budget else 0)
        for g, y, ordinal in _labelled_with_ordinals(stream):
            samples[y].add(np.asarray(g, dtype=np.float64), keys(ordinal, g.shape[0]))
            memo.add(y, g)
        frames = memo.finish()
        if frames is None and 0 < 2 * sum(r.seen for r in samples) * d * 8 <= budget:
            memo = _LabelFrames(nl, d, budget)
            for g, y in _labelled(stream):
                memo.add(y, g)
            frames = memo.finish()
        return samples, frames

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

    def _fit_in_memory(self, thetas: list[Theta], frames: LabelFrameBlocks, ws: Workspace,
                       progress: bool, pool: DevicePool | None = None) -> list[LabelEM]:
        """Frames in memory: label after label, each to convergence (its frames stay in cache)."""
        p = self.params
        ems: list[LabelEM] = []
        bar = progress_bar(range(len(thetas)), desc="gmm EM", unit="label", enable=progress)
        for c in bar:
            blocks = frames[c][0]

            def label_pass(th: list[Theta], active: np.ndarray, blocks: list[np.ndarray] = blocks) -> list[Stats]:
                if pool is not None:
                    return [pool.e_step(gauss_terms(*th[0]), blocks)]
                return [e_step(th[0], blocks, ws)]

            ems += em_fit([thetas[c]], label_pass, tol=p["tol"], reg=p["reg"], accelerate=p["accelerate"],
                          max_iter=p["max_iter"])
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(passes=len(ems[-1].loglik))
        return ems

    def _fit_streamed(self, thetas: list[Theta], stream: WindowStream, ws: Workspace,
                      progress: bool, pool: DevicePool | None = None) -> list[LabelEM]:
        """Frames re-read from the stream on every EM pass, all active labels at once."""
        p = self.params
        bar = progress_counter(desc="gmm EM", total=p["max_iter"], unit="pass", enable=progress)

        def on_pass(ems: list[LabelEM]) -> None:
            if bar is not None:
                bar.update(1)
                bar.set_postfix(active=sum(not em.done for em in ems))

        try:
            return em_fit(thetas, lambda th, active: self.pass_stats(_labelled(stream), th, active, ws, pool),
                          tol=p["tol"], reg=p["reg"], accelerate=p["accelerate"], max_iter=p["max_iter"],
                          on_pass=on_pass)
        finally:
            if bar is not None:
                bar.close()

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

    def _training_score_stats(self, stream: WindowStream, frames: LabelFrameBlocks | None,
                              pool: DevicePool | None = None) -> None:
        """Mean and sd, per label, of the training windows' scores under their own label's mixture
        (for unknown detection)."""
        if frames is None:
            self.set_score_stats(self.score_sums(_labelled(stream)))
            return
        sums = np.zeros((len(self.fitted_labels), 3))
        for c, (blocks, lengths) in enumerate(frames):
            if not lengths.size:
                continue
            terms = gauss_terms(self.weights_[c], self.means_[c], self.variances_[c])
            parts = pool.loglik(terms, blocks) if pool is not None else [responsibilities(xx, *terms)[0]
                                                                         for xx in blocks]
            ll = np.concatenate(parts)
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            s = np.add.reduceat(ll, starts) / lengths
            sums[c] = (s.size, s.sum(), (s * s).sum())
        self.set_score_stats(sums)

    @staticmethod
    def _frames_by_label(windows: Windows, active: np.ndarray | None = None):
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
        memo = _memo_bytes(d, n_labels, total_frames)
        # kept between EM passes (with frame_cache_mb unset, the memory plan counts what it grants)
        if self.params["frame_cache_mb"] is not None and memo <= self.params["frame_cache_mb"] << 20:
            state += memo
        return state + reservoir + max(kmeans, estep)

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
