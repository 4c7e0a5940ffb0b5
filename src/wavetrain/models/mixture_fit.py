"""EM of diagonal Gaussian mixtures written once for any executor: the passes of a ``gmm``'s fit
and the driver that runs them (:func:`fit_mixture`).

The init sample of each label (:class:`MixtureSamples`), one E-step per EM iteration
(:class:`MixtureStats`: each active label's sufficient statistics under its current mixture) and
the training score statistics (:class:`MixtureScores`) are passes of mergeable statistics
(:class:`~wavetrain.models.passes.Pass`); the M-step and SQUAREM run on the driver between them
(:func:`~wavetrain.models.mixture.em_fit`). The E-step and the scores are kernel passes
(:class:`~wavetrain.models.passes.KernelPass`): their work is cut into blocks of one label's
frames, which the local executor spreads over its devices and a Spark task computes in turn.
Where the frames come from (a stream read again each pass, the local executor's frame cache,
part files on Spark) is the executor's business, never the mixture's.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from wavetrain.models.device_pool import Device
from wavetrain.models.estep_devices import add_into, estep_on
from wavetrain.models.mixture import CHUNK_FRAMES, FrameKeys, KeyedSample, LabelEM, Stats, Theta, em_fit, gauss_terms
from wavetrain.models.passes import Executor, Window, add_by_kernel

if TYPE_CHECKING:
    from wavetrain.models.gmm import GMMClassifier

__all__ = ["MixtureSamples", "MixtureScores", "MixtureStats", "SampleState", "fit_mixture"]


@dataclass
class SampleState:
    """Each label's init sample, and the sampling keys of the recordings met in this part."""

    samples: list[KeyedSample]
    keys: FrameKeys


@dataclass
class MixtureSamples:
    """The init sample of each label (keyed by recording ordinal: any split of the data merges to
    the sample one local pass keeps)."""

    model: Any

    def new(self) -> SampleState:
        return SampleState(self.model.new_samples(), FrameKeys(self.model.params["seed"]))

    def add(self, state: SampleState, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]
            ) -> SampleState:
        for g, y, o in zip(grams, ys, ordinals):
            state.samples[int(y)].add(np.asarray(g, dtype=np.float64), state.keys(int(o), g.shape[0]))
        return state

    def merge(self, a: SampleState, b: SampleState) -> SampleState:
        return SampleState([KeyedSample.merge(x, y) for x, y in zip(a.samples, b.samples)], a.keys)


def _add(a: list, b: list) -> list:
    return [y if x is None else x if y is None else x + y for x, y in zip(a, b)]


@dataclass
class MixtureStats:
    """One E-step: the sufficient statistics of each active label under ``thetas`` (they add).

    A kernel pass: its blocks are up to ``CHUNK_FRAMES`` frames of one label (windows buffered
    per label across batches, see :meth:`GMMClassifier.frames_by_label
    <wavetrain.models.gmm.GMMClassifier.frames_by_label>`), each block's statistics computed on
    the device it is handed (:func:`~wavetrain.models.estep_devices.estep_on`)."""

    model: Any
    thetas: list[Theta]
    active: np.ndarray
    #: Blocks of every label's frames, cut the same whatever the mixtures: kept with the windows.
    pieces_key = ("mixture frames by label", CHUNK_FRAMES)

    def new(self) -> list[Stats | None]:
        return [None] * len(self.thetas)

    def add(self, state: list, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]) -> list:
        return add_by_kernel(self, state, zip(grams, ys, ordinals))

    def merge(self, a: list, b: list) -> list:
        return _add(a, b)

    # -- the kernel --------------------------------------------------------------------------------
    def pieces(self, windows: Iterable[Window]) -> Iterator[tuple[np.ndarray, int]]:
        """Blocks ``(x, label index)``: up to ``CHUNK_FRAMES`` frames (float64) of one label, of
        every label (an inactive label's are skipped by :meth:`compute`)."""
        for parts, c in self.model.frames_by_label((g, int(y)) for g, y, _ in windows):
            yield np.concatenate(parts, axis=0, dtype=np.float64), c

    def setup(self, device: Device) -> tuple[Any, dict[int, Any]]:
        estep = estep_on(device, self.model.params["components"], int(self.model.feature_dim_))
        return estep, estep.prepare({int(c): gauss_terms(*self.thetas[int(c)]) for c in np.flatnonzero(self.active)})

    def compute(self, device: Device, context: tuple[Any, dict[int, Any]], piece: tuple[np.ndarray, int]
                ) -> tuple[int, Stats | None]:
        estep, terms = context
        x, c = piece
        if not self.active[c]:
            return c, None
        return c, estep.stats(terms[c], estep.squared(x))

    def fold(self, state: list, result: tuple[int, Stats | None]) -> list:
        c, st = result
        if st is None:
            return state
        if state[c] is None:
            state[c] = st
        else:
            add_into(state[c], st)
        return state


@dataclass
class MixtureScores:
    """Count, sum and sum of squares of each label's window scores under its own mixture (they
    add). A kernel pass: a block is up to about ``CHUNK_FRAMES`` frames of whole windows of one
    label, scored with numpy on any device."""

    model: Any
    #: The pieces depend on the mixtures (none kept).
    pieces_key = None

    def new(self) -> np.ndarray:
        return np.zeros((len(self.model.fitted_labels), 3))

    def add(self, state: np.ndarray, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]
            ) -> np.ndarray:
        return add_by_kernel(self, state, zip(grams, ys, ordinals))

    def merge(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    # -- the kernel --------------------------------------------------------------------------------
    def pieces(self, windows: Iterable[Window]) -> Iterator[tuple[list[np.ndarray], int]]:
        by_label: dict[int, list[np.ndarray]] = {}
        for g, y, _ in windows:
            if g.shape[0] == 0:
                continue
            own = by_label.setdefault(int(y), [])
            own.append(g)
            if sum(w.shape[0] for w in own) >= CHUNK_FRAMES:
                yield by_label.pop(int(y)), int(y)
        for y, own in by_label.items():
            yield own, y

    def setup(self, device: Device) -> None:
        return None

    def compute(self, device: Device, context: None, piece: tuple[list[np.ndarray], int]) -> tuple[int, np.ndarray]:
        own, c = piece
        return c, self.model._mean_loglik(own, c)

    def fold(self, state: np.ndarray, result: tuple[int, np.ndarray]) -> np.ndarray:
        c, s = result
        state[c] += (s.size, s.sum(), (s * s).sum())
        return state


def fit_mixture(model: GMMClassifier, data: Executor, *, labels: Sequence[str] | None = None,
                on_pass: Callable[[list[LabelEM]], None] | None = None) -> GMMClassifier:
    """Fit a ``gmm`` on ``data``'s labelled windows by passes: the init sample, one E-step per EM
    iteration with the M-step (and SQUAREM) on the driver (:func:`~wavetrain.models.mixture.em_fit`),
    and the training score statistics. Every executor fits the same model up to the order of
    summation; ``train_info_`` records the seconds of each stage. ``labels``: the values window
    label indices name (default ``data.labels``)."""
    model.labels_, model.feature_dim_ = list(data.labels if labels is None else labels), int(data.feature_dim)
    model.feature_rate_, model.channels_ = data.rate, data.channels
    p = model.params
    t0 = time.perf_counter()
    thetas = model.initial_thetas(data.run(MixtureSamples(model)).samples)
    t1 = time.perf_counter()
    ems = em_fit(thetas, lambda th, active: data.run(MixtureStats(model, list(th), np.asarray(active))),
                 tol=p["tol"], reg=p["reg"], accelerate=p["accelerate"], max_iter=p["max_iter"], on_pass=on_pass)
    model.set_mixtures(ems)
    t2 = time.perf_counter()
    model.set_score_stats(data.run(MixtureScores(model)))
    model.train_info_.update(init_seconds=round(t1 - t0, 3), em_seconds=round(t2 - t1, 3),
                             score_seconds=round(time.perf_counter() - t2, 3))
    return model
