"""The jobs behind the commands: train, predict, evaluate (k-fold or a trained model).

Each job wires the layers together — data set, feature stream (with its store), model — and is
what the CLI, the demo and a Spark executor call. Nothing here parses arguments or prints.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from wavetrain.data.dataset import Dataset
from wavetrain.errors import UserError
from wavetrain.evaluate.folds import kfold_indices, rare_values
from wavetrain.evaluate.metrics import confusion, fold_spread, scores
from wavetrain.models.registry import build
from wavetrain.stream import FeatureStream
from wavetrain.windows import Windowing


@dataclass
class RunOptions:
    """Settings of a run that are not model hyper-parameters."""

    store: Any = None              # FeatureStore / NullStore / None
    batch_windows: int = 64
    workers: int | None = 1        # None: stream.default_workers for each stream's data (the CLI's default)
    prefetch: int | None = 4       # None: 2 per worker (at least 2)
    skip_bad: bool = False
    progress: bool = False
    device: str = "cpu"
    cache_bytes: int = 64 << 20    # in-memory cost-aware cache of feature grams (a fixed budget)
    memory_cache: Any = None       # the MemoryCache itself, made on first use and shared by the run's streams
    checkpoint: str | None = None
    resume: str | None = None
    group_by: str | None = None
    seed: int = 0
    extra: dict = field(default_factory=dict)


def make_stream(ds: Dataset, model, opts: RunOptions, *, label: str | None, labels=None) -> FeatureStream:
    from wavetrain.store import MemoryCache

    if opts.memory_cache is None and opts.cache_bytes > 0:
        opts.memory_cache = MemoryCache(opts.cache_bytes)
    workers = opts.workers
    if workers is None:                    # chosen for this data set (opts may serve several)
        from wavetrain.stream import default_workers

        known = [d for d in (r.known_duration_s() for r in ds) if d is not None]
        workers = default_workers(sum(known) / len(known) if known else None)
    prefetch = max(2, 2 * workers) if opts.prefetch is None else opts.prefetch
    return FeatureStream(ds, model.feature_spec, label=label, labels=labels,
                         windowing=Windowing.from_params(model.params), store=opts.store,
                         batch_windows=opts.batch_windows, workers=workers, prefetch=prefetch,
                         skip_bad=opts.skip_bad, device=opts.device if opts.device != "auto" else "cpu",
                         cache=opts.memory_cache)


def _fit_options(opts: RunOptions, **more) -> dict:
    """Run settings handed to ``Classifier.fit``."""
    out = dict(progress=opts.progress, device=opts.device, **more)
    if opts.group_by:
        out["group_by"] = opts.group_by
    return out


def train_model(ds: Dataset, label: str, spec: str, overrides: dict | None, opts: RunOptions):
    """Build and fit a model on the labelled recordings of ``ds``. Returns ``(model, stream)``."""
    model = build(spec, overrides)
    ds = ds.labelled(label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {label!r}")
    stream = make_stream(ds, model, opts, label=label)
    model.label_name_ = label
    t0 = time.perf_counter()
    stream.precompute(progress=opts.progress)
    model.fit(stream, **_fit_options(opts, checkpoint=opts.checkpoint, resume=opts.resume))
    model.train_seconds_ = time.perf_counter() - t0
    return model, stream


@dataclass
class Prediction:
    recording: Any
    start_ms: int
    end_ms: int
    label: str
    confidence: float
    proba: np.ndarray


def prediction_stream(model, ds: Dataset, opts: RunOptions) -> FeatureStream:
    """An unlabelled stream of ``ds`` with the model's features and windowing."""
    stream = make_stream(ds, model, opts, label=None, labels=model.labels_)
    if len(ds) and stream.feature_dim != model.feature_dim_:
        raise UserError(f"features of this data have {stream.feature_dim} values per frame, the model expects "
                        f"{model.feature_dim_}; was the model trained with another feature spec?")
    return stream


def predict(model, stream: FeatureStream) -> Iterator[Prediction]:
    """Classify every window of every recording of the stream, in order."""
    for batch in stream.batches():
        names, proba = model.predict_with_proba(batch.grams)
        for (i, s, e), p, name in zip(batch.refs, proba, names):
            conf = float(p.max()) if name in model.labels_ else float(1.0 - p.max())
            yield Prediction(stream.dataset[i], s, e, name, conf, p)


def _true_and_predicted(model, ds: Dataset, label: str, opts: RunOptions) -> tuple[list, list]:
    key = ds.resolve_label(label)
    y_true, y_pred = [], []
    for pred in predict(model, prediction_stream(model, ds, opts)):
        y_true.append(pred.recording.labels.get(key))
        y_pred.append(pred.label)
    return y_true, y_pred


def evaluate_model(model, ds: Dataset, label: str, opts: RunOptions) -> dict:
    """Evaluate a trained model on a labelled data set."""
    ds = ds.labelled(label)
    y_true, y_pred = _true_and_predicted(model, ds, label, opts)
    unseen = sorted({t for t in y_true if t not in model.labels_})
    labels = list(model.labels_) + unseen
    cm = confusion(y_true, y_pred, labels)
    res = scores(cm, labels)
    res.update(labels=labels, confusion=cm.tolist(), unseen_values=unseen, recordings=len(ds))
    return res


def evaluate_kfold(ds: Dataset, label: str, spec: str, overrides: dict | None, opts: RunOptions, *,
                   folds: int = 5, on_fold=None) -> dict:
    """k-fold cross-validation with folds of whole recordings (and whole groups with ``group_by``)."""
    ds = ds.labelled(label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {label!r}")
    labels = sorted(ds.counts(label))
    rare = rare_values(ds, label, folds, opts.group_by)
    test_folds = kfold_indices(ds, folds, label=label, group_by=opts.group_by, seed=opts.seed)
    # extract every recording once, up front; the folds then read from the store / memory cache
    make_stream(ds, build(spec, overrides), opts, label=label, labels=labels).precompute(progress=opts.progress)
    y_true_all, y_pred_all, fold_scores, fold_info = [], [], [], []
    t0 = time.perf_counter()
    for f, test_idx in enumerate(test_folds):
        train_idx = np.setdiff1d(np.arange(len(ds)), test_idx)
        train_ds = ds.subset(train_idx)
        present = sorted(train_ds.counts(label))
        model = build(spec, overrides)
        model.label_name_ = label
        stream = make_stream(train_ds, model, opts, label=label, labels=present)
        tf = time.perf_counter()
        model.fit(stream, **_fit_options(opts))
        train_s = time.perf_counter() - tf
        y_true, y_pred = _true_and_predicted(model, ds.subset(test_idx), label, opts)
        cm = confusion(y_true, y_pred, labels)
        s = scores(cm, labels)
        fold_scores.append(s)
        fold_info.append({"fold": f + 1, "train_recordings": len(train_idx), "test_recordings": len(test_idx),
                          "accuracy": s["accuracy"], "macro_f1": s["macro_f1"], "train_seconds": train_s})
        y_true_all += y_true
        y_pred_all += y_pred
        if on_fold:
            on_fold(fold_info[-1])
    cm = confusion(y_true_all, y_pred_all, labels)
    res = scores(cm, labels)
    res.update(labels=labels, confusion=cm.tolist(), folds=fold_info, folds_summary=fold_spread(fold_scores),
               rare_values=rare, group_by=opts.group_by, recordings=len(ds), seconds=time.perf_counter() - t0)
    return res
