"""What the plots show a user on real recordings: the ROC histograms keep a class of a few windows
visible beside one of hundreds, ``plot history`` marks the epoch whose weights were kept, and
``wavetrain plot`` labels band features in Hz, ends its feature image where the waveform ends and
titles the figure with what the user set."""
from __future__ import annotations

import numpy as np
import pytest

from wavetrain.cli import plot_cmd
from wavetrain.cli.main import main
from wavetrain.features import parse_spec

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


# ---- wavetrain plot: the feature axis in Hz, one time extent, a short title -----------------------
def _signal(seconds=0.5):
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.4 * np.sin(2 * np.pi * (300 + 1500 * t / seconds) * t)).astype(np.float32)


def _gram(spec, seconds=0.5):
    fig = plot_cmd.build_figure(_signal(seconds), RATE, spec, "t")
    return fig, _axes(fig, "gram")


def _ticks(ax):
    return list(ax.get_yticks()), [t.get_text() for t in ax.get_yticklabels()]


def test_mel_bands_are_labelled_in_hz_at_their_centre_frequencies():
    from wavetrain.features.filters import mel_edges

    _, gram = _gram("logmel(bands=32)")
    assert gram.get_ylabel() == "frequency (Hz, mel scale)"
    where, text = _ticks(gram)
    assert "1000" in text and len(text) >= 3
    centres = mel_edges(32, 0.0, RATE / 2, False)[1:-1]
    for pos, label in zip(where, text):
        row = int(pos)                  # row i spans [i, i + 1], its centre frequency at i + 0.5
        lo, hi = (centres[row - 1], centres[row]) if pos < row + 0.5 else (centres[row], centres[row + 1])
        assert lo <= float(label) <= hi, (label, pos)
    assert gram.get_ylim() == (0.0, 32.0)


def test_fft_bins_are_labelled_in_hz_and_cepstra_by_coefficient():
    _, gram = _gram("fft(window_ms=32, fmax=4000)")
    assert gram.get_ylabel() == "frequency (Hz)"
    where, text = _ticks(gram)
    # 32 ms at 16 kHz: bins every 31.25 Hz from 0 Hz, bin k's centre at row k + 0.5
    hz = [float(t) for t in text]
    assert hz[0] == 0.0 and hz[-1] == 4000.0 and all(v % 500 == 0 for v in hz)
    np.testing.assert_allclose(where, [v / 31.25 + 0.5 for v in hz])
    _, gram = _gram("mfcc(coeffs=13)")
    assert gram.get_ylabel() == "coefficient"
    _, gram = _gram("mfcc(coeffs=13) | delta")
    assert gram.get_ylabel() == "coefficient"
    _, gram = _gram("stats")
    assert "Hz" not in gram.get_ylabel()


@pytest.mark.parametrize("spec", ["logmel(bands=32)", "logmel(bands=32, window_ms=25, shift_pct=40)",
                                  "mfcc(coeffs=13) | delta"])
def test_the_gram_spans_the_waveform_with_columns_centred_on_their_frames(spec):
    seconds = 0.5
    fig, gram = _gram(spec, seconds)
    x0, x1, _, _ = gram.images[0].get_extent()
    assert (x0, x1) == pytest.approx((0.0, seconds))
    assert _axes(fig, "waveform").get_xlim() == gram.get_xlim() == (0.0, seconds)
    parsed = parse_spec(spec)
    ext = parsed.build_extractor()
    n = ext.n_frames(int(RATE * seconds), RATE)
    edges = plot_cmd.frame_edges(parsed, RATE, int(RATE * seconds), n)
    size, step = ext.frame_size(RATE), ext.frame_step(RATE, ext.frame_size(RATE))
    centres = (np.arange(n) * step + size / 2) / RATE
    assert edges[0] == 0.0 and edges[-1] == pytest.approx(seconds) and np.all(np.diff(edges) > 0)
    assert np.all((edges[:-1] <= centres) & (centres <= edges[1:]))
    inner = np.diff(edges)[1:-1]
    np.testing.assert_allclose(inner, step / RATE)         # the inner columns: one frame shift each


def test_the_title_shows_only_the_parameters_set_away_from_their_defaults():
    spec = parse_spec("logmel(bands=64, window_ms=40, fmax=6000)")
    title = plot_cmd.default_title("dog1.wav", spec)
    assert title == "dog1.wav: logmel(fmax=6000)"
    assert plot_cmd.default_title("x.wav", parse_spec("logmel")) == "x.wav: logmel"
    long = parse_spec("mfcc(coeffs=20, bands=40, window_ms=25, shift_pct=40) | delta(order=1) | normalize(axis=time)")
    short = plot_cmd.short_spec(long)
    assert parse_spec(short) == long and "\n" not in plot_cmd.default_title("a.wav", long)
    assert "n_fft" not in short and "per_axis" not in short
