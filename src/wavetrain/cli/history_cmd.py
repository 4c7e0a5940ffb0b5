"""``wavetrain plot history -m model.wt -o hist.png``: draw a model's training history."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("plot-history", help="draw a trained model's history (also: `wavetrain plot history`)",
                       description="Plot the loss and validation scores stored in a model file.")
    p.add_argument("-m", "--model-file", required=True, metavar="MODEL")
    p.add_argument("-o", "--output", required=True, metavar="PNG")
    p.set_defaults(func=run)


def run(args) -> int:
    from wavetrain.errors import UserError
    from wavetrain.models.modelfile import read_model_file

    meta, _ = read_model_file(args.model_file)
    history = meta.get("history") or []
    if not history:
        raise UserError(f"{args.model_file}: the model has no training history to plot")
    loss_label = "cross-entropy loss"
    if meta["model"] == "gmm":  # EM passes: plot the negative mean frame log-likelihood
        history = [{"epoch": h["iteration"], "train_loss": -h["mean_loglik"]} for h in history]
        loss_label = "−mean frame log-likelihood (EM pass on x axis)"
    from wavetrain.train.history_plot import plot_history

    out = plot_history(history, args.output, title=f"{meta['model']} on {meta.get('label_name')}",
                       loss_label=loss_label)
    print(f"wrote {out}")
    return 0
