"""``wavetrain evaluate --plot cm.png``: the confusion matrix as an image, rows normalised and each
cell annotated with its count and share, for a cross-validation (with --repeat too), a test set and
an anomaly detector; the output checked before any work as every plot's is."""
import json

import matplotlib.image
import numpy as np
import pytest
from sklearn.metrics import confusion_matrix

from tests.cli.test_plots import _bad_outputs, _error_line
from wavetrain.cli import evaluate_cmd
from wavetrain.cli.main import main
from wavetrain.evaluation import confusion_plot
from wavetrain.evaluation.confusion_plot import confusion_cells, result_cells
from wavetrain.evaluation.metrics import OTHER, report

GMM = ("--model", "gmm", "--set", "components=2", "--set", "max_iter=10")


@pytest.fixture
def figures(monkeypatch):
    """The confusion figures built, with the cells and labels they were given."""
    seen = []
    build = confusion_plot.build_confusion_figure

    def spy(cells, **kw):
        fig = build(cells, **kw)
        seen.append({"fig": fig, "cells": cells, **kw})
        return fig

    monkeypatch.setattr(confusion_plot, "build_confusion_figure", spy)
    return seen


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def _image_shows(fig, cells):
    """The matrix drawn (colours) is the cells' shares, and each cell's text is its annotation."""
    (ax,) = [a for a in fig.axes if a.get_label() == "confusion"]
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), cells.shares)
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    n_rows, n_cols = cells.shares.shape
    assert texts == {(i, j): cells.text[i][j] for i in range(n_rows) for j in range(n_cols)}
    assert [t.get_text() for t in ax.get_xticklabels()] == cells.columns
    assert [t.get_text() for t in ax.get_yticklabels()] == cells.rows
    return ax


# ---- the matrix: sklearn's normalize="true", counts and shares as text ---------------------------
def test_cells_are_sklearns_row_normalised_matrix_with_counts():
    rng = np.random.default_rng(3)
    labels = ["bearing", "healthy", "loose"]
    y_true = rng.choice(labels, 200).tolist()
    y_pred = [t if rng.random() < 0.6 else rng.choice(labels + ["unknown"]) for t in y_true]
    res = report(y_true, y_pred, labels)
    cells = result_cells(res)
    assert cells.rows == labels and cells.columns == labels + [OTHER]
    everything = labels + ["unknown"]
    oracle = confusion_matrix(y_true, y_pred, labels=everything, normalize="true")[:3]
    np.testing.assert_allclose(cells.shares, oracle)
    np.testing.assert_array_equal(cells.counts, confusion_matrix(y_true, y_pred, labels=everything)[:3])
    np.testing.assert_allclose(cells.shares.sum(axis=1), 1.0)
    for i in range(3):
        for j in range(4):
            n = int(cells.counts[i, j])
            assert cells.text[i][j] == (f"{n}\n{round(100 * oracle[i, j])}%" if n else "0")


def test_cells_of_a_hand_computed_case():
    # rows: a (3 windows), b (none: left out), c (4); columns a, b, c, (other) unused: left out
    cells = confusion_cells([[2, 1, 0, 0], [0, 0, 0, 0], [1, 0, 3, 0]], ["a", "b", "c"], ["a", "b", "c", OTHER])
    assert cells.rows == ["a", "c"] and cells.columns == ["a", "b", "c"]
    np.testing.assert_allclose(cells.shares, [[2 / 3, 1 / 3, 0], [1 / 4, 0, 3 / 4]])
    assert cells.text == [["2\n67%", "1\n33%", "0"], ["1\n25%", "0", "3\n75%"]]
    assert confusion_cells([[999, 1]], ["a"], ["a", "b"]).text == [["999\n100%", "1\n<1%"]]


def test_a_detectors_cells_are_its_windows_at_the_threshold():
    res = {"detector": True, "normal_value": "healthy", "tn": 9, "fp": 1, "fn": 4, "tp": 12}
    cells = result_cells(res)
    assert cells.rows == ["healthy (normal)", "not healthy (anomalous)"]
    assert cells.columns == ["healthy", "anomaly"]
    np.testing.assert_array_equal(cells.counts, [[9, 1], [4, 12]])
    np.testing.assert_allclose(cells.shares, [[0.9, 0.1], [0.25, 0.75]])


# ---- the command ------------------------------------------------------------------------------
def test_evaluate_plot_of_a_cross_validation(capsys, demo_csv, tmp_path, figures):
    out = tmp_path / "cm.png"
    text, err = _run(capsys, "evaluate", "--data", demo_csv, "--label", "state", *GMM, "--folds", "2",
                     "--json", "--plot", out)
    res = json.loads(text)                      # --json stays one object on stdout
    assert f"wrote {out}" in err
    image = matplotlib.image.imread(out)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 500
    (seen,) = figures
    cm = np.asarray(res["confusion"])
    ax = _image_shows(seen["fig"], seen["cells"])
    np.testing.assert_allclose(seen["cells"].shares, cm[:, :3] / cm.sum(axis=1, keepdims=True))
    assert ax.get_xlabel() == "predicted state" and ax.get_ylabel() == "true state"
    title = seen["fig"].get_suptitle()
    assert "gmm (components=2, max_iter=10)" in title and f"accuracy {res['accuracy']:.3f}" in title
    assert "2-fold cross-validation" in title and f"{res['windows']} windows" in title
    figures.clear()
    _run(capsys, "evaluate", "--data", demo_csv, "--label", "state", *GMM, "--folds", "2", "--group-by", "machine",
         "--plot", out)
    assert "2-fold cross-validation by machine" in figures[0]["fig"].get_suptitle()   # the folds were of machines


def test_evaluate_plot_of_a_repeated_cross_validation_draws_the_first_repeat(capsys, demo_csv, tmp_path, figures):
    out = tmp_path / "cm.svg"
    text, _ = _run(capsys, "evaluate", "--data", demo_csv, "--label", "state", *GMM, "--folds", "2", "--repeat",
                   "2", "--json", "--plot", out)
    res = json.loads(text)
    assert out.read_bytes().lstrip().startswith(b"<?xml")
    (seen,) = figures
    np.testing.assert_array_equal(seen["cells"].counts, np.asarray(res["confusion"])[:, :3])
    assert "repeat 1 of 2" in seen["fig"].get_suptitle()


@pytest.fixture(scope="module")
def trained(demo_csv, tmp_path_factory):
    folder = tmp_path_factory.mktemp("evalplot")
    gmm, detector = folder / "gmm.wt", folder / "nd.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", *GMM, "--where", "machine=m0",
                 "-o", str(gmm)]) == 0
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--normal", "healthy", "--model",
                 "normal-dist", "--where", "machine=m0", "-o", str(detector)]) == 0
    return {"gmm": gmm, "detector": detector}


def test_evaluate_plot_of_a_test_set(capsys, demo_csv, tmp_path, trained, figures):
    out = tmp_path / "cm.png"
    text, _ = _run(capsys, "evaluate", "-m", trained["gmm"], "--data", demo_csv, "--where", "machine=m1",
                   "--label", "state", "--json", "--plot", out)
    res = json.loads(text)
    assert matplotlib.image.imread(out).shape[2] in (3, 4)
    (seen,) = figures
    _image_shows(seen["fig"], seen["cells"])
    np.testing.assert_array_equal(seen["cells"].counts, np.asarray(res["confusion"])[:, :3])
    title = seen["fig"].get_suptitle()
    assert "gmm.wt (gmm)" in title and "test set" in title and f"accuracy {res['accuracy']:.3f}" in title


def test_evaluate_plot_of_a_detector_is_its_matrix_at_the_threshold(capsys, demo_csv, tmp_path, trained, figures):
    out = tmp_path / "cm.png"
    text, _ = _run(capsys, "evaluate", "-m", trained["detector"], "--data", demo_csv, "--where", "machine=m1",
                   "--label", "state", "--json", "--plot", out)
    res = json.loads(text)
    matplotlib.image.imread(out)
    (seen,) = figures
    ax = _image_shows(seen["fig"], seen["cells"])
    np.testing.assert_array_equal(seen["cells"].counts, [[res["tn"], res["fp"]], [res["fn"], res["tp"]]])
    assert seen["cells"].columns == ["healthy", "anomaly"]
    assert ax.get_xlabel() == f"predicted state (at threshold {res['threshold']:.4g})"
    assert f"AUC {res['auc']:.3f}" in seen["fig"].get_suptitle()


def test_evaluate_plot_output_is_checked_before_any_work(capsys, demo_csv, tmp_path, monkeypatch):
    def never(*a, **k):
        raise AssertionError("work started before --plot was checked")

    monkeypatch.setattr(evaluate_cmd, "load_data", never)
    for out, says in _bad_outputs(tmp_path):
        err = _error_line(capsys, main(["evaluate", "--data", str(demo_csv), "--label", "state", "--plot", out]))
        assert says in err and "--plot" in err
    assert (tmp_path / "target.png").read_bytes() == b"keep"
    # an input of the run is never replaced
    recording = tmp_path / "rec.png"
    recording.write_bytes(b"an input")
    err = _error_line(capsys, main(["evaluate", "--data", str(recording), "--label", "state",
                                    "--plot", str(recording)]))
    assert "is the input" in err
    assert recording.read_bytes() == b"an input"
