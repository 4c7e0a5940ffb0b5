"""``wavetrain evaluate``: k-fold cross-validation, or a trained model on a labelled set."""
from __future__ import annotations

import json
import sys

from wavetrain.cli.common import (
    add_data_options,
    add_engine_options,
    add_model_options,
    add_store_options,
    check_data,
    check_engine,
    check_model,
    engine_type,
    guard_outputs,
    int_at_least,
    load_data,
    load_model_file,
    model_overrides,
    open_engine,
    plan_run,
    reads,
    report_skipped,
    report_store,
    run_options,
    writes,
)
from wavetrain.core.errors import UserError
from wavetrain.models.registry import DEFAULT_MODEL


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="cross-validate a model spec, or test a trained model",
                       description=f"k-fold cross-validation of a model spec (--model, default {DEFAULT_MODEL}; "
                                   "folds of whole recordings, or whole groups with --group-by; recordings with "
                                   "identical content always in one fold), or evaluation of a trained model file (-m).")
    add_data_options(p, normal=True, label_required=False)
    reads(p.add_argument("-m", "--model-file", metavar="MODEL.wt",
                         help="evaluate this trained model file instead of cross-validating --model"))
    p.add_argument("--folds", type=int_at_least(2), default=5, help="number of folds (default 5)")
    p.add_argument("--group-by", metavar="LABEL",
                   help="keep each value of this label in one fold (e.g. speaker; several labels joined by "
                        "commas: machine,unit) and report each value's figures after the pooled ones, weakest "
                        "first (accuracy, or a detector's AUC and pAUC); with -m, the figures per value alone")
    p.add_argument("--by", nargs="?", const="", default=None, metavar="[MACHINE,]SECTION,DOMAIN",
                   help="with -m and an anomaly detector: the DCASE scores, one score per recording (the mean "
                        "of its windows'), per machine type and section: AUC of each domain (its normal "
                        "recordings against every anomalous one of the section), pAUC over both domains, and "
                        "the official score (their harmonic mean); names the section and domain labels "
                        "(default: section,domain; the machine type: label machine when it has several "
                        "values, or the first of three names); the domain label must have two values")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="fold assignment seed (default 0)")
    p.add_argument("--repeat", type=int_at_least(1), default=1, metavar="N",
                   help="repeat the cross-validation N times, repeat i with fold seed --seed + i and the "
                        "model's seed parameter + i, and report the mean ± sd over them of accuracy and "
                        "macro-F1 (detectors: AUC and pAUC), then each repeat; features are extracted once "
                        "(default 1)")
    p.add_argument("--cm", action="store_true", help="print the confusion matrix")
    writes(p.add_argument("--plot", metavar="IMAGE",
                          help="also draw the confusion matrix to this image (.png, .svg, .pdf or .jpg): rows "
                               "normalised, each cell with its count and share; a detector's normal and anomalous "
                               "windows against its answers at the threshold; with --repeat, the first repeat's"))
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (accuracy, macro_f1, confusion with its row and column "
                        "names, per-value scores, per-fold figures, with --group-by each group's figures "
                        "in groups, with --by the figures per section and domain and the official score in sections)")
    p.add_argument("--events", nargs="?", const="", default=None, metavar="SETTINGS",
                   help="with -m: score the events the model finds in each audio file of --data, each file "
                        "read whole once, against the data set's rows as events (a segment row is one event, "
                        "a row without a segment spans its file, rows tagged gap=true are not events): "
                        "event-based F1, precision, recall and error rate (onset within 200 ms, offset within "
                        "200 ms or 20%% of the event), class-aware and detection only, and segment-based F1 and "
                        "error rate over 100 ms segments; SETTINGS are the event detector's, e.g. "
                        "gap_ms=300,on_db=8 (default: its defaults); --label defaults to the model's label")
    add_model_options(p, required=False)
    add_store_options(p)
    add_engine_options(p, retries=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.evaluation.dcase_scores import format_dcase
    from wavetrain.evaluation.detection_metrics import format_detection_report
    from wavetrain.evaluation.group_results import format_groups
    from wavetrain.evaluation.metrics import format_repeat_summary, format_report
    from wavetrain.models.registry import build
    from wavetrain.pipeline.dcase_evaluation import dcase_layout, evaluate_by_section
    from wavetrain.pipeline.jobs import evaluate_kfold, evaluate_model

    if args.events is not None:
        return _run_events(args)
    if args.label is None:
        raise UserError("evaluate: --label NAME is required (the label whose values are scored, e.g. --label word)")
    check_engine(args)
    plot_out = _plot_output(args) if args.plot is not None else None
    opts = run_options(args, group_by=args.group_by, seed=args.seed)
    if args.repeat > 1 and args.model_file:
        raise UserError(f"--repeat {args.repeat} repeats a cross-validation; a trained model (-m) is evaluated once")
    if args.by is not None and not args.model_file:
        raise UserError("--by scores a trained anomaly detector on test recordings: give its file with -m MODEL.wt")

    def on_fold(info):        # progress on stderr, whatever stdout's format
        rep = f"repeat {info['repeat']}/{args.repeat} " if "repeat" in info else ""
        figures = (f"AUC {info['auc']:.4f}  pAUC {info['pauc']:.4f}" if "auc" in info
                   else f"accuracy {info['accuracy']:.4f}  macro-F1 {info['macro_f1']:.4f}")
        held = info.get("held_out")
        held = f"; held out {args.group_by}: {', '.join(held)}" if held else ""
        print(f"{rep}fold {info['fold']}/{args.folds}: {figures}  ({info['train_recordings']} train / "
              f"{info['test_recordings']} test recordings{held}, trained in {info['train_seconds']:.1f} s)",
              file=sys.stderr)

    if args.model_file:
        model = load_model_file(args.model_file)
    else:
        overrides = model_overrides(args)
        model = build(args.model, overrides)  # an invalid spec or parameter fails before the data is read
    check_model(args, model, training=not args.model_file)
    if args.by is not None and not model.detector:
        raise UserError(f"--by reports an anomaly detector's scores per section and domain; {args.model_file} is "
                        f"a {model.name} classifier: drop --by (--group-by gives a classifier's figures per group)")
    ds = load_data(args, opts)
    guard_outputs(args, ds)
    check_data(args, ds)
    layout = dcase_layout(ds.labelled(args.label), args.by) if args.by is not None else None
    with open_engine(args) as engine:
        plan_run(args, ds, None, opts, engine, model=model)
        if layout is not None:
            res = evaluate_by_section(model, ds, args.label, opts, layout, normal=args.normal, engine=engine)
            res["model"] = model.name
        elif args.model_file:
            res = evaluate_model(model, ds, args.label, opts, normal=args.normal, engine=engine)
            res["model"] = model.name
        else:
            res = evaluate_kfold(ds, args.label, args.model, overrides, opts, folds=args.folds, on_fold=on_fold,
                                 normal=args.normal, repeat=args.repeat, engine=engine)
            res["model"] = args.model
    if res.get("detector") and res.get("folds"):
        res["threshold"] = None             # each fold decided at its own (folds[i]["threshold"])
    skipped = res.pop("skipped")
    res["skipped"] = len(skipped)
    res["skipped_recordings"] = [{"recording": r.name, "error": e} for r, e in skipped]
    if not args.json and res.get("repeats"):
        # the figures over every repeat first, then each repeat's, then the first repeat in full
        print(format_repeat_summary(res))
        print(f"repeat 1 of {len(res['repeats'])} in detail:")
    if args.json:
        print(json.dumps(res))
    elif res.get("detector"):
        print(format_detection_report(res))
    else:
        if res.get("rare_values"):
            rare = ", ".join(f"{v} ({n})" for v, n in sorted(res["rare_values"].items()))
            print(f"note: values with fewer {'groups' if args.group_by else 'recordings'} than folds "
                  f"(not in every fold): {rare}")
        if res.get("unseen_values"):
            print(f"note: values the model never saw in training: {', '.join(res['unseen_values'])}")
        print(format_report(res, show_cm=args.cm))
    if not args.json and res.get("groups"):
        print(format_groups(res))                # weakest group first, after the pooled figures
    if not args.json and res.get("sections"):
        print(format_dcase(res["sections"]))
    report_skipped(skipped)
    if res.get("detector") and not (res["normal"] and res["anomalous"]):
        print(f"note: AUC needs normal and anomalous recordings; these have {res['normal']} normal and "
              f"{res['anomalous']} anomalous windows ({res['label']}={res['normal_value']} is normal)", file=sys.stderr)
    if res["windows"] == 0:
        raise UserError("no windows were evaluated (all recordings shorter than one clip?)")
    if plot_out is not None:
        _plot(args, res, plot_out)
    report_store(opts.store)
    return 0


def _plot_output(args):
    """``--plot``, checked before any work as every plot's output is."""
    from wavetrain.core.outputs import IMAGE_SUFFIXES, check_output_file

    return check_output_file(args.plot, option="--plot", suffixes=IMAGE_SUFFIXES, example="cm.png")


def _plot(args, res: dict, out) -> None:
    """Draw the result's confusion matrix to ``out``, titled with the model, how it was evaluated
    and its figures."""
    import math
    from pathlib import Path

    from wavetrain.evaluation.confusion_plot import plot_confusion, result_cells

    if args.model_file:
        what, how = f"{Path(args.model_file).name} ({res['model']})", "test set"
    else:
        overrides = model_overrides(args)
        what = args.model + (f" ({', '.join(f'{k}={v}' for k, v in overrides.items())})" if overrides else "")
        how = f"{args.folds}-fold cross-validation" + (f" by {args.group_by}" if args.group_by else "") + \
            (f", repeat 1 of {args.repeat}" if res.get("repeats") else "")
    predicted = f"predicted {args.label}"
    if res.get("detector"):
        t = res.get("threshold")
        at = f"at threshold {t:.4g}" if t is not None and math.isfinite(t) else "at each fold's threshold"
        figures = f"AUC {res['auc']:.3f}, F1 {res['f1']:.3f} {at}"
        predicted += f" ({at})"
    else:
        figures = f"accuracy {res['accuracy']:.3f}, macro-F1 {res['macro_f1']:.3f}"
    title = f"{what}: {figures}\n{how}, {res['recordings']} recordings, {res['windows']} windows"
    plot_confusion(result_cells(res), out, true_label=f"true {args.label}", predicted_label=predicted, title=title)
    print(f"wrote {out}", file=sys.stderr)


# -- --events: the events found in whole files against the data set's segment rows --------------------

#: Options that do not apply to ``--events`` (``(option, attribute, its value when not given)``).
_NOT_WITH_EVENTS = (("--folds", "folds", 5), ("--repeat", "repeat", 1), ("--group-by", "group_by", None),
                    ("--cm", "cm", False), ("--plot", "plot", None), ("--normal", "normal", None),
                    ("--by", "by", None))


def _run_events(args) -> int:
    """``evaluate -m MODEL --events [SETTINGS]``: each distinct audio file of ``--data`` through the
    event detector once, whole, and the events it finds scored against the data set's rows
    (:mod:`wavetrain.evaluation.event_metrics`)."""
    from dataclasses import asdict

    from wavetrain.evaluation.event_metrics import Event, event_scores, format_event_report
    from wavetrain.pipeline.jobs import event_predictions
    from wavetrain.stream.events import EventOptions

    check_engine(args)
    if not args.model_file:
        raise UserError("--events scores a trained model's events: give its file with -m MODEL.wt")
    for option, name, unset in _NOT_WITH_EVENTS:
        if getattr(args, name) != unset:
            raise UserError(f"{option} does not apply to --events (each file of --data is scored whole, once, "
                            f"against its rows): drop {option}")
    options = EventOptions.parse(args.events)
    model = load_model_file(args.model_file)
    check_model(args, model, training=False)
    if not callable(getattr(engine_type(args), "events", None)):
        raise UserError(f"--events: the {args.engine} engine does not detect events; use --engine local")
    label = args.label or model.label_name_
    if not label:
        raise UserError("--events: give --label NAME, the label whose values the events are (the model "
                        "does not record the label it learned)")
    opts = run_options(args)
    ds = load_data(args, opts)
    guard_outputs(args, ds)
    reference, files = _reference_events(ds, ds.resolve_label(label))
    with open_engine(args) as engine:
        preds, skipped = event_predictions(model, files, opts, options, engine=engine)
        estimate = []
        for p in preds:                  # each event's recording is the whole file it was found in
            assert p.recording is not None
            estimate.append(Event(_file_key(p.recording.path), p.start_ms, p.end_ms, str(p.label)))
    bad = {_file_key(r.path) for r, _ in skipped}            # files the detector could not read
    skipped = list(ds.skipped) + list(skipped)
    res = event_scores([e for e in reference if e.file not in bad], estimate)
    res.update(model=model.name, label=label, event_settings=asdict(options), skipped=len(skipped),
               skipped_recordings=[{"recording": r.name, "error": e} for r, e in skipped])
    if args.json:
        print(json.dumps(res, allow_nan=False))
    else:
        print(format_event_report(res))
    report_skipped(skipped)
    report_store(opts.store)
    return 0


def _file_key(path) -> str:
    from pathlib import Path

    return str(Path(path).resolve())


def _reference_events(ds, label: str):
    """The events a data set's rows declare (its segment rows; a row without a segment spans its
    file; rows tagged ``gap=true`` are not events), each valued by ``label``, in row order, and
    the data set of its distinct audio files, whole, in the order they first appear."""
    from wavetrain.core.errors import MetadataError
    from wavetrain.data.dataset import Dataset
    from wavetrain.data.recording import Recording
    from wavetrain.evaluation.event_metrics import Event

    events: list[Event] = []
    files: dict[str, Recording] = {}
    for r in ds:
        key = _file_key(r.path)
        files.setdefault(key, Recording(r.path))
        if r.tags.get("gap", "").strip().lower() == "true":
            continue
        value = r.labels.get(label)
        if value in (None, ""):
            where = r.source or r.name
            raise MetadataError(f"{where}: no value for label {label!r}: every row that is an event needs one "
                                "(tag a row that is no event gap=true)")
        start, end = r.segment_ms if r.segment_ms else (0, round(1000 * r.info().duration_s))
        events.append(Event(key, start, end, value))
    return events, Dataset(list(files.values()), ds.root, ds.folder_labels)
