"""Detectors scoring by group (``normalize_by``): units of one line in two halls score their normal
sound at different heights, so one threshold misses the quiet hall's faults; shifted by group, one
threshold catches them without false alarms in the loud hall. The held-out part is drawn from every
group, shifts survive a model file (a damaged one is refused), an unseen group keeps the pooled
scale (said once), and ``adapt`` gives a new unit's group its shift."""
from __future__ import annotations

import copy
import json
import logging

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from tests.machine_clips import write_clips
from wavetrain.cli.main import main
from wavetrain.data import load_dataset
from wavetrain.data.dataset import Dataset
from wavetrain.data.recording import Recording
from wavetrain.data.splits import holdout_split
from wavetrain.models.modelfile import ModelFileError, load_model
from wavetrain.pipeline.jobs import RunOptions, adapt_model, train_model, window_predictions

#: The same machine sound in a quiet hall and a noisy one (SNR in dB).
HALLS = {"quiet": 30.0, "loud": 3.0}
UNITS = {"u1": 20.0, "u2": 27.0, "u3": 33.0}
GROUPS = {"normalize_by": "unit,hall", "valid_fraction": 0.5}


@pytest.fixture(scope="module")
def halls(tmp_path_factory):
    """Per unit and hall, 8 normal training clips, 2 normal and 2 faulty test clips (u3: the new unit)."""
    root = tmp_path_factory.mktemp("halls")
    write_clips(root, ((f"{unit}_{hall}_{i}", "normal" if i < 10 else "bearing", hz * (1 + 0.01 * i), (u, h, i), snr,
                        {"unit": unit, "hall": hall, "split": "train" if i < 8 else "test"})
                       for u, (unit, hz) in enumerate(UNITS.items()) for h, (hall, snr) in enumerate(HALLS.items())
                       for i in range(12)))
    return root


def _data(root, **where):
    return load_dataset(root / "metadata.csv", where=[(k, v.split(",")) for k, v in where.items()])


def _answers(model, ds):
    """Per test recording: anomalous or not, its mean score, and whether each window was answered anomaly."""
    preds, _ = window_predictions(model, ds, RunOptions())
    by: dict = {}
    for p in preds:
        by.setdefault(p.recording.name, (p.recording.labels["state"] != "normal", [], []))
        by[p.recording.name][1].append(float(p.scores[0]))
        by[p.recording.name][2].append(p.label == "anomaly")
    y = np.array([v[0] for v in by.values()])
    return y, np.array([np.mean(v[1]) for v in by.values()]), np.array([np.mean(v[2]) for v in by.values()])


def test_held_out_recordings_come_from_every_group(tmp_path):
    groups = [(u, "loud") for u in ("u0", "u1", "u2") for _ in range(6)] + [("u0", "quiet")] * 3 + [("u1", "quiet")]
    for i in range(22):
        (tmp_path / f"r{i}.wav").write_bytes(bytes(i + 1))         # (distinct files: no copies to group)
    recs = [Recording(tmp_path / f"r{i}.wav", {"unit": u, "hall": h}) for i, (u, h) in enumerate(groups)]
    ds = Dataset(recs, tmp_path)
    train, valid = holdout_split(ds, 0.2, seed=0, strata=("unit", "hall"))
    held = {(recs[i].labels["unit"], recs[i].labels["hall"]) for i in valid}
    # every combination with two recordings or more has some held out; u1/quiet (one recording) keeps it
    assert held == {(u, "loud") for u in ("u0", "u1", "u2")} | {("u0", "quiet")}
    assert sorted([*train, *valid]) == list(range(22)) and not set(train) & set(valid)
    _, plain = holdout_split(ds, 0.2, seed=0)
    assert len(plain) == round(22 * 0.2)


def test_one_threshold_serves_both_halls_once_scores_are_shifted_by_group(halls):
    train, test = _data(halls, unit="u1,u2", split="train"), _data(halls, unit="u1,u2", split="test")
    pooled, _ = train_model(train, "state", "normal-dist", {"valid_fraction": 0.5}, RunOptions())
    grouped, _ = train_model(train, "state", "normal-dist", GROUPS, RunOptions())
    assert set(grouped.group_shifts_) == {(u, h) for u in ("u1", "u2") for h in HALLS}
    y, s_pooled, flagged_pooled = _answers(pooled, test)
    _, s_grouped, flagged = _answers(grouped, test)
    # one scale: the faults of one hall hide among the other hall's normal clips; by group, none does
    assert roc_auc_score(y, s_pooled) < 0.95 and flagged_pooled[y].mean() < 0.75
    assert roc_auc_score(y, s_grouped) == 1.0
    assert flagged[y].min() == 1.0 and flagged[~y].max() == 0.0
    # a window's score is its anomaly score less its group's shift
    raw = copy.deepcopy(grouped)
    raw.group_shifts_ = {}
    preds, _ = window_predictions(raw, test, RunOptions())
    expected = [float(p.scores[0]) - grouped.group_shift(p.recording.labels) for p in preds]
    got = [float(p.scores[0]) for p in window_predictions(grouped, test, RunOptions())[0]]
    np.testing.assert_allclose(got, expected)


def test_shifts_survive_the_model_file_and_a_damaged_one_is_refused(halls, tmp_path, capsys):
    csv = str(halls / "metadata.csv")
    path = tmp_path / "m.wt"
    assert main(["train", "--data", csv, "--where", "unit=u1,u2", "--where", "split=train", "--label", "state",
                 "--model", "normal-dist", "--set", "normalize_by=unit,hall", "--set", "valid_fraction=0.5",
                 "-o", str(path)]) == 0
    capsys.readouterr()
    model = load_model(path)
    assert len(model.group_shifts_) == 4 and model.params["normalize_by"] == "unit,hall"
    assert main(["info", str(path)]) == 0
    shown = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("groups")]
    assert shown and "shifts by unit,hall: u1/quiet" in shown[0]
    assert f"u2/loud {model.group_shifts_[('u2', 'loud')]:+.4g}" in shown[0]
    assert main(["evaluate", "-m", str(path), "--data", csv, "--where", "unit=u1,u2", "--where", "split=test",
                 "--label", "state", "--by", "unit,hall", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["auc"] == 1.0
    with np.load(path) as z:
        arrays = dict(z)
    arrays["w/group_values"] = np.frombuffer(b'[["u1"]]', dtype=np.uint8)
    bad = tmp_path / "bad.wt"
    with open(bad, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(ModelFileError, match="group shifts do not match normalize_by=unit,hall"):
        load_model(bad)


def test_an_unseen_group_keeps_the_pooled_scale_and_is_named_once(halls, caplog):
    model, _ = train_model(_data(halls, unit="u1,u2", split="train"), "state", "normal-dist", GROUPS, RunOptions())
    raw = copy.deepcopy(model)
    raw.group_shifts_ = {}
    new = _data(halls, unit="u3", split="test")
    with caplog.at_level(logging.WARNING):
        got = [float(p.scores[0]) for p in window_predictions(model, new, RunOptions())[0]]
    assert got == [float(p.scores[0]) for p in window_predictions(raw, new, RunOptions())[0]]
    said = [r.getMessage() for r in caplog.records if "has not seen" in r.getMessage()]
    assert len(said) == 1 and "u3/quiet" in said[0]


def test_adapting_to_a_new_unit_gives_its_groups_a_shift(halls):
    model, _ = train_model(_data(halls, unit="u1,u2", split="train"), "state", "knn-anomaly",
                           {**GROUPS, "k": 1}, RunOptions())
    before = dict(model.group_shifts_)
    info, _ = adapt_model(model, _data(halls, unit="u3", split="train"), RunOptions())
    assert {("u3", h) for h in HALLS} <= set(model.group_shifts_)
    assert all(model.group_shifts_[k] == v for k, v in before.items())      # the old groups keep theirs
    assert info["threshold"] >= info["threshold_before"]
    y, _, flagged = _answers(model, _data(halls, unit="u3", split="test"))
    assert flagged[~y].max() == 0.0 and flagged[y].mean() > 0.5


def test_normalize_by_a_label_the_data_lacks_is_refused(halls, capsys):
    code = main(["train", "--data", str(halls / "metadata.csv"), "--label", "state", "--model", "normal-dist",
                 "--set", "normalize_by=section", "-o", str(halls / "x.wt")])
    err = capsys.readouterr().err
    assert code == 2 and "section" in err and err.count("\n") == 1, err
