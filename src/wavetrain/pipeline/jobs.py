"""The jobs behind the commands: train, predict, evaluate (k-fold or a trained model).

Each job wires the layers together — data set, feature stream (with its store), model — and is
what the CLI, the demo and a Spark executor call. Nothing here parses arguments or prints.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from wavetrain.core.errors import AudioError, ParameterError, SpecError, UserError
from wavetrain.data.dataset import Dataset
from wavetrain.data.splits import kfold_indices, rare_values
from wavetrain.evaluation.detection_metrics import detection_report, pooled_fold_report
from wavetrain.evaluation.metrics import confusion, fold_spread, repeat_summary, report, scores
from wavetrain.features import FeatureSpec
from wavetrain.features.augment import Augmenter, parse_augment
from wavetrain.features.spec import warped_specs
from wavetrain.models.base import Classifier, FitOptions
from wavetrain.models.registry import build, families_with
from wavetrain.pipeline.memory import MB, Plan, plan
from wavetrain.pipeline.prediction import Prediction, predict, predict_recordings
from wavetrain.store import FeatureStore, MemoryCache, NullStore, Store
from wavetrain.stream.feature_stream import FeatureStream
from wavetrain.stream.scheduler import default_prefetch, default_workers
from wavetrain.stream.source import MAX_UPSAMPLE
from wavetrain.stream.windows import Windowing

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """Settings of a run that are not model hyper-parameters."""

    store: Store | None = None     # None: a NullStore (nothing kept between runs)
    batch_windows: int = 64
    workers: int | None = 1        # None: scheduler.default_workers for each stream's data (the CLI's default)
    prefetch: int | None = 4       # None: scheduler.default_prefetch(workers)
    skip_bad: bool = False
    progress: bool = False
    device: str = "cpu"
    cache_bytes: int = 64 << 20    # in-memory cost-aware cache of feature grams (a fixed budget)
    frame_cache_bytes: int | None = None  # training frames a family may keep between passes (the plan's grant)
    memory_cache: MemoryCache | None = None   # made on first use and shared by the run's streams
    checkpoint: str | None = None
    resume: str | None = None
    group_by: str | None = None
    seed: int = 0
    devices: tuple = ()            # a device group sharing each training step (neural models)
    balance: str = "throughput"    # how a device group splits each batch
    sync: str = "allreduce"        # how a device group combines its replicas


def make_stream(ds: Dataset, model: Classifier, opts: RunOptions, *, label: str | None,
                labels: list[str] | None = None, layout: tuple[int | None, int | None] | None = None,
                train: bool | None = None) -> FeatureStream:
    """A feature stream of ``ds`` with the model's features and windowing.

    ``layout`` is ``(rate, channels)`` of the features (see :func:`feature_layout`); default: a
    fitted model's own, else the data set's. ``train``: a stream the model learns from, which
    augments as the model's ``augment`` parameter says (its ``seed`` seeding the draws; the
    validation part it holds out stays clean); default: whether the model is not fitted yet
    (a fitted model's streams are predicted, never augmented)."""
    if opts.memory_cache is None and opts.cache_bytes > 0:
        opts.memory_cache = MemoryCache(opts.cache_bytes)
    workers = opts.workers
    if workers is None:                    # chosen for this data set (opts may serve several)
        known = [d for d in (r.known_duration_s() for r in ds) if d is not None]
        workers = default_workers(sum(known) / len(known) if known else None)
    prefetch = default_prefetch(workers) if opts.prefetch is None else opts.prefetch
    if layout is None:
        layout = ((model.feature_rate_, model.channels_) if model.labels_ is not None
                  else feature_layout(ds, model.feature_spec, skip_bad=opts.skip_bad))
    if train is None:
        train = model.labels_ is None
    augment = training_augmenter(model) if train else None
    return FeatureStream(ds, model.feature_spec, label=label, labels=labels,
                         windowing=Windowing.from_params(model.params), store=opts.store or NullStore(),
                         batch_windows=opts.batch_windows, workers=workers, prefetch=prefetch,
                         skip_bad=opts.skip_bad, device=opts.device if opts.device != "auto" else "cpu",
                         cache=opts.memory_cache, rate=layout[0], channels=layout[1],
                         augment=augment or None, augment_seed=int(model.params.get("seed") or 0))


def training_augmenter(model: Classifier) -> Augmenter | None:
    """How the streams ``model`` learns from augment (its ``augment`` parameter; None when empty),
    on either engine. ``mixup`` is refused for a family that does not mix its mini-batches."""
    augment = parse_augment(model.params.get("augment") or "")
    if augment.mixup is not None and not model.mixes_batches:
        mixers = ", ".join(families_with(mixes_batches=True))
        raise ParameterError(f"{model.name}: mixup mixes the mini-batches of a neural classifier ({mixers}); "
                             "drop it from --set augment for this model", param="augment")
    if augment.warps:
        try:
            warped_specs(model.feature_spec, (1.0,))
        except SpecError:
            raise ParameterError(f"{model.name}: warp(...) warps a mel filter bank, and the features "
                                 f"{model.params['features']!r} have none; drop it from --set augment or use mel, "
                                 "logmel, mfcc or pcen features", param="augment") from None
    return augment or None


def feature_layout(ds: Dataset, spec: FeatureSpec, *, skip_bad: bool = False) -> tuple[int | None, int | None]:
    """``(rate, channels)`` that training features of ``ds`` are computed for (reads headers).

    The rate is the spec's own, else the most common rate of the recordings (the others are
    resampled to it, with a warning); a model records it, and everything it scores later is
    resampled to it. ``channels`` is set for per-axis specs only, whose feature layout depends on
    it: every recording must have the most common channel count (the others are refused, or
    skipped with ``skip_bad``)."""
    rates = Counter(r.info().rate for r in ds)
    if not rates:
        return spec.rate, None
    rate = spec.rate or rates.most_common(1)[0][0]
    # (recordings too far below the rate to be resampled are refused one by one, not listed here)
    others = ", ".join(f"{n} at {r} Hz" for r, n in sorted(rates.items()) if r != rate and r * MAX_UPSAMPLE >= rate)
    if spec.rate is None and others:
        log.warning("the recordings have several sample rates: features are computed at %d Hz (the most "
                    "common) and the others are resampled to it (%s); set rate= in the feature spec to "
                    "choose", rate, others)
    channels = None
    if spec.per_axis:
        counts = Counter(r.info().channels for r in ds)
        channels = counts.most_common(1)[0][0]
        if len(counts) > 1 and not skip_bad:
            odd = next(r for r in ds if r.info().channels != channels)
            layout = ", ".join(f"{n} with {c}" for c, n in sorted(counts.items()))
            raise AudioError(f"{odd.path}: {odd.info().channels} channel(s); per-axis features "
                             f"(per_axis=true) need one channel layout, and the recordings have several "
                             f"({layout}); keep one layout, skip the others as bad recordings, or drop "
                             "per_axis to average the channels")
    return rate, channels


def _fit_options(opts: RunOptions, *, checkpoint: str | None = None, resume: str | None = None) -> FitOptions:
    """The run settings handed to ``Classifier.fit``."""
    return FitOptions(progress=opts.progress, device=opts.device, checkpoint=checkpoint, resume=resume,
                      group_by=opts.group_by, devices=tuple(opts.devices), balance=opts.balance,
                      sync=opts.sync, frame_cache_bytes=opts.frame_cache_bytes)


def model_and_data(ds: Dataset, label: str | None, spec: str, overrides: dict | None, *,
                   checkpoints: bool = False, normal: str | None = None) -> tuple[Any, Dataset]:
    """The model to train (built from ``spec``) and the recordings of ``ds`` it learns from:
    those labelled with ``label`` — for an anomaly detector, those whose ``label`` is the normal
    value (see :func:`normal_value`; every recording when ``label`` is None). ``checkpoints``: the
    run writes or resumes checkpoints (which the family must support). Any engine's training
    starts here."""
    model = build(spec, overrides)
    if checkpoints and not model.supports_checkpoints:
        raise ParameterError(f"{model.name} is fitted without checkpoints; checkpoint and resume folders "
                             f"apply to {', '.join(families_with(supports_checkpoints=True))}")
    if label is None:
        if not model.detector:
            raise UserError(f"{model.name} learns the values of a label: give --label NAME (anomaly detectors "
                            "alone train on unlabelled normal recordings)")
        return model, ds
    ds = ds.labelled(label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {label!r}")
    if model.detector:
        value = normal_value(ds, label, normal)
        key = ds.resolve_label(label)
        ds = ds.filter(lambda r: r.labels.get(key) == value)
    elif normal is not None:
        raise ParameterError(f"--normal applies to anomaly detectors; {model.name} learns every value of {label!r}")
    return model, ds


def normal_value(ds: Dataset, label: str, normal: str | None) -> str:
    """The value of ``label`` that marks normal recordings: ``normal`` when given (it must occur),
    else ``normal`` if it occurs, else the only value."""
    values = sorted(ds.counts(label))
    if normal is not None:
        if normal not in values:
            raise UserError(f"--normal {normal}: no recording has {label}={normal}; values: {', '.join(values)}")
        return normal
    if "normal" in values:
        return "normal"
    if len(values) == 1:
        return values[0]
    raise UserError(f"which value of {label!r} is normal sound? give --normal VALUE (values: {', '.join(values)})")


def train_model(ds: Dataset, label: str | None, spec: str, overrides: dict | None,
                opts: RunOptions, *, normal: str | None = None) -> tuple[Classifier, FeatureStream]:
    """Build and fit a model on the labelled recordings of ``ds`` (a detector: on the normal
    ones, see :func:`model_and_data`). Returns ``(model, stream)``."""
    model, ds = model_and_data(ds, label, spec, overrides, checkpoints=bool(opts.checkpoint or opts.resume),
                               normal=normal)
    stream = make_stream(ds, model, opts, label=label)
    model.label_name_ = label
    stream.precompute(progress=opts.progress)
    model.fit(stream, options=_fit_options(opts, checkpoint=opts.checkpoint, resume=opts.resume))
    return model, stream


def prediction_stream(model: Classifier, ds: Dataset, opts: RunOptions, *, warn: bool = True) -> FeatureStream:
    """An unlabelled stream of ``ds`` with the model's features, windowing, rate and channels;
    ``warn`` says (once) how many recordings are below the model's rate."""
    stream = make_stream(ds, model, opts, label=None, labels=model.labels_, train=False)
    if warn:
        _warn_upsampled(stream, ds)
    if len(ds) and stream.feature_dim != model.feature_dim_:
        raise UserError(f"features of this data have {stream.feature_dim} values per frame, the model expects "
                        f"{model.feature_dim_}; was the model trained with another feature spec?")
    return stream


def window_predictions(model: Classifier, ds: Dataset, opts: RunOptions, *, warn: bool = True
                       ) -> tuple[Iterator[Prediction], list]:
    """Every window's prediction of ``ds``, in order, and the list of recordings skipped as bad
    (``(recording, reason)``, filled as the predictions are drawn): from the model's feature
    stream, or, for a model that scores samples (an exported graph), from each recording's
    samples."""
    if model.scores_samples:
        skipped: list = []
        return predict_recordings(model, ds, skipped=skipped if opts.skip_bad else None), skipped
    stream = prediction_stream(model, ds, opts, warn=warn)
    return predict(model, stream), stream.stats.skipped


def _warn_upsampled(stream: FeatureStream, ds: Dataset) -> None:
    """Say once how many recordings of ``ds`` are below the stream's rate."""
    low = stream.source.upsampled(ds)
    if low:
        rates = ", ".join(f"{n} at {r} Hz" for r, n in sorted(low.items()))
        log.warning("%d recording(s) have a lower sample rate than the model's %d Hz (%s): they are "
                    "resampled up but hold nothing above %d Hz, so answers on them may be unreliable",
                    sum(low.values()), stream.rate, rates, min(low) // 2)


def _true_and_predicted(model, ds: Dataset, label: str, opts: RunOptions, *,
                        warn: bool = True) -> tuple[list, list, list]:
    """True and predicted values of every window, and the recordings skipped as bad."""
    key = ds.resolve_label(label)
    y_true, y_pred = [], []
    preds, skipped = window_predictions(model, ds, opts, warn=warn)
    for pred in preds:
        assert pred.recording is not None  # (predictions of a stream name their recording)
        y_true.append(pred.recording.labels.get(key))
        y_pred.append(pred.label)
    return y_true, y_pred, skipped


def group_names(ds: Dataset, group_by: str | None) -> list[str] | None:
    """Each recording's group for per-group reports: the value of ``group_by``, or of several
    labels joined by ``/`` (``group_by="machine,unit"`` gives ``fan/u1``); None without one."""
    if not group_by:
        return None
    keys = [ds.resolve_label(g.strip()) for g in group_by.split(",")]
    return ["/".join(r.labels.get(k) or "?" for k in keys) for r in ds]


def detector_scores(model, ds: Dataset, label: str, normal: str, opts: RunOptions, *, warn: bool = True,
                     groups: list[str] | None = None) -> tuple[list[int], list[float], list[str] | None, list]:
    """Per window: 1 if its recording's ``label`` is not ``normal``, its anomaly score, its
    recording's group (with ``groups``, one per recording of ``ds``); and the recordings skipped."""
    key = ds.resolve_label(label)
    y, scores, window_groups = [], [], []
    preds, skipped = window_predictions(model, ds, opts, warn=warn)
    index = {id(r): i for i, r in enumerate(ds)}
    for pred in preds:
        assert pred.recording is not None
        y.append(int(pred.recording.labels.get(key) != normal))
        scores.append(float(pred.scores[0]))
        if groups is not None:
            window_groups.append(groups[index[id(pred.recording)]])
    return y, scores, window_groups if groups is not None else None, skipped


def evaluate_detector(model, ds: Dataset, label: str, opts: RunOptions, *, normal: str | None = None) -> dict:
    """Evaluate a trained anomaly detector on recordings labelled normal or not: ROC AUC, pAUC
    and the figures at its threshold, overall and per ``opts.group_by`` group
    (:func:`~wavetrain.evaluation.detection_metrics.detection_report`)."""
    ds = ds.labelled(label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {label!r}")
    normal = detector_normal_value(model, ds, label, normal)
    y, s, groups, skipped = detector_scores(model, ds, label, normal, opts, groups=group_names(ds, opts.group_by))
    res = detection_report(y, s, model.threshold_, groups)
    res.update(detector=True, label=label, normal_value=normal, recordings=len(ds) - len(skipped),
               skipped=list(ds.skipped) + list(skipped))
    return res


def detector_normal_value(model, ds: Dataset, label: str, normal: str | None) -> str:
    """The value of ``label`` a trained detector's evaluation counts as normal: ``normal`` when
    given, else the detector's own (recorded in the model file) when it occurs or the detector
    learned it from this label (so a set of anomalies alone is all anomalous), else
    :func:`normal_value` (a detector trained on unlabelled recordings)."""
    own = model.fitted_labels[0]
    values = ds.counts(label)
    if normal is not None:
        return normal if normal == own else normal_value(ds, label, normal)
    if own in values or model.label_name_ == label:
        return own
    return normal_value(ds, label, None)


def evaluate_model(model, ds: Dataset, label: str, opts: RunOptions, *, normal: str | None = None) -> dict:
    """Evaluate a trained model on a labelled data set (a detector: :func:`evaluate_detector`).

    The result's ``skipped`` lists ``(recording, reason)`` of recordings skipped as bad (with
    ``skip_bad``), those the data set check dropped included."""
    if model.detector:
        return evaluate_detector(model, ds, label, opts, normal=normal)
    ds = ds.labelled(label)
    y_true, y_pred, skipped = _true_and_predicted(model, ds, label, opts)
    unseen = sorted({t for t in y_true if t not in model.labels_})
    res = report(y_true, y_pred, list(model.labels_) + unseen)
    res.update(unseen_values=unseen, recordings=len(ds) - len(skipped), skipped=list(ds.skipped) + list(skipped))
    return res


def evaluate_kfold(ds: Dataset, label: str, spec: str, overrides: dict | None, opts: RunOptions, *,
                   folds: int = 5, on_fold=None, normal: str | None = None, repeat: int = 1) -> dict:
    """k-fold cross-validation with folds of whole recordings (and whole groups with ``group_by``).

    Recordings with identical content always fall in the same fold. Every recording is extracted
    once, up front; with ``skip_bad`` the bad ones are left out of every fold (and listed in the
    result's ``skipped``).

    ``repeat`` > 1 runs the cross-validation that many times: repeat ``i`` (from 0) assigns folds
    with seed ``opts.seed + i`` and, when the model family has a ``seed`` parameter, trains with
    its seed + ``i``. The result is then the first repeat's (the one ``repeat=1`` gives) plus
    ``repeats`` (each repeat's seeds and figures) and ``repeat_summary`` (mean and sd over the
    repeats of accuracy and macro-F1, or of AUC and pAUC for a detector); ``seconds`` covers
    every repeat, and fold reports passed to ``on_fold`` carry ``repeat`` (from 1)."""
    if repeat < 1:
        raise ParameterError(f"repeat={repeat}: expected 1 or more repetitions of the cross-validation",
                             param="repeat")
    ds = ds.labelled(label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {label!r}")
    probe = build(spec, overrides)
    layout = feature_layout(ds, probe.feature_spec, skip_bad=opts.skip_bad)
    # extract every recording once, up front; the folds (of every repeat) then read from the store / memory cache
    first = make_stream(ds, probe, opts, label=label, labels=sorted(ds.counts(label)), layout=layout)
    first.precompute(progress=opts.progress)
    _warn_upsampled(first, ds)
    skipped = list(ds.skipped) + list(first.stats.skipped)
    if first.stats.skipped:
        bad = {id(r) for r, _ in first.stats.skipped}
        ds = ds.filter(lambda r: id(r) not in bad)
    if not probe.detector and normal is not None:
        raise ParameterError(f"--normal applies to anomaly detectors; {probe.name} learns every value of {label!r}")
    normal = normal_value(ds, label, normal) if probe.detector else None
    metrics = ("auc", "pauc") if probe.detector else ("accuracy", "macro_f1")
    results, t0 = [], time.perf_counter()
    for r in range(repeat):
        seed = opts.seed + r
        run_overrides = dict(overrides or {})
        if r and "seed" in probe.params:
            run_overrides["seed"] = probe.params["seed"] + r
        fold_cb = on_fold
        if repeat > 1 and on_fold:
            def fold_cb(info, _r=r):
                on_fold({**info, "repeat": _r + 1})
        if probe.detector:
            assert normal is not None
            res = _kfold_detector(ds, label, spec, run_overrides, opts, folds=folds, on_fold=fold_cb,
                                  layout=layout, normal=normal, skipped=skipped, seed=seed)
        else:
            res = _kfold_classifier(ds, label, spec, run_overrides, opts, folds=folds, on_fold=fold_cb,
                                    layout=layout, skipped=skipped, seed=seed)
        results.append((seed, run_overrides.get("seed", probe.params.get("seed")), res))
    res = results[0][2]
    if repeat > 1:
        res["repeats"] = [{"repeat": i + 1, "seed": seed, "model_seed": model_seed, "seconds": rr["seconds"],
                           **{m: rr[m] for m in metrics}, "folds_summary": rr["folds_summary"]}
                          for i, (seed, model_seed, rr) in enumerate(results)]
        res["repeat_summary"] = repeat_summary(res["repeats"], metrics)
        res["seconds"] = time.perf_counter() - t0
    return res


def _kfold_classifier(ds: Dataset, label: str, spec: str, overrides: dict | None, opts: RunOptions, *, folds: int,
                      on_fold, layout, skipped: list, seed: int) -> dict:
    """One k-fold cross-validation of a classifier with folds assigned by ``seed``: confusion and
    scores pooled over the folds, and each fold's."""
    labels = sorted(ds.counts(label))
    rare = rare_values(ds, label, folds, opts.group_by)
    test_folds = kfold_indices(ds, folds, group_by=opts.group_by, seed=seed, stratify=label)
    y_true_all, y_pred_all, fold_scores, fold_info = [], [], [], []
    t0 = time.perf_counter()
    for f, test_idx in enumerate(test_folds):
        train_idx = np.setdiff1d(np.arange(len(ds)), test_idx)
        train_ds = ds.subset(train_idx)
        present = sorted(train_ds.counts(label))
        model = build(spec, overrides)
        model.label_name_ = label
        stream = make_stream(train_ds, model, opts, label=label, labels=present, layout=layout)
        tf = time.perf_counter()
        model.fit(stream, options=_fit_options(opts))
        train_s = time.perf_counter() - tf
        # (low rates were reported once, above)
        y_true, y_pred, _ = _true_and_predicted(model, ds.subset(test_idx), label, opts, warn=False)
        cm = confusion(y_true, y_pred, labels)
        s = scores(cm, labels)
        fold_scores.append(s)
        fold_info.append({"fold": f + 1, "train_recordings": len(train_idx), "test_recordings": len(test_idx),
                          "accuracy": s["accuracy"], "macro_f1": s["macro_f1"], "train_seconds": train_s})
        y_true_all += y_true
        y_pred_all += y_pred
        if on_fold:
            on_fold(fold_info[-1])
    res = report(y_true_all, y_pred_all, labels)
    res.update(folds=fold_info, folds_summary=fold_spread(fold_scores),
               rare_values=rare, group_by=opts.group_by, recordings=len(ds), seconds=time.perf_counter() - t0,
               skipped=skipped)
    return res


#: One detector fold, for :func:`detector_folds`: ``(train indices, test indices)`` -> the fitted
#: model, its training seconds, and per test window its truth (1: anomalous), score and group.
DetectorFold = Callable[[np.ndarray, np.ndarray], tuple[Any, float, list[int], list[float], list[str]]]


def detector_folds(test_folds: list[np.ndarray], normal: np.ndarray, fold: DetectorFold, *, label: str,
                   value: str, on_fold=None) -> dict:
    """The fold loop of a detector's k-fold evaluation, on either engine: each fold's model
    learns from the normal recordings (``normal[i]`` true) of the other folds and scores every
    window of its own (``fold``); AUC and pAUC per fold and over the pooled scores, the figures
    at a threshold from each fold's decisions at its own threshold
    (:func:`~wavetrain.evaluation.detection_metrics.pooled_fold_report`; ``seconds`` added)."""
    ys: list[int] = []
    ss: list[float] = []
    flags: list[float] = []
    gs: list[str] = []
    fold_info = []
    t0 = time.perf_counter()
    everything = np.arange(len(normal))
    for f, test_idx in enumerate(test_folds):
        train_idx = np.array([i for i in np.setdiff1d(everything, test_idx) if normal[i]], dtype=np.int64)
        if not len(train_idx):
            raise UserError(f"fold {f + 1}: no normal recordings ({label}={value}) left to train on; use fewer folds")
        model, train_s, y, s, g = fold(train_idx, np.asarray(test_idx))
        r = detection_report(y, s, model.threshold_)
        fold_info.append({"fold": f + 1, "train_recordings": len(train_idx), "test_recordings": len(test_idx),
                          "auc": r["auc"], "pauc": r["pauc"], "f1": r["f1"], "threshold": model.threshold_,
                          "train_seconds": train_s})
        ys += y
        ss += s
        flags += [float(v > model.threshold_) for v in s]      # each fold's decisions at its own threshold
        gs += g
        if on_fold:
            on_fold(fold_info[-1])
    res = pooled_fold_report(ys, ss, flags, gs, fold_info)
    res["seconds"] = time.perf_counter() - t0
    return res


def _kfold_detector(ds: Dataset, label: str, spec: str, overrides: dict | None, opts: RunOptions, *, folds: int,
                    on_fold, layout, normal: str, skipped: list,
                    seed: int) -> dict:
    """k-fold evaluation of a detector (:func:`detector_folds`) on the local engine; folds assigned
    by ``seed``."""
    key = ds.resolve_label(label)
    test_folds = kfold_indices(ds, folds, group_by=opts.group_by, seed=seed, stratify=label)
    groups = group_names(ds, opts.group_by)

    def fold(train_idx: np.ndarray, test_idx: np.ndarray) -> tuple[Any, float, list[int], list[float], list[str]]:
        model = build(spec, overrides)
        model.label_name_ = label
        stream = make_stream(ds.subset(train_idx), model, opts, label=label, labels=[normal], layout=layout)
        tf = time.perf_counter()
        model.fit(stream, options=_fit_options(opts))
        train_s = time.perf_counter() - tf
        y, s, g, _ = detector_scores(model, ds.subset(test_idx), label, normal, opts, warn=False,
                                      groups=[groups[i] for i in test_idx] if groups else None)
        return model, train_s, y, s, g or []

    res = detector_folds(test_folds, np.array([r.labels.get(key) == normal for r in ds]), fold, label=label,
                         value=normal, on_fold=on_fold)
    res.update(label=label, normal_value=normal, group_by=opts.group_by, recordings=len(ds), skipped=skipped)
    return res


def plan_run(ds: Dataset, model: Classifier, opts: RunOptions, *, memory_limit: int | None = None) -> Plan:
    """Plan the peak memory of training ``model`` on ``ds`` and set ``opts`` to the settings
    chosen (raises :class:`~wavetrain.core.errors.MemoryLimitError` when ``memory_limit`` bytes cannot
    be met). A fitted ``model`` (classify, evaluate a model file) is planned as if training it
    on ``ds``: an upper bound of what prediction needs. Returns the :class:`~wavetrain.pipeline.memory.Plan`."""
    p = plan(ds, model, memory_limit=memory_limit, workers=opts.workers, batch_windows=opts.batch_windows,
             cache_bytes=opts.cache_bytes, persistent_store=isinstance(opts.store, FeatureStore),
             store_max_bytes=opts.store.max_bytes if opts.store is not None else None)
    opts.batch_windows = p.settings["batch_windows"]
    opts.workers = p.settings["workers"]
    opts.prefetch = p.settings["prefetch"]
    opts.cache_bytes = int(p.settings["cache_mb"] * MB)
    opts.frame_cache_bytes = int(p.settings["frame_cache_mb"] * MB)
    return p
