"""``wavetrain plot history -m model.wt -o hist.png``: draw a model's training history.

A neural model's history is drawn as losses (and validation scores when the run had validation
data) against epochs, the loss labelled with what the model family says it measures
(``Classifier.history_loss``: cross-entropy, an autoencoder's reconstruction error), top-5
accuracy only for a model of six values or more; a GMM's as the mean frame log-likelihood against
the EM pass.
"""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("plot-history", help="draw a trained model's history (also: `wavetrain plot history`)",
                       description="Plot the training history stored in a model file: losses and "
                                   "validation scores per epoch (neural models) or the mean frame "
                                   "log-likelihood per EM pass (Gaussian mixtures).")
    from wavetrain.cli.common import reads, writes

    reads(p.add_argument("-m", "--model-file", required=True, metavar="MODEL", help="model file (.wt)"))
    writes(p.add_argument("-o", "--output", required=True, metavar="PNG",
                          help="image to write (.png, .svg, .pdf or .jpg)"))
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from wavetrain.core.errors import ModelFileError, UserError
    from wavetrain.core.outputs import IMAGE_SUFFIXES, check_output_file
    from wavetrain.models.base import Classifier
    from wavetrain.models.modelfile import describe_model
    from wavetrain.models.registry import family, family_names
    from wavetrain.train.history_plot import check_history, plot_history

    out = check_output_file(args.output, option="-o", suffixes=IMAGE_SUFFIXES, example="history.png")
    path = Path(args.model_file)
    if not str(args.model_file).strip():
        raise ModelFileError("-m: empty path; give a model file written by `wavetrain train`, "
                             "e.g. model.wt")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a folder; give a model file written by `wavetrain "
                             "train`, e.g. model.wt")
    if not path.exists():
        raise ModelFileError(f"{path}: no such model file")
    meta, _ = describe_model(path)      # the validation every command applies
    try:
        kind = check_history(meta.get("history"))
    except UserError as e:
        raise ModelFileError(f"{path}: {e}") from None
    model = meta.get("model")
    model = model if isinstance(model, str) else "model"
    label = meta.get("label_name")
    preset = meta.get("preset")
    name = f"{preset} ({model})" if isinstance(preset, str) and preset else model
    title = f"{path.name}: {name}" + (f" on {label}" if isinstance(label, str) and label else "")
    if kind == "em":
        title += " (EM training passes)"
    cls = family(model) if model in family_names() else Classifier
    labels = meta.get("labels")
    plot_history(meta["history"], out, title=title, loss_label=cls.history_loss,
                 n_values=len(labels) if isinstance(labels, list) else None)
    print(f"wrote {out}")
    return 0
