"""What the plots show a user on real recordings: the ROC histograms keep a class of a few windows
visible beside one of hundreds, ``plot history`` marks the epoch whose weights were kept, and
``wavetrain plot`` labels band features in Hz, ends its feature image where the waveform ends and
titles the figure with what the user set."""
from __future__ import annotations

import numpy as np

from wavetrain.cli.main import main

RATE = 16000


def _axes(fig, label):
    (ax,) = [a for a in fig.axes if a.get_label() == label]
    return ax


def _bar_fraction(ax, height: float) -> float:
    """How far up the axes (0: bottom, 1: top) a bar of ``height`` counts reaches."""
    x = ax.get_xlim()[0]
    return float(ax.transAxes.inverted().transform(ax.transData.transform((x, height)))[1])


# ---- the ROC histograms ------------------------------------------------------------------------
def test_roc_histograms_keep_a_small_class_visible_beside_a_large_one():
    from wavetrain.evaluation.detection_plot import build_detection_figure

    rng = np.random.default_rng(0)
    normal, anomalous = rng.normal(0.0, 0.3, 6), rng.normal(2.0, 0.6, 642)
    y = np.r_[np.zeros(6, int), np.ones(642, int)]
    fig = build_detection_figure(y, np.r_[normal, anomalous], 1.0)
    hist = fig.axes[1]
    assert hist.get_yscale() == "log" and "log" in hist.get_ylabel()
    small = [p for p in hist.patches if p.get_facecolor()[2] > p.get_facecolor()[0]]   # tab:blue: normal
    large = [p for p in hist.patches if p.get_facecolor()[0] > p.get_facecolor()[2]]
    assert sum(p.get_height() for p in small) == 6 and sum(p.get_height() for p in large) == 642
    fig.canvas.draw()
    tallest_small = max(p.get_height() for p in small)
    tallest_large = max(p.get_height() for p in large)
    # the normal windows' tallest bar reaches a tenth of the axes at least (on a linear axis: ~1%),
    # a bar of one window stands above the floor, and the largest bar stays inside the axes
    assert _bar_fraction(hist, tallest_small) > 0.1
    assert _bar_fraction(hist, 1) > 0.05
    assert _bar_fraction(hist, tallest_large) < 1.0


# ---- plot history: the kept epoch --------------------------------------------------------------
def _history(best_epoch=None):
    out = []
    for e in range(1, 6):
        h = {"epoch": float(e), "iteration": 10 * e, "train_loss": 2.0 / (1 + e), "valid_loss": 1.0 + (e - 3) ** 2 / 10,
             "top1": 0.5, "top5": 1.0, "macro_f1": 0.4}
        if best_epoch is not None:
            h["best"] = e == best_epoch
        out.append(h)
    return out


def test_history_marks_the_epoch_whose_weights_were_kept():
    from wavetrain.train.history_plot import build_history_figure

    fig = build_history_figure(_history(best_epoch=3), n_values=3)
    loss = _axes(fig, "loss")
    (star,) = [ln for ln in loss.lines if ln.get_label() == "kept: epoch 3"]
    assert list(star.get_xdata()) == [3.0] and list(star.get_ydata()) == [1.0]     # on the validation loss
    assert "kept: epoch 3" in [t.get_text() for t in loss.get_legend().get_texts()]
    for ax in fig.axes:                     # a line through every panel at that epoch
        assert any(list(ln.get_xdata()) == [3.0, 3.0] for ln in ax.lines), ax.get_label()
    # no kept validation recorded (a run without validation, or an older file): nothing marked
    plain = build_history_figure(_history(), n_values=3)
    assert not any("kept" in ln.get_label() for ax in plain.axes for ln in ax.lines)


def test_plot_history_command_marks_the_kept_epoch(tmp_path, monkeypatch):
    from wavetrain.models import modelfile
    from wavetrain.train import history_plot

    figs = []
    build = history_plot.build_history_figure
    monkeypatch.setattr(history_plot, "build_history_figure", lambda *a, **k: figs.append(build(*a, **k)) or figs[-1])
    meta = {"model": "cnn", "labels": ["a", "b", "c"], "label_name": "word", "history": _history(best_epoch=4)}
    monkeypatch.setattr(modelfile, "describe_model", lambda path: (meta, {}))
    model = tmp_path / "cnn.wt"
    model.write_bytes(b"stands in for a model file")
    assert main(["plot", "history", "-m", str(model), "-o", str(tmp_path / "h.png")]) == 0
    (fig,) = figs
    assert "kept: epoch 4" in [t.get_text() for t in _axes(fig, "loss").get_legend().get_texts()]
