"""How a family learns, written once for any executor: passes of mergeable statistics, or
gradient steps.

A :class:`Pass` says what one pass over the labelled windows computes: an empty statistics object
(``new``), how a batch of windows is added to it (``add``) and how two of them, from two parts of
the data, are combined (``merge``: associative and, where the maths allows, independent of the
order). An :class:`Executor` runs a pass over every labelled window of its data and returns the
merged statistics; the family's driver-side code (an M-step, a threshold) runs between passes. A
family that learns by gradient steps hands the executor itself (:meth:`Executor.train_steps`):
the local executor fits it on its stream, the Spark executor as distributed-data-parallel ranks.

A pass whose work is heavy may declare a kernel (:class:`KernelPass`): the pieces its windows
are cut into, the work on one piece on a :class:`~wavetrain.models.device_pool.Device`, and how
a piece's result is folded into the statistics in order. An executor may spread the pieces over
devices; the statistics are those of one device.

:class:`StreamExecutor` is the local executor: one shard, a :class:`~wavetrain.stream.batches.WindowStream`
read batch by batch. For one fit (:meth:`Executor.using`) it keeps the windows of its first pass
in memory while they fit the frame cache the family asks for, so later passes read memory and not
the stream (which may decode and augment every recording again), and it spreads kernel passes
over the fit's devices (:class:`~wavetrain.models.device_pool.DevicePool`). The Spark executor
(:class:`wavetrain.spark.passes.SparkExecutor`) runs each pass as one job over the feature
table's part files, so a family that learns through :meth:`Classifier.learn
<wavetrain.models.base.Classifier.learn>` fits the same model on either.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from wavetrain.models.device_pool import CPU, Device, DevicePool
from wavetrain.stream.batches import CountsFrames, SplitsValidation, WindowStream, mapped

__all__ = ["Executor", "KernelPass", "Moments", "Pass", "RankFit", "ScoreList", "StreamExecutor",
           "Window", "add_by_kernel"]

log = logging.getLogger(__name__)

S = TypeVar("S")

#: One labelled window as a kernel pass reads it: ``(gram, label index, recording ordinal)``.
Window = tuple[np.ndarray, int, int]
#: Bytes a kept window costs beyond its frames (the array's header, its label and ordinal).
WINDOW_OVERHEAD = 128


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
class KernelPass(Protocol[S]):
    """A :class:`Pass` whose work is a kernel over pieces of its windows, which an executor may
    spread over devices: ``fold(state, compute(device, setup(device), piece))`` for every piece of
    ``pieces(windows)``, folded in the pieces' order, is what ``add`` does on the numpy device
    (:func:`add_by_kernel`).

    ``pieces_key`` names pieces that depend on the windows only, never on the pass's parameters
    (None: they do): the local executor keeps such pieces beside its frame cache, within its
    budget, and hands them to every later pass of the same key instead of cutting them again."""

    @property
    def pieces_key(self) -> Hashable | None:
        ...

    def new(self) -> S:
        ...

    def add(self, state: S, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: Sequence[int]) -> S:
        ...

    def merge(self, a: S, b: S) -> S:
        ...

    def pieces(self, windows: Iterable[Window]) -> Iterator[Any]:
        """The pieces of work of these windows, in order (cheap: the work is in ``compute``);
        ``windows`` may be every window of a pass, so pieces may span batches."""
        ...

    def setup(self, device: Device) -> Any:
        """What ``compute`` needs on ``device`` (parameters copied to it), once per pass."""
        ...

    def compute(self, device: Device, context: Any, piece: Any) -> Any:
        """The work on one piece, on ``device``."""
        ...

    def fold(self, state: S, result: Any) -> S:
        """``state`` with one piece's result added."""
        ...


def add_by_kernel(p: KernelPass[S], state: S, windows: Iterable[Window], device: Device = CPU) -> S:
    """``state`` with ``windows`` added by ``p``'s kernel on one device (a kernel pass's ``add``)."""
    context = p.setup(device)
    for piece in p.pieces(windows):
        state = p.fold(state, p.compute(device, context, piece))
    return state


class RankFit(Protocol):
    """A family that learns by gradient steps: what :meth:`Executor.train_steps` runs in each
    process (the local fit, or one distributed rank's share on Spark)."""

    def fit_rank(self, stream: WindowStream, valid: WindowStream | None, options: Any) -> None:
        """Fit from one local stream, the layout already taken, validating on ``valid``."""
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

    def using(self, *, cache_bytes: int = 0, devices: Sequence[str] = ()) -> AbstractContextManager[Executor]:
        """These windows for one fit: kept in memory after their first pass while they take at
        most ``cache_bytes``, kernel passes spread over ``devices`` (none, or ``cpu`` alone: this
        thread), where the executor can; what it cannot do it ignores. The devices are checked
        on entry and released on exit; :meth:`report` tells how they were used."""
        ...

    def report(self) -> dict[str, Any]:
        """``train_info_`` fields of the fit's devices (blocks and seconds per device), or none."""
        ...

    def split(self, fraction: float, seed: int, group_by: str | None, strata: Sequence[str] = ()
              ) -> tuple[Executor, Executor] | None:
        """``(train, held-out)`` executors with about ``fraction`` of the recordings (whole groups
        with ``group_by``; of each combination of the ``strata`` labels' values) held out, as
        :func:`~wavetrain.data.splits.holdout_split` chooses them; None when this data cannot hold
        recordings out."""
        ...

    def recording_values(self, names: Sequence[str]) -> list[tuple[str, ...]] | None:
        """Per recording ordinal (as passes see them), its values of the labels ``names`` (``""``
        where it has none); None when these windows do not know their recordings."""
        ...

    def scores(self, model: Any) -> np.ndarray:
        """``model.anomaly_score`` of every labelled window, in data set order (recording by
        recording, each recording's windows in time order)."""
        ...

    def train_steps(self, model: Any, valid: Executor | None, options: Any) -> None:
        """Fit ``model`` (its layout taken) by gradient steps on these windows, validating on
        ``valid``: its :meth:`RankFit.fit_rank` on one local stream, or on Spark as
        distributed-data-parallel ranks, each on its share of the part files."""
        ...

    def view(self, fn: Callable[[np.ndarray], np.ndarray], feature_dim: int) -> Executor:
        """These windows, each passed through ``fn`` (``feature_dim`` values per frame): an
        ensemble member's columns of the combined features. Splits split the view."""
        ...


#: A batch of labelled windows as passes read it: grams, label indices, recording ordinals.
_Labelled = tuple[Sequence[np.ndarray], np.ndarray, list[int]]


class _FrameCache:
    """The windows of one pass kept while they take at most ``budget`` bytes (given up, and
    freed, as soon as they do not)."""

    def __init__(self, budget: int):
        self.budget, self.bytes = budget, 0
        self.batches: list[_Labelled] | None = [] if budget > 0 else None
        self.complete = False

    def add(self, grams: Sequence[np.ndarray], ys: np.ndarray, ordinals: list[int]) -> None:
        if self.batches is None:
            return
        self.bytes += sum(g.nbytes + WINDOW_OVERHEAD for g in grams)
        if self.bytes > self.budget:
            self.batches = None
            return
        # copies: a stream may hand out views of a buffer it fills again, or of a whole recording
        self.batches.append(([np.array(g) for g in grams], ys.copy(), list(ordinals)))


def _nbytes(piece: Any) -> int:
    """Bytes of the arrays in a piece (an array, or a tuple or list of them and other values)."""
    if isinstance(piece, np.ndarray):
        return int(piece.nbytes)
    if isinstance(piece, (tuple, list)):
        return sum(_nbytes(x) for x in piece)
    return 0


class StreamExecutor:
    """The local executor: passes over a :class:`~wavetrain.stream.batches.WindowStream`, batch by batch.

    With ``every_window`` every window counts, labelled 0 (a detector's normal windows, whether
    the stream has a label or not); otherwise only the labelled ones.

    Within :meth:`using` (``cache_bytes`` > 0) the first pass keeps the labelled windows in memory
    when they fit (a stream that counts its frames and says they will not is not gathered), and
    later passes read them: every pass of a training stream sees the same windows (augmented
    streams draw the same augmentation each pass), so they give the same statistics. With
    ``devices``, kernel passes are spread over a :class:`~wavetrain.models.device_pool.DevicePool`.
    """

    def __init__(self, stream: WindowStream, *, every_window: bool = False):
        self.stream, self.every_window = stream, every_window
        self.labels = list(stream.labels)
        self.feature_dim, self.rate, self.channels = int(stream.feature_dim), stream.rate, stream.channels
        self.cache_bytes = 0
        self.pool: DevicePool | None = None
        self._cache: _FrameCache | None = None
        self._pieces: dict[Hashable, list[Any] | None] = {}      # kept pieces by key (None: they did not fit)

    @contextmanager
    def _using(self, cache_bytes: int, devices: Sequence[str]) -> Iterator[StreamExecutor]:
        out = StreamExecutor(self.stream, every_window=self.every_window)
        out.cache_bytes = max(0, int(cache_bytes))
        devices = list(devices)
        pool = DevicePool(devices) if devices and devices != ["cpu"] else None   # a wrong device fails here
        out.pool = pool
        try:
            yield out
        finally:
            out._cache, out._pieces = None, {}
            if pool is not None:
                pool.close()

    def using(self, *, cache_bytes: int = 0, devices: Sequence[str] = ()) -> AbstractContextManager[StreamExecutor]:
        return self._using(cache_bytes, devices)

    def report(self) -> dict[str, Any]:
        return self.pool.report() if self.pool is not None else {}

    def _batches(self) -> Iterator[_Labelled]:
        """The labelled windows of one pass, batch by batch: from memory once a pass kept them."""
        if self._cache is not None and self._cache.complete:
            yield from self._cache.batches or ()
            return
        cache = self._new_cache()
        n = 0
        for batch in self.stream.batches():
            ys = np.zeros(len(batch.grams), dtype=np.int64) if self.every_window else np.asarray(batch.y)
            keep = [i for i, y in enumerate(ys) if y >= 0]
            refs = batch.refs
            ordinals = [refs[i][0] if refs is not None else n + i for i in keep]
            n += len(batch.grams)
            if keep:
                grams = batch.grams if len(keep) == len(batch.grams) else [batch.grams[i] for i in keep]
                item = (grams, ys[keep], ordinals)
                if cache is not None:
                    cache.add(*item)
                yield item
        if cache is not None:
            self._keep(cache)

    def _new_cache(self) -> _FrameCache | None:
        """A cache for this pass's windows: none without a budget, once a pass gave up, or when
        the stream says its frames (as float32) will not fit."""
        if self.cache_bytes <= 0 or self._cache is not None:
            return None
        expected = self.stream.expected_frames() if isinstance(self.stream, CountsFrames) else None
        if expected is not None and expected * self.feature_dim * 4 > self.cache_bytes:
            self._cache = _FrameCache(0)
            self._warn_rereading(expected * self.feature_dim * 4)
            return None
        return _FrameCache(self.cache_bytes)

    def _keep(self, cache: _FrameCache) -> None:
        self._cache = cache
        if cache.batches is None:
            self._warn_rereading(cache.bytes)
        else:
            cache.complete = True

    def _warn_rereading(self, need: int) -> None:
        aug = getattr(self.stream, "augment", None)
        if aug is not None and aug.waveform:
            log.warning("the augmented training windows (%d MB or more) do not fit the frame cache (%d MB): every "
                        "pass decodes and augments the audio again; a larger frame_cache_mb (--set "
                        "frame_cache_mb=%d) keeps them", need >> 20, self.cache_bytes >> 20, (need >> 20) + 16)

    def _windows(self) -> Iterator[Window]:
        for grams, ys, ordinals in self._batches():
            yield from zip(grams, (int(y) for y in ys), ordinals)

    def run(self, p: Pass[S]) -> S:
        if isinstance(p, KernelPass):
            return self._run_kernel(p)
        state = p.new()
        for grams, ys, ordinals in self._batches():
            state = p.add(state, grams, ys, ordinals)
        return state

    def _run_kernel(self, p: KernelPass[S]) -> S:
        """The kernel's pieces of every window of the pass (pieces may span batches), on this
        thread or spread over the pool's devices, folded in order."""
        items = self._pieces_of(p)
        if self.pool is None:
            state, context = p.new(), p.setup(CPU)
            for piece in items:
                state = p.fold(state, p.compute(CPU, context, piece))
            return state
        out = [p.new()]

        def fold(result: Any) -> None:
            out[0] = p.fold(out[0], result)

        self.pool.map(items, p.compute, fold, setup=p.setup)
        return out[0]

    def _pieces_of(self, p: KernelPass[Any]) -> Iterable[Any]:
        """``p``'s pieces: those kept for its key, else cut from the windows (and, the first time
        a key comes with the windows in memory, kept as they are cut while the windows and every
        kept piece fit the frame cache)."""
        key, cache = p.pieces_key, self._cache
        if key is not None and self._pieces.get(key) is not None:
            return self._pieces[key] or ()
        pieces = p.pieces(self._windows())
        if key is None or key in self._pieces or cache is None or not cache.complete:
            return pieces
        return self._keeping(key, pieces, cache.bytes)

    def _keeping(self, key: Hashable, pieces: Iterable[Any], held: int) -> Iterator[Any]:
        held += sum(_nbytes(x) for kept in self._pieces.values() for x in kept or ())
        kept: list[Any] | None = []
        for piece in pieces:
            if kept is not None:
                held += _nbytes(piece)
                if held > self.cache_bytes:
                    kept = None                  # given up; this pass goes on with the pieces as cut
                else:
                    kept.append(piece)
            yield piece
        self._pieces[key] = kept

    def split(self, fraction: float, seed: int, group_by: str | None, strata: Sequence[str] = ()
              ) -> tuple[StreamExecutor, StreamExecutor] | None:
        if not isinstance(self.stream, SplitsValidation):
            return None
        train, valid = self.stream.split_validation(fraction, seed, group_by=group_by, strata=strata)
        return self._like(train, keep=True), self._like(valid, keep=False)

    def recording_values(self, names: Sequence[str]) -> list[tuple[str, ...]] | None:
        ds = getattr(self.stream, "dataset", None)
        return None if ds is None else list(zip(*[[v or "" for v in ds.values(n)] for n in names], strict=True))

    def _like(self, stream: WindowStream, *, keep: bool) -> StreamExecutor:
        """An executor of ``stream`` with this one's devices, and its frame cache when ``keep``."""
        out = StreamExecutor(stream, every_window=self.every_window)
        out.cache_bytes, out.pool = (self.cache_bytes if keep else 0), self.pool
        return out

    def scores(self, model: Any) -> np.ndarray:
        return self.run(ScoreList(model)).scores()

    def train_steps(self, model: RankFit, valid: Executor | None, options: Any) -> None:
        if valid is not None and not isinstance(valid, StreamExecutor):
            raise TypeError(f"a local executor validates on a local executor, not {type(valid).__name__}")
        model.fit_rank(self.stream, None if valid is None else valid.stream, options)

    def view(self, fn: Callable[[np.ndarray], np.ndarray], feature_dim: int) -> StreamExecutor:
        return self._like(mapped(self.stream, fn, feature_dim), keep=True)


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
