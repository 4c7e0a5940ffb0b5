"""The feature stream: recordings -> feature grams (via the store) -> windows -> batches.

A small worker pool loads, decodes and extracts recordings ahead of the consumer through a
bounded prefetch (back-pressure, never an unbounded queue), so reading overlaps training. The
stream can be iterated any number of times (EM passes, epochs); features come from the
content-addressed store after the first pass. It records how long the consumer waited for data.
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from wavetrain.data.dataset import Dataset
from wavetrain.data.recording import Recording
from wavetrain.errors import AudioError, UserError
from wavetrain.models.base import Batch
from wavetrain.windows import Windowing

#: Recordings longer than this (s) are decoded in blocks of half of it (see ``extract_blocks``).
LONG_RECORDING_S = 60.0
#: Short recordings go to a worker in groups of up to this many seconds of audio (one hand-off
#: per group instead of per recording: a thread hand-off costs about as much as reading a small
#: gram from the store).  A group never holds more than max(GROUP_S, longest recording) seconds.
GROUP_S = 8.0
#: Recordings at least this long on average (seconds) get a second worker by default.  Measured
#: on the reference machine (2 vCPUs), extracting every gram once with 2 workers instead of 1:
#: 0.4 s spoken words 1.5 -> 2.0-2.3 s (slower: per-file Python work holds the GIL), 3 s clips
#: 4.3 -> 2.9-3.5 s, 10 s 2.5 -> 2.0-2.2 s, 60 s files 5.4 -> 3.7 s (decoding, hashing and FFTs
#: release it).
AUTO_WORKERS_MIN_S = 2.0
#: A recording sampled more than this many times below the features' rate is refused: it holds
#: at most 1/16 of the band the features describe (an 8 kHz phone recording for a 16 kHz model,
#: 2-fold, is resampled with a warning).
MAX_UPSAMPLE = 16


def default_workers(mean_seconds: float | None) -> int:
    """Workers when none are asked for: 2 for recordings of ``AUTO_WORKERS_MIN_S`` or more on
    average on a machine with 2+ CPUs, else 1 (``mean_seconds`` None: unknown, 1)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return 2 if cpus >= 2 and mean_seconds is not None and mean_seconds >= AUTO_WORKERS_MIN_S else 1


@dataclass
class StreamStats:
    """Counters of one stream (all passes)."""

    windows: int = 0
    recordings: int = 0
    extracted: int = 0          # grams computed (store misses)
    store_reads: int = 0        # grams read from the feature store (hits)
    wait_s: float = 0.0         # consumer time spent waiting for the next batch
    total_s: float = 0.0        # consumer wall time inside batches()
    features_s: float = 0.0     # wall time of precompute(): extracting or reading every gram once
    features_wait_s: float = 0.0   # the parts of wait_s and total_s spent in precompute()
    features_total_s: float = 0.0
    skipped: list = field(default_factory=list)

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
    """Labelled windows of a data set, as batches of feature grams.

    Parameters
    ----------
    dataset : Dataset
    spec : FeatureSpec or str
    label : str or None
        Label name; ``None`` for unlabelled data (``Batch.y`` is -1).
    labels : list of str or None
        Class values in index order; default: sorted values present in ``dataset``.
    windowing : Windowing
    store : FeatureStore, NullStore or None
        Where computed grams are kept; ``None`` = :class:`~wavetrain.store.NullStore`.
    batch_windows : int, default=64
        Windows per batch.
    workers : int, default=1
        Threads that load and extract ahead of the consumer.
    prefetch : int, default=4
        Units in flight at most (bounds memory): a unit is one recording, or a group of short
        recordings of up to ``GROUP_S`` seconds in all.
    cache : MemoryCache or None
        In-memory, cost-aware cache of grams in front of the store (what makes repeated passes
        cheap with ``--no-cache``).
    skip_bad : bool, default=False
        Skip recordings that fail to load or extract (recorded in ``stats.skipped``) instead of raising.
    """

    def __init__(self, dataset: Dataset, spec, *, label: str | None = None, labels: Sequence[str] | None = None,
                 windowing: Windowing | None = None, store=None, batch_windows: int = 64, workers: int = 1,
                 prefetch: int = 4, skip_bad: bool = False, device: str = "cpu", cache=None,
                 rate: int | None = None, channels: int | None = None):
        from wavetrain.features import parse_spec
        from wavetrain.features.fft import check_backend
        from wavetrain.features.spec import replace

        self.dataset = dataset
        check_backend()  # an unusable WAVETRAIN_FFT fails here, not as a "bad recording"
        self.spec = parse_spec(spec)
        self.spec_key = self.spec.key  # computed once: the canonical string is not free
        #: The rate features are computed at: the spec's own, else ``rate`` (a trained model's, or
        #: the training data's most common one), else each recording's.  A recording at another
        #: rate is resampled to it, with the spec that says so (and its own store key).
        self.rate = self.spec.rate or rate
        self._resampling = None
        if self.spec.rate is None and rate is not None:
            rs = replace(self.spec, rate=int(rate))
            self._resampling = (rs, rs.key)
        #: Channels every recording must have (per-axis features: the feature layout depends on it).
        self.channels = channels if self.spec.per_axis else None
        self._shift: dict[int, float] = {}
        self._meta_cache: dict[int, tuple[int, float, int, int]] = {}
        self._bad: set[int] = set()  # recordings that failed once (with skip_bad): never retried
        self.label = dataset.resolve_label(label) if label is not None else None
        if labels is None and self.label is not None:
            labels = sorted({v for v in dataset.values(label) if v not in (None, "")})
        self.labels = list(labels or [])
        self._index = {v: i for i, v in enumerate(self.labels)}
        self.windowing = windowing or Windowing()
        if store is None:
            from wavetrain.store import NullStore

            store = NullStore()
        self.store = store
        self.batch_windows = max(1, int(batch_windows))
        self.workers = max(1, int(workers))
        self.prefetch = max(1, int(prefetch))
        self.skip_bad = skip_bad
        self.device = device
        self.cache = cache
        self.stats = StreamStats()
        self._feature_dim: int | None = None
        self._silence: np.ndarray | None = None
        self._lock = threading.Lock()
        if self.spec.extractor.whole and self.windowing.clip_ms:
            from wavetrain.errors import ParameterError

            raise ParameterError(f"clip_ms={self.windowing.clip_ms}: windows need framed features, but "
                                 f"{self.spec.name} with whole=true (or window_ms=0) gives one frame per "
                                 "recording; use clip_ms=0 or a window_ms > 0")

    # -- derived streams ------------------------------------------------------------------------
    def subset(self, indices: Sequence[int]) -> "FeatureStream":
        """The same stream over some recordings (label order kept)."""
        s = FeatureStream(self.dataset.subset(indices), self.spec, label=None, labels=self.labels,
                          windowing=self.windowing, store=self.store, batch_windows=self.batch_windows,
                          workers=self.workers, prefetch=self.prefetch, skip_bad=self.skip_bad, device=self.device,
                          cache=self.cache, rate=self.rate, channels=self.channels)
        s.label = self.label
        s._feature_dim = self._feature_dim
        # recordings already found bad here are skipped there without another try (or report)
        s._bad = {new for new, old in enumerate(indices) if old in self._bad}
        return s

    def split_validation(self, fraction: float, seed: int = 0, group_by: str | None = None
                         ) -> tuple["FeatureStream", "FeatureStream"]:
        """Hold out about ``fraction`` of the recordings (whole groups with ``group_by``)."""
        from wavetrain.evaluate.folds import holdout_split

        train, valid = holdout_split(self.dataset, fraction, seed=seed, label=self.label, group_by=group_by)
        return self.subset(train), self.subset(valid)

    # -- features -------------------------------------------------------------------------------
    def _rate(self, rec: Recording) -> int:
        """The rate this recording's features are computed at."""
        return self.rate or rec.info().rate

    def _spec_for(self, rec: Recording):
        """``(spec, store key)`` of this recording: the stream's, or the resampling one when the
        recording's rate differs from :attr:`rate`."""
        if self._resampling is not None and rec.info().rate != self.rate:
            return self._resampling
        return self.spec, self.spec_key

    def check_recording(self, rec: Recording) -> None:
        """Raise :class:`AudioError` when the recording cannot give these features: its channels
        do not fit per-axis features, or its rate is so far below :attr:`rate` that resampling
        would invent nearly all of the band (more than ``MAX_UPSAMPLE`` times)."""
        info = rec.info()
        if self.channels is not None and info.channels != self.channels:
            raise AudioError(f"{rec.path}: {info.channels} channel(s), but the features are per "
                             f"axis (per_axis=true) for {self.channels}-channel recordings; give "
                             f"{self.channels}-channel audio")
        if self.rate is not None and info.rate * MAX_UPSAMPLE < self.rate:
            raise AudioError(f"{rec.path}: sampled at {info.rate} Hz, but the features are computed at "
                             f"{self.rate} Hz: resampling up {self.rate / info.rate:.0f}-fold would invent "
                             f"nearly all of the band; give recordings at {-(-self.rate // MAX_UPSAMPLE)} Hz "
                             "or more (or set rate= in the feature spec)")

    def upsampled(self) -> dict[int, int]:
        """Recordings below :attr:`rate`, by native rate: they are resampled up and hold nothing
        above half their own rate (reads headers only)."""
        out: dict[int, int] = {}
        if self.rate is not None:
            for rec in self.dataset:
                r = rec.info().rate
                if r < self.rate <= r * MAX_UPSAMPLE:   # (lower ones are refused)
                    out[r] = out.get(r, 0) + 1
        return out

    def _frame_shift(self, rate: int) -> float:
        """Seconds between frames at ``rate`` (computed once per rate)."""
        shift = self._shift.get(rate)
        if shift is None:
            shift = self._shift[rate] = self.spec.frame_shift_s(rate)
        return shift

    def expected_frames(self) -> int | None:
        """About how many feature frames a pass yields in labelled windows (all windows for an
        unlabelled stream), from durations known without opening files; None while some
        recording's duration is unknown."""
        total = 0
        counts: dict[tuple[int, int], int] = {}      # (samples, rate) -> frames in windows
        for i, rec in enumerate(self.dataset):
            if i in self._bad:
                continue
            if self.label is not None:
                v = rec.labels.get(self.label)
                if v is None or v not in self._index:
                    continue
            d, info = rec.known_duration_s(), rec._cache.get("info")
            if d is None or info is None:
                return None
            key = (int(round(d * info.rate)), info.rate)
            n = counts.get(key)
            if n is None:
                shift = self._frame_shift(self.rate or info.rate)
                n = counts[key] = sum(stop - start for start, stop in
                                      self.windowing.spans(self._spec_for(rec)[0].n_frames(*key), shift))
            total += n
        return total

    def gram(self, rec: Recording) -> np.ndarray:
        """The feature gram ``(frames, features)`` of a whole recording, from the store or computed."""
        from wavetrain.features import extract, extract_blocks
        from wavetrain.features.fft import BackendError

        self.check_recording(rec)
        spec, spec_key = self._spec_for(rec)

        def compute() -> np.ndarray:
            try:
                g = None
                if self.device == "cpu" and rec.duration_s > LONG_RECORDING_S:
                    read, n, sr = rec.block_reader()  # decode a block at a time, not the whole file
                    g = extract_blocks(read, n, sr, spec, block_s=LONG_RECORDING_S / 2)
                if g is None:
                    x, sr = rec.load(spec.rate, mono=not spec.per_axis)
                    g = extract(x, sr, spec, device=self.device)
            except AudioError as e:
                raise AudioError(str(e) if str(rec.path) in str(e) else f"{rec.path}: {e}") from None
            except BackendError:
                raise  # a setting of the run, not a fault of this recording
            except UserError as e:
                raise AudioError(f"{rec.path}: {e}") from None
            with self._lock:
                self.stats.extracted += 1
            computed.append(True)
            return g

        computed: list[bool] = []

        def from_store() -> np.ndarray:
            g = self.store.get_or_compute(rec.id, spec_key, compute)
            if not computed:
                with self._lock:
                    self.stats.store_reads += 1
            return g

        if self.cache is None:
            return from_store()
        key = (rec.id, spec_key)
        g = self.cache.get(key)
        if g is None:
            t0 = time.perf_counter()
            g = from_store()
            # keep plain float32 arrays, never memory maps (each pins a file descriptor)
            g = np.array(g, dtype=np.float32) if isinstance(g, np.memmap) else np.asarray(g, dtype=np.float32)
            g.flags.writeable = False
            self.cache.put(key, g, cost_s=time.perf_counter() - t0)
        return g

    def _in_memory(self, rec: Recording) -> np.ndarray | None:
        return None if self.cache is None else self.cache.get((rec.id, self._spec_for(rec)[1]))

    @property
    def feature_dim(self) -> int:
        if self._feature_dim is None:
            for i, rec in enumerate(self.dataset):
                if i in self._bad:
                    continue
                try:
                    self._feature_dim = int(self.gram(rec).shape[1])
                    break
                except AudioError as e:
                    if not self.skip_bad:
                        raise
                    self._bad.add(i)
                    self.stats.skipped.append((rec, str(e)))
            else:
                raise UserError("no usable recordings in the data set")
        return self._feature_dim

    def silence_row(self, rate: int) -> np.ndarray:
        """Features of one all-zero sub-window (used by ``pad=zero``)."""
        if self._silence is None:
            from wavetrain.features import extract

            n = max(int(rate * 4), 1)  # a few seconds of silence: enough for any sub-window
            g = extract(np.zeros(n, np.float32) if not self.spec.per_axis else np.zeros((n, 1), np.float32),
                        rate, self.spec)
            self._silence = np.asarray(g[0], dtype=np.float32)
        return self._silence

    def _meta(self, i: int, rec: Recording) -> tuple[int, float, int, int]:
        """Per recording, computed once: (label index, frame shift s, segment offset ms, duration ms)."""
        m = self._meta_cache.get(i)
        if m is None:
            y = -1
            if self.label is not None:
                v = rec.labels.get(self.label)
                y = self._index.get(v, -1) if v is not None else -1
            shift = self._frame_shift(self._rate(rec))
            m = (y, shift, rec.segment_ms[0] if rec.segment_ms else 0, int(round(rec.duration_s * 1000)))
            self._meta_cache[i] = m
        return m

    def _windows(self, i: int, rec: Recording, g: np.ndarray | None = None
                 ) -> tuple[int, list[np.ndarray], list[tuple[int, int, int]]]:
        """Load one recording: its label index, windows and their references."""
        if g is None:
            g = self.gram(rec)
        y, shift, offset, duration_ms = self._meta(i, rec)
        clip_ms = self.windowing.clip_ms
        if clip_ms == 0:
            return y, [g], [(i, offset, offset + duration_ms)]
        spans = self.windowing.spans(g.shape[0], shift)
        silence = None
        if self.windowing.pad == "zero" and any(stop > g.shape[0] for _, stop in spans) and not self.spec.per_axis:
            silence = self.silence_row(self._rate(rec))
        wins, refs = [], []
        for span in spans:
            wins.append(self.windowing.cut(g, span, silence))
            start_ms = int(round(span[0] * shift * 1000))
            refs.append((i, offset + start_ms, offset + min(start_ms + clip_ms, duration_ms)))
        return y, wins, refs

    # -- iteration ------------------------------------------------------------------------------
    def order(self, shuffle: bool, seed: int) -> list[int]:
        idx = list(range(len(self.dataset)))
        if shuffle:
            np.random.default_rng(seed).shuffle(idx)
        return idx

    def batches(self, *, shuffle: bool = False, seed: int = 0) -> Iterator[Batch]:
        """One pass: batches of ``batch_windows`` windows (recordings in order, or shuffled by ``seed``)."""
        order = self.order(shuffle, seed)
        t_start = time.perf_counter()
        grams: list[np.ndarray] = []
        ys: list[int] = []
        refs: list = []
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="wavetrain-stream")
        # each pending unit: (future of a group, None) or (None, results ready in memory)
        pending: deque[tuple[Future | None, list | None]] = deque()
        it = iter(order)
        # a recording looked at but left for the next unit, with its gram when it is in memory
        pushback: list[tuple[int, np.ndarray | None]] = []
        try:
            def submit_next() -> None:
                """Queue exactly one unit (so at most ``prefetch`` are ever pending): a group of
                recordings for the pool (up to ``GROUP_S`` seconds), or one recording already in
                memory (no hand-off)."""
                group: list[tuple[int, Recording]] = []
                seconds = 0.0
                while True:
                    if pushback:
                        i, g = pushback.pop()
                        rec = self.dataset[i]
                    else:
                        i = next(it, None)
                        while i is not None and i in self._bad:
                            i = next(it, None)
                        if i is None:
                            break
                        rec = self.dataset[i]
                        g = self._in_memory(rec)
                    if g is not None:
                        if group:  # this unit is the group; the hit starts the next one
                            pushback.append((i, g))
                            break
                        pending.append((None, [(i, self._windows(i, rec, g), None)]))
                        return
                    d = self._seconds(rec)
                    if group and seconds + d > GROUP_S:  # does not fit: it starts the next unit
                        pushback.append((i, None))
                        break
                    group.append((i, rec))
                    seconds += d
                    if seconds >= GROUP_S:
                        break
                if group:
                    pending.append((pool.submit(self._windows_group, group), None))

            for _ in range(self.prefetch):
                submit_next()
            while pending:
                fut, ready = pending.popleft()
                if ready is None:
                    t0 = time.perf_counter()
                    try:
                        ready = fut.result()
                    finally:
                        self.stats.wait_s += time.perf_counter() - t0
                submit_next()
                for i, loaded, err in ready:
                    if err is not None:
                        if not self.skip_bad:
                            raise err
                        self._bad.add(i)
                        self.stats.skipped.append((self.dataset[i], str(err)))
                        continue
                    y, wins, rrefs = loaded
                    self.stats.recordings += 1
                    for w, r in zip(wins, rrefs):
                        grams.append(w)
                        ys.append(y)
                        refs.append(r)
                        if len(grams) == self.batch_windows:
                            self.stats.windows += len(grams)
                            yield Batch(grams, np.asarray(ys, dtype=np.int64), refs)
                            grams, ys, refs = [], [], []
            if grams:
                self.stats.windows += len(grams)
                yield Batch(grams, np.asarray(ys, dtype=np.int64), refs)
        finally:
            for f, _ in pending:
                if f is not None:
                    f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            self.stats.total_s += time.perf_counter() - t_start

    @staticmethod
    def _seconds(rec: Recording) -> float:
        """Duration for grouping, without opening files on the consumer thread: a recording
        whose header has not been read yet counts as long (a group of its own; the worker reads
        it, and later passes know it)."""
        d = rec.known_duration_s()
        return GROUP_S if d is None else d

    def _windows_group(self, items: list[tuple[int, Recording]]) -> list:
        """On a worker: ``_windows`` of each recording, in order, as ``(i, result, None)`` or
        ``(i, None, AudioError)`` so that one bad recording does not lose its group."""
        out = []
        for i, rec in items:
            try:
                out.append((i, self._windows(i, rec), None))
            except AudioError as e:
                out.append((i, None, e))
        return out

    def precompute(self, *, progress: bool = False) -> int:
        """Compute every missing gram once (with a progress bar) so that later passes only read.

        Returns the number of grams extracted. Useful before multi-pass training on a persistent
        store; with a :class:`~wavetrain.store.NullStore` it only fills the memory cache."""
        from wavetrain.progress import progress_bar

        before = self.stats.extracted
        t0 = time.perf_counter()
        wait0, total0 = self.stats.wait_s, self.stats.total_s
        bar = progress_bar(None, desc="features", total=len(self.dataset), unit="rec", enable=progress)
        seen = 0
        for _ in self.batches():
            if bar is not None:
                bar.update(self.stats.recordings - seen if self.stats.recordings > seen else 0)
                seen = self.stats.recordings
        if bar is not None:
            bar.close()
        self.stats.features_s += time.perf_counter() - t0
        self.stats.features_wait_s += self.stats.wait_s - wait0
        self.stats.features_total_s += self.stats.total_s - total0
        return self.stats.extracted - before

    def __len__(self) -> int:
        return len(self.dataset)
