"""The Spark engine's jobs, as the local engine's in :mod:`wavetrain.pipeline.jobs`: train, evaluate
(a model file, or k folds in parallel), classify into a predictions file, and extract features.

Every job first brings the feature table up to date (:func:`prepare`: executors extract the
recordings it lacks), then maps over its part files. The driver holds the data set's
description, the table's catalog of recording ids and small per-task results (statistics,
confusion matrices, counts) — never the features, nor per-window results of the whole data set.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wavetrain.core.errors import AudioError, ParameterError, UserError
from wavetrain.data.dataset import Dataset
from wavetrain.data.splits import kfold_indices, rare_values
from wavetrain.evaluation.detection_metrics import detection_report
from wavetrain.evaluation.metrics import confusion_report, fold_spread, scores
from wavetrain.features import parse_spec
from wavetrain.models.anomaly import AnomalyDetector
from wavetrain.models.base import Classifier, FitOptions
from wavetrain.models.passes import Confusion, ScoreList
from wavetrain.models.registry import build
from wavetrain.pipeline.jobs import (
    detector_folds,
    detector_normal_value,
    feature_layout,
    group_names,
    model_and_data,
    normal_value,
    training_augmenter,
)
from wavetrain.pipeline.prediction import Prediction, write_predictions
from wavetrain.spark.extract import extract_missing
from wavetrain.spark.jobs import checked, job_progress, on_executor
from wavetrain.spark.passes import SparkExecutor
from wavetrain.spark.shards import Augmenting, PartTask, part_tasks, part_windows
from wavetrain.spark.support import spark_support
from wavetrain.spark.table import FeatureTable
from wavetrain.stream.source import FeatureSource
from wavetrain.stream.windows import Windowing

__all__ = ["Prepared", "SparkJob", "classify", "evaluate_kfold", "evaluate_model", "prepare", "train"]

log = logging.getLogger(__name__)

@dataclass
class SparkJob:
    """What a Spark run needs besides the model: the session, the feature table, run switches."""

    spark: Any
    table: FeatureTable
    skip_bad: bool = False
    progress: bool = False
    group_by: str | None = None
    seed: int = 0
    processes: int | None = None          # DDP ranks of neural training (default: the cluster's cores)
    max_retries: int = 5                  # barrier stages retried from the last checkpoint
    checkpoint: str | None = None         # shared checkpoint folder of neural training
    resume: str | None = None             # the checkpoint folder the first attempt continues from


@dataclass
class Prepared:
    """A data set as the table holds it (bad recordings left out)."""

    ds: Dataset
    source: FeatureSource
    keys: list[str]                               # spec key of each recording
    catalog: dict[tuple[str, str], str]           # (recording id, spec key) -> part file
    feature_dim: int
    extracted: int = 0
    skipped: list = field(default_factory=list)

    def tasks(self, ys: list[int] | None = None, indices: np.ndarray | None = None) -> list[PartTask]:
        """Tasks reading the recordings ``indices`` (all by default), the ``j``-th of them with
        label index ``ys[j]`` and ordinal ``j``: as a local stream over that subset numbers them."""
        ds, keys = self.ds, self.keys
        if indices is not None:
            ds, keys = ds.subset(indices), [keys[int(i)] for i in indices]
        tasks, missing = part_tasks(self.catalog, ds, keys, ys)
        if missing:
            raise UserError(f"{ds[missing[0]].path}: its features are not in the feature table after extraction; "
                            "is the table's folder shared by every executor?")
        return tasks


def prepare(job: SparkJob, ds: Dataset, source: FeatureSource) -> Prepared:
    """Extract what the table lacks of ``ds``, and refuse (or, with ``skip_bad``, leave out) bad
    recordings."""
    res = extract_missing(job.spark, job.table, ds, source, progress=job.progress)
    if res.bad and not job.skip_bad:
        raise AudioError(res.bad[0][1])
    if res.bad:
        bad = {id(r) for r, _ in res.bad}
        ds = ds.filter(lambda r: id(r) not in bad)
    if len(ds) == 0:
        raise UserError("no usable recordings in the data set")
    keys = [source.spec_for(rec)[1] for rec in ds]
    catalog = job.table.catalog(keys)
    first = catalog.get((ds[0].id, keys[0]))
    if first is None:
        raise UserError(f"{ds[0].path}: its features are not in the feature table {job.table.root} after "
                        "extraction; is the table's folder shared by every executor?")
    return Prepared(ds, source, keys, catalog, job.table.feature_dim(first), res.extracted, list(res.bad))


def label_indices(ds: Dataset, label: str, labels: list[str]) -> list[int]:
    """Index of each recording's value in ``labels`` (-1 for another value or none)."""
    key, index = ds.resolve_label(label), {v: i for i, v in enumerate(labels)}
    return [index.get(rec.labels.get(key) or "", -1) for rec in ds]


def _present_values(ds: Dataset, label: str) -> list[str]:
    return sorted({v for v in ds.values(ds.resolve_label(label)) if v not in (None, "")})


def _fit(job: SparkJob, model: Classifier, prep: Prepared, label: str, indices: np.ndarray | None = None, *,
         progress: bool) -> None:
    """Fit ``model`` on the recordings ``indices`` of the prepared data through the family's own
    :meth:`~wavetrain.models.base.Classifier.learn` on the Spark executor: passes of statistics
    as one job each, gradient steps as distributed-data-parallel ranks."""
    ds = prep.ds if indices is None else prep.ds.subset(indices)
    labels = _present_values(ds, label)
    if len(labels) < model.min_labels:
        raise UserError(f"{model.name}: training needs at least {model.min_labels} label values, got "
                        f"{len(labels)} ({', '.join(labels) or 'none'})")
    model.label_name_ = label
    _check_family(model)
    data = _executor(job, model, prep, label_indices(ds, label, labels), indices, labels)
    options = FitOptions(progress=progress, group_by=job.group_by, checkpoint=job.checkpoint, resume=job.resume)
    with job_progress(job.spark.sparkContext, model.name, enable=progress):
        model.learn(data, options=options)
    model.train_info_["tasks"] = len(data.tasks)


def _executor(job: SparkJob, model: Classifier, prep: Prepared, ys: list[int], indices: np.ndarray | None,
              labels: list[str]) -> SparkExecutor:
    """The recordings ``indices`` of the prepared data (label indices ``ys``) as a Spark executor,
    windows cut (and augmented) as ``model`` cuts them."""
    base = np.arange(len(prep.ds)) if indices is None else np.asarray(indices)
    ds = prep.ds.subset(base)
    return SparkExecutor.of_dataset(
        job.spark, job.table, ds,
        lambda sub: prep.tasks([ys[int(i)] for i in sub], base[np.asarray(sub, dtype=np.int64)]),
        labels=labels, feature_dim=prep.feature_dim, rate=prep.source.rate, channels=prep.source.channels,
        spec=model.feature_spec, windowing=Windowing.from_params(model.params),
        augmenting=_augmenting(model, prep, ds), processes=job.processes, max_retries=job.max_retries)


def _augmenting(model: Classifier, prep: Prepared, ds: Dataset) -> Augmenting | None:
    """How the executors augment the training windows of ``ds`` as the local engine would (None
    when the model's ``augment`` leaves the windows as they are, and for a fitted model: its
    windows are scored, never augmented)."""
    if model.labels_ is not None:
        return None
    augmenter = training_augmenter(model)
    if not Augmenting.needed(augmenter):
        return None
    return Augmenting(model.params["augment"], int(model.params.get("seed") or 0), prep.source.rate,
                      prep.source.channels, {rec.id: rec for rec in ds})


def _check_family(model: Classifier) -> None:
    """Refuse, before any work, a family the Spark engine does not train (:func:`spark_support`)."""
    reason = spark_support(model)
    if reason:
        raise ParameterError(reason)


def train(job: SparkJob, ds: Dataset, label: str, spec: str, overrides: dict | None, *, normal: str | None = None
          ) -> tuple[Classifier, Prepared]:
    """Build and fit a model on the labelled recordings of ``ds`` (a detector: on those whose
    ``label`` is ``normal``, see :func:`~wavetrain.pipeline.jobs.model_and_data`): ``(model, prepared data)``."""
    model, ds = model_and_data(ds, label, spec, overrides, checkpoints=bool(job.checkpoint or job.resume),
                               normal=normal)
    _check_family(model)
    rate, channels = feature_layout(ds, model.feature_spec, skip_bad=job.skip_bad)
    prep = prepare(job, ds, FeatureSource(model.feature_spec, rate=rate, channels=channels))
    _fit(job, model, prep, label, progress=job.progress)
    return model, prep


# -- evaluation ----------------------------------------------------------------------------------
def _model_source(model: Classifier) -> FeatureSource:
    """The features a fitted model scores: its spec, rate and channels."""
    return FeatureSource(model.feature_spec, rate=model.feature_rate_, channels=model.channels_)


def evaluate_model(job: SparkJob, model: Classifier, ds: Dataset, label: str, *, normal: str | None = None) -> dict:
    """Evaluate a trained model on a labelled data set (see :func:`wavetrain.pipeline.jobs.evaluate_model`;
    ``normal``: a detector's normal value, as there)."""
    _check_family(model)
    ds = ds.labelled(label)
    if isinstance(model, AnomalyDetector):
        return _evaluate_detector(job, model, ds, label, normal)
    prep = prepare(job, ds, _model_source(model))
    _check_dim(model, prep)
    unseen = sorted(v for v in _present_values(prep.ds, label) if v not in model.fitted_labels)
    labels = list(model.fitted_labels) + unseen
    data = _executor(job, model, prep, label_indices(prep.ds, label, labels), None, labels)
    with job_progress(job.spark.sparkContext, "evaluate", enable=job.progress):
        cm = data.run(Confusion(model, labels))
    res = confusion_report(cm, labels)
    res.update(unseen_values=unseen, recordings=len(prep.ds), skipped=list(ds.skipped) + prep.skipped)
    return res


def _evaluate_detector(job: SparkJob, model: AnomalyDetector, ds: Dataset, label: str, normal: str | None) -> dict:
    """A detector's evaluation (see :func:`wavetrain.pipeline.jobs.evaluate_detector`): the anomaly
    score of every window, collected to the driver in data set order (one float per window)."""
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {label!r}")
    _check_scores_once(model)
    normal = detector_normal_value(model, ds, label, normal)
    prep = prepare(job, ds, _model_source(model))
    _check_dim(model, prep)
    key = prep.ds.resolve_label(label)
    truth = np.array([int(r.labels.get(key) != normal) for r in prep.ds], dtype=np.int64)
    data = _executor(job, model, prep, [0] * len(prep.ds), None, list(model.fitted_labels))
    with job_progress(job.spark.sparkContext, "evaluate", enable=job.progress):
        ordinals, s = data.run(ScoreList(model)).ordered()
    groups = group_names(prep.ds, job.group_by)
    res = detection_report(truth[ordinals], s, model.threshold_,
                           None if groups is None else [groups[int(o)] for o in ordinals])
    res.update(detector=True, label=label, normal_value=normal, recordings=len(prep.ds),
               skipped=list(ds.skipped) + prep.skipped)
    return res


def _check_scores_once(model: Classifier) -> None:
    """Refuse a detector whose scores depend on the windows it scored before (each Spark task
    would adapt its own copy)."""
    if model.adapts:
        raise ParameterError(f"{model.name} with adapt > 0 changes while it classifies, window after window; "
                             "evaluate it with --engine local")


def _kfold_detector(job: SparkJob, prep: Prepared, label: str, spec: str, overrides: dict | None,
                    test_folds: list[np.ndarray], on_fold, normal: str | None) -> dict:
    """k-fold evaluation of a detector (:func:`~wavetrain.pipeline.jobs.detector_folds`, as the
    local engine): each fold's model learns on the executors and scores every window of its own
    fold, collected in data set order."""
    key = prep.ds.resolve_label(label)
    normal = normal_value(prep.ds, label, normal)
    truth = np.array([int(r.labels.get(key) != normal) for r in prep.ds], dtype=np.int64)
    groups = group_names(prep.ds, job.group_by)

    def fold(train_idx: np.ndarray, test_idx: np.ndarray) -> tuple[Any, float, list[int], list[float], list[str]]:
        model = build(spec, overrides)
        tf = time.perf_counter()
        _fit(job, model, prep, label, train_idx, progress=False)
        train_s = time.perf_counter() - tf
        test = _executor(job, model, prep, [0] * len(test_idx), test_idx, [normal])
        ordinals, s = test.run(ScoreList(model)).ordered()
        return (model, train_s, [int(v) for v in truth[test_idx][ordinals]], [float(v) for v in s],
                [groups[int(test_idx[o])] for o in ordinals] if groups else [])

    res = detector_folds(test_folds, truth == 0, fold, label=label, value=normal, on_fold=on_fold)
    res.update(label=label, normal_value=normal, group_by=job.group_by, recordings=len(prep.ds))
    return res


def _check_dim(model: Classifier, prep: Prepared) -> None:
    if prep.feature_dim != model.feature_dim_:
        raise UserError(f"features of this data have {prep.feature_dim} values per frame, the model expects "
                        f"{model.feature_dim_}; was the model trained with another feature spec?")


def evaluate_kfold(job: SparkJob, ds: Dataset, label: str, spec: str, overrides: dict | None, *, folds: int = 5,
                   on_fold=None, normal: str | None = None) -> dict:
    """k-fold cross-validation (see :func:`wavetrain.pipeline.jobs.evaluate_kfold`: the same folds and,
    for the statistic families, the same models). GMM folds run in parallel, each fold's jobs from
    its own driver thread; neural folds one after another (each takes every executor for its
    ranks), and a detector's too (``normal``: its normal value, as locally)."""
    ds = ds.labelled(label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {label!r}")
    probe = build(spec, overrides)
    _check_family(probe)
    rate, channels = feature_layout(ds, probe.feature_spec, skip_bad=job.skip_bad)
    prep = prepare(job, ds, FeatureSource(probe.feature_spec, rate=rate, channels=channels))
    labels = _present_values(prep.ds, label)
    rare = rare_values(prep.ds, label, folds, job.group_by)
    test_folds = kfold_indices(prep.ds, folds, group_by=job.group_by, seed=job.seed, stratify=label)
    if probe.detector:
        _check_scores_once(probe)
        with job_progress(job.spark.sparkContext, "folds", enable=job.progress):
            res = _kfold_detector(job, prep, label, spec, overrides, test_folds, on_fold, normal)
        res.update(rare_values=rare, skipped=list(ds.skipped) + prep.skipped)
        return res
    everything = np.arange(len(prep.ds))

    def run_fold(f: int) -> dict:
        test_idx = test_folds[f]
        train_idx = np.setdiff1d(everything, test_idx)
        model = build(spec, overrides)
        t0 = time.perf_counter()
        _fit(job, model, prep, label, train_idx, progress=False)
        train_s = time.perf_counter() - t0
        test_ys = label_indices(prep.ds.subset(test_idx), label, labels)
        cm = _executor(job, model, prep, test_ys, test_idx, labels).run(Confusion(model, labels))
        s = scores(cm, labels)
        return {"fold": f + 1, "train_recordings": len(train_idx), "test_recordings": len(test_idx),
                "accuracy": s["accuracy"], "macro_f1": s["macro_f1"], "train_seconds": train_s, "cm": cm,
                "scores": s}

    t0 = time.perf_counter()
    parallel = probe.learns_by == "statistics"     # gradient-step folds each take every executor
    results: list[dict] = []
    with ThreadPoolExecutor(max_workers=folds if parallel else 1) as pool, \
            job_progress(job.spark.sparkContext, "folds", enable=job.progress):
        for info in pool.map(run_fold, range(folds)):
            results.append(info)
            if on_fold:
                on_fold({k: v for k, v in info.items() if k not in ("cm", "scores")})
    cm = sum(r["cm"] for r in results)
    res = confusion_report(np.asarray(cm), labels)
    res.update(folds=[{k: v for k, v in r.items() if k not in ("cm", "scores")} for r in results],
               folds_summary=fold_spread([r["scores"] for r in results]), rare_values=rare,
               group_by=job.group_by, recordings=len(prep.ds), seconds=time.perf_counter() - t0,
               skipped=list(ds.skipped) + prep.skipped)
    return res


# -- classification ------------------------------------------------------------------------------
def _task_predictions(table: FeatureTable, model: Classifier, folder: str, index: int, task: PartTask
                      ) -> tuple[int, int]:
    """On an executor: predict one task's windows into ``folder/part-<index>.jsonl`` (rows of
    :meth:`Prediction.to_json` with the recording's ordinal in ``file``); ``(index, rows)``."""
    import io
    import json

    labels, name = list(model.fitted_labels), model.label_name_ or "label"
    spec, windowing = model.feature_spec, Windowing.from_params(model.params)
    tmp, final = f"{folder}/.part-{index:06d}.{uuid.uuid4().hex[:8]}", f"{folder}/part-{index:06d}.jsonl"
    rows = 0
    with table.fs.open_output_stream(tmp) as raw, io.TextIOWrapper(raw, encoding="utf-8") as f:
        batch: list[tuple[np.ndarray, int, int, int]] = []

        def flush() -> None:
            if not batch:
                return
            names, values, details = model.predict_scores([b[0] for b in batch])
            for j, ((_, ordinal, s, e), row, value) in enumerate(zip(batch, values, names)):
                p = Prediction(None, s, e, value, row, model.score_kind, labels,
                               {k: float(v[j]) for k, v in details.items()})
                out = p.to_json(name)
                out["file"] = ordinal
                f.write(json.dumps(out) + "\n")
            batch.clear()

        for w, _, ordinal, (s, e) in part_windows(table, task, spec, windowing):
            batch.append((w, ordinal, s, e))
            if len(batch) == 64:
                rows += len(batch)
                flush()
        rows += len(batch)
        flush()
    table.fs.move(tmp, final)      # a retried or speculative task writes the same rows
    return index, rows


def classify(job: SparkJob, model: Classifier, ds: Dataset, output: str) -> tuple[int, list]:
    """Classify every window of ``ds`` into the predictions file ``output`` (.parquet, .csv or
    .jsonl), in data set order: ``(windows, skipped recordings)``.

    The model is broadcast once; each task writes its predictions to a part file in a staging
    folder of the feature table (which every executor reaches), and the driver streams the parts
    into ``output`` one at a time."""
    prep = prepare(job, ds, _model_source(model))
    _check_dim(model, prep)
    tasks = _in_dataset_order(prep.tasks())
    table = job.table
    stage = table.scratch("predictions")
    sc = job.spark.sparkContext
    fitted = sc.broadcast(model)
    try:
        with job_progress(sc, "classify", enable=job.progress):
            checked(sc.parallelize(list(enumerate(tasks)), max(1, len(tasks))).map(on_executor(
                lambda it: _task_predictions(table, fitted.value, stage, it[0], it[1]))).collect())
        n = write_predictions(output, _merged(table, stage, len(tasks), prep.ds), list(model.fitted_labels))
    finally:
        fitted.destroy()
        table.fs.delete_dir(stage)
    return n, list(ds.skipped) + prep.skipped


def _in_dataset_order(tasks: list[PartTask]) -> list[PartTask]:
    """Tasks ordered by their first recording's position in the data set."""
    return sorted(tasks, key=lambda t: min(o for occ in t[1].values() for o, _ in occ))


def _merged(table: FeatureTable, stage: str, parts: int, ds: Dataset) -> Iterator[dict]:
    """The rows of the part files in order, with each recording's path in ``file``."""
    import io
    import json

    for i in range(parts):
        with table.fs.open_input_stream(f"{stage}/part-{i:06d}.jsonl") as raw, \
                io.TextIOWrapper(raw, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                row["file"] = str(ds[int(row["file"])].path)
                yield row


def extract_features(job: SparkJob, ds: Dataset, spec: str) -> Prepared:
    """Extract the features of every recording of ``ds`` into the table (those it lacks)."""
    fs = parse_spec(spec)
    rate, channels = feature_layout(ds, fs, skip_bad=job.skip_bad)
    return prepare(job, ds, FeatureSource(fs, rate=rate, channels=channels))
