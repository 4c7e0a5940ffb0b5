"""Results per held-out group (``evaluate_model`` / ``evaluate_kfold`` with ``group_by``): each
group's figures equal a count made by hand from the window predictions, for a classifier and an
anomaly detector, on a trained model and in k-fold cross-validation."""
from collections import defaultdict

import numpy as np
import pytest

from wavetrain.data import load_dataset
from wavetrain.evaluation.group_results import format_groups, weakest_first
from wavetrain.pipeline.jobs import RunOptions, evaluate_kfold, evaluate_model, train_model, window_predictions

#: A classifier weak enough on the demo machines (quarter-second clips, one component) that its
#: groups differ.
GMM = {"components": "1", "max_iter": "5", "clip_ms": "250"}
DETECTOR = {"clip_ms": "250"}


def _machine(ds, value):
    return ds.filter(lambda r: r.labels["machine"] == value)


def _hand_count(model, ds, group):
    """Per group (``group(recording)``): windows, windows answered right, recordings, from the
    model's window predictions."""
    windows, right, recs = defaultdict(int), defaultdict(int), defaultdict(set)
    preds, _ = window_predictions(model, ds, RunOptions())
    for p in preds:
        g = group(p.recording)
        windows[g] += 1
        right[g] += p.label == p.recording.labels["state"]
        recs[g].add(p.recording.name)
    return windows, right, recs


def _auc_by_pairs(normal, anomalous):
    """The probability that an anomalous window scores above a normal one, ties counting half,
    over every pair."""
    pairs = [(a > n) + 0.5 * (a == n) for a in anomalous for n in normal]
    return sum(pairs) / len(pairs)


def test_a_trained_classifier_per_group_is_the_count_of_its_predictions(demo_csv):
    ds = load_dataset([demo_csv])
    model, _ = train_model(_machine(ds, "m0"), "state", "gmm", GMM, RunOptions())
    res = evaluate_model(model, ds, "state", RunOptions(group_by="machine,speed"))
    windows, right, recs = _hand_count(model, ds, lambda r: f"{r.labels['machine']}/{r.labels['speed']}")
    assert res["group_by"] == "machine,speed"
    assert set(res["groups"]) == {"m0/15", "m0/30", "m1/15", "m1/30"} == set(windows)
    for g, r in res["groups"].items():
        assert r["windows"] == windows[g] and r["correct"] == right[g] and r["recordings"] == len(recs[g]) == 6
        assert r["accuracy"] == pytest.approx(right[g] / windows[g])
    # the groups partition the pooled windows, and they differ (the count is not trivially 1.0)
    assert sum(r["windows"] for r in res["groups"].values()) == res["windows"]
    assert sum(r["correct"] for r in res["groups"].values()) == round(res["accuracy"] * res["windows"])
    assert len({r["accuracy"] for r in res["groups"].values()}) > 1
    assert "groups" not in evaluate_model(model, ds, "state", RunOptions())


def test_kfold_classifier_per_group_is_the_count_of_the_fold_that_held_it_out(demo_csv):
    ds = load_dataset([demo_csv])
    res = evaluate_kfold(ds, "state", "gmm", GMM, RunOptions(group_by="machine"), folds=2)
    assert set(res["groups"]) == {"m0", "m1"}
    for held_out, other in (("m0", "m1"), ("m1", "m0")):
        # the fold that held out a machine trained on the other one: the same model, by hand
        model, _ = train_model(_machine(ds, other), "state", "gmm", GMM, RunOptions(group_by="machine"))
        windows, right, recs = _hand_count(model, _machine(ds, held_out), lambda r: r.labels["machine"])
        r = res["groups"][held_out]
        assert (r["windows"], r["correct"], r["recordings"]) == (windows[held_out], right[held_out], 12)
        assert r["accuracy"] == pytest.approx(right[held_out] / windows[held_out])
        fold = next(f for f in res["folds"] if f["test_recordings"] == 12 and f["accuracy"] == r["accuracy"])
        assert fold["macro_f1"] == pytest.approx(r["macro_f1"])
    assert res["groups"]["m0"]["accuracy"] != res["groups"]["m1"]["accuracy"]
    assert "groups" not in evaluate_kfold(ds, "state", "gmm", GMM, RunOptions(), folds=2)


def test_a_trained_detector_per_group_is_the_count_of_its_scores(demo_csv):
    ds = load_dataset([demo_csv])
    healthy_m0 = ds.filter(lambda r: r.labels["state"] == "healthy" and r.labels["machine"] == "m0")
    model, _ = train_model(healthy_m0, None, "normal-dist", DETECTOR, RunOptions())
    res = evaluate_model(model, ds, "state", RunOptions(group_by="speed"), normal="healthy")
    scores, recs = defaultdict(lambda: ([], [])), defaultdict(set)
    for p in window_predictions(model, ds, RunOptions())[0]:
        g = p.recording.labels["speed"]
        scores[g][p.recording.labels["state"] != "healthy"].append(float(p.scores[0]))
        recs[g].add(p.recording.name)
    assert set(res["groups"]) == {"15", "30"} and res["group_by"] == "speed"
    for g, r in res["groups"].items():
        normal, anomalous = scores[g]
        assert (r["normal"], r["anomalous"], r["recordings"]) == (len(normal), len(anomalous), len(recs[g]))
        assert r["auc"] == pytest.approx(_auc_by_pairs(normal, anomalous))
        assert r["recall"] == pytest.approx(np.mean(np.asarray(anomalous) > model.threshold_))


def test_a_detector_group_without_both_kinds_has_no_auc_and_says_why(demo_csv):
    ds = load_dataset([demo_csv])
    model, _ = train_model(ds, "state", "normal-dist", DETECTOR, RunOptions(), normal="healthy")
    # m1's faults left out: m1 has normal windows only
    mixed = ds.filter(lambda r: r.labels["machine"] == "m0" or r.labels["state"] == "healthy")
    res = evaluate_model(model, mixed, "state", RunOptions(group_by="machine"), normal="healthy")
    m0, m1 = res["groups"]["m0"], res["groups"]["m1"]
    assert np.isfinite(m0["auc"]) and np.isnan(m1["auc"]) and np.isnan(m1["pauc"])
    per_recording = res["windows"] // len(mixed)                 # (recordings of one length)
    assert (m1["normal"], m1["anomalous"], m1["recordings"]) == (4 * per_recording, 0, 4)
    table = format_groups(res).splitlines()
    assert table[0] == "per machine, weakest AUC first:"
    assert table[2].startswith("m0 ") and "no AUC" not in table[2]
    assert table[3].startswith("m1 ") and table[3].endswith("(no AUC: only normal windows)")
    by_state = format_groups(evaluate_model(model, ds, "state", RunOptions(group_by="state"), normal="healthy"))
    assert any(line.startswith("loose") and line.endswith("(no AUC: only anomalous windows)")
               for line in by_state.splitlines())


def test_kfold_detector_per_group_is_the_fold_that_held_it_out(demo_csv):
    ds = load_dataset([demo_csv])
    res = evaluate_kfold(ds, "state", "normal-dist", DETECTOR, RunOptions(group_by="machine"), folds=2,
                         normal="healthy")
    assert set(res["groups"]) == {"m0", "m1"} and res["group_by"] == "machine"
    fold_aucs = sorted(f["auc"] for f in res["folds"])
    assert sorted(r["auc"] for r in res["groups"].values()) == pytest.approx(fold_aucs)
    for g, r in res["groups"].items():
        # trained on the other machine's healthy recordings, by hand
        other = "m1" if g == "m0" else "m0"
        model, _ = train_model(_machine(ds, other), "state", "normal-dist", DETECTOR, RunOptions(group_by="machine"),
                               normal="healthy")
        normal, anomalous = [], []
        for p in window_predictions(model, _machine(ds, g), RunOptions())[0]:
            (anomalous if p.recording.labels["state"] != "healthy" else normal).append(float(p.scores[0]))
        assert (r["normal"], r["anomalous"], r["recordings"]) == (len(normal), len(anomalous), 12)
        assert r["auc"] == pytest.approx(_auc_by_pairs(normal, anomalous))


def test_weakest_first_orders_by_the_figure_with_nan_last():
    groups = {"a": {"auc": 0.9}, "b": {"auc": float("nan")}, "c": {"auc": 0.6}, "d": {"auc": 0.9}}
    assert weakest_first(groups, "auc") == ["c", "a", "d", "b"]


def test_the_table_lists_the_weakest_group_first():
    res = {"group_by": "speaker", "groups": {
        "alice": {"accuracy": 0.95, "macro_f1": 0.9, "windows": 20, "correct": 19, "recordings": 5},
        "bob": {"accuracy": 0.5, "macro_f1": 0.4, "windows": 10, "correct": 5, "recordings": 3},
        "carol": {"accuracy": 0.8, "macro_f1": 0.7, "windows": 10, "correct": 8, "recordings": 2}}}
    lines = format_groups(res).splitlines()
    assert lines[0] == "per speaker, weakest first:"
    assert lines[1].split() == ["speaker", "accuracy", "macro-F1", "windows", "recordings"]
    assert [line.split()[0] for line in lines[2:]] == ["bob", "carol", "alice"]
    assert lines[2].split() == ["bob", "0.5000", "0.4000", "10", "3"]
    assert format_groups({"accuracy": 1.0}) == ""
