"""Draw a training history (the ``history`` list of a model file) as an image.

Two kinds of history are drawn:

* neural models (one entry per validation, ``epoch``, ``train_loss``, ``valid_loss``, ``top1``,
  ``top5``, ``macro_f1``): the losses (the y axis says what the family's loss measures, e.g.
  cross-entropy or reconstruction error) and, when the run had validation data, the validation
  scores in a second panel sharing the epoch axis (ticks on whole epochs; no top-5 accuracy for
  a model of five values or fewer, where it is always 1); the validation whose weights the model
  kept (the entry marked ``best``) is starred on the loss curve, "kept: epoch N" in the legend,
  with a dotted line through every panel;
* GMMs (one entry per EM pass, ``iteration``, ``mean_loglik``): one panel of the mean frame
  log-likelihood against the EM pass.

matplotlib is imported only here, without pyplot (an Agg canvas per figure).
"""
from __future__ import annotations

import math
import os
from numbers import Real
from pathlib import Path

from wavetrain.core.errors import UserError
from wavetrain.core.outputs import IMAGE_SUFFIXES, check_output_file, write_atomic

#: Keys of a neural history entry that are drawn (plus ``epoch`` on the x axis).
NEURAL_KEYS = ("train_loss", "valid_loss", "top1", "top5", "macro_f1")
#: Keys of a GMM (EM) history entry that are drawn (``iteration`` on the x axis).
EM_KEYS = ("mean_loglik",)
_X_KEYS = ("epoch", "iteration")
_SCORES = (("top1", "top-1 accuracy"), ("top5", "top-5 accuracy"), ("macro_f1", "macro-F1"))
#: Label values a model needs for its top-5 accuracy to say anything (with five or fewer the true
#: value is always among the top five).
TOP5_MIN_VALUES = 6


def _is_number(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def check_history(history) -> str:
    """Check that ``history`` can be drawn; returns its kind, ``'neural'`` or ``'em'``.

    Raises
    ------
    UserError
        One line: not a list, empty, an entry that is not a mapping, a value that is not a
        number, or no value to draw.
    """
    if history is None:
        history = []
    if not isinstance(history, (list, tuple)):
        raise UserError(f"the training history is {type(history).__name__} data, not a list of "
                        "entries; the model file is damaged or was not written by wavetrain")
    if not history:
        raise UserError("the model has no training history to plot")
    for i, h in enumerate(history, 1):
        if not isinstance(h, dict):
            raise UserError(f"training history entry {i} is {type(h).__name__} data, not a mapping "
                            "of values; the model file is damaged or was not written by wavetrain")
        for key in (*_X_KEYS, *NEURAL_KEYS, *EM_KEYS):
            v = h.get(key)
            if v is not None and not _is_number(v):
                raise UserError(f"training history entry {i}: {key}={str(v)[:40]!r} is not a number; "
                                "the model file is damaged or was not written by wavetrain")
        for key in _X_KEYS:
            v = h.get(key)
            if v is not None and not math.isfinite(v):
                raise UserError(f"training history entry {i}: {key}={v} is not a finite number")

    def drawable(keys) -> bool:
        return any(_is_number(h.get(k)) and math.isfinite(h[k]) for h in history for k in keys)

    if drawable(NEURAL_KEYS):
        return "neural"
    if drawable(EM_KEYS):
        return "em"
    raise UserError("the training history has no finite value to plot (expected train_loss, "
                    "valid_loss, top1, top5, macro_f1 or mean_loglik)")


def _series(history: list[dict], key: str, x_key: str) -> tuple[list[float], list[float]]:
    """The finite values of ``key`` against ``x_key`` (the entry's position when missing)."""
    xs, ys = [], []
    for i, h in enumerate(history):
        v = h.get(key)
        if v is None or not math.isfinite(v):
            continue
        x = h.get(x_key)
        xs.append(float(i + 1 if x is None else x))
        ys.append(float(v))
    return xs, ys


def _whole_ticks(ax, xs: list[float]) -> None:
    """Ticks on whole numbers only (the points may sit between them), at least two in view."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    lo, hi = min(xs), max(xs)
    if math.ceil(lo) >= math.floor(hi):  # at most one whole number inside the data: widen
        ax.set_xlim(math.floor(lo) if lo > math.floor(lo) else lo - 0.5,
                    math.ceil(hi) if hi < math.ceil(hi) else hi + 0.5)


def build_history_figure(meta_history: list[dict], *, title: str | None = None,
                         loss_label: str = "cross-entropy loss", n_values: int | None = None):
    """The history as a matplotlib Figure (see the module docstring for the two kinds).

    ``loss_label`` is what the loss measures (the y axis of the loss panel); ``n_values`` the
    model's label values, when known: below :data:`TOP5_MIN_VALUES` the top-5 accuracy is not
    drawn.

    Raises
    ------
    UserError
        From :func:`check_history`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    em = check_history(meta_history) == "em"
    shown = [key for key, _ in _SCORES if key != "top5" or n_values is None or n_values >= TOP5_MIN_VALUES]
    scores = {key: _series(meta_history, key, "epoch") for key in shown}
    two_panels = not em and any(xs for xs, _ in scores.values())
    shares = [(h["epoch"], h["device_shares"]) for h in meta_history
              if isinstance(h.get("device_shares"), list) and _is_number(h.get("epoch"))]
    names = device_names(meta_history, len(shares[0][1]) if shares else 0)
    panels = 1 + two_panels + bool(shares)
    fig = Figure(figsize=(7, 1.5 + 3 * panels if panels > 1 else 4.5))
    FigureCanvasAgg(fig)
    if em:
        _draw_em(fig, meta_history, title)
    else:
        _draw_neural(fig, meta_history, scores if two_panels else None, title, loss_label, shares, names)
    fig.tight_layout()
    return fig


def _draw_em(fig, history: list[dict], title: str | None) -> None:
    """One panel: the mean frame log-likelihood per EM pass."""
    ax = fig.add_subplot(label="loglik")
    xs, ys = _series(history, "mean_loglik", "iteration")
    ax.plot(xs, ys, marker="o", markersize=3, label="training data")
    ax.set_xlabel("EM pass")
    ax.set_ylabel("mean frame log-likelihood")
    ax.ticklabel_format(axis="y", useOffset=False)  # real values, never "-1.23e1 + ..."
    ax.grid(True, alpha=0.3)
    _whole_ticks(ax, xs)
    ax.set_title(title or "EM training history", fontsize=10)


def device_names(history: list[dict], n: int) -> list[str]:
    """Names of a device group's ``n`` devices for a legend: as the history records them
    (``cpu``, ``cuda:0``; a name given twice is numbered, ``cpu #1``, ``cpu #2``), else ``device k``."""
    recorded = next((h["devices"] for h in history if isinstance(h.get("devices"), str)), "")
    names = [d.strip() for d in recorded.split(",")] if recorded else []
    if len(names) != n or not all(names):
        return [f"device {k + 1}" for k in range(n)]
    counts: dict[str, int] = {}
    out = []
    for name in names:
        counts[name] = counts.get(name, 0) + 1
        out.append(f"{name} #{counts[name]}" if names.count(name) > 1 else name)
    return out


def _draw_neural(fig, history: list[dict], scores: dict | None, title: str | None, loss_label: str,
                 shares: list | None = None, names: list[str] | None = None) -> None:
    """Losses per epoch; when there are validation scores, a panel of them; for a device group,
    each device's share of the batch."""
    rows = 1 + bool(scores) + bool(shares)
    ax_loss = fig.add_subplot(rows, 1, 1, label="loss")
    all_x: list[float] = []
    for key, label in (("train_loss", "training data"), ("valid_loss", "validation data")):
        xs, ys = _series(history, key, "epoch")
        if xs:
            all_x += xs
            ax_loss.plot(xs, ys, marker="o", markersize=3, label=label)
    kept = kept_epoch(history)
    if kept is not None:
        epoch, loss = kept
        if loss is not None:
            ax_loss.plot([epoch], [loss], marker="*", markersize=14, color="tab:red", linestyle="none",
                         label=f"kept: epoch {epoch:g}", zorder=5)
        else:
            ax_loss.plot([], [], color="tab:red", ls=":", label=f"kept: epoch {epoch:g}")
    ax_loss.set_ylabel(loss_label)
    ax_loss.ticklabel_format(axis="y", useOffset=False)
    ax_loss.grid(True, alpha=0.3)
    if all_x:
        ax_loss.legend(loc="upper right")
    ax_loss.set_title(title or "training history", fontsize=10)
    ax_x = ax_loss
    if scores:
        ax_x = fig.add_subplot(rows, 1, 2, sharex=ax_loss, label="scores")
        for key, label in _SCORES:
            if key not in scores:
                continue
            xs, ys = scores[key]
            if xs:
                all_x += xs
                ax_x.plot(xs, ys, marker="o", markersize=3, label=label)
        ax_x.set_ylabel("validation score")
        ax_x.set_ylim(-0.02, 1.02)
        ax_x.grid(True, alpha=0.3)
        ax_x.legend(loc="lower right")
        ax_loss.tick_params(labelbottom=False)
    if shares:
        above = ax_x
        ax_x = fig.add_subplot(rows, 1, rows, sharex=ax_loss, label="shares")
        xs = [e for e, _ in shares]
        for k in range(len(shares[0][1])):
            ax_x.plot(xs, [s[k] if k < len(s) else None for _, s in shares], marker="o", markersize=3,
                      label=names[k] if names and k < len(names) else f"device {k + 1}")
        ax_x.set_ylabel("share of each batch")
        ax_x.set_ylim(-0.02, 1.02)
        ax_x.grid(True, alpha=0.3)
        ax_x.legend(loc="upper right")
        above.tick_params(labelbottom=False)
    ax_x.set_xlabel("epoch")
    _whole_ticks(ax_x, all_x)
    if kept is not None:
        for ax in fig.axes:
            ax.axvline(kept[0], color="tab:red", lw=1, ls=":", zorder=1)


def kept_epoch(history: list[dict]) -> tuple[float, float | None] | None:
    """The epoch of the validation whose weights the model kept (the entry training marked
    ``best``) and its validation loss (else its training loss; None when neither is finite), or
    None when no entry is marked (no validation, or a run that kept its last weights)."""
    for h in history:
        if h.get("best") is True and _is_number(h.get("epoch")):
            loss = next((float(h[k]) for k in ("valid_loss", "train_loss")
                         if _is_number(h.get(k)) and math.isfinite(h[k])), None)
            return float(h["epoch"]), loss
    return None


def plot_history(meta_history: list[dict], out_path: str | os.PathLike, *, title: str | None = None,
                 loss_label: str = "cross-entropy loss", n_values: int | None = None) -> Path:
    """Write a plot of ``meta_history`` to ``out_path`` (format from the suffix: .png, .svg, .pdf,
    .jpg), atomically.

    Parameters
    ----------
    meta_history : list of dict
        A neural history (one entry per validation with ``epoch``, ``train_loss``,
        ``valid_loss``, ``top1``, ``top5``, ``macro_f1``; missing or ``None`` values are
        skipped) or a GMM history (one entry per EM pass with ``iteration``, ``mean_loglik``).
    out_path : path
    title : str, optional
    loss_label : str
        Y label of a neural history's loss panel: what the family's loss measures.
    n_values : int, optional
        The model's label values: with fewer than :data:`TOP5_MIN_VALUES` no top-5 accuracy.

    Raises
    ------
    UserError
        An empty or malformed history (see :func:`check_history`), or an output path that cannot
        be written.
    """
    out = check_output_file(out_path, suffixes=IMAGE_SUFFIXES, example="history.png")
    fig = build_history_figure(meta_history, title=title, loss_label=loss_label, n_values=n_values)
    fmt = out.suffix.lower().lstrip(".")
    return write_atomic(out, lambda f: fig.savefig(f, format=fmt, dpi=100), what="plot")
