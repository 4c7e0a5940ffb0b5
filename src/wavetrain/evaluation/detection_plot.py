"""Draw a detector's evaluation: the ROC curve (the pAUC region shaded) beside the histograms of
the anomaly scores of normal and anomalous windows, with the stored threshold.

matplotlib is imported only here, without pyplot (an Agg canvas per figure).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from wavetrain.core.outputs import IMAGE_SUFFIXES, check_output_file, write_atomic
from wavetrain.evaluation.detection_metrics import PAUC_MAX_FPR, partial_auc, roc_auc, roc_curve


def build_detection_figure(y, scores, threshold: float, *, title: str | None = None):
    """A figure of the ROC curve and the two score histograms (``y``: 1 = anomalous window)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    y = np.asarray(y, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    roc_ax, hist_ax = fig.subplots(1, 2, width_ratios=(1, 1.4))
    fpr, tpr, _ = roc_curve(y, s)
    auc, pauc = roc_auc(y, s), partial_auc(y, s)
    roc_ax.plot(fpr, tpr, color="tab:blue", lw=2, label=f"AUC {auc:.3f}, pAUC {pauc:.3f}")
    roc_ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="chance")
    roc_ax.axvspan(0, PAUC_MAX_FPR, color="tab:orange", alpha=0.12, label=f"pAUC region (FPR ≤ {PAUC_MAX_FPR})")
    flagged = s > threshold
    if np.isfinite(threshold) and (y == 0).any() and (y == 1).any():
        at = (flagged[y == 0].mean(), flagged[y == 1].mean())
        roc_ax.plot(*at, "o", color="tab:red", label=f"threshold: FPR {at[0]:.2f}, TPR {at[1]:.2f}")
    roc_ax.set(xlim=(0, 1), ylim=(0, 1.01), xlabel="false-positive rate (normal flagged)",
               ylabel="true-positive rate (anomalies flagged)", title="ROC curve")
    roc_ax.legend(loc="lower right", fontsize=8)
    bins = np.histogram_bin_edges(s[np.isfinite(s)], bins=min(40, max(10, s.size // 4)))
    for kind, colour, name in ((0, "tab:blue", "normal"), (1, "tab:red", "anomalous")):
        if (y == kind).any():
            hist_ax.hist(s[y == kind], bins=bins, color=colour, alpha=0.55, label=f"{name} ({(y == kind).sum()})")
    if np.isfinite(threshold):
        hist_ax.axvline(threshold, color="k", lw=1.5, ls="--", label=f"threshold {threshold:.4g}")
    hist_ax.set(xlabel="anomaly score (higher = less like normal sound)", ylabel="windows",
                title="anomaly scores")
    hist_ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def plot_detection(y, scores, threshold: float, out_path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Write :func:`build_detection_figure` to ``out_path`` (.png, .svg, .pdf, .jpg), atomically."""
    out = check_output_file(out_path, suffixes=IMAGE_SUFFIXES, example="roc.png")
    fig = build_detection_figure(y, scores, threshold, title=title)
    fmt = out.suffix.lower().lstrip(".")
    return write_atomic(out, lambda f: fig.savefig(f, format=fmt, dpi=100), what="plot")
