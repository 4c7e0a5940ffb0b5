"""Draw an evaluation's confusion matrix (``wavetrain evaluate --plot``): rows normalised (each
true value's row sums to 1, shown as colour), each cell annotated with its count and share.

A classifier's matrix has a row per true value and a column per predicted value, plus the
:data:`~wavetrain.evaluation.metrics.OTHER` column (answers outside the label values, such as a
GMM's ``unknown``) when some answer fell there. A detector's is two by two: normal and anomalous
windows against what the detector answered at its threshold (the normal value or ``anomaly``).

matplotlib is imported only here, without pyplot (an Agg canvas per figure).
"""
from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wavetrain.core.outputs import IMAGE_SUFFIXES, check_output_file, write_atomic
from wavetrain.evaluation.metrics import OTHER


@dataclass(frozen=True)
class ConfusionCells:
    """What the confusion plot shows.

    Attributes
    ----------
    rows, columns : list of str
        True values (those with windows) and predicted values, in order.
    counts : np.ndarray [shape=(rows, columns), int64]
    shares : np.ndarray [shape=(rows, columns), float64]
        ``counts`` divided by each row's total: every row sums to 1.
    text : list of list of str
        Each cell's annotation: its count, and its share in per cent (``0`` alone for an empty cell).
    """

    rows: list[str]
    columns: list[str]
    counts: np.ndarray
    shares: np.ndarray
    text: list[list[str]]


def _share_text(share: float) -> str:
    if 0 < share < 0.005:
        return "<1%"
    return f"{share:.0%}"


def confusion_cells(cm, rows: Sequence[str], columns: Sequence[str]) -> ConfusionCells:
    """The row-normalised matrix and its annotations of a count matrix ``cm`` (rows: true values,
    columns: predicted values, the last one possibly :data:`OTHER`).

    Rows without windows (values the model knows that the data lacks) are left out; the
    :data:`OTHER` column is kept only when some answer fell in it.
    """
    counts = np.asarray(cm, dtype=np.int64).reshape(len(rows), len(columns))
    keep_cols = [j for j, c in enumerate(columns) if c != OTHER or counts[:, j].any()]
    keep_rows = [i for i in range(len(rows)) if counts[i].sum() > 0]
    counts = counts[np.ix_(keep_rows, keep_cols)]
    shares = counts / counts.sum(axis=1, keepdims=True) if counts.size else counts.astype(np.float64)
    text = [[f"{n}\n{_share_text(s)}" if n else "0" for n, s in zip(count_row, share_row)]
            for count_row, share_row in zip(counts.tolist(), shares.tolist())]
    return ConfusionCells([rows[i] for i in keep_rows], [columns[j] for j in keep_cols], counts,
                          shares.astype(np.float64), text)


def result_cells(result: dict) -> ConfusionCells:
    """:func:`confusion_cells` of an evaluation result (``evaluate``'s report): a classifier's
    ``confusion`` with its row and column names, or a detector's windows at its threshold
    (``tn``, ``fp``, ``fn``, ``tp``) as a 2 x 2 matrix of the normal value and the others."""
    if result.get("detector"):
        normal = str(result.get("normal_value") or "normal")
        cm = [[result["tn"], result["fp"]], [result["fn"], result["tp"]]]
        return confusion_cells(cm, [f"{normal} (normal)", f"not {normal} (anomalous)"], [normal, "anomaly"])
    return confusion_cells(result["confusion"], result["confusion_rows"], result["confusion_columns"])


def build_confusion_figure(cells: ConfusionCells, *, true_label: str, predicted_label: str,
                           title: str | None = None):
    """The matrix as a matplotlib Figure: colour = share of the row, text = count and share.

    Parameters
    ----------
    cells : ConfusionCells
    true_label, predicted_label : str
        Axis labels, e.g. ``true word`` and ``predicted word``.
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
        With an Agg canvas; the matrix axes are labelled ``confusion``, its colour bar ``colorbar``;
        the title (wrapped to the figure's width) is the figure's suptitle.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n_rows, n_cols = cells.shares.shape
    side = max(n_rows, n_cols)
    cell_in = 0.75 if side <= 8 else max(0.42, 6.0 / side)      # inches a cell
    width = max(7.0, 2.6 + cell_in * n_cols)
    fig = Figure(figsize=(width, max(4.5, 2.2 + cell_in * n_rows)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(label="confusion")
    im = ax.imshow(cells.shares, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(n_cols), cells.columns, rotation=45 if side > 4 else 0,
                  ha="right" if side > 4 else "center", rotation_mode="anchor")
    ax.set_yticks(range(n_rows), cells.rows)
    ax.set_xlabel(predicted_label)
    ax.set_ylabel(true_label)
    size = 9 if side <= 8 else max(5.5, min(8.0, 150 / side))   # points: two lines fit a cell
    for i in range(n_rows):
        for j in range(n_cols):
            ax.text(j, i, cells.text[i][j], ha="center", va="center", fontsize=size,
                    color="white" if cells.shares[i, j] > 0.55 else "black")
    fig.colorbar(im, ax=ax, label="share of the true value's windows", fraction=0.05)
    fig.axes[-1].set_label("colorbar")
    if title:
        wrap = int(width * 12)     # characters of a 10-point line across the figure
        fig.suptitle("\n".join(textwrap.fill(line, wrap, break_long_words=False) for line in title.splitlines()),
                     fontsize=10)
    return fig


def plot_confusion(cells: ConfusionCells, out_path: str | os.PathLike, *, true_label: str,
                   predicted_label: str, title: str | None = None) -> Path:
    """Write :func:`build_confusion_figure` to ``out_path`` (.png, .svg, .pdf, .jpg), atomically."""
    out = check_output_file(out_path, option="--plot", suffixes=IMAGE_SUFFIXES, example="cm.png")
    fig = build_confusion_figure(cells, true_label=true_label, predicted_label=predicted_label, title=title)
    fmt = out.suffix.lower().lstrip(".")
    return write_atomic(out, lambda f: fig.savefig(f, format=fmt, dpi=100), what="plot")
