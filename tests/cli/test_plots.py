"""`wavetrain plot` and `wavetrain plot history`: layout, titles, scaling, channel marks, input and
output checks, and training histories of both kinds (neural and GMM)."""
import json
import math
import os

import numpy as np
import pytest
import soundfile as sf

from wavetrain.cli import plot_cmd
from wavetrain.cli.main import main
from wavetrain.features import extract, parse_spec
from wavetrain.train.history_plot import build_history_figure, plot_history

RATE = 16000
PNG = b"\x89PNG\r\n\x1a\n"


def _signal(seconds=0.5, seed=0):
    """A rising tone over a faint noise floor: every feature row varies over time."""
    t = np.arange(int(RATE * seconds)) / RATE
    rng = np.random.default_rng(seed)
    f = 300 + 1500 * t / seconds
    x = 0.4 * np.sin(2 * np.pi * np.cumsum(f) / RATE) * np.linspace(0.2, 1, t.size)
    return (x + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.fixture
def wav(tmp_path):
    path = tmp_path / "tone.wav"
    sf.write(path, _signal(), RATE)
    return path


@pytest.fixture
def stereo(tmp_path):
    path = tmp_path / "two.wav"
    sf.write(path, np.stack([_signal(seed=1), 0.5 * _signal(seed=2)[::-1]], axis=1), RATE)
    return path


@pytest.fixture
def figures(monkeypatch):
    """The figures `wavetrain plot` builds, with the title it was given."""
    seen = []
    build = plot_cmd.build_figure

    def spy(samples, rate, spec, title):
        fig = build(samples, rate, spec, title)
        seen.append({"fig": fig, "spec": parse_spec(spec), "title": title, "shape": samples.shape})
        return fig

    monkeypatch.setattr(plot_cmd, "build_figure", spy)
    return seen


def _axes(fig, label):
    (ax,) = [a for a in fig.axes if a.get_label() == label]
    return ax


def _error_line(capsys, code):
    """The one-line error of a run that failed with exit code 2."""
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("wavetrain: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def _model_file(path, history, model="gmm"):
    """A model file holding only metadata (what `plot history` reads)."""
    from wavetrain.models import modelfile

    meta = {"format": modelfile.FORMAT, "format_version": modelfile.FORMAT_VERSION, "model": model,
            "params": {}, "labels": ["a", "b"], "label_name": "state", "history": history}
    with open(path, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    return path


def _visible_xticks(ax):
    lo, hi = ax.get_xlim()
    return [t for t in ax.get_xticks() if lo - 1e-9 <= t <= hi + 1e-9]


GMM_HISTORY = [{"iteration": i, "mean_loglik": -60.0 + 20 * (1 - 0.5 ** i), "frames": 12345,
                "active_labels": 2} for i in range(1, 7)]


def _neural_history(epochs, valid=True):
    out = []
    for i, e in enumerate(epochs, 1):
        h = {"epoch": e, "iteration": 10 * i, "train_loss": 2.0 / (1 + e), "valid_loss": None,
             "top1": None, "top5": None, "macro_f1": None, "lr": 1e-3, "samples_per_s": 900.0}
        if valid:
            h.update(valid_loss=2.2 / (1 + e), top1=min(1.0, 0.3 + 0.1 * e), top5=1.0,
                     macro_f1=min(1.0, 0.2 + 0.1 * e))
        out.append(h)
    return out


# ---- 1. one time extent for both panels ------------------------------------------------------
@pytest.mark.parametrize("spec", ["logmel(bands=32)", "mfcc(coeffs=13) | delta(order=2)"])
def test_plot_waveform_and_gram_share_the_same_x_extent(spec):
    fig = plot_cmd.build_figure(_signal(), RATE, spec, "title")
    fig.canvas.draw()
    wave, gram = _axes(fig, "waveform").get_position(), _axes(fig, "gram").get_position()
    assert wave.x0 == pytest.approx(gram.x0, abs=1e-9)
    assert wave.x1 == pytest.approx(gram.x1, abs=1e-9)
    assert _axes(fig, "waveform").get_xlim() == _axes(fig, "gram").get_xlim() == (0.0, 0.5)
    assert _axes(fig, "colorbar").get_position().x0 > gram.x1


# ---- 2. title: file name and the spec's parameters that are not at their defaults -------------
def test_plot_title_is_file_name_and_short_spec(capsys, wav, tmp_path, figures):
    out = tmp_path / "p.png"
    assert main(["plot", str(wav), "--features", "mfcc(coeffs=20)|delta", "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    title = figures[0]["title"]
    assert title == "tone.wav: mfcc(coeffs=20) | delta"
    assert parse_spec(title.split(": ", 1)[1]) == parse_spec("mfcc(coeffs=20)|delta")
    assert _axes(figures[0]["fig"], "waveform").get_title(loc="left") == title
    assert main(["plot", str(wav), "--title", "mine", "-o", str(out)]) == 0
    assert figures[1]["title"] == "mine"


# ---- 3. rows standardised for mfcc / processed specs, raw values for log-mel ------------------
def test_plot_mfcc_delta_rows_are_standardised_and_logmel_is_raw():
    x = _signal()
    spec = "mfcc(coeffs=13) | delta(order=2)"
    fig = plot_cmd.build_figure(x, RATE, spec, "t")
    img = np.asarray(_axes(fig, "gram").images[0].get_array(), dtype=np.float64)
    feats = extract(x, RATE, spec)
    assert img.shape == feats.T.shape
    np.testing.assert_allclose(img.mean(axis=1), 0.0, atol=1e-4)
    np.testing.assert_allclose(img.std(axis=1), 1.0, atol=1e-3)
    assert np.ptp(feats.mean(axis=0)) > 20  # c0 really dwarfs the other rows
    assert "standardised" in _axes(fig, "colorbar").get_ylabel()

    fig = plot_cmd.build_figure(x, RATE, "logmel(bands=32)", "t")
    img = np.asarray(_axes(fig, "gram").images[0].get_array())
    np.testing.assert_array_equal(img, extract(x, RATE, "logmel(bands=32)").T)
    assert "standardised" not in _axes(fig, "colorbar").get_ylabel()


def test_plot_standardising_keeps_a_constant_row_finite():
    x = np.zeros(RATE // 2, dtype=np.float32)
    x[::400] = 0.5  # a click train: some rows are constant over time
    fig = plot_cmd.build_figure(x, RATE, "mfcc(coeffs=8) | delta(order=1)", "t")
    img = np.asarray(_axes(fig, "gram").images[0].get_array())
    assert np.isfinite(img).all()


# ---- 4. per-axis channel blocks ---------------------------------------------------------------
def test_plot_per_axis_two_channels_marks_the_channel_blocks(capsys, stereo, tmp_path, figures):
    out = tmp_path / "p.png"
    assert main(["plot", str(stereo), "--features", "logmel(bands=16, per_axis=true)",
                 "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    (seen,) = figures
    assert seen["shape"] == (RATE // 2, 2)
    gram = _axes(seen["fig"], "gram")
    seps = [ln for ln in gram.lines if ln.get_label() == "block separator"]
    assert [tuple(ln.get_ydata()) for ln in seps] == [(16, 16)]
    labels = [t.get_text() for t in gram.texts]
    assert labels == ["ch 1", "ch 2"]
    assert gram.images[0].get_array().shape == (32, extract(
        sf.read(stereo, dtype="float32")[0], RATE, "logmel(bands=16, per_axis=true)").shape[0])


def test_plot_blocks_of_per_axis_delta_and_mono_logmel():
    two = np.stack([_signal(seed=1), _signal(seed=2)], axis=1)
    spec = parse_spec("logmel(bands=8, per_axis=true) | delta(order=1)")
    assert plot_cmd.feature_blocks(spec, RATE, 2, 32) == [("ch 1", 8), ("ch 2", 8),
                                                          ("Δ ch 1", 8), ("Δ ch 2", 8)]
    gram = _axes(plot_cmd.build_figure(two, RATE, spec, "t"), "gram")
    assert len([ln for ln in gram.lines if ln.get_label() == "block separator"]) == 3
    gram = _axes(plot_cmd.build_figure(_signal(), RATE, "logmel(bands=16)", "t"), "gram")
    assert not gram.lines and not gram.texts
    assert gram.get_ylabel() == "frequency (Hz, mel scale)"


# ---- 5. one audio file only -------------------------------------------------------------------
def test_plot_refuses_a_metadata_csv_a_folder_and_a_missing_file(capsys, demo_csv, tmp_path):
    from wavetrain.data import load_dataset

    n = len(load_dataset(demo_csv, check=False))
    out = tmp_path / "p.png"
    for target in (demo_csv, demo_csv.parent):
        err = _error_line(capsys, main(["plot", str(target), "-o", str(out)]))
        assert f"listing {n} recordings" in err and "one audio file" in err
    err = _error_line(capsys, main(["plot", str(tmp_path / "nope.wav"), "-o", str(out)]))
    assert "nope.wav: no such audio file" in err
    assert not out.exists()


# ---- 6. --features, with --spec as an alias ---------------------------------------------------
@pytest.mark.parametrize("option", ["--features", "--spec"])
def test_plot_accepts_features_and_spec_alias(capsys, wav, tmp_path, figures, option):
    out = tmp_path / "p.svg"
    assert main(["plot", str(wav), option, "mfcc(coeffs=8)", "-o", str(out)]) == 0
    assert figures[0]["spec"] == parse_spec("mfcc(coeffs=8)")
    assert out.read_bytes().lstrip().startswith(b"<?xml")


# ---- 7. GMM history ---------------------------------------------------------------------------
def test_history_of_a_gmm_is_one_panel_of_loglik_per_em_pass():
    fig = build_history_figure(GMM_HISTORY, title="gmm on state")
    (ax,) = fig.axes
    assert ax.get_xlabel() == "EM pass"
    assert ax.get_ylabel() == "mean frame log-likelihood"
    (line,) = ax.lines
    np.testing.assert_allclose(line.get_ydata(), [h["mean_loglik"] for h in GMM_HISTORY])
    assert np.all(np.diff(line.get_ydata()) > 0)  # the log-likelihood itself, rising
    assert all(float(t).is_integer() for t in _visible_xticks(ax))
    fig.canvas.draw()
    box = ax.yaxis.label.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= 0 and box.y0 >= 0 and box.y1 <= fig.bbox.height  # the label is not cut


def test_history_of_a_converged_gmm_shows_real_loglik_values():
    flat = [dict(h, mean_loglik=-12.3097 + 0.001 * i) for i, h in enumerate(GMM_HISTORY)]
    fig = build_history_figure(flat)
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.yaxis.get_offset_text().get_text() == ""  # no "-1.23e1" offset above the axis
    labels = [t.get_text().replace("\u2212", "-") for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(lab.startswith("-12.3") for lab in labels)


@pytest.fixture(scope="module")
def gmm_model(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("gmm") / "g.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm",
                 "--set", "components=2", "-o", str(path)]) == 0
    return path


def test_plot_history_of_a_trained_gmm(capsys, gmm_model, tmp_path, monkeypatch):
    from wavetrain.train import history_plot

    figs = []
    build = history_plot.build_history_figure
    monkeypatch.setattr(history_plot, "build_history_figure",
                        lambda *a, **k: figs.append(build(*a, **k)) or figs[-1])
    out = tmp_path / "h.png"
    assert main(["plot", "history", "-m", str(gmm_model), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    (ax,) = figs[0].axes
    assert ax.get_xlabel() == "EM pass" and ax.get_ylabel() == "mean frame log-likelihood"
    assert "g.wt" in ax.get_title() and "gmm" in ax.get_title()


def test_neural_history_without_validation_has_only_the_loss_panel():
    fig = build_history_figure(_neural_history([1.0, 2.0, 3.0], valid=False))
    (ax,) = fig.axes
    assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == "cross-entropy loss"
    assert not ax.texts
    fig = build_history_figure(_neural_history([1.0, 2.0, 3.0]))
    assert [a.get_label() for a in fig.axes] == ["loss", "scores"]


# ---- 8. whole-epoch ticks ---------------------------------------------------------------------
def test_history_ticks_whole_epochs_only():
    fig = build_history_figure(_neural_history([1.0, 2.0, 3.0, 4.0]))
    ticks = _visible_xticks(fig.axes[-1])
    assert ticks and all(float(t).is_integer() for t in ticks)

    epochs = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    fig = build_history_figure(_neural_history(epochs))
    ticks = _visible_xticks(fig.axes[-1])
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)
    assert list(fig.axes[0].lines[0].get_xdata()) == epochs  # points stay where they are

    fig = build_history_figure(_neural_history([0.25, 0.5, 0.75]))  # less than one epoch
    ticks = _visible_xticks(fig.axes[-1])
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)


# ---- 9. garbage histories and model files -----------------------------------------------------
@pytest.mark.parametrize("history", [
    "not a list", {"epoch": 1}, [1, 2, 3], [{"epoch": "one", "train_loss": 1.0}],
    [{"epoch": 1, "train_loss": "low"}], [{"iteration": 1, "mean_loglik": [1, 2]}],
    [{"epoch": 1, "train_loss": True}], [{"lr": 0.1}], [], None,
])
def test_plot_history_of_a_garbage_history_is_one_line(capsys, tmp_path, history):
    model = _model_file(tmp_path / "m.wt", history, model="cnn")
    out = tmp_path / "h.png"
    err = _error_line(capsys, main(["plot", "history", "-m", str(model), "-o", str(out)]))
    assert "m.wt" in err
    assert not out.exists()


def test_plot_history_of_a_missing_or_non_model_file_is_one_line(capsys, tmp_path, wav):
    out = tmp_path / "h.png"
    for model, says in ((tmp_path / "none.wt", "no such model file"), (wav, "tone.wav"),
                        (tmp_path, "is a folder")):
        err = _error_line(capsys, main(["plot", "history", "-m", str(model), "-o", str(out)]))
        assert says in err
    assert not out.exists()


def test_plot_history_skips_non_finite_losses(tmp_path):
    hist = _neural_history([1.0, 2.0, 3.0])
    hist[1]["train_loss"] = math.nan
    out = plot_history(hist, tmp_path / "h.png")
    assert out.read_bytes()[:8] == PNG
    assert len(build_history_figure(hist).axes[0].lines[0].get_xdata()) == 2


# ---- 10. -o checked before any work -----------------------------------------------------------
def _bad_outputs(tmp_path):
    target = tmp_path / "target.png"
    target.write_bytes(b"keep")
    link = tmp_path / "link.png"
    link.symlink_to(target)
    (tmp_path / "dir.png").mkdir()
    return [("", "empty path"), (str(tmp_path / "dir.png"), "is a folder"),
            (str(tmp_path / "missing" / "p.png"), "does not exist"),
            (os.devnull, "is a device"), (str(link), "symbolic link"),
            (str(tmp_path / "p.txt"), "expected a file name ending in")]


def test_plot_output_is_checked_before_any_work(capsys, wav, tmp_path, monkeypatch):
    def never(*a, **k):
        raise AssertionError("work started before -o was checked")

    monkeypatch.setattr(plot_cmd, "build_figure", never)
    monkeypatch.setattr(plot_cmd, "_one_audio_file", never)
    before = sorted(p.name for p in tmp_path.iterdir())
    for out, says in _bad_outputs(tmp_path):
        err = _error_line(capsys, main(["plot", str(wav), "-o", out]))
        assert says in err
    assert (tmp_path / "target.png").read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        before + ["target.png", "link.png", "dir.png"])
    assert not any((tmp_path / "dir.png").iterdir())


def test_plot_history_output_is_checked_before_any_work(capsys, tmp_path, monkeypatch):
    from wavetrain.models import modelfile

    model = _model_file(tmp_path / "m.wt", GMM_HISTORY)

    def never(*a, **k):
        raise AssertionError("work started before -o was checked")

    monkeypatch.setattr(modelfile, "read_model_file", never)
    for out, says in _bad_outputs(tmp_path):
        err = _error_line(capsys, main(["plot", "history", "-m", str(model), "-o", out]))
        assert says in err
    assert (tmp_path / "target.png").read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.png", "link.png", "m.wt", "target.png"]


# ---- 11. plot roc: the title names what the curve is of ---------------------------------------
@pytest.fixture(scope="module")
def detector_m0(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("roc") / "m0.wt"
    assert main(["train", "--data", str(demo_csv), "--where", "machine=m0", "--label", "state", "--normal",
                 "healthy", "--model", "normal-dist", "-o", str(path)]) == 0
    return path


def test_plot_roc_title_names_the_machine_and_the_auc(capsys, demo_csv, detector_m0, tmp_path, monkeypatch):
    from wavetrain.evaluation import detection_plot
    from wavetrain.evaluation.detection_metrics import roc_auc

    figs = []
    build = detection_plot.build_detection_figure
    monkeypatch.setattr(detection_plot, "build_detection_figure",
                        lambda y, s, *a, **k: figs.append((build(y, s, *a, **k), roc_auc(y, s))) or figs[-1][0])
    out = tmp_path / "roc.png"
    assert main(["plot", "roc", "-m", str(detector_m0), "--data", str(demo_csv), "--where", "machine=m1",
                 "--label", "state", "-o", str(out)]) == 0
    fig, auc = figs[0]
    first, second = fig.get_suptitle().splitlines()
    assert first == f"machine m1 \u2014 ROC AUC {auc:.3f}"
    assert second.startswith("normal-dist on 12 recordings") and "state=healthy is normal" in second
    assert main(["plot", "roc", "-m", str(detector_m0), "--data", str(demo_csv), "--label", "state",
                 "-o", str(out)]) == 0                 # both machines: nothing names them
    assert figs[1][0].get_suptitle().splitlines()[0] == f"all recordings \u2014 ROC AUC {figs[1][1]:.3f}"
    assert out.read_bytes()[:8] == PNG


def test_roc_data_scope_names_shared_values_and_the_where_values(tmp_path):
    from wavetrain.cli.roc_cmd import data_scope
    from wavetrain.data.dataset import Dataset
    from wavetrain.data.recording import Recording

    ds = Dataset([Recording(tmp_path / f"{i}.wav", {"machine": "fan", "unit": str(1 + i % 2),
                                                    "state": "normal" if i % 3 else "anomaly"})
                  for i in range(6)], tmp_path)
    assert data_scope(ds, "state") == "machine fan"
    assert data_scope(ds, "state", [("unit", ("1", "2"))]) == "unit 1,2, machine fan"
    one = ds.where([("unit", ["2"])])
    assert data_scope(one, "state", [("unit", ("2",))]) == "unit 2, machine fan"
    assert data_scope(ds, "unit") == "machine fan"   # the label the curve separates is never named


# ---- 12. history: the loss says what the family measures; top-5 only with six values or more ----
def _score_lines(fig):
    (ax,) = [a for a in fig.axes if a.get_label() == "scores"]
    return [ln.get_label() for ln in ax.lines]


def test_history_draws_top5_only_for_six_values_or_more():
    hist = _neural_history([1.0, 2.0, 3.0])
    for n in (2, 5):
        assert _score_lines(build_history_figure(hist, n_values=n)) == ["top-1 accuracy", "macro-F1"]
    for n in (6, 35):
        assert _score_lines(build_history_figure(hist, n_values=n)) == ["top-1 accuracy", "top-5 accuracy",
                                                                        "macro-F1"]


@pytest.fixture
def history_figures(monkeypatch):
    from wavetrain.train import history_plot

    figs = []
    build = history_plot.build_history_figure
    monkeypatch.setattr(history_plot, "build_history_figure",
                        lambda *a, **k: figs.append(build(*a, **k)) or figs[-1])
    return figs


@pytest.mark.parametrize("values, top5", [(3, False), (8, True)])
def test_plot_history_of_a_classifier_says_cross_entropy_and_counts_its_values(capsys, tmp_path, monkeypatch,
                                                                                history_figures, values, top5):
    from wavetrain.models import modelfile

    labels = [f"v{i}" for i in range(values)]
    meta = {"model": "cnn", "labels": labels, "label_name": "word", "history": _neural_history([1.0, 2.0])}
    monkeypatch.setattr(modelfile, "describe_model", lambda path: (meta, {}))
    model = tmp_path / "cnn.wt"
    model.write_bytes(b"stands in for a model file")
    assert main(["plot", "history", "-m", str(model), "-o", str(tmp_path / "h.png")]) == 0
    (fig,) = history_figures
    assert fig.axes[0].get_ylabel() == "cross-entropy loss"
    assert ("top-5 accuracy" in _score_lines(fig)) is top5


def test_plot_history_of_an_autoencoder_says_reconstruction_error(capsys, demo_csv, tmp_path, history_figures):
    pytest.importorskip("torch")
    from wavetrain.models.autoencoder import AutoencoderDetector

    model = tmp_path / "ae.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--normal", "healthy", "--model",
                 "autoencoder", "--set", "epochs=2", "--set", "hidden=8", "--set", "layers=1", "--no-cache",
                 "-o", str(model)]) == 0
    out = tmp_path / "h.png"
    assert main(["plot", "history", "-m", str(model), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG
    (fig,) = history_figures
    (ax,) = fig.axes                                       # no validation scores: one panel
    assert ax.get_ylabel() == AutoencoderDetector.history_loss
    assert "reconstruction error" in ax.get_ylabel()
    assert [ln.get_label() for ln in ax.lines] == ["training data"]
