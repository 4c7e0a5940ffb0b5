"""``wavetrain plot roc -m detector.wt --data TEST --label state -o roc.png``: a detector's ROC
curve and the score histograms of normal and anomalous windows."""
from __future__ import annotations

import sys

from wavetrain.cli.common import add_data_options, add_store_options, load_data, load_model_file, run_options


def register(sub) -> None:
    p = sub.add_parser("plot-roc", help="draw an anomaly detector's ROC curve and score histograms on test data "
                                        "(also: `wavetrain plot roc`)",
                       description="Score labelled test recordings with a trained anomaly detector and draw "
                                   "its ROC curve (pAUC region shaded, the stored threshold marked) beside the "
                                   "histograms of the anomaly scores of normal and anomalous windows.")
    p.add_argument("-m", "--model-file", required=True, metavar="MODEL.wt", help="a trained anomaly detector")
    add_data_options(p, normal=True)
    p.add_argument("-o", "--output", required=True, metavar="PNG", help="image to write (.png, .svg, .pdf or .jpg)")
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
    ds = load_data(args, opts).labelled(args.label)
    if len(ds) == 0:
        raise UserError(f"no recording has a value for label {args.label!r}")
    normal = args.normal or (model.fitted_labels[0] if model.fitted_labels[0] in ds.counts(args.label) else None)
    normal = normal_value(ds, args.label, normal)
    y, s, _, _ = detector_scores(model, ds, args.label, normal, opts)
    if not (0 < sum(y) < len(y)):
        raise UserError(f"a ROC curve needs normal and anomalous recordings; these have {len(y) - sum(y)} normal "
                        f"and {sum(y)} anomalous windows ({args.label}={normal} is normal)")
    title = f"{model.name} on {len(ds)} recordings ({args.label}={normal} is normal)"
    plot_detection(y, s, model.threshold_, out, title=title)
    print(f"wrote {out}: AUC {roc_auc(y, s):.4f}, pAUC {partial_auc(y, s):.4f}", file=sys.stderr)
    return 0
