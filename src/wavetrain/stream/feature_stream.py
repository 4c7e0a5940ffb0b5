"""The feature stream: recordings -> feature grams -> windows -> batches.

Three parts, one job each, put together here:

* :class:`~wavetrain.stream.source.FeatureSource` — one recording to its gram (memory cache, feature
  store, extraction);
* :func:`~wavetrain.stream.windows.cut_windows` — a gram to its windows (padding included);
* :class:`~wavetrain.stream.scheduler.Scheduler` — a small worker pool ahead of the consumer, with a
  bounded prefetch (back-pressure, never an unbounded queue) and the consumer's wait measured.

The stream can be iterated any number of times (EM passes, epochs); features come from the
content-addressed store after the first pass.

A training stream may augment (``augment=``, a parsed :class:`~wavetrain.features.augment.Augmenter`,
the model's own): the ``seed`` of :meth:`FeatureStream.batches` is then the draw index of every
recording's augmentation, so passes with the same seed (a mixture's EM passes) see the same
augmented windows and passes with another seed (a neural model's epochs) fresh ones; with
``copies(n=K)`` a pass holds K augmented copies of each recording, one after the other. Augmented
grams are extracted on every pass and kept nowhere; :meth:`FeatureStream.precompute` and the
validation part of :meth:`FeatureStream.split_validation` stay clean.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from wavetrain.core.errors import AudioError, UserError
from wavetrain.core.progress import progress_counter
from wavetrain.data.dataset import Dataset
from wavetrain.data.recording import Recording
from wavetrain.data.splits import holdout_split
from wavetrain.features import FeatureSpec
from wavetrain.features.augment import Augmenter
from wavetrain.store import MemoryCache, Store
from wavetrain.stream import scheduler
from wavetrain.stream.batches import Batch
from wavetrain.stream.scheduler import Scheduler
from wavetrain.stream.source import FeatureSource
from wavetrain.stream.windows import Windowing, cut_windows, silence_row

__all__ = ["FeatureStream", "StreamStats", "recording_windows"]

#: One recording loaded: its label index, windows and their references (index, start, end ms).
Loaded = tuple[int, list[np.ndarray], list[tuple[int, int, int]]]
#: What a worker returns per recording: ``(index, loaded, None)`` or ``(index, None, error)``.
Result = tuple[int, Loaded | None, AudioError | None]


def recording_windows(source: FeatureSource, windowing: Windowing, rec: Recording, g: np.ndarray, shift: float,
                      duration_ms: int, draw: int | None = None) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """A recording's gram ``g`` cut into windows (``shift``: seconds per frame; the recording
    lasts ``duration_ms``), padded as the spec pads, and with ``draw`` the masks of the source's
    augmenter applied (drawn from its seed, the recording's content id, the draw and each window's
    place): ``(windows, (start ms, end ms) of each)``. The one rule of the local stream and the
    Spark executors, so both see the same windows of the same draw."""
    spec = source.spec
    silence = None if spec.per_axis else lambda: silence_row(spec, source.rate_of(rec))
    wins, times = cut_windows(g, windowing, shift, duration_ms, silence=silence)
    aug = source.augment
    if draw is not None and aug is not None and aug.masks:
        seed, cid = source.augment_seed, rec.id
        wins = [aug.mask(w, seed=seed, content_id=cid, draw=draw, index=k) for k, w in enumerate(wins)]
    return wins, times


@dataclass
class StreamStats:
    """Counters of one stream (all passes)."""

    windows: int = 0
    recordings: int = 0
    extracted: int = 0          # grams computed (store misses)
    augmented: int = 0          # augmented grams computed (every pass of an augmenting stream)
    store_reads: int = 0        # grams read from the feature store (hits)
    wait_s: float = 0.0         # consumer time spent waiting for the next batch
    total_s: float = 0.0        # consumer wall time inside batches()
    features_s: float = 0.0     # wall time of precompute(): extracting or reading every gram once
    features_wait_s: float = 0.0   # the parts of wait_s and total_s spent in precompute()
    features_total_s: float = 0.0
    skipped: list = field(default_factory=list)
    #: The stats of the stream this one is a subset of: its extraction counters (``extracted``,
    #: ``augmented``, ``store_reads``) count this one's too, so a run's summary covers its parts.
    also: StreamStats | None = None

    @property
    def wait_fraction(self) -> float:
        return self.wait_s / self.total_s if self.total_s > 0 else 0.0

    @property
    def fit_wait_fraction(self) -> float:
        """Waiting for data as a fraction of the passes after :meth:`FeatureStream.precompute`
        (in precompute the consumer does nothing but wait for extraction, by design)."""
        total = self.total_s - self.features_total_s
        return (self.wait_s - self.features_wait_s) / total if total > 0 else 0.0


class FeatureStream:
    """Labelled windows of a data set, as batches of feature grams (a
    :class:`~wavetrain.stream.batches.WindowStream` that counts its frames and splits off a validation
    part).

    Parameters
    ----------
    dataset : Dataset
    spec : FeatureSpec or str
    label : str or None
        Label name; ``None`` for unlabelled data (``Batch.y`` is -1).
    labels : list of str or None
        Class values in index order; default: sorted values present in ``dataset``.
    windowing : Windowing
    store : Store or None
        Where computed grams are kept; ``None`` = :class:`~wavetrain.store.NullStore`.
    batch_windows : int, default=64
        Windows per batch.
    workers : int, default=1
        Threads that load and extract ahead of the consumer.
    prefetch : int, default=4
        Units in flight at most (bounds memory): a unit is one recording, or a group of short
        recordings of up to :data:`~wavetrain.stream.scheduler.GROUP_S` seconds in all.
    cache : MemoryCache or None
        In-memory, cost-aware cache of grams in front of the store (what makes repeated passes
        cheap with a :class:`~wavetrain.store.NullStore`).
    skip_bad : bool, default=False
        Skip recordings that fail to load or extract (recorded in ``stats.skipped``) instead of raising.
    rate, channels : int or None
        Rate (Hz) the features are computed at and per-axis channel count (see
        :class:`~wavetrain.stream.source.FeatureSource`).
    augment : Augmenter or None
        Augmentation of every pass of :meth:`batches` (parsed once, by the model: see
        :mod:`wavetrain.features.augment`); None or empty: none.
    augment_seed : int
        Seed of the augmentation draws (a model's ``seed``).
    """

    def __init__(self, dataset: Dataset, spec: FeatureSpec | str, *, label: str | None = None,
                 labels: Sequence[str] | None = None, windowing: Windowing | None = None, store: Store | None = None,
                 batch_windows: int = 64, workers: int = 1, prefetch: int = 4, skip_bad: bool = False,
                 device: str = "cpu", cache: MemoryCache | None = None, rate: int | None = None,
                 channels: int | None = None, augment: Augmenter | None = None, augment_seed: int = 0):
        self.dataset = dataset
        self.stats = StreamStats()
        self.source = FeatureSource(spec, rate=rate, channels=channels, store=store, cache=cache, device=device,
                                    stats=self.stats, augment=augment or None, augment_seed=augment_seed)
        self.spec = self.source.spec
        self.label = dataset.resolve_label(label) if label is not None else None
        if labels is None and self.label is not None:
            labels = sorted({v for v in dataset.values(self.label) if v not in (None, "")})
        self.labels = list(labels or [])
        self._index = {v: i for i, v in enumerate(self.labels)}
        self.windowing = windowing or Windowing()
        self.batch_windows = max(1, int(batch_windows))
        self.workers = max(1, int(workers))
        self.prefetch = max(1, int(prefetch))
        self.skip_bad = skip_bad
        self._meta_cache: dict[int, tuple[int, float, int, int]] = {}
        self._bad: set[int] = set()  # recordings that failed once (with skip_bad): never retried
        self._feature_dim: int | None = None
        if self.spec.extractor.whole:          # refused before any work, not at the first window
            self.windowing.check_frames(0.0, self.spec.name)

    @property
    def rate(self) -> int | None:
        """Rate (Hz) the features are computed at (None: each recording's own)."""
        return self.source.rate

    @property
    def channels(self) -> int | None:
        return self.source.channels

    @property
    def augment(self) -> Augmenter | None:
        """The augmentation of :meth:`batches` (None: none)."""
        return self.source.augment

    # -- derived streams ------------------------------------------------------------------------
    def subset(self, indices: Sequence[int] | np.ndarray, *, augment: bool = True) -> FeatureStream:
        """The same stream over some recordings (label order kept); ``augment=False``: without
        this stream's augmentation."""
        src = self.source
        s = FeatureStream(self.dataset.subset(indices), self.spec, label=None, labels=self.labels,
                          windowing=self.windowing, store=src.store, batch_windows=self.batch_windows,
                          workers=self.workers, prefetch=self.prefetch, skip_bad=self.skip_bad, device=src.device,
                          cache=src.cache, rate=src.rate, channels=src.channels,
                          augment=src.augment if augment else None, augment_seed=src.augment_seed)
        s.label = self.label
        s._feature_dim = self._feature_dim
        s.stats.also = self.stats
        # recordings already found bad here are skipped there without another try (or report)
        s._bad = {new for new, old in enumerate(indices) if old in self._bad}
        return s

    def split_validation(self, fraction: float, seed: int = 0, group_by: str | None = None,
                         strata: Sequence[str] = ()) -> tuple[FeatureStream, FeatureStream]:
        """Hold out about ``fraction`` of the recordings (whole groups with ``group_by``; of each
        combination of the ``strata`` labels' values); the held-out part is never augmented."""
        train, valid = holdout_split(self.dataset, fraction, seed=seed, group_by=group_by, strata=strata)
        return self.subset(train), self.subset(valid, augment=False)

    # -- sizes ----------------------------------------------------------------------------------
    def expected_frames(self) -> int | None:
        """About how many feature frames a pass yields in labelled windows (all windows for an
        unlabelled stream), from durations known without opening files; None while some
        recording's duration is unknown."""
        total = 0
        counts: dict[tuple[int, int], int] = {}      # (samples, rate) -> frames in windows
        for i, rec in enumerate(self.dataset):
            if i in self._bad or (self.label is not None and rec.labels.get(self.label) not in self._index):
                continue
            d, info = rec.known_duration_s(), rec.known_info()
            if d is None or info is None:
                return None
            key = (int(round(d * info.rate)), info.rate)
            n = counts.get(key)
            if n is None:
                shift = self.source.frame_shift(self.rate or info.rate)
                frames = self.source.spec_for(rec)[0].n_frames(*key)
                n = counts[key] = sum(stop - start for start, stop in self.windowing.spans(frames, shift))
            total += n
        return total

    @property
    def feature_dim(self) -> int:
        if self._feature_dim is None:
            for i, rec in enumerate(self.dataset):
                if i in self._bad:
                    continue
                try:
                    self._feature_dim = int(self.source.gram(rec).shape[1])
                    break
                except AudioError as e:
                    if not self.skip_bad:
                        raise
                    self._bad.add(i)
                    self.stats.skipped.append((rec, str(e)))
            else:
                raise UserError("no usable recordings in the data set")
        return self._feature_dim

    def __len__(self) -> int:
        return len(self.dataset)

    # -- one recording --------------------------------------------------------------------------
    def _meta(self, i: int, rec: Recording) -> tuple[int, float, int, int]:
        """Per recording, computed once: (label index, frame shift s, segment offset ms, duration ms)."""
        m = self._meta_cache.get(i)
        if m is None:
            y = -1
            if self.label is not None:
                v = rec.labels.get(self.label)
                y = self._index.get(v, -1) if v is not None else -1
            shift = self.source.frame_shift(self.source.rate_of(rec))
            m = (y, shift, rec.segment_ms[0] if rec.segment_ms else 0, int(round(rec.duration_s * 1000)))
            self._meta_cache[i] = m
        return m

    def _windows(self, i: int, rec: Recording, g: np.ndarray | None = None, draw: int | None = None) -> Loaded:
        """Load one recording: its label index, windows and their references (with ``draw``:
        augmented by draw ``draw``)."""
        if g is None:
            g = self.source.gram(rec) if draw is None else self.source.gram(rec, draw)
        y, shift, offset, duration_ms = self._meta(i, rec)
        wins, times = recording_windows(self.source, self.windowing, rec, g, shift, duration_ms, draw)
        return y, wins, [(i, offset + s, offset + e) for s, e in times]

    @property
    def _copies(self) -> int:
        """Augmented copies of each recording in an augmenting pass (``copies(n=K)``; 1 without)."""
        return self.source.augment.copies if self.source.augment is not None else 1

    def _item(self, item: int, draw: int | None) -> tuple[int, int | None]:
        """A pass's work item -> (recording index, its draw): an augmenting pass with ``copies``
        per recording numbers copy ``k`` of recording ``i`` ``k * len(dataset) + i``, drawn
        ``draw * copies + k``."""
        if draw is None:
            return item, None
        n = len(self.dataset)
        return item % n, draw * self._copies + item // n

    def _windows_group(self, items: list[int], draw: int | None = None) -> list[Result]:
        """On a worker: ``_windows`` of each item (:meth:`_item`), in order, as ``(i, result,
        None)`` or ``(i, None, AudioError)`` so that one bad recording does not lose its group."""
        out: list[Result] = []
        for item in items:
            i, d = self._item(item, draw)
            try:
                rec = self.dataset[i]
                out.append((i, self._windows(i, rec) if d is None else self._windows(i, rec, draw=d), None))
            except AudioError as e:
                out.append((i, None, e))
        return out

    def _ready(self, item: int, draw: int | None = None) -> Result | None:
        """A recording whose gram is in memory: loaded now, without a hand-off to a worker."""
        i, d = self._item(item, draw)
        rec = self.dataset[i]
        g = self.source.in_memory(rec) if d is None else self.source.in_memory(rec, d)
        if g is None:
            return None
        return i, self._windows(i, rec, g) if d is None else self._windows(i, rec, g, d), None

    def _seconds(self, item: int) -> float:
        """Duration for grouping, without opening files on the consumer thread: a recording
        whose header has not been read yet counts as long (a group of its own; the worker reads
        it, and later passes know it)."""
        d = self.dataset[item % len(self.dataset)].known_duration_s()
        return scheduler.GROUP_S if d is None else d

    # -- iteration ------------------------------------------------------------------------------
    def order(self, shuffle: bool, seed: int) -> list[int]:
        idx = list(range(len(self.dataset)))
        if shuffle:
            np.random.default_rng(seed).shuffle(idx)
        return idx

    def batches(self, *, shuffle: bool = False, seed: int = 0) -> Iterator[Batch]:
        """One pass: batches of ``batch_windows`` windows (recordings in order, or shuffled by
        ``seed``); an augmenting stream augments them with draw index ``seed``."""
        return self._pass(shuffle, seed, seed if self.source.augment is not None else None)

    def _pass(self, shuffle: bool, seed: int, draw: int | None) -> Iterator[Batch]:
        t_start = time.perf_counter()
        work: Callable[[list[int]], list[Result]] = self._windows_group
        ready: Callable[[int], Result | None] = self._ready
        if draw is not None:           # (a clean pass calls the methods as they are)
            work = functools.partial(self._windows_group, draw=draw)
            ready = functools.partial(self._ready, draw=draw)
        sched: Scheduler[int, Result] = Scheduler(work, seconds=self._seconds, ready=ready,
                                                  workers=self.workers, prefetch=self.prefetch)
        grams: list[np.ndarray] = []
        ys: list[int] = []
        refs: list[tuple[int, int, int]] = []
        try:
            copies = self._copies if draw is not None else 1
            n = len(self.dataset)
            items = (k * n + i for i in self.order(shuffle, seed) for k in range(copies) if i not in self._bad)
            for i, loaded, err in sched.run(items):
                if loaded is None:
                    self._skip(i, err)
                    continue
                y, wins, rrefs = loaded
                self.stats.recordings += 1
                for w, r in zip(wins, rrefs):
                    grams.append(w)
                    ys.append(y)
                    refs.append(r)
                    if len(grams) == self.batch_windows:
                        yield self._batch(grams, ys, refs)
                        grams, ys, refs = [], [], []
            if grams:
                yield self._batch(grams, ys, refs)
        finally:
            self.stats.wait_s += sched.wait_s
            self.stats.total_s += time.perf_counter() - t_start

    def _batch(self, grams: list[np.ndarray], ys: list[int], refs: list[tuple[int, int, int]]) -> Batch:
        self.stats.windows += len(grams)
        return Batch(grams, np.asarray(ys, dtype=np.int64), refs)

    def _skip(self, i: int, err: AudioError | None) -> None:
        if not self.skip_bad and err is not None:
            raise err
        if i in self._bad:                    # (another copy of it in this pass)
            return
        self._bad.add(i)
        self.stats.skipped.append((self.dataset[i], str(err)))

    def precompute(self, *, progress: bool = False) -> int:
        """Compute every missing gram once (with a progress bar) so that later passes only read.

        Returns the number of grams extracted. Useful before multi-pass training on a persistent
        store; with a :class:`~wavetrain.store.NullStore` it only fills the memory cache. The
        grams are the clean ones, augmenting stream or not (augmented passes extract their own)."""
        before = self.stats.extracted
        t0 = time.perf_counter()
        wait0, total0 = self.stats.wait_s, self.stats.total_s
        bar = progress_counter(desc="features", total=len(self.dataset), unit="rec", enable=progress)
        seen = 0
        for _ in self._pass(False, 0, None):
            if bar is not None:
                bar.update(self.stats.recordings - seen if self.stats.recordings > seen else 0)
                seen = self.stats.recordings
        if bar is not None:
            bar.close()
        self.stats.features_s += time.perf_counter() - t0
        self.stats.features_wait_s += self.stats.wait_s - wait0
        self.stats.features_total_s += self.stats.total_s - total0
        return self.stats.extracted - before
