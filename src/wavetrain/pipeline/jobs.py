"""The jobs behind the commands: train, predict (classify), evaluate (k-fold or a trained model).

Each job is written once, against an engine (:mod:`wavetrain.pipeline.engine`): this process by
default, or Spark (:class:`wavetrain.spark.engine.SparkEngine`). The engine prepares the data set,
hands the model an executor to learn from and streams predictions back; what a job computes from
them — labels and checks, folds, reports — is here, the same on every engine. Nothing here parses
arguments or prints.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wavetrain.core.errors import ParameterError, UserError
from wavetrain.data.dataset import Dataset
from wavetrain.data.splits import kfold_indices, rare_values
from wavetrain.evaluation.detection_metrics import detection_report, pooled_fold_report
from wavetrain.evaluation.group_results import classifier_groups, recordings_per_group, window_groups
from wavetrain.evaluation.metrics import confusion, fold_spread, repeat_summary, report, scores
from wavetrain.features.onnx_chain import quote
from wavetrain.models.anomaly import ADAPT_FOLDS, AnomalyDetector
from wavetrain.models.base import Classifier, FitOptions
from wavetrain.models.modelfile import save_model
from wavetrain.models.registry import build, families_with
from wavetrain.pipeline.engine import Engine, LocalEngine, Prepared
from wavetrain.pipeline.prediction import Prediction
from wavetrain.pipeline.streams import (  # noqa: F401  (the jobs' settings and streams, importable from here)
    RunOptions,
    feature_layout,
    make_stream,
    plan_run,
    prediction_stream,
    training_augmenter,
    warn_upsampled,
)
from wavetrain.stream.events import EventOptions

log = logging.getLogger(__name__)


def _fit_options(opts: RunOptions, *, progress: bool | None = None, checkpoint: str | None = None,
                 resume: str | None = None) -> FitOptions:
    """The run settings handed to :meth:`~wavetrain.models.base.Classifier.learn`."""
    return FitOptions(progress=opts.progress if progress is None else progress, device=opts.device,
                      checkpoint=checkpoint, resume=resume,
                      group_by=opts.group_by, devices=tuple(opts.devices), balance=opts.balance,
                      sync=opts.sync, frame_cache_bytes=opts.frame_cache_bytes)


def _engine(engine: Engine | None) -> Engine:
    return LocalEngine() if engine is None else engine


def refuse_on(engine: Engine, model: Classifier, *, training: bool) -> None:
    """Refuse, before any work, a model ``engine`` cannot train (``training``) or score."""
    reason = engine.refusal(model, training=training)
    if reason:
        raise ParameterError(reason)


def model_and_data(ds: Dataset, label: str | None, spec: str | Classifier, overrides: dict | None = None, *,
                   checkpoints: bool = False, normal: str | None = None) -> tuple[Any, Dataset]:
    """The model to train (built from ``spec``, or ``spec`` itself when it is an unfitted model)
    and the recordings of ``ds`` it learns from: those labelled with ``label`` — for an anomaly
    detector, those whose ``label`` is the normal value (see :func:`normal_value`; every
    recording when ``label`` is None). ``checkpoints``: the run writes or resumes checkpoints
    (which the family must support)."""
    model = spec if isinstance(spec, Classifier) else build(spec, overrides)
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


def present_values(ds: Dataset, label: str | None) -> list[str]:
    """The values of ``label`` in ``ds``, sorted (none without a label)."""
    return [] if label is None else sorted(ds.counts(label))


def _learn(engine: Engine, prep: Prepared, model: Classifier, label: str | None, opts: RunOptions, *,
           indices: np.ndarray | None = None, progress: bool | None = None, checkpoints: bool = False) -> float:
    """Fit ``model`` on recordings ``indices`` of ``prep`` (all by default) on ``engine``: the
    family's :meth:`~wavetrain.models.base.Classifier.learn` on the engine's executor. Returns the
    seconds it took."""
    ds = prep.ds if indices is None else prep.ds.subset(indices)
    model.label_name_ = label
    data = engine.executor(prep, model, opts, label=label, labels=present_values(ds, label), indices=indices)
    show = opts.progress if progress is None else progress
    options = _fit_options(opts, progress=show, checkpoint=opts.checkpoint if checkpoints else None,
                           resume=opts.resume if checkpoints else None)
    t0 = time.perf_counter()
    with engine.progress(model.name, enable=True) if show else contextlib.nullcontext():
        model.learn(data, options=options)
    return time.perf_counter() - t0


def train_model(ds: Dataset, label: str | None, spec: str | Classifier, overrides: dict | None,
                opts: RunOptions, *, normal: str | None = None, engine: Engine | None = None,
                network: str | os.PathLike | None = None) -> tuple[Classifier, Prepared]:
    """Build (or take, when ``spec`` is an unfitted model) and fit a model on the labelled
    recordings of ``ds`` (a detector: on the normal ones, see :func:`model_and_data`), on
    ``engine`` (default: this process). A detector with ``id_labels`` first has its network
    learn them (:func:`train_id_network`), written to ``network``. Returns ``(model, prepared
    data)``: what the engine read (:class:`~wavetrain.pipeline.engine.Prepared`)."""
    engine = _engine(engine)
    model, ds = model_and_data(ds, label, spec, overrides, checkpoints=bool(opts.checkpoint or opts.resume),
                               normal=normal)
    refuse_on(engine, model, training=True)
    net = None
    if isinstance(model, AnomalyDetector) and model.id_labels:
        net = train_id_network(model, ds, opts, network, engine=engine)
    training_augmenter(model)
    values = present_values(ds, label)
    if label is not None and len(values) < model.min_labels:     # (before the engine's work)
        raise UserError(f"{model.name}: training needs at least {model.min_labels} label values, got "
                        f"{len(values)} ({', '.join(values) or 'none'})")
    prep = engine.prepare(ds, model, opts, label=label, labels=values)
    _learn(engine, prep, model, label, opts, checkpoints=True)
    if net is not None:
        model.train_info_["id_network"] = net.train_info_["id_network"]
    return model, prep


#: The label a network of several ``id_labels`` learns: their values joined.
ID_JOIN = "/"


def train_id_network(model: AnomalyDetector, ds: Dataset, opts: RunOptions, network: str | os.PathLike | None, *,
                     engine: Engine | None = None) -> Classifier:
    """Train the network of a detector with ``id_labels`` on its normal recordings ``ds``: a
    classifier (``id_network``, a family whose models embed) of those labels' values (several: of
    each combination, values joined by ``/``), written to ``network``; the detector's features
    become its embeddings, ``embedding(model=NETWORK)``. Returns the network.

    Raises
    ------
    UserError
        No file to write the network to, a detector given its own features, a network that does
        not embed, a recording without a value of a label, or fewer than two values.
    """
    names = model.id_labels
    if network is None:
        raise UserError(f"{model.name}: id_labels={','.join(names)} trains a network that the detector's features "
                        "read: give the file to write it to (train -o M.wt writes it beside, M.net.wt)")
    if model.params["features"] != model.default_features:
        raise UserError(f"{model.name}: with id_labels the detector learns the network's embeddings: leave its "
                        f"features out (the network's are id_network's: {model.params['id_network']})")
    net = build(model.params["id_network"])
    if not net.embeds or net.detector:
        raise UserError(f"id_network={model.params['id_network']}: {net.name} models "
                        f"{'learn no labels' if net.detector else 'embed no windows'}; use one of "
                        f"{', '.join(families_with(embeds=True, detector=False))} or a preset of one")
    keys = [ds.resolve_label(n) for n in names]
    label = "+".join(names)
    lacking = [r for r in ds if any(not r.labels.get(k) for k in keys)]
    if lacking:
        raise UserError(f"id_labels={','.join(names)}: {len(lacking)} normal recording(s) have no value of "
                        f"{' or '.join(names)} (e.g. {lacking[0].name}): the network learns every recording's")
    recs = [dataclasses.replace(r, labels={**r.labels, label: ID_JOIN.join(r.labels[k] for k in keys)})
            for r in ds]
    ids = Dataset(recs, ds.root, ds.folder_labels)
    if len(ids.counts(label)) < 2:
        raise UserError(f"id_labels={','.join(names)}: the normal recordings have one value "
                        f"({next(iter(ids.counts(label)))}); the network learns to tell two or more apart")
    log.info("%s: training %s on %s (%d values) for its embeddings", model.name, net.name, label,
             len(ids.counts(label)))
    net, _ = train_model(ids, label, net, None, opts, engine=engine)
    path = Path(network).resolve()
    save_model(net, path)
    model.params["features"] = f"embedding(model={quote(str(path))})"
    net.train_info_["id_network"] = {"path": str(path), "family": net.name, "label": label,
                                     "values": len(net.fitted_labels)}
    return net


def adapt_model(model: Classifier, ds: Dataset, opts: RunOptions, *, label: str | None = None,
                engine: Engine | None = None) -> tuple[dict[str, Any], Prepared]:
    """Teach a fitted detector the normal recordings of ``ds`` without retraining it (a new unit,
    or a new operating condition, from a few clips): :meth:`~wavetrain.models.anomaly.AnomalyDetector.adapt`
    on ``engine`` (default: this process), the recordings in up to
    :data:`~wavetrain.models.anomaly.ADAPT_FOLDS` parts. ``label``: the label that marks normal
    recordings, which must be the model's. Returns what changed and the data read.

    Raises
    ------
    UserError
        A model that is not such a detector, another label than the model's, recordings whose
        value of the model's label is not its normal value (anomalous ones given as normal), or
        recordings at another sample rate than the model's features were computed at.
    """
    engine = _engine(engine)
    if not (isinstance(model, AnomalyDetector) and model.adapts_to_new):
        raise UserError(f"{model.name} cannot learn new recordings without retraining; adapt applies to the anomaly "
                        f"detectors {', '.join(families_with(adapts_to_new=True, detector=True))} (train this one "
                        "again with the new recordings)")
    normal = model.fitted_labels[0]
    own = model.label_name_
    if label is not None and label != own:
        fix = f"give --label {own} or leave it out" if own else "leave --label out"
        raise UserError(f"--label {label}: {model.name} was trained on normal recordings told by "
                        f"{repr(own) if own else 'no label'}; {fix}")
    if own is not None and own in ds.label_names():
        key = ds.resolve_label(own)
        other = [r for r in ds if r.labels.get(key) not in (None, normal)]
        if other:
            values = sorted({r.labels[key] for r in other})
            raise UserError(f"{len(other)} of the recordings have {own}={', '.join(values)}, not {normal}: adapt "
                            f"learns normal sound only; keep the normal ones (--where {own}={normal})")
    rate = model.feature_spec.rate
    if not rate and model.feature_rate_:
        rates = sorted({r.info().rate for r in ds} - {int(model.feature_rate_)})
        if rates:
            raise UserError(f"recordings at {', '.join(map(str, rates))} Hz: {model.name}'s features were computed at "
                            f"{model.feature_rate_} Hz, so recordings at another rate give other features; resample "
                            "them first (wavetrain sound augment keeps the rate; sox or ffmpeg change it)")
    refuse_on(engine, model, training=True)
    prep = engine.prepare(ds, model, opts)
    n = len(prep.ds)
    if n == 0:
        raise UserError("no new recordings to adapt to")
    folds = min(ADAPT_FOLDS, n)
    parts = [engine.executor(prep, model, opts, label=None, labels=[], indices=np.arange(f, n, folds))
             for f in range(folds)]
    return model.adapt(parts), prep


def window_predictions(model: Classifier, ds: Dataset, opts: RunOptions, *, warn: bool = True,
                       engine: Engine | None = None) -> tuple[Iterator[Prediction], list]:
    """Every window's prediction of ``ds``, in data set order, and the list of recordings skipped
    as bad (``(recording, reason)``, filled as the predictions are drawn), on ``engine``
    (default: this process): from the model's features, or, for a model that scores samples (an
    exported graph), from each recording's samples."""
    engine = _engine(engine)
    refuse_on(engine, model, training=False)
    prep = engine.prepare(ds, model, opts)
    preds, later = engine.predictions(prep, model, opts, warn=warn)
    skipped = list(prep.skipped)

    def drawn() -> Iterator[Prediction]:
        yield from preds
        skipped.extend(later)

    return drawn(), skipped


def event_predictions(model: Classifier, ds: Dataset, opts: RunOptions, options: EventOptions | None = None, *,
                      unknown: str | float = "trained", engine: Engine | None = None
                      ) -> tuple[Iterator[Prediction], list]:
    """Every event of every recording of ``ds`` (:mod:`wavetrain.pipeline.events`), in data set
    order, each a prediction whose times are the event's (from its recording's start), and the
    list of recordings skipped as bad (filled as the events are drawn), on ``engine`` (default:
    this process)."""
    engine = _engine(engine)
    refuse_on(engine, model, training=False)
    return engine.events(ds, model, opts, options or EventOptions(), unknown=unknown)


def group_names(ds: Dataset, group_by: str | None) -> list[str] | None:
    """Each recording's group for per-group reports: the value of ``group_by``, or of several
    labels joined by ``/`` (``group_by="machine,unit"`` gives ``fan/u1``); None without one."""
    if not group_by:
        return None
    keys = [ds.resolve_label(g.strip()) for g in group_by.split(",")]
    return ["/".join(r.labels.get(k) or "?" for k in keys) for r in ds]


def _places(ds: Dataset) -> dict[int, int]:
    """Each recording of ``ds`` by its id: its place in ``ds`` (a prediction names its recording)."""
    return {id(r): i for i, r in enumerate(ds)}


def _true_and_predicted(preds: Iterable[Prediction], key: str, index: dict[int, int]) -> tuple[list, list, list[int]]:
    """Each window's true value (its recording's ``key`` label), the value predicted and its
    recording's place (``index``: :func:`_places`)."""
    y_true, y_pred, places = [], [], []
    for pred in preds:
        assert pred.recording is not None  # (predictions of a data set name their recording)
        y_true.append(pred.recording.labels.get(key))
        y_pred.append(pred.label)
        places.append(index[id(pred.recording)])
    return y_true, y_pred, places


def _detector_scores(preds: Iterable[Prediction], key: str, normal: str, index: dict[int, int]
                     ) -> tuple[list[int], list[float], list[int]]:
    """Per window: 1 if its recording's ``key`` label is not ``normal``, its anomaly score, and its
    recording's place (``index``: :func:`_places`)."""
    y, scores, places = [], [], []
    for pred in preds:
        assert pred.recording is not None
        y.append(int(pred.recording.labels.get(key) != normal))
        scores.append(float(pred.scores[0]))
        places.append(index[id(pred.recording)])
    return y, scores, places


def detector_scores(model, ds: Dataset, label: str, normal: str, opts: RunOptions, *, warn: bool = True,
                    groups: list[str] | None = None, engine: Engine | None = None
                    ) -> tuple[list[int], list[float], list[str] | None, list]:
    """Per window: 1 if its recording's ``label`` is not ``normal``, its anomaly score, its
    recording's group (with ``groups``, one per recording of ``ds``); and the recordings skipped."""
    preds, skipped = window_predictions(model, ds, opts, warn=warn, engine=engine)
    y, s, places = _detector_scores(preds, ds.resolve_label(label), normal, _places(ds))
    return y, s, None if groups is None else window_groups(places, groups), skipped


def _per_group(res: dict, names: list[str] | None, places: list[int], group_by: str | None) -> None:
    """Add to a detector's report the recordings of each of its ``groups`` (``names``: each
    recording's group; ``places``: each window's recording) and ``group_by``."""
    if names is None:
        return
    for g, n in recordings_per_group(window_groups(places, names), places).items():
        res["groups"][g]["recordings"] = n
    res["group_by"] = group_by


def evaluate_detector(model, ds: Dataset, label: str, opts: RunOptions, *, normal: str | None = None,
                      engine: Engine | None = None) -> dict:
    """Evaluate a trained anomaly detector on recordings labelled normal or not: ROC AUC, pAUC
    and the figures at its threshold, overall and per ``opts.group_by`` group
    (:func:`~wavetrain.evaluation.detection_metrics.detection_report`)."""
    ds = ds.labelled(label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {label!r}")
    normal = detector_normal_value(model, ds, label, normal)
    names = group_names(ds, opts.group_by)
    preds, skipped = window_predictions(model, ds, opts, engine=engine)
    y, s, places = _detector_scores(preds, ds.resolve_label(label), normal, _places(ds))
    res = detection_report(y, s, model.threshold_, None if names is None else window_groups(places, names))
    _per_group(res, names, places, opts.group_by)
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


def evaluate_model(model, ds: Dataset, label: str, opts: RunOptions, *, normal: str | None = None,
                   engine: Engine | None = None) -> dict:
    """Evaluate a trained model on a labelled data set (a detector: :func:`evaluate_detector`),
    on ``engine`` (default: this process).

    With ``opts.group_by``, the result's ``groups`` holds each group's accuracy, macro-F1,
    windows, windows answered right and recordings
    (:func:`~wavetrain.evaluation.group_results.classifier_groups`; a detector's: AUC, pAUC, the
    figures at its threshold and recordings). The result's ``skipped`` lists ``(recording,
    reason)`` of recordings skipped as bad (with ``skip_bad``), those the data set check dropped
    included."""
    if model.detector:
        return evaluate_detector(model, ds, label, opts, normal=normal, engine=engine)
    ds = ds.labelled(label)
    preds, skipped = window_predictions(model, ds, opts, engine=engine)
    y_true, y_pred, places = _true_and_predicted(preds, ds.resolve_label(label), _places(ds))
    unseen = sorted({t for t in y_true if t not in model.labels_})
    res = report(y_true, y_pred, list(model.labels_) + unseen)
    names = group_names(ds, opts.group_by)
    if names is not None:
        res.update(group_by=opts.group_by, groups=classifier_groups(
            y_true, y_pred, res["labels"], window_groups(places, names), places))
    res.update(unseen_values=unseen, recordings=len(ds) - len(skipped), skipped=list(ds.skipped) + list(skipped))
    return res


def evaluate_kfold(ds: Dataset, label: str, spec: str, overrides: dict | None, opts: RunOptions, *,
                   folds: int = 5, on_fold=None, normal: str | None = None, repeat: int = 1,
                   engine: Engine | None = None) -> dict:
    """k-fold cross-validation with folds of whole recordings (and whole groups with ``group_by``),
    on ``engine`` (default: this process).

    Recordings with identical content always fall in the same fold. Every recording is extracted
    once, up front; with ``skip_bad`` the bad ones are left out of every fold (and listed in the
    result's ``skipped``). With ``group_by``, the result's ``groups`` holds each group's figures
    from the fold that held it out (a classifier's:
    :func:`~wavetrain.evaluation.group_results.classifier_groups`; a detector's: AUC, pAUC, the
    figures at the fold's threshold, and its recordings). Folds of a family that learns by
    passes of statistics may run at once (on Spark: each fold's jobs from a driver thread); the
    results are the same.

    ``repeat`` > 1 runs the cross-validation that many times: repeat ``i`` (from 0) assigns folds
    with seed ``opts.seed + i`` and, when the model family has a ``seed`` parameter, trains with
    its seed + ``i``. The result is then the first repeat's (the one ``repeat=1`` gives) plus
    ``repeats`` (each repeat's seeds and figures) and ``repeat_summary`` (mean and sd over the
    repeats of accuracy and macro-F1, or of AUC and pAUC for a detector); ``seconds`` covers
    every repeat, and fold reports passed to ``on_fold`` carry ``repeat`` (from 1)."""
    engine = _engine(engine)
    if repeat < 1:
        raise ParameterError(f"repeat={repeat}: expected 1 or more repetitions of the cross-validation",
                             param="repeat")
    ds = ds.labelled(label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {label!r}")
    probe = build(spec, overrides)
    if isinstance(probe, AnomalyDetector) and probe.id_labels:
        raise UserError(f"{probe.name}: cross-validation does not train id_labels networks (one per fold); train "
                        "on the training recordings (train -o M.wt), then evaluate -m M.wt on the others")
    refuse_on(engine, probe, training=True)
    refuse_on(engine, probe, training=False)        # (each fold's model scores its test fold there too)
    training_augmenter(probe)
    if not probe.detector and normal is not None:
        raise ParameterError(f"--normal applies to anomaly detectors; {probe.name} learns every value of {label!r}")
    # every recording extracted once, up front; the folds (of every repeat) then read what the engine keeps
    prep = engine.prepare(ds, probe, opts, label=label, labels=present_values(ds, label))
    skipped = list(ds.skipped) + list(prep.skipped)
    normal = normal_value(prep.ds, label, normal) if probe.detector else None
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
        kfold = _KFold(engine, prep, label, spec, run_overrides, opts, folds=folds, seed=seed, on_fold=fold_cb,
                       parallel=probe.learns_by == "statistics")
        with engine.progress("folds", enable=opts.progress):
            res = kfold.detector(normal) if normal is not None else kfold.classifier()
        res.update(group_by=opts.group_by, recordings=len(prep.ds), skipped=skipped)
        results.append((seed, run_overrides.get("seed", probe.params.get("seed")), res))
    res = results[0][2]
    if repeat > 1:
        res["repeats"] = [{"repeat": i + 1, "seed": seed, "model_seed": model_seed, "seconds": rr["seconds"],
                           **{m: rr[m] for m in metrics}, "folds_summary": rr["folds_summary"]}
                          for i, (seed, model_seed, rr) in enumerate(results)]
        res["repeat_summary"] = repeat_summary(res["repeats"], metrics)
        res["seconds"] = time.perf_counter() - t0
    return res


@dataclass
class _KFold:
    """One k-fold cross-validation on an engine, folds assigned by ``seed``."""

    engine: Engine
    prep: Prepared
    label: str
    spec: str
    overrides: dict
    opts: RunOptions
    folds: int
    seed: int
    on_fold: Callable[[dict], None] | None
    #: Whether the folds may run at once: a family that learns by passes of statistics (short
    #: jobs, where gradient steps take every executor for their ranks).
    parallel: bool

    def _test_folds(self) -> list[np.ndarray]:
        return kfold_indices(self.prep.ds, self.folds, group_by=self.opts.group_by, seed=self.seed,
                             stratify=self.label)

    def _fit(self, train_idx: np.ndarray) -> tuple[Classifier, float]:
        """A new model fitted on recordings ``train_idx``, and its training seconds."""
        model = build(self.spec, self.overrides)
        # (folds that run at once report together, not each its own)
        seconds = _learn(self.engine, self.prep, model, self.label, self.opts, indices=train_idx,
                         progress=self.opts.progress and not (self.engine.parallel and self.parallel))
        return model, seconds

    def _held_out(self, test_idx: np.ndarray) -> dict[str, list[str]]:
        """``held_out``: the ``group_by`` groups of a fold's test recordings (none without groups)."""
        names = group_names(self.prep.ds, self.opts.group_by)
        return {} if names is None else {"held_out": sorted({names[i] for i in test_idx})}

    def _predictions(self, model: Classifier, test_idx: np.ndarray) -> Iterator[Prediction]:
        # (low rates were reported once, when the data was prepared)
        return self.engine.predictions(self.prep, model, self.opts, indices=test_idx, warn=False)[0]

    def classifier(self) -> dict:
        """Confusion and scores pooled over the folds, and each fold's."""
        ds, label = self.prep.ds, self.label
        labels = sorted(ds.counts(label))
        key = ds.resolve_label(label)
        test_folds = self._test_folds()
        everything = np.arange(len(ds))

        index = _places(ds)

        def run_fold(f: int) -> tuple[dict, list, list, list, dict]:
            test_idx = test_folds[f]
            train_idx = np.setdiff1d(everything, test_idx)
            model, train_s = self._fit(train_idx)
            y_true, y_pred, places = _true_and_predicted(self._predictions(model, test_idx), key, index)
            s = scores(confusion(y_true, y_pred, labels), labels)
            info = {"fold": f + 1, "train_recordings": len(train_idx), "test_recordings": len(test_idx),
                    "accuracy": s["accuracy"], "macro_f1": s["macro_f1"], "train_seconds": train_s,
                    **self._held_out(test_idx)}
            return info, y_true, y_pred, places, s

        t0 = time.perf_counter()
        y_true_all, y_pred_all, places_all, fold_scores, fold_info = [], [], [], [], []
        for info, y_true, y_pred, places, s in self.engine.map(run_fold, range(len(test_folds)),
                                                               parallel=self.parallel):
            fold_info.append(info)
            fold_scores.append(s)
            y_true_all += y_true
            y_pred_all += y_pred
            places_all += places
            if self.on_fold:
                self.on_fold(info)
        res = report(y_true_all, y_pred_all, labels)
        names = group_names(ds, self.opts.group_by)
        if names is not None:
            res["groups"] = classifier_groups(y_true_all, y_pred_all, labels, window_groups(places_all, names),
                                              places_all)
        res.update(folds=fold_info, folds_summary=fold_spread(fold_scores),
                   rare_values=rare_values(ds, label, self.folds, self.opts.group_by),
                   seconds=time.perf_counter() - t0)
        return res

    def detector(self, normal: str) -> dict:
        """A detector's k-fold evaluation (:func:`detector_folds`)."""
        ds = self.prep.ds
        key = ds.resolve_label(self.label)
        index = _places(ds)

        def fold(train_idx: np.ndarray, test_idx: np.ndarray) -> tuple[Any, float, list[int], list[float], list[int]]:
            model, train_s = self._fit(train_idx)
            y, s, places = _detector_scores(self._predictions(model, test_idx), key, normal, index)
            return model, train_s, y, s, places

        res = detector_folds(self._test_folds(), np.array([r.labels.get(key) == normal for r in ds]), fold,
                             label=self.label, value=normal, on_fold=self.on_fold,
                             groups=group_names(ds, self.opts.group_by), group_by=self.opts.group_by)
        res.update(label=self.label, normal_value=normal,
                   rare_values=rare_values(ds, self.label, self.folds, self.opts.group_by))
        return res


#: One detector fold, for :func:`detector_folds`: ``(train indices, test indices)`` -> the fitted
#: model, its training seconds, and per test window its truth (1: anomalous), score and
#: recording (its place in the data set).
DetectorFold = Callable[[np.ndarray, np.ndarray], tuple[Any, float, list[int], list[float], list[int]]]


def detector_folds(test_folds: list[np.ndarray], normal: np.ndarray, fold: DetectorFold, *, label: str,
                   value: str, on_fold=None, groups: list[str] | None = None, group_by: str | None = None) -> dict:
    """The fold loop of a detector's k-fold evaluation: each fold's model learns from the normal
    recordings (``normal[i]`` true) of the other folds and scores every window of its own
    (``fold``); AUC and pAUC per fold and over the pooled scores, the figures at a threshold from
    each fold's decisions at its own threshold
    (:func:`~wavetrain.evaluation.detection_metrics.pooled_fold_report`; ``seconds`` added), and
    with ``groups`` (each recording's group, ``group_by`` its name) the same per group, with its
    recordings."""
    ys: list[int] = []
    ss: list[float] = []
    flags: list[float] = []
    places: list[int] = []
    fold_info = []
    t0 = time.perf_counter()
    everything = np.arange(len(normal))
    for f, test_idx in enumerate(test_folds):
        train_idx = np.array([i for i in np.setdiff1d(everything, test_idx) if normal[i]], dtype=np.int64)
        if not len(train_idx):
            raise UserError(f"fold {f + 1}: no normal recordings ({label}={value}) left to train on; use fewer folds")
        model, train_s, y, s, p = fold(train_idx, np.asarray(test_idx))
        r = detection_report(y, s, model.threshold_)
        held = {} if groups is None else {"held_out": sorted({groups[i] for i in test_idx})}
        fold_info.append({**held, "fold": f + 1, "train_recordings": len(train_idx), "test_recordings": len(test_idx),
                          "auc": r["auc"], "pauc": r["pauc"], "f1": r["f1"], "threshold": model.threshold_,
                          "train_seconds": train_s})
        ys += y
        ss += s
        flags += [float(v > model.threshold_) for v in s]      # each fold's decisions at its own threshold
        places += p
        if on_fold:
            on_fold(fold_info[-1])
    res = pooled_fold_report(ys, ss, flags, None if groups is None else window_groups(places, groups), fold_info)
    _per_group(res, groups, places, group_by)
    res["seconds"] = time.perf_counter() - t0
    return res


