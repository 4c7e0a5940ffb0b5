"""The Spark executor of :mod:`wavetrain.models.passes`: each pass is one Spark job.

A pass is broadcast, every part task streams its windows (:func:`~wavetrain.spark.shards.part_windows`)
into the pass's statistics batch by batch, and the tasks' statistics are merged with the pass's
``merge`` along a tree fixed by the task list, never by the order tasks finish: up to
:data:`DRIVER_MERGE_TASKS` tasks, the driver folds their statistics in task order (one stage);
beyond, the executors fold groups of about √tasks consecutive tasks in task order (a second stage,
so that the driver receives √tasks results, not one per task), and the driver folds the groups in
order.
A merge that is not associative (a knn summary beyond its buffer) therefore gives the same model
on every run over the same table, and sums of floating-point statistics the same bits. A
:class:`~wavetrain.core.errors.WavetrainError` raised in a task comes back as a
:class:`~wavetrain.spark.jobs.TaskError` and is raised on the driver with its one-line message.
"""
from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from wavetrain.data.dataset import Dataset
from wavetrain.data.splits import holdout_split
from wavetrain.features import FeatureSpec
from wavetrain.models.base import FitOptions
from wavetrain.models.passes import Executor, Pass, ScoreList
from wavetrain.spark.jobs import TaskError, checked, on_executor
from wavetrain.spark.neural import fit_neural
from wavetrain.spark.shards import Augmenting, PartTask, task_windows
from wavetrain.spark.table import FeatureTable
from wavetrain.stream.windows import Windowing

__all__ = ["SparkExecutor"]

S = TypeVar("S")

#: Windows a task adds to a pass's statistics at a time.
BATCH_WINDOWS = 64
#: Tasks whose statistics the driver merges itself (in task order, one stage); beyond, groups of
#: tasks are merged on the executors first.
DRIVER_MERGE_TASKS = 32


def task_pass(table: FeatureTable, spec: FeatureSpec, windowing: Windowing, p: Pass[S], task: PartTask,
              aug: Augmenting | None = None, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> S:
    """On an executor: the statistics of one task's labelled windows (with ``aug``: augmented,
    draw 0, as every pass of a local training stream's statistics; with ``transform``: each
    window passed through it)."""
    state = p.new()
    grams: list[np.ndarray] = []
    ys: list[int] = []
    ordinals: list[int] = []
    for w, y, ordinal, _ in task_windows(table, task, spec, windowing, aug, keep=True):
        if y < 0:
            continue
        grams.append(w if transform is None else transform(w))
        ys.append(y)
        ordinals.append(ordinal)
        if len(grams) == BATCH_WINDOWS:
            state = p.add(state, grams, np.asarray(ys, dtype=np.int64), ordinals)
            grams, ys, ordinals = [], [], []
    if grams:
        state = p.add(state, grams, np.asarray(ys, dtype=np.int64), ordinals)
    return state


def merging(merge: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``merge`` as a reduce of task results: ``None`` is the zero and a :class:`TaskError` wins."""

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
    transform : callable, optional
        Applied to every window (:meth:`view`); ``feature_dim`` is then its output's.
    processes : int or None
        Ranks of :meth:`train_steps` (default: the cluster's cores, at most one per part file).
    max_retries : int
        Times :meth:`train_steps` runs a failed stage again, from the last checkpoint.
    """

    def __init__(self, spark: Any, table: FeatureTable, tasks: Sequence[PartTask], *, labels: Sequence[str],
                 feature_dim: int, rate: int | None, channels: int | None, spec: FeatureSpec, windowing: Windowing,
                 ds: Dataset | None = None, tasks_of: Callable[[np.ndarray], list[PartTask]] | None = None,
                 augmenting: Augmenting | None = None, transform: Callable[[np.ndarray], np.ndarray] | None = None,
                 processes: int | None = None, max_retries: int = 5):
        self.spark, self.table, self.tasks = spark, table, list(tasks)
        self.labels, self.feature_dim, self.rate, self.channels = list(labels), int(feature_dim), rate, channels
        self.spec, self.windowing, self.ds, self.tasks_of = spec, windowing, ds, tasks_of
        self.augmenting, self.transform = augmenting, transform
        self.processes, self.max_retries = processes, int(max_retries)

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
        table, spec, windowing, aug, transform = self.table, self.spec, self.windowing, self.augmenting, self.transform
        work = [(t, aug.for_tasks([t]) if aug is not None else None) for t in self.tasks]
        reduce = merging(p.merge)
        size = math.isqrt(len(work) - 1) + 1           # ceil(sqrt(tasks)) tasks per group, as many groups
        one = on_executor(lambda w: task_pass(table, spec, windowing, shared.value, w[0], w[1], transform))

        def fold(results: Iterator[tuple[tuple[int, int], Any]]) -> Iterator[tuple[int, Any]]:
            """On an executor: one group's task results in task order (Spark's sort, which spills
            beyond ``spark.python.worker.memory``), merged one by one by the broadcast pass."""
            merge, group, out = merging(shared.value.merge), None, None
            for (g, _), state in results:
                group, out = g, merge(out, state)
            if group is not None:
                yield group, out

        try:
            if len(work) <= DRIVER_MERGE_TASKS:            # (collect keeps the partitions' order)
                states = sc.parallelize(work, len(work)).map(one).collect()
                out = checked(functools.reduce(reduce, states, None))
                return p.new() if out is None else out
            groups = (sc.parallelize(list(enumerate(work)), len(work))
                      .map(lambda iw: ((iw[0] // size, iw[0]), one(iw[1])))
                      .repartitionAndSortWithinPartitions(numPartitions=size, partitionFunc=lambda k: k[0])
                      .mapPartitions(fold).collect())
        finally:
            shared.destroy()
        out = checked(functools.reduce(reduce, (state for _, state in sorted(groups, key=lambda g: g[0])), None))
        return p.new() if out is None else out

    def using(self, *, cache_bytes: int = 0, devices: Sequence[str] = ()) -> AbstractContextManager[SparkExecutor]:
        """This executor: each pass reads the part files in its tasks (no frame cache on the
        driver), and a kernel pass runs on each task's numpy device (the fit's devices are the
        local executor's)."""
        return nullcontext(self)

    def report(self) -> dict[str, Any]:
        return {}

    def split(self, fraction: float, seed: int, group_by: str | None, strata: Sequence[str] = ()
              ) -> tuple[SparkExecutor, SparkExecutor] | None:
        if self.ds is None or self.tasks_of is None:
            return None
        train, valid = holdout_split(self.ds, fraction, seed=seed, group_by=group_by, strata=strata)
        return self._subset(train, self.augmenting), self._subset(valid, None)

    def recording_values(self, names: Sequence[str]) -> list[tuple[str, ...]] | None:
        ds = self.ds
        return None if ds is None else list(zip(*[[v or "" for v in ds.values(n)] for n in names], strict=True))

    def _subset(self, indices: np.ndarray, augmenting: Augmenting | None) -> SparkExecutor:
        assert self.ds is not None and self.tasks_of is not None
        outer = self.tasks_of
        return SparkExecutor.of_dataset(
            self.spark, self.table, self.ds.subset(indices),
            lambda sub: outer(np.asarray(indices)[np.asarray(sub, dtype=np.int64)]),
            labels=self.labels, feature_dim=self.feature_dim, rate=self.rate, channels=self.channels,
            spec=self.spec, windowing=self.windowing, augmenting=augmenting, transform=self.transform,
            processes=self.processes, max_retries=self.max_retries)

    def scores(self, model: Any) -> np.ndarray:
        return self.run(ScoreList(model)).scores()

    def train_steps(self, model: Any, valid: Executor | None, options: FitOptions) -> None:
        """Distributed-data-parallel ranks (:func:`~wavetrain.spark.neural.fit_neural`), rank
        ``r`` of ``N`` on the part files ``tasks[r::N]``; ``options`` gives the checkpoint folder,
        the resume folder, callbacks and whether to show progress."""
        if valid is not None and not isinstance(valid, SparkExecutor):
            raise TypeError(f"a Spark executor validates on a Spark executor, not {type(valid).__name__}")
        processes = self.processes or max(1, min(self.spark.sparkContext.defaultParallelism, len(self.tasks)))
        fit_neural(self.spark, model, self.table, self.tasks, valid.tasks if valid is not None else [],
                   labels=self.labels, feature_dim=self.feature_dim, rate=self.rate, channels=self.channels,
                   num_processes=processes, checkpoint=options.checkpoint, resume=options.resume,
                   max_retries=self.max_retries, progress=options.progress, callbacks=tuple(options.callbacks),
                   augmenting=self.augmenting, transform=self.transform)

    def view(self, fn: Callable[[np.ndarray], np.ndarray], feature_dim: int) -> SparkExecutor:
        out = copy.copy(self)
        out.transform = fn if self.transform is None else _Composed(self.transform, fn)
        out.feature_dim = int(feature_dim)
        return out


@dataclass(frozen=True)
class _Composed:
    """``then(first(window))``: a view of a view."""

    first: Callable[[np.ndarray], np.ndarray]
    then: Callable[[np.ndarray], np.ndarray]

    def __call__(self, g: np.ndarray) -> np.ndarray:
        return self.then(self.first(g))
