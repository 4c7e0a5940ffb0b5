"""Draw a detector's evaluation: the ROC curve (the pAUC region shaded) beside the histograms of
the anomaly scores of normal and anomalous windows (counts on a log axis), with the stored
threshold; or, by section and domain (``plot roc --by``), a panel per machine type and section
with the ROC curve of each domain.

matplotlib is imported only here, without pyplot (an Agg canvas per figure).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from wavetrain.core.outputs import IMAGE_SUFFIXES, check_output_file, write_atomic
from wavetrain.evaluation.dcase_scores import section_roc
from wavetrain.evaluation.detection_metrics import PAUC_MAX_FPR, partial_auc, roc_auc, roc_curve

#: The floor of the histograms' log count axis: a bin of one window rises a visible step above it.
HIST_FLOOR = 0.5


def build_detection_figure(y, scores, threshold: float, *, title: str | None = None):
    """A figure of the ROC curve and the two score histograms (``y``: 1 = anomalous window), the
    histograms' counts on a log axis (a class of a few windows stays visible beside one of
    hundreds)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

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
    # counts on a log axis: a class of a few windows beside one of hundreds stays visible (a bin
    # of one window reaches a visible height above the axis' floor of HIST_FLOOR)
    hist_ax.set_yscale("log")
    hist_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))   # 1, 10, 100: counts
    top = max([p.get_height() for p in hist_ax.patches] + [1.0])
    hist_ax.set_ylim(HIST_FLOOR, top * 1.6)
    hist_ax.set(xlabel="anomaly score (higher = less like normal sound)", ylabel="windows (log scale)",
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


#: Panels per row of the ROC curves per section.
SECTION_COLUMNS = 4


def build_section_roc_figure(y, scores, section, domain, report: dict, *, machine=None, title: str | None = None):
    """A grid of panels, one per machine type and section of ``report``
    (:func:`~wavetrain.evaluation.dcase_scores.dcase_report`), each with the ROC curve of each
    domain (that domain's normal recordings against every anomalous one of the section), its AUC
    in the legend and the section's pAUC in the panel's title; ``y``, ``scores``, ``section``,
    ``domain`` and ``machine`` are per recording, as the report was computed from."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    y = np.asarray(y, dtype=np.int64)
    s = np.asarray(scores, dtype=np.float64)
    sec = np.asarray(section, dtype=object)
    dom = np.asarray(domain, dtype=object)
    mac = np.full(y.size, None, dtype=object) if machine is None else np.asarray(machine, dtype=object)
    groups = report["groups"]
    cols = min(SECTION_COLUMNS, max(1, len(groups)))
    rows = -(-max(1, len(groups)) // cols)
    fig = Figure(figsize=(max(3.4 * cols, 8.0), 3.3 * rows + (0.6 if title else 0)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)).ravel()
    colours = ("tab:blue", "tab:red")
    for ax, g in zip(axes, groups):
        idx = (mac == g["machine"]) & (sec == g["section"]) & np.isfinite(s)
        for which, colour in zip(report["domains"], colours):
            fpr, tpr = section_roc(y[idx], s[idx], dom[idx], which)
            auc = g["auc"][which]
            if fpr.size:
                ax.plot(fpr, tpr, color=colour, lw=1.8, label=f"{which}: AUC {auc:.3f}")
            else:
                ax.plot([], [], color=colour, label=f"{which}: AUC n/a")
        ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--")
        ax.axvspan(0, report["max_fpr"], color="tab:orange", alpha=0.12)
        pauc = "n/a" if g["pauc"] is None else f"{g['pauc']:.3f}"
        name = g["section"] if g["machine"] is None else f"{g['machine']} {g['section']}"
        ax.set_title(f"{name} \u2014 pAUC {pauc}", fontsize=10)
        ax.set(xlim=(0, 1), ylim=(0, 1.02))
        ax.legend(loc="lower right", fontsize=8)
    for ax in axes[len(groups):]:
        ax.set_visible(False)
    for ax in axes[(rows - 1) * cols:]:
        ax.set_xlabel("false-positive rate")
    for ax in axes[::cols]:
        ax.set_ylabel("true-positive rate")
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def plot_section_roc(y, scores, section, domain, report: dict, out_path: str | os.PathLike, *, machine=None,
                     title: str | None = None) -> Path:
    """Write :func:`build_section_roc_figure` to ``out_path`` (.png, .svg, .pdf, .jpg), atomically."""
    out = check_output_file(out_path, suffixes=IMAGE_SUFFIXES, example="roc.png")
    fig = build_section_roc_figure(y, scores, section, domain, report, machine=machine, title=title)
    fmt = out.suffix.lower().lstrip(".")
    return write_atomic(out, lambda f: fig.savefig(f, format=fmt, dpi=100), what="plot")
