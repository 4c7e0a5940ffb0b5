"""The engines a job runs on: a data set in, executors and predictions out.

Every job (:mod:`wavetrain.pipeline.jobs`: train, evaluate a model file, k-fold, classify) is
written once against :class:`Engine`. An engine does three things:

* :meth:`~Engine.prepare`: bring a data set's features to where the engine reads them, leaving
  out (with ``skip_bad``) or refusing bad recordings; the :class:`Prepared` data it returns names
  the recordings that remain;
* :meth:`~Engine.executor`: some of those recordings' labelled windows as a
  :class:`~wavetrain.models.passes.Executor`, which a model learns from
  (:meth:`~wavetrain.models.base.Classifier.learn`);
* :meth:`~Engine.predictions`: a fitted model's answer for every window of some of them, in data
  set order (recording by recording, each recording's windows in time order), streamed.

:class:`LocalEngine` (here) reads a :class:`~wavetrain.stream.feature_stream.FeatureStream`
(worker threads, the feature store, the memory cache); the Spark engine
(:class:`wavetrain.spark.engine.SparkEngine`) reads the Parquet feature table in Spark tasks. What an
engine cannot do is declared on it (:attr:`Engine.live`, :attr:`Engine.device_groups`,
:meth:`Engine.refusal`) and refused before any work.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, cast

import numpy as np

from wavetrain.core.errors import AudioError
from wavetrain.data.dataset import Dataset
from wavetrain.models.base import Classifier
from wavetrain.models.passes import Executor, StreamExecutor
from wavetrain.pipeline.events import iter_recording_events
from wavetrain.pipeline.prediction import Prediction, by_group, predict, predict_recordings
from wavetrain.pipeline.streams import (
    RunOptions,
    feature_layout,
    make_stream,
    plan_run,
    prediction_stream,
    warn_upsampled,
)

if TYPE_CHECKING:
    from wavetrain.stream.batches import WindowStream
    from wavetrain.stream.events import EventOptions
    from wavetrain.stream.feature_stream import FeatureStream

__all__ = ["Engine", "LocalEngine", "LocalPrepared", "Prepared"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Prepared:
    """A data set as an engine holds it.

    Attributes
    ----------
    ds : Dataset
        The recordings that remain (bad ones left out with ``skip_bad``); executors and
        predictions index it.
    skipped : list of (Recording, str)
        The recordings left out as bad while preparing, with why.
    layout : (int or None, int or None)
        ``(rate, channels)`` the features are computed for.
    extracted : int
        Recordings whose features were computed while preparing.
    """

    ds: Dataset
    layout: tuple[int | None, int | None]
    skipped: list = field(default_factory=list)
    extracted: int = 0

    def training_summary(self, model: Classifier) -> tuple[dict[str, Any], str]:
        """What the model file's ``training`` entry records of the features, and the line that
        reports them after training."""
        return {"features_extracted": self.extracted}, f"features: {self.extracted} recordings extracted"


class Engine(Protocol):
    """Where a job's work runs (see the module's description)."""

    #: ``local`` or ``spark`` (``--engine``).
    name: ClassVar[str]
    #: Whether it classifies a live stream (samples as they arrive, in this process).
    live: ClassVar[bool]
    #: Whether it trains on a device group of this process (``--devices``).
    device_groups: ClassVar[bool]
    #: Whether :meth:`map` runs items at once.
    parallel: ClassVar[bool]

    @classmethod
    def refusal(cls, model: Classifier, *, training: bool) -> str | None:
        """Why this engine cannot train (``training``) or score ``model``, or None: asked before
        any work, from the model's tags."""
        ...

    def where(self) -> str:
        """Where the work ran, for a report (``""`` for this process)."""
        ...

    def plan(self, ds: Dataset, model: Classifier, opts: RunOptions, *, memory_limit: int | None = None) -> Any:
        """Plan the peak memory of training ``model`` on ``ds`` (a fitted model: as if training it,
        an upper bound of predicting), with ``memory_limit`` changing the run's settings to fit it
        (:class:`~wavetrain.core.errors.MemoryLimitError` when it cannot be met). Returns the plan
        (with a ``format()`` for people), or None when there is nothing to plan."""
        ...

    def prepare(self, ds: Dataset, model: Classifier, opts: RunOptions, *, label: str | None = None,
                labels: list[str] | None = None) -> Prepared:
        """``ds`` ready for ``model``: its features (a fitted model's spec, rate and channels;
        an unfitted model's spec at :func:`~wavetrain.pipeline.jobs.feature_layout`) where the
        engine reads them, bad recordings refused or (``skip_bad``) left out. ``label`` and
        ``labels``: the label and values training windows are labelled with."""
        ...

    def executor(self, prep: Prepared, model: Classifier, opts: RunOptions, *, label: str | None,
                 labels: list[str], indices: np.ndarray | None = None) -> Executor:
        """The windows of recordings ``indices`` of ``prep`` (all by default), cut (and, for an
        unfitted model, augmented) as ``model`` cuts them, labelled with the index of their
        ``label`` value in ``labels`` (every window labelled 0 for a detector)."""
        ...

    def predictions(self, prep: Prepared, model: Classifier, opts: RunOptions, *,
                    indices: np.ndarray | None = None, warn: bool = True) -> tuple[Iterator[Prediction], list]:
        """Every window's prediction of recordings ``indices`` of ``prep`` (all by default), in
        data set order, and the list of recordings skipped as bad, filled as they are drawn.
        ``warn``: say (once) how many recordings are below the model's rate."""
        ...

    def events(self, ds: Dataset, model: Classifier, opts: RunOptions, options: EventOptions, *,
               unknown: str | float) -> tuple[Iterator[Prediction], list]:
        """Every event of every recording of ``ds`` (:func:`~wavetrain.pipeline.events.iter_recording_events`:
        each recording read in blocks, whole), in data set order, each answered by ``model`` with
        the ``unknown`` rule, and the list of recordings skipped as bad (``opts.skip_bad``),
        filled as the events are drawn."""
        ...

    def map(self, fn: Callable[[T], R], items: Iterable[T], *, parallel: bool) -> Iterator[R]:
        """``fn`` of each item, results in order; ``parallel``: items may run at once (k-fold
        folds of a family whose work is short jobs)."""
        ...

    def progress(self, desc: str, *, enable: bool) -> contextlib.AbstractContextManager[Any]:
        """A progress display of the work done inside the block."""
        ...


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun if n == 1 else noun + 's'}"


@dataclass
class LocalPrepared(Prepared):
    """A data set prepared by the local engine: for training, a stream over every recording (its
    features computed once, up front, into the store and memory cache); for a fitted model,
    nothing yet (its recordings are read as they are predicted, in one pass)."""

    stream: FeatureStream | None = None

    def training_summary(self, model: Classifier) -> tuple[dict[str, Any], str]:
        stats = self.stream.stats if self.stream is not None else None
        if stats is None:
            return super().training_summary(model)
        # the fraction of fitting time spent waiting for data: the trainer's own measure for neural
        # models (its input is a background prefetcher), the stream's passes after extraction otherwise
        wait = model.train_info_.get("data_wait_fraction", stats.fit_wait_fraction)
        used = len(self.ds)
        again = " (some more than once: the store could not keep them)" if stats.extracted > used else ""
        aug = (f", {_counted(stats.augmented, 'augmented extraction')} (every pass's augmented audio)"
               if stats.augmented else "")
        line = (f"features: {_counted(stats.extracted, 'extraction')}{again}{aug}, "
                f"{_counted(stats.store_reads, 'recording')}' features read from the store, in "
                f"{stats.features_s:.2f} s; "
                f"fitting waited for input {100 * wait:.1f}% of the time")
        return {"features_extracted": stats.extracted, "features_seconds": round(stats.features_s, 3),
                "input_wait_fraction": round(wait, 4)}, line


class LocalEngine:
    """This process: feature streams (worker threads, the store, the memory cache), one
    :class:`~wavetrain.models.passes.StreamExecutor` per training set."""

    name: ClassVar[str] = "local"
    live: ClassVar[bool] = True
    device_groups: ClassVar[bool] = True
    parallel: ClassVar[bool] = False

    @classmethod
    def refusal(cls, model: Classifier, *, training: bool) -> str | None:
        return None

    def where(self) -> str:
        return ""

    def plan(self, ds: Dataset, model: Classifier, opts: RunOptions, *, memory_limit: int | None = None) -> Any:
        if model.scores_samples:      # (an exported graph computes its own features, a window at a time)
            return None
        return plan_run(ds, model, opts, memory_limit=memory_limit)

    def prepare(self, ds: Dataset, model: Classifier, opts: RunOptions, *, label: str | None = None,
                labels: list[str] | None = None) -> LocalPrepared:
        if model.labels_ is not None:           # a fitted model: read as predicted, in one pass
            return LocalPrepared(ds, (model.feature_rate_, model.channels_))
        layout = feature_layout(ds, model.feature_spec, skip_bad=opts.skip_bad)
        stream = make_stream(ds, model, opts, label=label, labels=labels, layout=layout)
        stream.precompute(progress=opts.progress)
        warn_upsampled(stream, ds)
        skipped = list(stream.stats.skipped)
        if skipped:           # (the stream itself passes over them from now on)
            bad = {id(r) for r, _ in skipped}
            ds = ds.filter(lambda r: id(r) not in bad)
        return LocalPrepared(ds, layout, skipped, stream.stats.extracted, stream=stream)

    def executor(self, prep: Prepared, model: Classifier, opts: RunOptions, *, label: str | None,
                 labels: list[str], indices: np.ndarray | None = None) -> StreamExecutor:
        assert isinstance(prep, LocalPrepared)
        if indices is None and prep.stream is not None and list(prep.stream.labels) == list(labels):
            stream = prep.stream
        else:
            ds = prep.ds if indices is None else prep.ds.subset(indices)
            stream = make_stream(ds, model, opts, label=label, labels=labels, layout=prep.layout)
        return StreamExecutor(cast("WindowStream", stream), every_window=model.detector)

    def predictions(self, prep: Prepared, model: Classifier, opts: RunOptions, *,
                    indices: np.ndarray | None = None, warn: bool = True) -> tuple[Iterator[Prediction], list]:
        ds = prep.ds if indices is None else prep.ds.subset(indices)
        if model.scores_samples:
            skipped: list = []
            return predict_recordings(model, ds, skipped=skipped if opts.skip_bad else None), skipped
        stream = prediction_stream(model, ds, opts, warn=warn)
        return predict(model, stream), stream.stats.skipped

    def events(self, ds: Dataset, model: Classifier, opts: RunOptions, options: EventOptions, *,
               unknown: str | float) -> tuple[Iterator[Prediction], list]:
        skipped: list = []

        def each() -> Iterator[Prediction]:
            for rec in ds:
                try:
                    yield from iter_recording_events(model, rec, options, unknown=unknown)
                except AudioError as e:
                    if not opts.skip_bad:
                        raise
                    skipped.append((rec, f"{rec.name}: {e}"))

        return by_group(model, each()), skipped

    def map(self, fn: Callable[[T], R], items: Iterable[T], *, parallel: bool) -> Iterator[R]:
        return (fn(item) for item in items)

    def progress(self, desc: str, *, enable: bool) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()
