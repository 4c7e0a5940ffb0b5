"""``wavetrain evaluate --group-by LABEL``: results per group after the pooled figures, weakest
group first, and in ``--json`` — a count by hand from ``classify --json``'s window answers."""
import csv
import json
from collections import defaultdict

import pytest

from wavetrain.cli.main import main

GMM = ("--model", "gmm", "--set", "components=1", "--set", "max_iter=5", "--clip-ms", "250")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def _labels(demo_csv):
    """Each recording's labels, by its path."""
    with open(demo_csv, newline="") as f:
        rows = list(csv.reader(f))
    return {str(demo_csv.parent / r[0]): dict(kv.split("=") for kv in r[1].split(";")) for r in rows}


def _answers(capsys, model, demo_csv):
    """``classify --json`` of every recording: one answer per window."""
    labels = _labels(demo_csv)
    out, _ = run(capsys, "classify", "-m", model, "--json", *sorted(labels))
    return [json.loads(line) for line in out.splitlines()], labels


def _table(out, header):
    """The title and rows of the per-group table whose header line begins with the words ``header``."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == header.split())
    rows = []
    for line in lines[at + 1:]:
        if not line or line.startswith(("per fold", "repeat", "over ")):
            break
        rows.append(line.split())
    return lines[at - 1], rows


@pytest.fixture(scope="module")
def classifier(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("grp") / "m0.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--where", "machine=m0", *GMM,
                 "-o", str(path)]) == 0
    return path


@pytest.fixture(scope="module")
def detector(demo_csv, tmp_path_factory):
    path = tmp_path_factory.mktemp("grp") / "nd.wt"
    assert main(["train", "--data", str(demo_csv), "--label", "state", "--normal", "healthy", "--where",
                 "machine=m0", "--model", "normal-dist", "--clip-ms", "250", "-o", str(path)]) == 0
    return path


def test_a_trained_classifier_per_group_counts_the_windows_classify_answers(capsys, demo_csv, classifier):
    answers, labels = _answers(capsys, classifier, demo_csv)
    windows, right, recs = defaultdict(int), defaultdict(int), defaultdict(set)
    for a in answers:
        rec = labels[a["file"]]
        g = f"{rec['machine']}/{rec['speed']}"
        windows[g] += 1
        right[g] += a["value"] == rec["state"]
        recs[g].add(a["file"])
    out, _ = run(capsys, "evaluate", "-m", classifier, "--data", demo_csv, "--label", "state",
                 "--group-by", "machine,speed", "--json")
    res = json.loads(out)
    assert res["group_by"] == "machine,speed" and set(res["groups"]) == set(windows) and len(windows) == 4
    for g, r in res["groups"].items():
        assert (r["windows"], r["correct"], r["recordings"]) == (windows[g], right[g], len(recs[g]))
        assert r["accuracy"] == pytest.approx(right[g] / windows[g])
    # the text report: the pooled figures, then the groups weakest first with the same numbers
    out, _ = run(capsys, "evaluate", "-m", classifier, "--data", demo_csv, "--label", "state",
                 "--group-by", "machine,speed")
    assert out.startswith("accuracy ") and out.index("macro mean") < out.index("per machine/speed, weakest first:")
    title, rows = _table(out, "machine/speed accuracy")
    assert title == "per machine/speed, weakest first:" and len(rows) == 4
    accs = [float(r[1]) for r in rows]
    assert accs == sorted(accs) and accs[0] < accs[-1]
    for g, acc, _f1, n, n_recs in rows:
        assert float(acc) == pytest.approx(right[g] / windows[g], abs=5e-5)
        assert (int(n), int(n_recs)) == (windows[g], len(recs[g]))


def test_without_group_by_there_is_no_table(capsys, demo_csv, classifier):
    out, _ = run(capsys, "evaluate", "-m", classifier, "--data", demo_csv, "--label", "state")
    assert "weakest" not in out
    out, _ = run(capsys, "evaluate", "-m", classifier, "--data", demo_csv, "--label", "state", "--json")
    assert "groups" not in json.loads(out)


def test_kfold_classifier_groups_are_the_folds_that_held_them_out(capsys, demo_csv):
    out, err = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", *GMM, "--folds", "2",
                   "--group-by", "machine", "--json", "--no-cache")
    res = json.loads(out)
    # each fold held out one machine: its accuracy is that machine's, and the fold names it
    assert sorted(r["accuracy"] for r in res["groups"].values()) == sorted(f["accuracy"] for f in res["folds"])
    for f in res["folds"]:
        (machine,) = f["held_out"]
        assert res["groups"][machine]["accuracy"] == f["accuracy"]
        assert f"fold {f['fold']}/2: accuracy {f['accuracy']:.4f}" in err and f"held out machine: {machine}" in err
    assert all(r["recordings"] == 12 for r in res["groups"].values())
    assert sum(r["correct"] for r in res["groups"].values()) == round(res["accuracy"] * res["windows"])
    out, err = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", *GMM, "--folds", "2",
                   "--group-by", "machine", "--no-cache")
    title, rows = _table(out, "machine accuracy")
    assert title == "per machine, weakest first:"
    assert [r[0] for r in rows] == sorted(res["groups"], key=lambda g: res["groups"][g]["accuracy"])
    # --repeat: the groups of the first repeat, as the pooled figures are
    out, _ = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", *GMM, "--folds", "2",
                 "--group-by", "machine", "--json", "--no-cache", "--repeat", "2")
    assert json.loads(out)["groups"] == res["groups"]


def _auc_by_pairs(normal, anomalous):
    pairs = [(a > n) + 0.5 * (a == n) for a in anomalous for n in normal]
    return sum(pairs) / len(pairs)


def test_a_detector_per_group_counts_the_scores_classify_answers(capsys, demo_csv, detector):
    answers, labels = _answers(capsys, detector, demo_csv)
    normal, anomalous, recs = defaultdict(list), defaultdict(list), defaultdict(set)
    for a in answers:
        rec = labels[a["file"]]
        (normal if rec["state"] == "healthy" else anomalous)[rec["speed"]].append(a["anomaly_score"])
        recs[rec["speed"]].add(a["file"])
    out, _ = run(capsys, "evaluate", "-m", detector, "--data", demo_csv, "--label", "state", "--group-by", "speed",
                 "--json")
    res = json.loads(out)
    assert set(res["groups"]) == {"15", "30"}
    for g, r in res["groups"].items():
        assert (r["normal"], r["anomalous"], r["recordings"]) == (len(normal[g]), len(anomalous[g]), len(recs[g]))
        # (classify --json rounds scores; ties among them would move the AUC by at most this)
        assert r["auc"] == pytest.approx(_auc_by_pairs(normal[g], anomalous[g]), abs=0.01)
    out, _ = run(capsys, "evaluate", "-m", detector, "--data", demo_csv, "--label", "state", "--group-by", "speed")
    assert out.startswith("AUC ")
    title, rows = _table(out, "speed AUC")
    assert title == "per speed, weakest AUC first:" and len(rows) == 2
    assert [r[0] for r in rows] == sorted(res["groups"], key=lambda g: res["groups"][g]["auc"])
    assert [int(r[8]) for r in rows] == [len(recs[r[0]]) for r in rows]


def test_a_detector_group_without_anomalies_says_it_has_no_auc(capsys, demo_csv, detector):
    out, _ = run(capsys, "evaluate", "-m", detector, "--data", demo_csv, "--label", "state", "--group-by", "state")
    _, rows = _table(out, "state AUC")
    line = {r[0]: " ".join(r) for r in rows}
    assert line["healthy"].endswith("(no AUC: only normal windows)")
    assert line["loose"].endswith("(no AUC: only anomalous windows)")


def test_kfold_detector_groups(capsys, demo_csv):
    out, err = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", "--normal", "healthy",
                   "--model", "normal-dist", "--clip-ms", "250", "--folds", "2", "--group-by", "machine", "--json")
    res = json.loads(out)
    assert sorted(r["auc"] for r in res["groups"].values()) == pytest.approx(sorted(f["auc"] for f in res["folds"]))
    assert all(res["groups"][f["held_out"][0]]["auc"] == pytest.approx(f["auc"]) for f in res["folds"])
    assert all(r["recordings"] == 12 for r in res["groups"].values())
    out, _ = run(capsys, "evaluate", "--data", demo_csv, "--label", "state", "--normal", "healthy",
                 "--model", "normal-dist", "--clip-ms", "250", "--folds", "2", "--group-by", "machine")
    title, rows = _table(out, "machine AUC")
    assert title == "per machine, weakest AUC first:"
    assert [r[0] for r in rows] == sorted(res["groups"], key=lambda g: res["groups"][g]["auc"])
