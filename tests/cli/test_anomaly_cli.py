"""Anomaly detectors through the CLI: train on normal recordings only, evaluate (AUC, pAUC, per
group, k-fold), classify, plot roc, and the one-line errors."""
import json

import numpy as np
import pytest

from wavetrain.cli.main import main


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def detector(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("det") / "nd.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--normal", "healthy", "--model",
                 "normal-dist", "-o", str(path)]) == 0
    return path


def test_train_on_normal_recordings_only(capsys, demo_csv, tmp_path):
    code, out, _ = run(capsys, "train", "--data", demo_csv, "--label", "state", "--normal", "healthy",
                       "--model", "anomaly-gmm", "--set", "components=2", "-o", tmp_path / "g.wt")
    assert code == 0
    assert "trained anomaly-gmm on 8 normal recordings (state=healthy)" in out
    assert "threshold" in out and "held-out normal windows" in out
    from wavetrain.models import load_model

    m = load_model(tmp_path / "g.wt")
    assert m.detector and m.labels_ == ["healthy"] and np.isfinite(m.threshold_)


def test_where_selects_recordings(capsys, demo_csv, tmp_path):
    code, out, _ = run(capsys, "train", "--data", demo_csv, "--where", "state=healthy", "--where", "machine=m0",
                       "--model", "normal-dist", "-o", tmp_path / "w.wt")
    assert code == 0 and "on 4 normal recordings" in out       # no label: every selected recording is normal
    code, _, err = run(capsys, "train", "--data", demo_csv, "--where", "state=nothing", "--model", "normal-dist",
                       "-o", tmp_path / "x.wt")
    assert code == 2 and "--where state=nothing: no recording left" in err and "healthy" in err
    code, _, err = run(capsys, "train", "--data", demo_csv, "--where", "state", "--model", "normal-dist",
                       "-o", tmp_path / "x.wt")
    assert code == 2 and "LABEL=VALUE" in err


def test_train_errors_are_one_line(capsys, demo_csv, tmp_path):
    # three values of state and no --normal: which is normal?
    code, _, err = run(capsys, "train", "--data", demo_csv, "--label", "state", "--model", "normal-dist",
                       "-o", tmp_path / "a.wt")
    assert code == 2 and "give --normal VALUE" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "train", "--data", demo_csv, "--label", "state", "--normal", "broken",
                       "--model", "normal-dist", "-o", tmp_path / "a.wt")
    assert code == 2 and "--normal broken: no recording has state=broken" in err
    # a classifier needs --label; --normal is for detectors
    code, _, err = run(capsys, "train", "--data", demo_csv, "--model", "gmm", "-o", tmp_path / "a.wt")
    assert code == 2 and "give --label NAME" in err
    code, _, err = run(capsys, "train", "--data", demo_csv, "--label", "state", "--normal", "healthy",
                       "--model", "gmm", "-o", tmp_path / "a.wt")
    assert code == 2 and "--normal applies to anomaly detectors" in err
    code, _, err = run(capsys, "train", "--data", demo_csv, "--label", "state", "--normal", "healthy",
                       "--model", "normal-dist", "--set", "fpr=0.9", "-o", tmp_path / "a.wt")
    assert code == 2 and "fpr" in err


def test_evaluate_reports_auc_per_group(capsys, demo_csv, detector):
    code, out, _ = run(capsys, "evaluate", "-m", detector, "--data", demo_csv, "--label", "state",
                       "--normal", "healthy", "--group-by", "machine", "--json")
    assert code == 0
    res = json.loads(out)
    assert res["detector"] and res["normal_value"] == "healthy"
    assert res["normal"] == 8 and res["anomalous"] == 16 and res["windows"] == 24
    assert 0.5 < res["auc"] <= 1.0 and 0.0 <= res["pauc"] <= 1.0
    assert set(res["groups"]) == {"m0", "m1"} and all(g["normal"] == 4 for g in res["groups"].values())
    for k in ("precision", "recall", "f1", "threshold"):
        assert k in res
    code, out, _ = run(capsys, "evaluate", "-m", detector, "--data", demo_csv, "--label", "state", "--group-by",
                       "machine,speed")
    assert code == 0 and out.startswith("AUC ") and "m0/15" in out and "m1/30" in out


def test_evaluate_defaults_to_the_trained_normal_value(capsys, demo_csv, detector):
    code, out, _ = run(capsys, "evaluate", "-m", detector, "--data", demo_csv, "--label", "state", "--json")
    assert code == 0 and json.loads(out)["normal_value"] == "healthy"


def test_evaluate_only_normal_recordings_says_auc_needs_both(capsys, demo_csv, detector):
    code, out, err = run(capsys, "evaluate", "-m", detector, "--data", demo_csv, "--where", "state=healthy",
                         "--label", "state", "--json")
    assert code == 0 and json.loads(out)["auc"] != json.loads(out)["auc"]      # NaN
    assert "AUC needs normal and anomalous recordings" in err


def test_kfold_trains_each_fold_on_normal_recordings(capsys, demo_csv):
    code, out, err = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", "--normal", "healthy",
                         "--model", "normal-dist", "--folds", "2", "--group-by", "machine", "--json")
    assert code == 0
    res = json.loads(out)
    assert len(res["folds"]) == 2 and res["windows"] == 24
    assert all(f["train_recordings"] == 4 for f in res["folds"])          # the other machine's healthy ones
    assert np.isfinite(res["auc"]) and set(res["folds_summary"]) == {"auc", "pauc", "f1"}
    code, out, err = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", "--normal", "healthy",
                         "--model", "normal-dist", "--folds", "2")
    assert code == 0 and "fold 1/2: AUC" in err and out.startswith("AUC ")


def test_classify_prints_the_decision(capsys, demo_csv, detector, tmp_path):
    wav = sorted(demo_csv.parent.glob("bearing_*.wav"))[0]
    code, out, _ = run(capsys, "classify", "-m", detector, wav)
    assert code == 0 and " anomaly=" in out and " score=" in out and " threshold=" in out
    code, out, _ = run(capsys, "classify", "-m", detector, "--json", wav)
    rec = json.loads(out)
    assert rec["score_kind"] == "anomaly" and isinstance(rec["anomaly"], bool)
    assert rec["anomaly"] == (rec["anomaly_score"] > rec["threshold"])
    assert rec["value"] == ("anomaly" if rec["anomaly"] else "healthy")
    code, _, _ = run(capsys, "classify", "-m", detector, wav, "-o", tmp_path / "p.csv")
    header = (tmp_path / "p.csv").read_text().splitlines()[0].split(",")
    assert code == 0 and {"anomaly", "anomaly_score", "threshold"} <= set(header)


def test_plot_roc(capsys, demo_csv, detector, tmp_path):
    code, _, err = run(capsys, "plot", "roc", "-m", detector, "--data", demo_csv, "--label", "state",
                       "-o", tmp_path / "roc.png")
    assert code == 0 and (tmp_path / "roc.png").read_bytes()[:4] == b"\x89PNG" and "AUC" in err
    code, _, err = run(capsys, "plot", "roc", "-m", detector, "--data", demo_csv, "--where", "state=healthy",
                       "--label", "state", "-o", tmp_path / "r2.png")
    assert code == 2 and "needs normal and anomalous" in err and not (tmp_path / "r2.png").exists()


def test_plot_roc_refuses_a_classifier(capsys, demo_csv, tmp_path):
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--model", "gmm", "--set", "components=2",
                 "-o", str(tmp_path / "c.wt")]) == 0
    capsys.readouterr()
    code, _, err = run(capsys, "plot", "roc", "-m", tmp_path / "c.wt", "--data", demo_csv, "--label", "state",
                       "-o", tmp_path / "roc.png")
    assert code == 2 and "draws anomaly detectors" in err
