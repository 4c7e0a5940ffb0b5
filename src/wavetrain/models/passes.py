"""How a family learns, written once for any executor: passes of mergeable statistics, or
gradient steps.

A :class:`Pass` says what one pass over the labelled windows computes: an empty statistics object
(``new``), how a batch of windows is added to it (``add``) and how two of them, from two parts of
the data, are combined (``merge``: associative and, where the maths allows, independent of the
order). An :class:`Executor` runs a pass over every labelled window of its data and returns the
merged statistics; the family's driver-side code (an M-step, a threshold) runs between passes. A
family that learns by gradient steps hands the executor itself (:meth:`Executor.train_steps`):
the local executor fits it on its stream, the Spark executor as distributed-data-parallel ranks.

:class:`StreamExecutor` is the local executor: one shard, a :class:`~wavetrain.stream.batches.WindowStream`
read batch by batch. The Spark executor (:class:`wavetrain.spark.passes.SparkExecutor`) runs each
pass as one job over the feature table's part files, so a family that learns through
:meth:`AnomalyDetector.learn <wavetrain.models.anomaly.AnomalyDetector.learn>` fits the same model on
either.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from wavetrain.evaluation.metrics import confusion
from wavetrain.models.mixture import FrameKeys, KeyedSample, LabelEM, Stats, Theta, em_fit
from wavetrain.stream.batches import SplitsValidation, WindowStream, mapped

if TYPE_CHECKING:
    from wavetrain.models.gmm import GMMClassifier

__all__ = ["Confusion", "Executor", "Moments", "Pass", "ScoreList", "StreamExecutor", "fit_mixture"]

S = TypeVar("S")


class Pass(Protocol[S]):
    """One pass of mergeable statistics over labelled windows."""

    def new(self) -> S:
        """Empty statistics (the zero of ``merge``)."""
        ...

    def add(self, state: S, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]) -> S:
        """``state`` with a batch of windows added: their grams, label indices (all >= 0) and the
        ordinal of each window's recording in the executor's data set."""
        ...

    def merge(self, a: S, b: S) -> S:
        """The statistics of two disjoint parts of the data together."""
        ...


@runtime_checkable
class Executor(Protocol):
    """Labelled windows of a data set, and the passes that run over them.

    Attributes
    ----------
    labels : list of str
        Label values (window label indices index this list).
    feature_dim : int
        Values per feature frame.
    rate, channels : int or None
        The features' sample rate and channels (as the model records them).
    """

    labels: list[str]
    feature_dim: int
    rate: int | None
    channels: int | None

    def run(self, p: Pass[S]) -> S:
        """One pass over every labelled window, the statistics of every part merged."""
        ...

    def split(self, fraction: float, seed: int, group_by: str | None) -> tuple[Executor, Executor] | None:
        """``(train, held-out)`` executors with about ``fraction`` of the recordings (whole groups
        with ``group_by``) held out, as :func:`~wavetrain.data.splits.holdout_split` chooses them;
        None when this data cannot hold recordings out."""
        ...

    def scores(self, model: Any) -> np.ndarray:
        """``model.anomaly_score`` of every labelled window, in data set order (recording by
        recording, each recording's windows in time order)."""
        ...

    def train_steps(self, model: Any, valid: Executor | None, options: Any) -> None:
        """Fit ``model`` (its layout taken) by gradient steps on these windows, validating on
        ``valid``: its :meth:`~wavetrain.models.base.Classifier.fit_rank` on one local stream,
        or on Spark as distributed-data-parallel ranks, each on its share of the part files."""
        ...

    def view(self, fn: Callable[[np.ndarray], np.ndarray], feature_dim: int) -> Executor:
        """These windows, each passed through ``fn`` (``feature_dim`` values per frame): an
        ensemble member's columns of the combined features. Splits split the view."""
        ...


class StreamExecutor:
    """The local executor: passes over a :class:`~wavetrain.stream.batches.WindowStream`, batch by batch.

    With ``every_window`` every window counts, labelled 0 (a detector's normal windows, whether
    the stream has a label or not); otherwise only the labelled ones."""

    def __init__(self, stream: WindowStream, *, every_window: bool = False):
        self.stream, self.every_window = stream, every_window
        self.labels = list(stream.labels)
        self.feature_dim, self.rate, self.channels = int(stream.feature_dim), stream.rate, stream.channels

    def run(self, p: Pass[S]) -> S:
        state, n = p.new(), 0
        for batch in self.stream.batches():
            ys = np.zeros(len(batch.grams), dtype=np.int64) if self.every_window else np.asarray(batch.y)
            keep = [i for i, y in enumerate(ys) if y >= 0]
            refs = batch.refs
            ordinals = [refs[i][0] if refs is not None else n + i for i in keep]
            n += len(batch.grams)
            if keep:
                grams = batch.grams if len(keep) == len(batch.grams) else [batch.grams[i] for i in keep]
                state = p.add(state, grams, ys[keep], ordinals)
        return state

    def split(self, fraction: float, seed: int, group_by: str | None) -> tuple[StreamExecutor, StreamExecutor] | None:
        if not isinstance(self.stream, SplitsValidation):
            return None
        train, valid = self.stream.split_validation(fraction, seed, group_by=group_by)
        every = self.every_window
        return StreamExecutor(train, every_window=every), StreamExecutor(valid, every_window=every)

    def scores(self, model: Any) -> np.ndarray:
        return self.run(ScoreList(model)).scores()

    def train_steps(self, model: Any, valid: Executor | None, options: Any) -> None:
        if valid is not None and not isinstance(valid, StreamExecutor):
            raise TypeError(f"a local executor validates on a local executor, not {type(valid).__name__}")
        model.fit_rank(self.stream, None if valid is None else valid.stream, options)

    def view(self, fn: Callable[[np.ndarray], np.ndarray], feature_dim: int) -> StreamExecutor:
        return StreamExecutor(mapped(self.stream, fn, feature_dim), every_window=self.every_window)


# -- passes every statistic family can use --------------------------------------------------------
@dataclass
class MomentState:
    """Count, mean and sum of squared deviations of vectors (``mean``/``m2`` None while empty)."""

    n: int = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None

    def merged(self, other: MomentState) -> MomentState:
        """Both parts' moments (Chan et al.'s parallel algorithm: exact up to rounding, and the
        same whichever part comes first up to rounding). A part without vectors adds nothing."""
        if other.mean is None or other.m2 is None or other.n == 0:
            return self
        if self.mean is None or self.m2 is None or self.n == 0:
            return other
        total = self.n + other.n
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.n / total)
        m2 = self.m2 + other.m2 + delta ** 2 * (self.n * other.n / total)
        return MomentState(total, mean, m2)


@dataclass
class Moments:
    """Moments of the vectors ``vectors(gram)`` of every window (a ``(m, dims)`` array each)."""

    vectors: Any

    def new(self) -> MomentState:
        return MomentState()

    def add(self, state: MomentState, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]
            ) -> MomentState:
        v = np.concatenate([self.vectors(g) for g in grams])
        if v.shape[0] == 0:                    # windows of no frames: their mean would be NaN
            return state
        mb = v.mean(axis=0)
        return state.merged(MomentState(v.shape[0], mb, ((v - mb) ** 2).sum(axis=0)))

    def merge(self, a: MomentState, b: MomentState) -> MomentState:
        return a.merged(b)


@dataclass
class ScoreParts:
    """Scores with where each comes from: recording ordinal and the window's place in it."""

    ordinals: list[np.ndarray] = field(default_factory=list)
    places: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)
    seen: dict[int, int] = field(default_factory=dict)     # windows so far per ordinal (this part)

    def scores(self) -> np.ndarray:
        """Every score, in data set order (by ordinal, then place): the same whatever the parts."""
        return self.ordered()[1]

    def ordered(self) -> tuple[np.ndarray, np.ndarray]:
        """The recording ordinal and score of every window, in data set order."""
        if not self.values:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        o, p, v = (np.concatenate(x) for x in (self.ordinals, self.places, self.values))
        order = np.lexsort((p, o))
        return o[order], v[order]


@dataclass
class ScoreList:
    """An exact collection of one score per window, ``model.<of>(grams)`` (a detector's anomaly
    score by default): a mergeable list, the driver holds one float per window, so it is meant for
    held-out or small data."""

    model: Any
    of: str = "anomaly_score"

    def new(self) -> ScoreParts:
        return ScoreParts()

    def add(self, state: ScoreParts, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]
            ) -> ScoreParts:
        places = np.empty(len(ordinals), dtype=np.int64)
        for i, o in enumerate(ordinals):
            places[i] = state.seen.get(int(o), 0)
            state.seen[int(o)] = int(places[i]) + 1
        state.ordinals.append(np.asarray(ordinals, dtype=np.int64))
        state.places.append(places)
        state.values.append(np.asarray(getattr(self.model, self.of)(grams), dtype=np.float64))
        return state

    def merge(self, a: ScoreParts, b: ScoreParts) -> ScoreParts:
        # a recording (an ordinal) is read whole by one part, so places never collide
        return ScoreParts(a.ordinals + b.ordinals, a.places + b.places, a.values + b.values, {})


@dataclass
class Confusion:
    """The confusion matrix of a fitted classifier's predictions of the windows (rows: each
    window's value among ``labels``; columns: the predicted value, then any other: see
    :func:`~wavetrain.evaluation.metrics.confusion`); counts, merged by adding."""

    model: Any
    labels: list[str]

    def new(self) -> np.ndarray:
        return np.zeros((len(self.labels), len(self.labels) + 1), dtype=np.int64)

    def add(self, state: np.ndarray, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]
            ) -> np.ndarray:
        state += confusion([self.labels[int(y)] for y in ys], self.model.predict(grams), self.labels)
        return state

    def merge(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b


# -- the mixture passes (a ``gmm``'s EM, on any executor) -----------------------------------------
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
    """One E-step: the sufficient statistics of each active label under ``thetas`` (they add)."""

    model: Any
    thetas: list[Theta]
    active: np.ndarray

    def new(self) -> list[Stats | None]:
        return [None] * len(self.thetas)

    def add(self, state: list, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]) -> list:
        stats = self.model.pass_stats(zip(grams, (int(y) for y in ys)), self.thetas, self.active)
        return _add(state, [s if a else None for s, a in zip(stats, self.active)])

    def merge(self, a: list, b: list) -> list:
        return _add(a, b)


@dataclass
class MixtureScores:
    """Count, sum and sum of squares of each label's window scores (they add)."""

    model: Any

    def new(self) -> np.ndarray:
        return np.zeros((len(self.model.fitted_labels), 3))

    def add(self, state: np.ndarray, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]
            ) -> np.ndarray:
        return state + self.model.score_sums(zip(grams, (int(y) for y in ys)))

    def merge(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b


def fit_mixture(model: GMMClassifier, data: Executor, *, labels: Sequence[str] | None = None,
                on_pass: Callable[[list[LabelEM]], None] | None = None) -> GMMClassifier:
    """Fit a ``gmm`` on ``data``'s labelled windows by passes: the init sample, one E-step per EM
    iteration with the M-step (and SQUAREM) on the driver (:func:`~wavetrain.models.mixture.em_fit`,
    as the local fit runs it), and the training score statistics. Equal to the local fit up to the
    order of summation; ``train_info_`` records the seconds of each stage. ``labels``: the values
    window label indices name (default ``data.labels``)."""
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
