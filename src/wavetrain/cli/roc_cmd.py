"""``wavetrain plot roc -m detector.wt --data TEST --label state -o roc.png``: a detector's ROC
curve and the score histograms of normal and anomalous windows, titled with what the curve is of
(the machine or unit the recordings are of: the label values they share, e.g. ``machine m1``)."""
from __future__ import annotations

import sys

from wavetrain.cli.common import (
    add_data_options,
    add_store_options,
    guard_outputs,
    load_data,
    load_model_file,
    reads,
    run_options,
    writes,
)


def register(sub) -> None:
    p = sub.add_parser("plot-roc", help="draw an anomaly detector's ROC curve and score histograms on test data "
                                        "(also: `wavetrain plot roc`)",
                       description="Score labelled test recordings with a trained anomaly detector and draw "
                                   "its ROC curve (pAUC region shaded, the stored threshold marked) beside the "
                                   "histograms of the anomaly scores of normal and anomalous windows.")
    reads(p.add_argument("-m", "--model-file", required=True, metavar="MODEL.wt", help="a trained anomaly detector"))
    add_data_options(p, normal=True)
    writes(p.add_argument("-o", "--output", required=True, metavar="PNG",
                          help="image to write (.png, .svg, .pdf or .jpg)"))
    p.add_argument("--by", nargs="?", const="", default=None, metavar="[MACHINE,]SECTION,DOMAIN",
                   help="a panel per machine type and section with the ROC curve of each domain (its normal "
                        "recordings against every anomalous one of the section), AUC in the legend, pAUC in the "
                        "title; one score per recording, the mean of its windows' (as evaluate --by; default "
                        "labels: section,domain)")
    add_store_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.core.errors import UserError
    from wavetrain.core.outputs import IMAGE_SUFFIXES, check_output_file
    from wavetrain.evaluation.detection_metrics import partial_auc, roc_auc
    from wavetrain.evaluation.detection_plot import plot_detection
    from wavetrain.pipeline.jobs import detector_scores, normal_value

    out = check_output_file(args.output, option="-o", suffixes=IMAGE_SUFFIXES, example="roc.png")
    model = load_model_file(args.model_file)
    if not model.detector:
        raise UserError(f"{args.model_file}: a {model.name} classifier; `plot roc` draws anomaly detectors "
                        "(evaluate --cm shows a classifier's confusion matrix)")
    opts = run_options(args)
    ds = load_data(args, opts)
    guard_outputs(args, ds)
    ds = ds.labelled(args.label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {args.label!r}")
    normal = args.normal or (model.fitted_labels[0] if model.fitted_labels[0] in ds.counts(args.label) else None)
    normal = normal_value(ds, args.label, normal)
    if args.by is not None:
        return _run_by(args, model, ds, normal, opts, out)
    y, s, _, _ = detector_scores(model, ds, args.label, normal, opts)
    if not (0 < sum(y) < len(y)):
        raise UserError(f"a ROC curve needs normal and anomalous recordings; these have {len(y) - sum(y)} normal "
                        f"and {sum(y)} anomalous windows ({args.label}={normal} is normal)")
    auc = roc_auc(y, s)
    title = (f"{data_scope(ds, args.label, args.where) or 'all recordings'} \u2014 ROC AUC {auc:.3f}\n"
             f"{model.title} on {len(ds)} recordings ({args.label}={normal} is normal)")
    plot_detection(y, s, model.threshold_, out, title=title)
    print(f"wrote {out}: AUC {auc:.4f}, pAUC {partial_auc(y, s):.4f}", file=sys.stderr)
    return 0


def _run_by(args, model, ds, normal: str, opts, out) -> int:
    """``plot roc --by``: the ROC curve of each domain in a panel per machine type and section,
    from the recordings' scores (:mod:`wavetrain.pipeline.dcase_evaluation`)."""
    from wavetrain.cli.common import report_skipped
    from wavetrain.core.errors import UserError
    from wavetrain.evaluation.detection_plot import plot_section_roc
    from wavetrain.pipeline.dcase_evaluation import dcase_layout, recording_scores_by

    layout = dcase_layout(ds, args.by)
    rs = recording_scores_by(model, ds, args.label, normal, opts, layout)
    report = rs.report(layout)
    if not any(v is not None for g in report["groups"] for v in g["auc"].values()):
        raise UserError(f"a ROC curve needs normal and anomalous recordings in a section; these have "
                        f"{int((rs.y == 0).sum())} normal and {int((rs.y == 1).sum())} anomalous recordings "
                        f"({args.label}={normal} is normal)")
    score = report["official_score"]
    scope = data_scope(ds, args.label, args.where)
    sep = " \u2014 " if scope else ""
    title = (f"{scope}{sep}official score {score:.3f}\n"
             f"{model.title} on {report['recordings']} recordings ({args.label}={normal} is normal), "
             f"each scored by the mean of its windows")
    plot_section_roc(rs.y, rs.scores, rs.section, rs.domain, report, out, machine=rs.machine, title=title)
    report_skipped(rs.skipped)
    print(f"wrote {out}: official score {score:.4f} over {len(report['groups'])} sections", file=sys.stderr)
    return 0


#: Labels named in a ROC plot's title at most (the --where ones first).
SCOPE_LABELS = 4


def data_scope(ds, label: str, where=()) -> str:
    """What the recordings of ``ds`` are of, for a title: each label other than ``label`` whose
    value they all share, and each ``--where`` label with the values kept, as ``name value``
    (``machine fan, unit 2``; ``unit 1,2`` for several); empty when there is none."""
    key = ds.resolve_label(label)
    named = [name for name, _ in where] + [name for name in ds.label_names() if name not in dict(where)]
    parts = []
    for name in named:
        if name in (label, key):
            continue
        values = sorted({v for v in ds.values(name) if v not in (None, "")})
        if values and (len(values) == 1 or name in dict(where)):
            parts.append(f"{name} {','.join(values)}")
    return ", ".join(parts[:SCOPE_LABELS])
