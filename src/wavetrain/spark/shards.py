"""Work for executors: which part files hold a data set's recordings, and the windows a task
reads from them.

A :data:`PartTask` names one part file of the feature table and, for each recording of the data
set it holds, the occurrences to read: ``(ordinal, label index)`` — a recording listed twice in the
data set is read twice, as the local engine reads it. :func:`part_windows` cuts the grams into
windows exactly as :class:`~wavetrain.stream.feature_stream.FeatureStream` does, and :class:`TableStream` is a
:class:`~wavetrain.stream.batches.WindowStream` over some tasks (a rank's shard in distributed
training).

A training pass of a model that augments (``--set augment=...``) makes its windows where the local
stream makes them (:class:`Augmenting`, :func:`augmented_windows`): the executor decodes the
recording, augments it with the draw the local stream would use (seed, recording content id, draw
index; ``copies``), extracts and cuts it with the same function
(:func:`~wavetrain.stream.feature_stream.recording_windows`); an augmenter that only masks
(``specaugment``) masks the table's clean grams. The passes of statistics all draw alike (draw
0, as locally), so their augmented grams are kept in the gram cache below when they fit, as clean
ones; a neural rank's epochs draw anew and keep none.

Between passes (EM, epochs, the score pass), every executor process keeps the grams it decoded
in a :class:`GramCache` bounded by bytes (``$WAVETRAIN_SPARK_GRAM_CACHE``, default 64 MB; set it
with ``--spark-conf spark.executorEnv.WAVETRAIN_SPARK_GRAM_CACHE=512M``, ``0`` turns it off), so
a task whose grams it holds reads no Parquet. It lasts as long as the Python worker, which Spark
reuses from task to task unless ``spark.python.worker.reuse`` is false.
"""
from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from wavetrain.core.errors import ParameterError
from wavetrain.data.dataset import Dataset
from wavetrain.data.recording import Recording
from wavetrain.features import FeatureSpec
from wavetrain.features.augment import Augmenter
from wavetrain.spark.table import FeatureTable, TableGram
from wavetrain.stream.batches import Batch
from wavetrain.stream.feature_stream import recording_windows
from wavetrain.stream.source import FeatureSource
from wavetrain.stream.windows import Windowing, cut_windows, silence_row

__all__ = ["DEFAULT_GRAM_CACHE", "GRAM_CACHE_ENV", "Augmenting", "GramCache", "PartTask", "TableStream",
           "augmented_windows", "cache_bytes", "part_tasks", "part_windows", "process_cache"]

#: The environment variable of an executor that bounds its gram cache (bytes, or 64M, 1G...).
GRAM_CACHE_ENV = "WAVETRAIN_SPARK_GRAM_CACHE"
#: The gram cache's bound when the variable is not set: as the local engine's memory cache.
DEFAULT_GRAM_CACHE = 64 * 2 ** 20
#: Bytes charged for remembering the place of one recording in a part file.
PLACE_BYTES = 128
_UNITS = {"": 1, "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40}

#: ``(part file, {recording id: [(ordinal, label index), ...]})``.
PartTask = tuple[str, dict[str, list[tuple[int, int]]]]


def part_tasks(catalog: dict[tuple[str, str], str], ds: Dataset, keys: Sequence[str],
               ys: Sequence[int] | None = None) -> tuple[list[PartTask], list[int]]:
    """The tasks that read ``ds`` from the table whose ``catalog`` is given (see
    :meth:`FeatureTable.catalog`; recording ``i`` under spec key ``keys[i]`` with label index
    ``ys[i]``, -1 when None, and ordinal ``i``), in part-file order, and the indices of recordings
    the table lacks."""
    by_part: dict[str, dict[str, list[tuple[int, int]]]] = {}
    missing = []
    for i, (rec, key) in enumerate(zip(ds, keys)):
        path = catalog.get((rec.id, key))
        if path is None:
            missing.append(i)
            continue
        by_part.setdefault(path, {}).setdefault(rec.id, []).append((i, -1 if ys is None else int(ys[i])))
    return sorted(by_part.items()), missing


def cache_bytes(value: str | None) -> int:
    """The gram cache's bound given as ``value`` (bytes, or with a unit: ``512k``, ``64M``,
    ``1G``; None or empty: :data:`DEFAULT_GRAM_CACHE`; 0: no cache).

    Raises
    ------
    ParameterError
        Not a size (one line naming :data:`GRAM_CACHE_ENV`).
    """
    if value is None or not value.strip():
        return DEFAULT_GRAM_CACHE
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", value.lower())
    if m is None:
        raise ParameterError(f"{GRAM_CACHE_ENV}={value!r}: expected a size such as 64M, 1G or 0 (no cache)",
                             param=GRAM_CACHE_ENV)
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def configured_cache_bytes(conf: Mapping[str, str]) -> int:
    """The gram cache bound a session's executors get (:func:`cache_bytes`): the Spark setting
    ``spark.executorEnv.WAVETRAIN_SPARK_GRAM_CACHE`` in ``conf``, else the variable in this
    environment (which the Python workers of a local session inherit)."""
    return cache_bytes(conf.get(f"spark.executorEnv.{GRAM_CACHE_ENV}", os.environ.get(GRAM_CACHE_ENV)))


class GramCache:
    """Decoded grams of part files kept in one process, at most ``max_bytes`` of them.

    Keys are ``(part file, recording id, spec key)``; a part file's name is a hash of its content,
    so an entry never goes stale. A gram is kept when it fits in the free bytes, and nothing is
    evicted for a new one: the passes of EM read the same recordings in the same order every
    time, and a least-recently-used cache smaller than that scan would evict every gram before
    its next read (no hits at all), where keeping the first ones serves that share of each pass.

    The cache also remembers each part file's order of recordings (charged
    :data:`PLACE_BYTES` each), so that grams it holds and grams read again come out in file order,
    exactly as an uncached read gives them.

    Parameters
    ----------
    max_bytes : int >= 0
        Bound of the grams and places held; 0 keeps nothing.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._grams: dict[tuple[str, str, str], TableGram] = {}
        self._places: dict[str, dict[str, int]] = {}
        self.bytes = 0
        self.hits = self.misses = self.reads = 0
        self._lock = threading.Lock()

    def stats(self) -> dict[str, int]:
        """``hits``, ``misses`` (grams), ``reads`` (part files opened), ``bytes``, ``entries``."""
        return {"hits": self.hits, "misses": self.misses, "reads": self.reads, "bytes": self.bytes,
                "entries": len(self._grams), "max_bytes": self.max_bytes}

    def held(self, key: tuple[str, str, str]) -> TableGram | None:
        """A gram kept under ``key`` (None when not held), counted as a hit or a miss."""
        with self._lock:
            tg = self._grams.get(key)
        if tg is None:
            self.misses += 1
        else:
            self.hits += 1
        return tg

    def keep(self, key: tuple[str, str, str], tg: TableGram) -> None:
        """Keep ``tg`` under ``key`` when it fits (a gram computed on the executor, e.g. the
        augmented gram that every EM pass draws alike)."""
        self._keep(key, tg)

    def _keep(self, key: tuple[str, str, str], tg: TableGram) -> None:
        with self._lock:
            if key not in self._grams and self.bytes + tg.gram.nbytes <= self.max_bytes:
                tg.gram.flags.writeable = False        # every later pass gets these very values
                self._grams[key] = tg
                self.bytes += tg.gram.nbytes

    def grams(self, table: FeatureTable, path: str, wanted: set[str], spec_key: str) -> Iterator[TableGram]:
        """The grams of the ``wanted`` recordings of the part file ``path``, in file order, as
        :meth:`FeatureTable.read_part` gives them: from the cache, reading the file only for
        those it lacks (the whole file the first time, to learn its order)."""
        if self.max_bytes <= 0:
            yield from table.read_part(path, wanted)
            return
        places = self._places.get(path)
        if places is None or not wanted <= places.keys():
            yield from self._first_read(table, path, wanted, spec_key)
            return
        order = sorted(wanted, key=places.__getitem__)
        held = {rec: self._grams.get((path, rec, spec_key)) for rec in order}
        lacking = {rec for rec, tg in held.items() if tg is None}
        self.hits += len(order) - len(lacking)
        self.misses += len(lacking)
        if lacking:
            self.reads += 1
        reader = table.read_part(path, lacking) if lacking else iter(())
        try:
            for rec in order:
                tg = held[rec]
                if tg is None:
                    tg = next(reader, None)
                    if tg is None or tg.rec != rec:       # the file is not as its first read found it
                        raise RuntimeError(f"{path}: expected recording {rec} next, found "
                                           f"{'none' if tg is None else tg.rec}; the part file changed while kept")
                    self._keep((path, rec, spec_key), tg)
                yield tg
        finally:
            getattr(reader, "close", lambda: None)()          # the file is closed now, not when collected

    def _first_read(self, table: FeatureTable, path: str, wanted: set[str], spec_key: str) -> Iterator[TableGram]:
        """Read every recording of the file (its order), keeping and giving the wanted ones."""
        self.reads += 1
        places: dict[str, int] = {}
        for tg in table.read_part(path):
            places.setdefault(tg.rec, len(places))
            if tg.rec in wanted:
                self.misses += 1
                self._keep((path, tg.rec, spec_key), tg)
                yield tg
        cost = PLACE_BYTES * len(places)
        with self._lock:
            if path not in self._places and self.bytes + cost <= self.max_bytes:
                self._places[path] = places
                self.bytes += cost


_PROCESS: dict[str, GramCache] = {}


def process_cache() -> GramCache:
    """This process's gram cache (bounded by ``$WAVETRAIN_SPARK_GRAM_CACHE``, read once)."""
    cache = _PROCESS.get("cache")
    if cache is None:
        cache = _PROCESS["cache"] = GramCache(cache_bytes(os.environ.get(GRAM_CACHE_ENV)))
    return cache


def part_windows(table: FeatureTable, task: PartTask, spec: FeatureSpec, windowing: Windowing
                 ) -> Iterator[tuple[np.ndarray, int, int, tuple[int, int]]]:
    """``(window, label index, ordinal, (start ms, end ms))`` of every occurrence of the task's
    recordings, recording by recording, each occurrence's windows back to back. Grams come from
    the process's :class:`GramCache` where it holds them."""
    path, occurrences = task
    for tg in process_cache().grams(table, path, set(occurrences), spec.key):
        silence = None if spec.per_axis else (lambda rate=tg.rate: silence_row(spec, rate))
        wins, spans = cut_windows(tg.gram, windowing, tg.shift, tg.duration_ms, silence=silence)
        for ordinal, y in occurrences[tg.rec]:
            for w, span in zip(wins, spans):
                yield w, y, ordinal, span


@dataclass(frozen=True)
class Augmenting:
    """How a training pass augments its windows on the executors, as the local stream does.

    Attributes
    ----------
    augmenter : Augmenter
        The model's ``augment``, parsed (once, on the driver).
    seed : int
        The model's ``seed`` (with the recording's content id and the draw, it seeds each draw).
    rate, channels : int or None
        The features' rate and channels (the recordings are decoded as the table's were).
    recordings : dict
        The recordings the passes read, by id (an executor decodes the audio of those it augments).
    """

    augmenter: Augmenter
    seed: int
    rate: int | None
    channels: int | None
    recordings: Mapping[str, Recording]

    @staticmethod
    def needed(augmenter: Augmenter | None) -> bool:
        """Whether ``augmenter`` changes the windows of a pass (audio stages, masks or copies; not
        ``mixup`` alone, which mixes batches in the trainer)."""
        return augmenter is not None and (augmenter.waveform or augmenter.masks or augmenter.copies > 1)

    def for_tasks(self, tasks: Sequence[PartTask]) -> Augmenting:
        """The same, holding only the recordings ``tasks`` read (what is shipped with them)."""
        return Augmenting(self.augmenter, self.seed, self.rate, self.channels,
                          {rec: self.recordings[rec] for _, occurrences in tasks for rec in occurrences})


def augmented_windows(table: FeatureTable, task: PartTask, spec: FeatureSpec, windowing: Windowing,
                      aug: Augmenting, draw: int, *, keep: bool = False
                      ) -> Iterator[tuple[np.ndarray, int, int, tuple[int, int]]]:
    """:func:`part_windows` of a pass with draw index ``draw`` of an augmenting model: for each
    recording, its ``copies`` augmented copies (draws ``draw * copies`` to ``draw * copies +
    copies - 1``, one after the other, as the local stream orders them), each cut into windows
    and masked by :func:`~wavetrain.stream.feature_stream.recording_windows`. Audio stages decode
    and extract the recording again, unless ``keep`` (passes that all draw alike: a mixture's EM)
    and the process's :class:`GramCache` holds that draw's gram from an earlier pass; masks alone
    read the clean gram from the table."""
    augmenter = aug.augmenter
    source = FeatureSource(spec, rate=aug.rate, channels=aug.channels, augment=augmenter, augment_seed=aug.seed)
    path, occurrences = task
    grams: Iterator[tuple[str, TableGram | None]]
    if augmenter.waveform:                      # in data-set order; the audio is decoded again
        grams = ((rec, None) for rec in sorted(occurrences, key=lambda r: occurrences[r][0][0]))
    else:                                       # in file order, as part_windows reads them
        grams = ((tg.rec, tg) for tg in process_cache().grams(table, path, set(occurrences), spec.key))
    copies = augmenter.copies
    for rec_id, tg in grams:
        rec = aug.recordings[rec_id]
        for k in range(copies):
            d = draw * copies + k
            if tg is None:
                g, shift, duration_ms = _augmented_gram(source, path, rec, spec, aug, d, keep)
            else:
                g, shift, duration_ms = tg.gram, tg.shift, tg.duration_ms
            wins, spans = recording_windows(source, windowing, rec, g, shift, duration_ms, d)
            for ordinal, y in occurrences[rec_id]:
                for w, span in zip(wins, spans):
                    yield w, y, ordinal, span


def _augmented_gram(source: FeatureSource, path: str, rec: Recording, spec: FeatureSpec, aug: Augmenting, draw: int,
                    keep: bool) -> tuple[np.ndarray, float, int]:
    """Draw ``draw`` of ``rec``'s augmented gram, its frame shift and duration (ms): computed, or
    with ``keep`` from the process's gram cache when an earlier pass kept it (and kept now when
    it fits)."""
    key = (path, rec.id, f"{spec.key}|{aug.augmenter.key}|{aug.seed}|{draw}")
    held = process_cache().held(key) if keep else None
    if held is not None:
        return held.gram, held.shift, held.duration_ms
    g = source.gram(rec, draw)
    rate = source.rate_of(rec)
    shift, duration_ms = source.frame_shift(rate), int(round(rec.duration_s * 1000))
    if keep:
        process_cache().keep(key, TableGram(rec.id, g, rate, shift, duration_ms))
    return g, shift, duration_ms


def task_windows(table: FeatureTable, task: PartTask, spec: FeatureSpec, windowing: Windowing,
                 aug: Augmenting | None = None, draw: int = 0, *, keep: bool = False
                 ) -> Iterator[tuple[np.ndarray, int, int, tuple[int, int]]]:
    """The windows of one task: clean (:func:`part_windows`), or with ``aug`` those of draw
    ``draw`` (:func:`augmented_windows`; ``keep``: augmented grams may be kept between passes)."""
    if aug is None:
        return part_windows(table, task, spec, windowing)
    return augmented_windows(table, task, spec, windowing, aug, draw, keep=keep)


class TableStream:
    """Labelled windows of some part tasks, as batches (a
    :class:`~wavetrain.stream.batches.WindowStream`).

    ``max_windows`` caps the windows of one pass (distributed ranks take equal numbers of steps);
    ``shuffle`` permutes the order of the part files each pass. Batch refs carry the ordinal of
    each window's recording. With ``augmenting`` a pass augments with draw index ``seed``, as a
    local training stream does; with ``transform`` every window is passed through it (its output
    has ``feature_dim`` values per frame)."""

    def __init__(self, table: FeatureTable, tasks: Sequence[PartTask], spec: FeatureSpec, windowing: Windowing,
                 labels: Sequence[str], feature_dim: int, *, rate: int | None = None, channels: int | None = None,
                 batch_windows: int = 64, max_windows: int | None = None, augmenting: Augmenting | None = None,
                 transform: Callable[[np.ndarray], np.ndarray] | None = None):
        self.table, self.tasks, self.spec, self.windowing = table, list(tasks), spec, windowing
        self.labels, self.feature_dim, self.rate, self.channels = list(labels), int(feature_dim), rate, channels
        self.batch_windows, self.max_windows = max(1, int(batch_windows)), max_windows
        self.augmenting, self.transform = augmenting, transform

    def batches(self, *, shuffle: bool = False, seed: int = 0) -> Iterator[Batch]:
        order = list(range(len(self.tasks)))
        if shuffle:
            np.random.default_rng(seed).shuffle(order)
        grams: list[np.ndarray] = []
        ys: list[int] = []
        refs: list[tuple[int, int, int]] = []
        n = 0
        cap = self.max_windows if self.max_windows is not None else np.inf
        for t in order:
            if n >= cap:
                break
            windows = task_windows(self.table, self.tasks[t], self.spec, self.windowing, self.augmenting, seed)
            for w, y, ordinal, (start, end) in windows:
                if n >= cap:
                    break
                grams.append(w if self.transform is None else self.transform(w))
                ys.append(y)
                refs.append((ordinal, start, end))
                n += 1
                if len(grams) == self.batch_windows:
                    yield Batch(grams, np.asarray(ys, dtype=np.int64), refs)
                    grams, ys, refs = [], [], []
        if grams:
            yield Batch(grams, np.asarray(ys, dtype=np.int64), refs)
