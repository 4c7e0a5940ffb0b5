"""Work for executors: which part files hold a data set's recordings, and the windows a task
reads from them.

A :data:`PartTask` names one part file of the feature table and, for each recording of the data
set it holds, the occurrences to read: ``(ordinal, label index)`` — a recording listed twice in the
data set is read twice, as the local engine reads it. :func:`part_windows` cuts the grams into
windows exactly as :class:`~wavetrain.stream.FeatureStream` does, and :class:`TableStream` is a
:class:`~wavetrain.batches.WindowStream` over some tasks (a rank's shard in distributed
training).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from wavetrain.batches import Batch
from wavetrain.data.dataset import Dataset
from wavetrain.features import FeatureSpec
from wavetrain.spark.table import FeatureTable
from wavetrain.windows import Windowing, cut_windows, silence_row

__all__ = ["PartTask", "TableStream", "part_tasks", "part_windows"]

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


def part_windows(table: FeatureTable, task: PartTask, spec: FeatureSpec, windowing: Windowing
                 ) -> Iterator[tuple[np.ndarray, int, int, tuple[int, int]]]:
    """``(window, label index, ordinal, (start ms, end ms))`` of every occurrence of the task's
    recordings, recording by recording, each occurrence's windows back to back."""
    path, occurrences = task
    for tg in table.read_part(path, set(occurrences)):
        silence = None if spec.per_axis else (lambda rate=tg.rate: silence_row(spec, rate))
        wins, spans = cut_windows(tg.gram, windowing, tg.shift, tg.duration_ms, silence=silence)
        for ordinal, y in occurrences[tg.rec]:
            for w, span in zip(wins, spans):
                yield w, y, ordinal, span


class TableStream:
    """Labelled windows of some part tasks, as batches (a
    :class:`~wavetrain.batches.WindowStream`).

    ``max_windows`` caps the windows of one pass (distributed ranks take equal numbers of steps);
    ``shuffle`` permutes the order of the part files each pass. Batch refs carry the ordinal of
    each window's recording."""

    def __init__(self, table: FeatureTable, tasks: Sequence[PartTask], spec: FeatureSpec, windowing: Windowing,
                 labels: Sequence[str], feature_dim: int, *, rate: int | None = None, channels: int | None = None,
                 batch_windows: int = 64, max_windows: int | None = None):
        self.table, self.tasks, self.spec, self.windowing = table, list(tasks), spec, windowing
        self.labels, self.feature_dim, self.rate, self.channels = list(labels), int(feature_dim), rate, channels
        self.batch_windows, self.max_windows = max(1, int(batch_windows)), max_windows

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
            for w, y, ordinal, (start, end) in part_windows(self.table, self.tasks[t], self.spec, self.windowing):
                if n >= cap:
                    break
                grams.append(w)
                ys.append(y)
                refs.append((ordinal, start, end))
                n += 1
                if len(grams) == self.batch_windows:
                    yield Batch(grams, np.asarray(ys, dtype=np.int64), refs)
                    grams, ys, refs = [], [], []
        if grams:
            yield Batch(grams, np.asarray(ys, dtype=np.int64), refs)
