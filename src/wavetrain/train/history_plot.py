"""Draw a training history (the ``history`` list of a model file) as a PNG.

Two panels share the x axis (epochs): losses (training and validation) and validation scores
(top-1, top-5, macro-F1). matplotlib is imported only here, with the Agg backend.
"""
from __future__ import annotations

import os
from pathlib import Path

from wavetrain.errors import UserError


def _series(history: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, h in enumerate(history):
        v = h.get(key)
        if v is None:
            continue
        xs.append(float(h.get("epoch", i + 1)))
        ys.append(float(v))
    return xs, ys


def plot_history(meta_history: list[dict], out_path: str | os.PathLike, *, title: str | None = None,
                 loss_label: str = "cross-entropy loss") -> Path:
    """Write a loss/score plot of ``meta_history`` to ``out_path`` (format from the suffix, e.g. .png).

    Parameters
    ----------
    meta_history : list of dict
        One entry per validation with ``epoch``, ``train_loss``, ``valid_loss``, ``top1``, ``top5``,
        ``macro_f1`` (missing or ``None`` values are skipped).
    out_path : path
    title : str, optional

    Raises
    ------
    UserError
        When the history is empty (e.g. a model that is not trained by epochs, like gmm).
    """
    if not meta_history:
        raise UserError("this model has no training history to plot (only neural models record one)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_score) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    try:
        for key, label in (("train_loss", "training loss"), ("valid_loss", "validation loss")):
            xs, ys = _series(meta_history, key)
            if xs:
                ax_loss.plot(xs, ys, marker="o", markersize=3, label=label)
        ax_loss.set_ylabel(loss_label)
        ax_loss.grid(True, alpha=0.3)
        ax_loss.legend(loc="upper right")
        any_score = False
        for key, label in (("top1", "top-1 accuracy"), ("top5", "top-5 accuracy"), ("macro_f1", "macro-F1")):
            xs, ys = _series(meta_history, key)
            if xs:
                any_score = True
                ax_score.plot(xs, ys, marker="o", markersize=3, label=label)
        ax_score.set_ylabel("validation score")
        ax_score.set_xlabel("epoch")
        ax_score.set_ylim(-0.02, 1.02)
        ax_score.grid(True, alpha=0.3)
        if any_score:
            ax_score.legend(loc="lower right")
        else:
            ax_score.text(0.5, 0.5, "no validation data", ha="center", va="center", transform=ax_score.transAxes)
        fig.suptitle(title or "training history")
        fig.tight_layout()
        out = Path(out_path)
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out
