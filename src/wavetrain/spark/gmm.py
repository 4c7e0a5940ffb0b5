"""GMM training as Spark jobs: EM as map and reduce over the feature table.

Three kinds of job, each a map over the part tasks and a tree aggregation to the driver:

1. the init sample: every task keeps a :class:`~wavetrain.models.mixture.KeyedSample` per label,
   and merging them gives exactly the sample one pass of the local engine keeps;
2. one job per EM pass: every task streams its windows and returns each active label's
   sufficient statistics under the current mixtures (broadcast); the driver adds them and runs
   the M-step (and SQUAREM) through the same :func:`~wavetrain.models.mixture.em_fit` as the local
   engine, so the model equals the local one up to the order of summation;
3. the training score statistics (mean and sd of each label's window scores).

No task holds more than one recording's gram, its label statistics and the E-step's blocks.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from wavetrain.models.gmm import GMMClassifier
from wavetrain.models.mixture import FrameKeys, KeyedSample, LabelEM, Stats, Theta, em_fit
from wavetrain.progress import progress_counter
from wavetrain.spark.jobs import TaskError, add_lists, checked, job_progress, on_executor
from wavetrain.spark.shards import PartTask, part_windows
from wavetrain.spark.table import FeatureTable
from wavetrain.windows import Windowing

__all__ = ["fit_gmm"]


def _windows(table: FeatureTable, model: GMMClassifier, task: PartTask):
    return part_windows(table, task, model.feature_spec, Windowing.from_params(model.params))


def _task_samples(table: FeatureTable, model: GMMClassifier, task: PartTask) -> list[KeyedSample]:
    samples, keys = model.new_samples(), FrameKeys(model.params["seed"])
    for w, y, ordinal, _ in _windows(table, model, task):
        samples[y].add(np.asarray(w, dtype=np.float64), keys(ordinal, w.shape[0]))
    return samples


def _merge_samples(a: list[KeyedSample] | TaskError | None, b: list[KeyedSample] | TaskError | None
                   ) -> list[KeyedSample] | TaskError | None:
    if isinstance(a, TaskError) or b is None:          # an error wins
        return a
    if isinstance(b, TaskError) or a is None:
        return b
    return [KeyedSample.merge(x, y) for x, y in zip(a, b)]


def _task_stats(table: FeatureTable, model: GMMClassifier, thetas: list[Theta], active: np.ndarray,
                task: PartTask) -> list[Stats | None]:
    stats = model.pass_stats(((w, y) for w, y, _, _ in _windows(table, model, task)), thetas, active)
    return [s if a else None for s, a in zip(stats, active)]


def _task_scores(table: FeatureTable, model: GMMClassifier, task: PartTask) -> list[np.ndarray]:
    return [model.score_sums((w, y) for w, y, _, _ in _windows(table, model, task))]


def fit_gmm(spark: Any, model: GMMClassifier, table: FeatureTable, tasks: Sequence[PartTask], *,
            labels: list[str], feature_dim: int, rate: int | None, channels: int | None,
            progress: bool = False) -> GMMClassifier:
    """Fit ``model`` on the labelled windows of ``tasks`` (label indices into ``labels``)."""
    model.labels_, model.feature_dim_ = list(labels), int(feature_dim)
    model.feature_rate_, model.channels_ = rate, channels
    p = model.params
    sc = spark.sparkContext
    rdd = sc.parallelize(list(tasks), max(1, len(tasks)))
    setup = sc.broadcast(model)
    t0 = time.perf_counter()
    try:
        with job_progress(sc, f"{model.name} init", enable=progress):
            samples = checked(rdd.map(on_executor(lambda t: _task_samples(table, setup.value, t))).treeAggregate(
                None, _merge_samples, _merge_samples))
        thetas = model.initial_thetas(samples or model.new_samples())
        t1 = time.perf_counter()
        bar = progress_counter(desc=f"{model.name} EM", total=p["max_iter"], unit="pass", enable=progress)

        def pass_stats(th: list[Theta], active: np.ndarray) -> list[Stats | None]:
            current = sc.broadcast((th, active))
            try:
                out = checked(rdd.map(on_executor(
                    lambda t: _task_stats(table, setup.value, current.value[0], current.value[1], t))
                ).treeAggregate(None, add_lists, add_lists))
            finally:
                current.destroy()
            return out if out is not None else [None] * len(th)

        def on_pass(ems: list[LabelEM]) -> None:
            if bar is not None:
                bar.update(1)
                bar.set_postfix(active=sum(not em.done for em in ems))

        try:
            ems = em_fit(thetas, pass_stats, tol=p["tol"], reg=p["reg"], accelerate=p["accelerate"],
                         max_iter=p["max_iter"], on_pass=on_pass)
        finally:
            if bar is not None:
                bar.close()
        model.set_mixtures(ems)
    finally:
        setup.destroy()
    t2 = time.perf_counter()
    fitted = sc.broadcast(model)
    try:
        sums = checked(rdd.map(on_executor(lambda t: _task_scores(table, fitted.value, t))).treeAggregate(
            None, add_lists, add_lists))
    finally:
        fitted.destroy()
    model.set_score_stats(sums[0] if sums else np.zeros((len(labels), 3)))
    model.train_info_.update(init_seconds=round(t1 - t0, 3), em_seconds=round(t2 - t1, 3),
                             score_seconds=round(time.perf_counter() - t2, 3), tasks=len(tasks))
    return model
