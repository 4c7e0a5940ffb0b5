"""The Spark engine (:class:`SparkEngine`): the :class:`~wavetrain.pipeline.engine.Engine` whose data
is the shared Parquet feature table and whose work runs in Spark tasks. The jobs themselves (train,
evaluate, k-fold, classify) are the local engine's, in :mod:`wavetrain.pipeline.jobs`.

Preparing a data set brings the feature table up to date (executors extract the recordings it
lacks); an executor is a :class:`~wavetrain.spark.passes.SparkExecutor` over part files;
predictions are computed by tasks into part files of a staging folder, which the driver reads back
in data set order; so are events, each recording's in a task of its own (the local engine's
:meth:`~wavetrain.pipeline.engine.LocalEngine.events` run there on that recording). The driver
holds the data set's description, the table's catalog of recording ids and small per-task results,
and one task's predictions at a time — never the features.
"""
from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

from wavetrain.core.errors import AudioError, UserError
from wavetrain.data.dataset import Dataset
from wavetrain.features import parse_spec
from wavetrain.models.base import Classifier
from wavetrain.pipeline.engine import LocalEngine, Prepared
from wavetrain.pipeline.jobs import RunOptions, feature_layout, training_augmenter
from wavetrain.pipeline.prediction import Prediction, by_group, predict_recordings
from wavetrain.spark import session
from wavetrain.spark.extract import extract_missing
from wavetrain.spark.jobs import checked, job_progress, on_executor
from wavetrain.spark.passes import SparkExecutor
from wavetrain.spark.plan import SparkPlan, plan_within
from wavetrain.spark.session import SparkSettings
from wavetrain.spark.shards import Augmenting, PartTask, part_tasks, part_windows
from wavetrain.spark.support import spark_support
from wavetrain.spark.table import FeatureTable
from wavetrain.stream.events import EventOptions
from wavetrain.stream.source import FeatureSource
from wavetrain.stream.windows import Windowing

__all__ = ["SparkEngine", "SparkPrepared", "extract_features", "label_indices", "prepare"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: Windows a prediction task scores at a time.
PREDICT_BATCH = 64


@dataclass
class SparkPrepared(Prepared):
    """A data set as the feature table holds it (bad recordings left out with ``skip_bad``).
    A model that scores samples (an exported graph) reads the recordings themselves: ``source``
    is then None and nothing is in the table."""

    source: FeatureSource | None = None
    keys: list[str] = field(default_factory=list)                        # spec key of each recording
    catalog: dict[tuple[str, str], str] = field(default_factory=dict)    # (recording id, spec key) -> part file
    feature_dim: int = 0
    table_root: str = ""

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

    def training_summary(self, model: Classifier) -> tuple[dict[str, Any], str]:
        return ({"features_extracted": self.extracted},
                f"features: {self.extracted} recordings extracted into the feature table {self.table_root}")


def prepare(spark: Any, table: FeatureTable, ds: Dataset, source: FeatureSource, *, skip_bad: bool = False,
            progress: bool = False) -> SparkPrepared:
    """Extract what the table lacks of ``ds``, and refuse (or, with ``skip_bad``, leave out) bad
    recordings."""
    res = extract_missing(spark, table, ds, source, progress=progress)
    if res.bad and not skip_bad:
        raise AudioError(res.bad[0][1])
    if res.bad:
        bad = {id(r) for r, _ in res.bad}
        ds = ds.filter(lambda r: id(r) not in bad)
    if len(ds) == 0:
        raise UserError("no usable recordings in the data set")
    keys = [source.spec_for(rec)[1] for rec in ds]
    catalog = table.catalog(keys)
    first = catalog.get((ds[0].id, keys[0]))
    if first is None:
        raise UserError(f"{ds[0].path}: its features are not in the feature table {table.root} after "
                        "extraction; is the table's folder shared by every executor?")
    return SparkPrepared(ds, (source.rate, source.channels), list(res.bad), res.extracted, source=source, keys=keys,
                         catalog=catalog, feature_dim=table.feature_dim(first), table_root=str(table.root))


class SparkEngine:
    """Jobs on a Spark cluster (or local Spark): the data in the feature ``table``, the work in
    Spark tasks.

    Parameters
    ----------
    spark : SparkSession or None
        The session; None: one is started from ``settings`` when a job first needs it (so that
        what a job refuses is refused before the JVM starts) and stopped by :meth:`close`.
    table : FeatureTable
        The shared feature table (a folder or URI every executor reaches).
    settings : SparkSettings, optional
        The session to start (default: local Spark's defaults).
    processes : int or None
        Ranks of distributed training (default: the cluster's cores).
    max_retries : int
        Times distributed training runs a failed stage again, from the last checkpoint.
    """

    name: ClassVar[str] = "spark"
    live: ClassVar[bool] = False
    device_groups: ClassVar[bool] = False
    parallel: ClassVar[bool] = True

    def __init__(self, spark: Any, table: FeatureTable, *, settings: SparkSettings | None = None,
                 processes: int | None = None, max_retries: int = 5):
        self._spark, self.table, self.settings = spark, table, settings or SparkSettings()
        self.processes, self.max_retries = processes, int(max_retries)
        self._stack = contextlib.ExitStack()

    @property
    def spark(self) -> Any:
        """The session (started on first use)."""
        if self._spark is None:
            self._spark = self._stack.enter_context(session.spark_session(self.settings))
        return self._spark

    def close(self) -> None:
        """Stop the session this engine started (if it did)."""
        self._stack.close()

    def __enter__(self) -> SparkEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.__exit__(*exc)

    def plan(self, ds: Dataset, model: Classifier, opts: RunOptions, *, memory_limit: int | None = None
             ) -> SparkPlan | None:
        """With ``memory_limit``, the executors' and the driver's plan within it (the executors'
        gram cache made to fit, a setting of the session, which must not have started yet:
        :func:`~wavetrain.spark.plan.plan_within`); None without a limit."""
        if memory_limit is None or model.scores_samples:
            return None
        plan, settings = plan_within(ds, model, self.settings, memory_limit)
        if self._spark is not None and settings.conf != self.settings.conf:
            log.warning("--memory-limit: the Spark session is already running with its own gram cache bound; "
                        "the plan's (%s MB) applies to a new session", plan.settings["gram_cache_mb"])
        else:
            self.settings = settings
        return plan

    @classmethod
    def refusal(cls, model: Classifier, *, training: bool) -> str | None:
        if training and model.labels_ is None:
            return spark_support(model)
        if model.adapts:
            return (f"{model.name} with adapt > 0 changes while it classifies, window after window, and each Spark "
                    "task would adapt its own copy; run it with --engine local")
        return None

    def where(self) -> str:
        return f" on Spark ({self.spark.sparkContext.master})"

    # -- data --------------------------------------------------------------------------------
    def prepare(self, ds: Dataset, model: Classifier, opts: RunOptions, *, label: str | None = None,
                labels: list[str] | None = None) -> SparkPrepared:
        if model.labels_ is not None:
            if model.scores_samples:        # (an exported graph computes its own features)
                return SparkPrepared(ds, (model.feature_rate_, model.channels_), table_root=str(self.table.root))
            source = FeatureSource(model.feature_spec, rate=model.feature_rate_, channels=model.channels_)
        else:
            rate, channels = feature_layout(ds, model.feature_spec, skip_bad=opts.skip_bad)
            source = FeatureSource(model.feature_spec, rate=rate, channels=channels)
        prep = prepare(self.spark, self.table, ds, source, skip_bad=opts.skip_bad, progress=opts.progress)
        if model.labels_ is not None and prep.feature_dim != model.feature_dim_:
            raise UserError(f"features of this data have {prep.feature_dim} values per frame, the model expects "
                            f"{model.feature_dim_}; was the model trained with another feature spec?")
        return prep

    def executor(self, prep: Prepared, model: Classifier, opts: RunOptions, *, label: str | None,
                 labels: list[str], indices: np.ndarray | None = None) -> SparkExecutor:
        assert isinstance(prep, SparkPrepared)
        base = np.arange(len(prep.ds)) if indices is None else np.asarray(indices)
        ds = prep.ds.subset(base)
        ys = [0] * len(ds) if label is None else label_indices(ds, label, labels)
        assert prep.source is not None
        return SparkExecutor.of_dataset(
            self.spark, self.table, ds,
            lambda sub: prep.tasks([ys[int(i)] for i in sub], base[np.asarray(sub, dtype=np.int64)]),
            labels=labels, feature_dim=prep.feature_dim, rate=prep.source.rate, channels=prep.source.channels,
            spec=model.feature_spec, windowing=Windowing.from_params(model.params),
            augmenting=_augmenting(model, prep, ds), processes=self.processes, max_retries=self.max_retries)

    # -- predictions ---------------------------------------------------------------------------
    def predictions(self, prep: Prepared, model: Classifier, opts: RunOptions, *,
                    indices: np.ndarray | None = None, warn: bool = True) -> tuple[Iterator[Prediction], list]:
        assert isinstance(prep, SparkPrepared)
        ds = prep.ds if indices is None else prep.ds.subset(indices)
        skipped: list = []
        if not len(ds):
            return iter(()), skipped
        if model.scores_samples:
            chunks = [list(range(i, min(i + SAMPLE_CHUNK, len(ds)))) for i in range(0, len(ds), SAMPLE_CHUNK)]
            work: list[Any] = [[(o, ds[o]) for o in chunk] for chunk in chunks]
            holder = {o: i for i, chunk in enumerate(chunks) for o in chunk}
        else:
            work = _in_dataset_order(prep.tasks(None, indices))
            holder = {o: i for i, t in enumerate(work) for occ in t[1].values() for o, _ in occ}
        return _Predicted(self, model, ds, work, holder, skip_bad=opts.skip_bad, progress=opts.progress,
                          skipped=skipped).rows(), skipped

    def events(self, ds: Dataset, model: Classifier, opts: RunOptions, options: EventOptions, *,
               unknown: str | float) -> tuple[Iterator[Prediction], list]:
        """Every event of every recording of ``ds``, each recording's found in a Spark task of its
        own as the local engine finds them (read in blocks, whole; bad recordings refused, or left
        out with ``skip_bad``), read back in data set order with ``recording`` set."""
        skipped: list = []
        if not len(ds):
            return iter(()), skipped
        work: list[Any] = [[(o, rec)] for o, rec in enumerate(ds)]
        return _Predicted(self, model, ds, work, {o: o for o in range(len(ds))}, skip_bad=opts.skip_bad,
                          progress=opts.progress, skipped=skipped, events=(options, unknown)).rows(), skipped

    # -- scheduling ----------------------------------------------------------------------------
    def map(self, fn: Callable[[T], R], items: Iterable[T], *, parallel: bool) -> Iterator[R]:
        items = list(items)
        if not parallel or len(items) < 2:
            return (fn(item) for item in items)
        pool = ThreadPoolExecutor(max_workers=len(items))     # each item's jobs from its own driver thread

        def results() -> Iterator[R]:
            with pool:
                yield from pool.map(fn, items)

        return results()

    def progress(self, desc: str, *, enable: bool) -> contextlib.AbstractContextManager[Any]:
        return job_progress(self.spark.sparkContext, desc, enable=enable)


#: Recordings of a data set a task of an exported graph's predictions reads.
SAMPLE_CHUNK = 16


def label_indices(ds: Dataset, label: str, labels: list[str]) -> list[int]:
    """Index of each recording's value in ``labels`` (-1 for another value or none)."""
    key, index = ds.resolve_label(label), {v: i for i, v in enumerate(labels)}
    return [index.get(rec.labels.get(key) or "", -1) for rec in ds]


def _augmenting(model: Classifier, prep: SparkPrepared, ds: Dataset) -> Augmenting | None:
    """How the executors augment the training windows of ``ds`` as the local engine would (None
    when the model's ``augment`` leaves the windows as they are, and for a fitted model: its
    windows are scored, never augmented)."""
    if model.labels_ is not None:
        return None
    augmenter = training_augmenter(model)
    if augmenter is None or not Augmenting.needed(augmenter):
        return None
    assert prep.source is not None
    return Augmenting(augmenter, int(model.params.get("seed") or 0), prep.source.rate,
                      prep.source.channels, {rec.id: rec for rec in ds})


def _in_dataset_order(tasks: list[PartTask]) -> list[PartTask]:
    """Tasks ordered by their first recording's position in the data set."""
    return sorted(tasks, key=lambda t: min(o for occ in t[1].values() for o, _ in occ))


# -- predictions in tasks ------------------------------------------------------------------------
@dataclass
class _Rows:
    """One task's predictions, sorted by recording ordinal (each recording's windows in order)."""

    ordinals: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    scores: list[np.ndarray] = field(default_factory=list)
    details: list[dict[str, float]] = field(default_factory=list)

    def add(self, ordinal: int, p: Prediction) -> None:
        self.ordinals.append(ordinal)
        self.starts.append(p.start_ms)
        self.ends.append(p.end_ms)
        self.names.append(p.label)
        self.scores.append(np.asarray(p.scores, dtype=np.float64))
        self.details.append(p.details)

    def save(self, f: Any, labels: int) -> None:
        order = np.argsort(np.asarray(self.ordinals, dtype=np.int64), kind="stable")
        keys = sorted(self.details[0]) if self.details else []
        np.savez(f, ordinals=np.asarray(self.ordinals, dtype=np.int64)[order],
                 starts=np.asarray(self.starts, dtype=np.int64)[order],
                 ends=np.asarray(self.ends, dtype=np.int64)[order],
                 names=np.asarray(self.names, dtype=str)[order] if self.names else np.zeros(0, dtype="U1"),
                 scores=(np.stack(self.scores) if self.scores else np.zeros((0, labels)))[order],
                 detail_keys=np.asarray(keys, dtype=str) if keys else np.zeros(0, dtype="U1"),
                 details=np.asarray([[d[k] for k in keys] for d in self.details],
                                    dtype=np.float64).reshape(len(self.details), len(keys))[order])


def _task_predictions(table: FeatureTable, model: Classifier, folder: str, index: int, work: Any, skip_bad: bool,
                      events: tuple[EventOptions, str | float] | None = None) -> tuple[int, list[tuple[int, str]]]:
    """On an executor: the predictions of one task's windows (a part task of the table, or, for a
    model that scores samples, ``(ordinal, recording)`` pairs read whole, bad ones skipped with
    ``skip_bad``) into ``folder/part-<index>.npz``; ``(index, [(ordinal, reason) of recordings
    skipped])``. With ``events`` (the detector's settings and the unknown rule), the events of the
    ``(ordinal, recording)`` pairs instead, as the local engine finds them."""
    rows, skipped = _Rows(), []
    if events is not None:
        for ordinal, rec in work:
            found, passed = LocalEngine().events(Dataset([rec], rec.path.parent), model,
                                                 RunOptions(skip_bad=skip_bad), events[0], unknown=events[1])
            for p in found:
                rows.add(ordinal, p)
            skipped += [(ordinal, reason) for _, reason in passed]
    elif model.scores_samples:
        for ordinal, rec in work:
            bad: list = []
            for p in predict_recordings(model, [rec], skipped=bad if skip_bad else None):
                rows.add(ordinal, p)
            skipped += [(ordinal, reason) for _, reason in bad]
    else:
        labels = list(model.fitted_labels)
        batch: list[tuple[np.ndarray, int, int, int]] = []

        def flush() -> None:
            names, values, details = model.predict_scores([b[0] for b in batch])
            for j, ((_, ordinal, s, e), row, value) in enumerate(zip(batch, values, names)):
                rows.add(ordinal, Prediction(None, s, e, value, row, model.score_kind, labels,
                                             {k: float(v[j]) for k, v in details.items()}))
            batch.clear()

        for w, _, ordinal, (s, e) in part_windows(table, work, model.feature_spec, Windowing.from_params(model.params)):
            batch.append((w, ordinal, s, e))
            if len(batch) == PREDICT_BATCH:
                flush()
        if batch:
            flush()
    tmp, final = f"{folder}/.part-{index:06d}.{uuid.uuid4().hex[:8]}", f"{folder}/part-{index:06d}.npz"
    with table.fs.open_output_stream(tmp) as f:
        rows.save(f, len(model.fitted_labels))
    table.fs.move(tmp, final)      # a retried or speculative task writes the same rows
    return index, skipped


@dataclass
class _Predicted:
    """The predictions of some recordings (or, with ``events``, their events), computed by Spark
    tasks into a staging folder of the feature table and read back by the driver in data set
    order, one task's file at a time."""

    engine: SparkEngine
    model: Classifier
    ds: Dataset
    work: list[Any]              # per task: a part task, or (ordinal, recording) pairs
    holder: dict[int, int]       # recording ordinal -> the task that predicts it
    skip_bad: bool
    progress: bool
    skipped: list
    events: tuple[EventOptions, str | float] | None = None      # the detector's settings, the unknown rule

    def rows(self) -> Iterator[Prediction]:
        table = self.engine.table
        stage = table.scratch("predictions")
        sc = self.engine.spark.sparkContext
        fitted, skip_bad, events = sc.broadcast(self.model), self.skip_bad, self.events
        try:
            with job_progress(sc, "events" if events else "classify", enable=self.progress):
                done = checked(sc.parallelize(list(enumerate(self.work)), max(1, len(self.work))).map(on_executor(
                    lambda it: _task_predictions(table, fitted.value, stage, it[0], it[1], skip_bad, events)
                )).collect())
            for _, bad in sorted(done, key=lambda r: r[0]):
                self.skipped += [(self.ds[o], reason) for o, reason in bad]
            # (events were found by the local engine in the tasks, shifted by group there)
            yield from self._read(stage) if events else by_group(self.model, self._read(stage))
        finally:
            fitted.destroy()
            table.fs.delete_dir(stage)

    def _read(self, stage: str) -> Iterator[Prediction]:
        labels, kind = list(self.model.fitted_labels), self.model.score_kind
        loaded: tuple[int, Any] | None = None
        for ordinal, rec in enumerate(self.ds):
            task = self.holder.get(ordinal)
            if task is None:
                continue
            if loaded is None or loaded[0] != task:
                with self.engine.table.fs.open_input_stream(f"{stage}/part-{task:06d}.npz") as raw:
                    loaded = task, dict(np.load(_Buffered(raw), allow_pickle=False))
            part = loaded[1]
            lo, hi = np.searchsorted(part["ordinals"], [ordinal, ordinal + 1])
            keys = [str(k) for k in part["detail_keys"]]
            for j in range(int(lo), int(hi)):
                yield Prediction(rec, int(part["starts"][j]), int(part["ends"][j]), str(part["names"][j]),
                                 part["scores"][j], kind, labels,
                                 {k: float(v) for k, v in zip(keys, part["details"][j])})


def _Buffered(raw: Any) -> Any:
    """A seekable copy of a stream (``np.load`` reads a zip file)."""
    import io

    return io.BytesIO(raw.read())


def extract_features(engine: SparkEngine, ds: Dataset, spec: str, opts: RunOptions | None = None) -> SparkPrepared:
    """Extract the features of every recording of ``ds`` into the table (those it lacks)."""
    opts = opts or RunOptions()
    fs = parse_spec(spec)
    rate, channels = feature_layout(ds, fs, skip_bad=opts.skip_bad)
    return prepare(engine.spark, engine.table, ds, FeatureSource(fs, rate=rate, channels=channels),
                   skip_bad=opts.skip_bad, progress=opts.progress)
