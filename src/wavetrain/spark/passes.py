"""The Spark executor of :mod:`wavetrain.models.passes`: each pass is one Spark job.

A pass is broadcast, every part task streams its windows (:func:`~wavetrain.spark.shards.part_windows`)
into the pass's statistics batch by batch, and a tree aggregation merges the tasks' statistics
with the pass's ``merge`` on the way to the driver. A :class:`~wavetrain.core.errors.WavetrainError`
raised in a task comes back as a :class:`~wavetrain.spark.jobs.TaskError` and is raised on the
driver with its one-line message.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from wavetrain.data.dataset import Dataset
from wavetrain.data.splits import holdout_split
from wavetrain.features import FeatureSpec
from wavetrain.models.passes import Pass, ScoreList
from wavetrain.spark.jobs import TaskError, checked, on_executor
from wavetrain.spark.shards import Augmenting, PartTask, task_windows
from wavetrain.spark.table import FeatureTable
from wavetrain.stream.windows import Windowing

__all__ = ["SparkExecutor"]

S = TypeVar("S")

#: Windows a task adds to a pass's statistics at a time.
BATCH_WINDOWS = 64


def task_pass(table: FeatureTable, spec: FeatureSpec, windowing: Windowing, p: Pass[S], task: PartTask,
              aug: Augmenting | None = None) -> S:
    """On an executor: the statistics of one task's labelled windows (with ``aug``: augmented,
    draw 0, as every pass of a local training stream's statistics)."""
    state = p.new()
    grams: list[np.ndarray] = []
    ys: list[int] = []
    ordinals: list[int] = []
    for w, y, ordinal, _ in task_windows(table, task, spec, windowing, aug):
        if y < 0:
            continue
        grams.append(w)
        ys.append(y)
        ordinals.append(ordinal)
        if len(grams) == BATCH_WINDOWS:
            state = p.add(state, grams, np.asarray(ys, dtype=np.int64), ordinals)
            grams, ys, ordinals = [], [], []
    if grams:
        state = p.add(state, grams, np.asarray(ys, dtype=np.int64), ordinals)
    return state


def merging(merge: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``merge`` as a tree aggregation's reduce: ``None`` is the zero and a :class:`TaskError` wins."""

    def reduce(a: Any, b: Any) -> Any:
        if isinstance(a, TaskError) or b is None:
            return a
        if isinstance(b, TaskError) or a is None:
            return b
        return merge(a, b)

    return reduce


class SparkExecutor:
    """The labelled windows of some part tasks of the feature table, read by Spark tasks.

    Parameters
    ----------
    spark : SparkSession
    table : FeatureTable
    tasks : list of PartTask
        What the passes read (ordinals number the recordings from 0, as a local stream over them
        does).
    labels : list of str
    feature_dim : int
    rate, channels : int or None
    spec : FeatureSpec
    windowing : Windowing
        How the model's windows are cut.
    ds : Dataset, optional
        The recordings the tasks read (ordinal ``j`` = ``ds[j]``), to hold some out (:meth:`split`).
    tasks_of : callable, optional
        ``tasks_of(indices)``: the part tasks reading recordings ``indices`` of ``ds`` (ordinal
        ``j`` for the ``j``-th of them, with its label index).
    augmenting : Augmenting, optional
        Augment every pass as a local training stream does (draw 0: the passes of statistics see
        the same augmented windows); the part :meth:`split` holds out stays clean.
    """

    def __init__(self, spark: Any, table: FeatureTable, tasks: Sequence[PartTask], *, labels: Sequence[str],
                 feature_dim: int, rate: int | None, channels: int | None, spec: FeatureSpec, windowing: Windowing,
                 ds: Dataset | None = None, tasks_of: Callable[[np.ndarray], list[PartTask]] | None = None,
                 augmenting: Augmenting | None = None):
        self.spark, self.table, self.tasks = spark, table, list(tasks)
        self.labels, self.feature_dim, self.rate, self.channels = list(labels), int(feature_dim), rate, channels
        self.spec, self.windowing, self.ds, self.tasks_of = spec, windowing, ds, tasks_of
        self.augmenting = augmenting

    @classmethod
    def of_dataset(cls, spark: Any, table: FeatureTable, ds: Dataset,
                   tasks_of: Callable[[np.ndarray], list[PartTask]], **layout: Any) -> SparkExecutor:
        """The executor of every recording of ``ds`` (which :meth:`split` can hold out from);
        ``layout``: the other keyword parameters."""
        return cls(spark, table, tasks_of(np.arange(len(ds))), ds=ds, tasks_of=tasks_of, **layout)

    def run(self, p: Pass[S]) -> S:
        if not self.tasks:
            return p.new()
        sc = self.spark.sparkContext
        shared = sc.broadcast(p)
        table, spec, windowing, aug = self.table, self.spec, self.windowing, self.augmenting
        work = [(t, aug.for_tasks([t]) if aug is not None else None) for t in self.tasks]
        reduce = merging(p.merge)
        try:
            out = checked(sc.parallelize(work, len(work)).map(on_executor(
                lambda w: task_pass(table, spec, windowing, shared.value, *w))).treeAggregate(None, reduce, reduce))
        finally:
            shared.destroy()
        return p.new() if out is None else out

    def split(self, fraction: float, seed: int, group_by: str | None) -> tuple[SparkExecutor, SparkExecutor] | None:
        if self.ds is None or self.tasks_of is None:
            return None
        train, valid = holdout_split(self.ds, fraction, seed=seed, group_by=group_by)
        return self._subset(train, self.augmenting), self._subset(valid, None)

    def _subset(self, indices: np.ndarray, augmenting: Augmenting | None) -> SparkExecutor:
        assert self.ds is not None and self.tasks_of is not None
        outer = self.tasks_of
        return SparkExecutor.of_dataset(
            self.spark, self.table, self.ds.subset(indices),
            lambda sub: outer(np.asarray(indices)[np.asarray(sub, dtype=np.int64)]),
            labels=self.labels, feature_dim=self.feature_dim, rate=self.rate, channels=self.channels,
            spec=self.spec, windowing=self.windowing, augmenting=augmenting)

    def scores(self, model: Any) -> np.ndarray:
        return self.run(ScoreList(model)).scores()
